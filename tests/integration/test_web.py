"""``sluice web`` in a real browser: Debian's chromium driven by Playwright, against a real
daemon, agent and executors with a scripted model (:mod:`tests.support.fake_model`).

The web server runs as ``sluice web --port 0`` (a process of its own, with its own
runtime dir's token), started per test; the daemon serves the module. Screenshots of the
main views go to ``$SLUICE_TEST_ARTEFACTS`` (else a directory of the test's own under
tmp_path): look at them after a change to the page.

Without chromium or Playwright (``pip install '.[browser]'``) the browser tests skip with
one line; the HTTP checks of the guard run either way.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.fake_model import assistant, call, gated, response
from tests.support.frontends import Frontends
from tests.support.harness import daemons, short_tempdir, wait_for

pytestmark = pytest.mark.timeout(90)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Long enough for a loaded two-core machine; every wait ends as soon as its condition holds.
WAIT_MS = 30_000


class WebServer:
    """``sluice web --port 0`` as a process: its URL (with the token) read from stdout."""

    def __init__(self, fe: Frontends, *args: str) -> None:
        self.proc = subprocess.Popen(fe.argv("web", "--port", "0", *args), env=fe.env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        line = b""
        fd = self.proc.stdout.fileno()
        while b"\n" not in line:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                self.close()
                raise AssertionError("sluice web printed no URL")
            data = os.read(fd, 4096)
            if not data:
                self.close()
                raise AssertionError("sluice web exited before printing its URL")
            line += data
        self.url = line.decode().split("\n")[0].strip()
        match = re.fullmatch(r"http://127\.0\.0\.1:(\d+)/\?token=([\w-]{32,})", self.url)
        assert match, self.url
        self.port, self.token = int(match[1]), match[2]
        self.base = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture
def web(fe):
    server = WebServer(fe)
    yield server
    server.close()


@pytest.fixture(scope="module")
def browser():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip("no chromium (apt-get install chromium) to run the browser tests in")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("no Playwright (pip install '.[browser]') to drive chromium with")
    with sync_playwright() as p:
        # --no-sandbox: chromium's own sandbox refuses to run as root (CI runs as root).
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser, web):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(web.url)
    page.wait_for_selector("#status:has-text('connected to the daemon')")
    yield page
    context.close()
    assert not errors, errors


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory) -> Path:
    path = Path(os.environ.get("SLUICE_TEST_ARTEFACTS") or tmp_path_factory.mktemp("web-screenshots"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def detached(fe: Frontends, *args: str) -> str:
    p = fe.run("exec", "--detach", *args)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def open_session(page, web, session_id: str) -> None:
    page.goto(f"{web.base}/#/s/{session_id}")
    page.wait_for_selector("#log .ev")


def seqs(page) -> list[int]:
    return [int(s) for s in page.eval_on_selector_all("#log [data-seq]", "nodes => nodes.map(n => n.dataset.seq)")]


# -- the guard, over plain HTTP -----------------------------------------------------------


def test_the_token_host_and_origin_are_required(web) -> None:
    with httpx.Client(base_url=web.base, follow_redirects=False) as http:
        # Nothing without the token: not the page, not an asset, not the API.
        for path in ("/", "/static/app.js", "/api/sessions/stream"):
            assert http.get(path).status_code == 403, path
        assert http.get("/?token=" + "x" * 43).status_code == 403
        # Wrong Host (DNS rebinding): refused even with the right token.
        assert http.get("/?token=" + web.token, headers={"host": f"attacker.example:{web.port}"}).status_code == 403
        answer = http.get("/?token=" + web.token)
        assert answer.status_code == 303 and answer.headers["location"] == "/"
        cookie = answer.headers["set-cookie"]
        assert cookie.startswith(f"sluice_web={web.token};") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
        assert "script-src 'self';" in answer.headers["content-security-policy"]
        http.cookies.clear()
    with httpx.Client(base_url=web.base, cookies={"sluice_web": web.token}) as authed:
        page = authed.get("/")
        assert page.status_code == 200 and "<script>" not in page.text
        assert "'unsafe-inline'" not in page.headers["content-security-policy"].split("script-src")[1].split(";")[0]
        csrf = re.search(r'name="sluice-csrf" content="([0-9a-f]{64})"', page.text)[1]
        assert csrf not in web.token

        # A state-changing request: the cookie alone is not enough.
        good = {"origin": web.base, "x-sluice-csrf": csrf, "content-type": "application/json"}
        path = "/api/sessions/none/input"
        assert authed.post(path, headers=good, json={"text": ""}).status_code == 400  # let in
        for headers, why in (({**good, "origin": "http://attacker.example"}, "cross-site origin"),
                             ({k: v for k, v in good.items() if k != "origin"}, "no origin"),
                             ({**good, "x-sluice-csrf": "0" * 64}, "wrong request token"),
                             ({k: v for k, v in good.items() if k != "x-sluice-csrf"}, "no request token")):
            assert authed.post(path, headers=headers, json={"text": ""}).status_code == 403, why
    with httpx.Client(base_url=web.base) as anonymous:
        assert anonymous.post(path, headers=good, json={"text": ""}).status_code == 403


def test_typing_needs_the_request_token_and_names_a_session_a_command_and_text(web) -> None:
    with httpx.Client(base_url=web.base, cookies={"sluice_web": web.token}) as authed:
        csrf = re.search(r'name="sluice-csrf" content="([0-9a-f]{64})"', authed.get("/").text)[1]
        good = {"origin": web.base, "x-sluice-csrf": csrf}
        path = "/api/sessions/5b0a8c52-0000-4000-8000-000000000000/stdin"
        typed = {"call_id": "c1", "text": "ls\n"}
        assert authed.post(path, headers={"origin": web.base}, json=typed).status_code == 403
        for body, status, message in (({"call_id": "c1", "text": ""}, 400, "nothing to type"),
                                      ({"text": "ls\n"}, 400, "call_id names the command to type into"),
                                      ({"call_id": "c1", "text": "x" * 65537}, 400, "at most 65536 characters"),
                                      (typed, 404, "unknown session")):
            answer = authed.post(path, headers=good, json=body)
            assert answer.status_code == status and message in answer.json()["error"], (body, answer.text)


def test_listen_elsewhere_needs_tls(fe) -> None:
    p = fe.run("web", "--listen", "0.0.0.0", "--port", "0")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--certfile and --keyfile" in p.stderr, p.stderr


# -- in the browser ---------------------------------------------------------------------


def test_a_detached_sessions_events_appear_live_and_a_reload_replays_them(
        fe, server, work, page, web, browser, artefacts) -> None:
    gate = threading.Event()
    server.script(response(call("shell", {"command": ["bash", "-c", "printf 'plain \\033[31mred\\033[0m\\n'"]}, "c1")),
                  gated(response(assistant("Said **hi**.\n\n- one\n- two")), gate))
    session_id = detached(fe, "--approval-policy", "never", "--sandbox", "read-only", "-C", str(work), "say hi")
    page.wait_for_selector(f".session[data-id='{session_id}']")
    page.screenshot(path=str(artefacts / "sessions.png"))
    open_session(page, web, session_id)
    page.wait_for_selector("#log .ev.user:has-text('say hi')")
    page.wait_for_selector("#log .ev.command .fg-red:text-is('red')")
    assert page.locator("#log .ev.agent").count() == 0
    gate.set()  # the model answers now: the page shows it as it comes
    page.wait_for_selector("#log .ev.agent strong:text-is('hi')")
    page.wait_for_selector("#log .ev.turn:has-text('turn complete')")
    page.screenshot(path=str(artefacts / "session.png"))
    before = seqs(page)
    assert before == sorted(before) and before[0] == 1 and len(before) >= 6
    texts = page.inner_text("#log")
    page.reload()
    page.wait_for_selector("#log .ev.turn:has-text('turn complete')")
    assert seqs(page) == before and page.inner_text("#log") == texts
    # A second browser sees the same, and the daemon still has the web process attached
    # once: the tabs share one attachment per session.
    other = browser.new_context()
    try:
        second = other.new_page()
        second.goto(web.url)
        open_session(second, web, session_id)
        second.wait_for_selector("#log .ev.turn:has-text('turn complete')")
        assert seqs(second) == before and second.inner_text("#log") == texts
        listed = [json.loads(line) for line in fe.run("sessions", "--json").stdout.splitlines()]
        (info,) = [s for s in listed if s["id"] == session_id]
        assert sum("(sluice web tab)" in f for f in info["frontends"]) == 1, info["frontends"]
    finally:
        other.close()


def test_approve_in_the_browser_while_sluice_attach_asks_too(fe, server, work, page, web, artefacts) -> None:
    server.script(response(call("shell", {"command": ["touch", "made.txt"]}, "c1")), response(assistant("Made it.")))
    session_id = detached(fe, "--approval-policy", "untrusted", "--sandbox", "workspace-write", "-C", str(work),
                          "make a file")
    with fe.on_pty("attach", session_id) as person:
        person.read_until(b"Allow? [y]es")
        open_session(page, web, session_id)
        card = page.locator("#log .ev.approval")
        card.locator(".cmd:text-is('$ touch made.txt')").wait_for()
        page.screenshot(path=str(artefacts / "approval.png"))
        card.locator("button[data-decision='approved']").click()
        card.locator(".answered:has-text('approved by')").wait_for()
        assert "(sluice web)" in card.locator(".answered").inner_text()
        person.read_until(b"(sluice web) answered: approved")
        person.read_until(b"Made it.")
        assert person.seen.count(b"Allow? [y]es") == 1
        person.write(b"\x04")
        assert person.wait() == 0
    page.wait_for_selector("#log .ev.agent:has-text('Made it.')")
    assert (work / "made.txt").exists()


def test_a_patch_is_shown_as_a_diff_before_it_is_approved(fe, server, work, page, web, artefacts) -> None:
    (work / "notes.txt").write_text("one\ntwo\n")
    body = "*** Update File: notes.txt\n@@\n one\n-two\n+three"
    server.script(response(call("apply_patch", {"input": f"*** Begin Patch\n{body}\n*** End Patch"}, "p1")),
                  response(assistant("Patched.")))
    session_id = detached(fe, "--approval-policy", "on-request", "--sandbox", "read-only", "-C", str(work),
                          "patch it")
    open_session(page, web, session_id)
    card = page.locator("#log .ev.approval")
    card.locator(".file-name:has-text('notes.txt')").wait_for()
    assert card.locator(".diff-del").inner_text().strip() == "-two"
    assert card.locator(".diff-add").inner_text().strip() == "+three"
    assert (work / "notes.txt").read_text() == "one\ntwo\n"  # nothing written before the answer
    page.screenshot(path=str(artefacts / "patch.png"))
    card.locator("button[data-decision='approved']").click()
    page.wait_for_selector("#log .ev.agent:has-text('Patched.')")
    assert (work / "notes.txt").read_text() == "one\nthree\n"


def test_a_follow_up_message_and_an_interrupt(fe, server, work, page, web) -> None:
    server.script(response(assistant("First.")))
    session_id = detached(fe, "--approval-policy", "never", "--sandbox", "read-only", "-C", str(work), "start")
    open_session(page, web, session_id)
    page.wait_for_selector("#log .ev.agent:has-text('First.')")

    server.script(response(call("shell", {"command": ["sleep", "60"]}, "c2")), response(assistant("never")))
    page.fill("#message", "now wait a minute")
    page.click("#send button")
    page.wait_for_selector("#log .ev.user:has-text('now wait a minute')")
    page.wait_for_selector("#log .ev.command .cmd:text-is('$ sleep 60')")
    assert page.input_value("#message") == ""
    page.click("#interrupt")
    page.wait_for_selector("#log .ev.aborted:has-text('turn aborted')")
    # The command was killed with the turn, long before its minute was up.
    page.wait_for_selector("#log .ev.command:has-text('sleep 60') .exit.failed")


XSS = ('<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'
       '[click](javascript:window.pwned=3) <b onmouseover="window.pwned=4">b</b>')


def test_hostile_text_renders_as_text(fe, server, work, page, web, browser) -> None:
    # Without the page's care the payload is live: put in as HTML on a page without a
    # CSP, it runs.
    bare = browser.new_page()
    try:
        bare.set_content("<div id=x></div>")
        bare.evaluate("p => { document.getElementById('x').innerHTML = p; }", XSS)
        bare.wait_for_function("window.pwned === 2")
    finally:
        bare.close()

    name = '<img src=x onerror="window.pwned=5">.txt'
    (work / name).write_text("old\n")
    osc = "\x1b]0;pwned title\x07\x1b]52;c;cHduZWQ=\x07\x1b]8;;javascript:alert(1)\x1b\\link\x1b]8;;\x1b\\"
    script = f"printf '%s\\n' '{XSS}'; printf '{osc}'"
    server.script(
        response(call("shell", {"command": ["bash", "-c", script]}, "c1")),
        response(call("apply_patch", {"input": f"*** Begin Patch\n*** Update File: {name}\n@@\n-old\n+{XSS}\n"
                                               "*** End Patch"}, "p1")),
        response(assistant(XSS + "\n\n```diff\n+" + XSS + "\n```")))
    session_id = detached(fe, "--approval-policy", "on-request", "--sandbox", "read-only", "-C", str(work), XSS)
    open_session(page, web, session_id)
    card = page.locator("#log .ev.approval")
    card.locator(".file-name").wait_for()
    card.locator("button[data-decision='approved']").click()
    page.wait_for_selector("#log .ev.agent")
    log = page.inner_text("#log")
    assert log.count("<script>window.pwned=1</script>") >= 4  # message, output, diff, agent
    assert name in log
    # The command is shown with its escapes made visible; its output without them (the
    # title, clipboard and hyperlink sequences dropped, payload and all).
    assert "\u241b]0;pwned title\u2407" in page.inner_text("#log .ev.command .cmd")
    output = page.inner_text("#log .ev.command .output")
    assert "pwned title" not in output and "cHduZWQ=" not in output and "javascript" not in output.split("</b>")[-1]
    assert output.rstrip().endswith("link")
    assert page.evaluate("window.pwned") is None
    assert page.locator("#log img, #log script, #log b, #log [onerror]").count() == 0
    assert page.locator("#log a").count() == 0
    assert page.title() == "sluice"


def test_the_command_box_streams_one_sandboxed_command(fe, page, web, work, artefacts) -> None:
    page.goto(f"{web.base}/#/run")
    page.fill("#run input[name=command]", "bash -c \"echo hello; printf '\\033[32mgreen\\033[0m\\n'; touch /etc/nope\"")
    page.fill("#run input[name=cwd]", str(work))
    page.click("#run button[name=go]")
    page.wait_for_selector("#run-output .exit")
    page.screenshot(path=str(artefacts / "run.png"))
    out = page.inner_text("#run-output")
    assert "hello" in out and "Read-only file system" in out
    assert page.locator("#run-output .fg-green").inner_text() == "green"
    assert page.locator("#run-output .exit").inner_text() == "exit 1"


def test_an_interactive_session_in_a_read_only_terminal_view(fe, server, work, page, web, artefacts) -> None:
    # A carriage return overwrites what the line began with: a terminal shows "Xb", where
    # the text view shows both lines' characters.
    command = "printf 'ab\\rX\\n\\033[1mready\\033[0m\\n'; sleep 30"
    server.script(response(call("exec_command", {"cmd": command, "tty": True, "yield_time_ms": 1500}, "c1")),
                  response(assistant("Started.")))
    session_id = detached(fe, "-c", 'unified_exec="codex"', "--approval-policy", "never", "--sandbox", "read-only",
                          "-C", str(work), "start a shell")
    open_session(page, web, session_id)
    page.wait_for_selector("#log .ev.agent:has-text('Started.')")
    page.locator("#log .ev.command .watch").first.click()
    shown = "[...document.querySelectorAll('#terminal .xterm-rows > div')].map(r => r.textContent.trimEnd())"
    # Polled from here: a predicate Playwright polls in the page is compiled with eval,
    # which the page's Content-Security-Policy (rightly) refuses.
    wait_for(lambda: "ready" in page.evaluate(shown), timeout=30, what="the terminal view to show 'ready'")
    lines = page.evaluate(shown)
    assert "Xb" in lines and "ab" not in lines, lines
    assert page.locator("#log .ev.command .output").inner_text().splitlines()[-3:] == ["ab", "X", "ready"]
    page.screenshot(path=str(artefacts / "terminal.png"))
    # Read-only: what is typed goes nowhere (xterm's input is off, and nothing is sent).
    requests = []
    page.on("request", lambda r: requests.append(r.url) if r.method == "POST" else None)
    page.locator("#terminal").click()
    page.keyboard.type("echo typed\n")
    assert requests == [] and "typed" not in "".join(page.evaluate(shown))


def test_typing_into_an_interactive_session_is_explicit_and_every_frontend_sees_it(
        dmn, fe, server, work, page, web, artefacts) -> None:
    from broker.client import Client
    from broker.wire.protocol import ExecCommandStdin, Shutdown
    from tests.support.sessions import collect

    server.script(response(call("exec_command", {"cmd": "python3 -q -i", "tty": True, "yield_time_ms": 1500}, "c1")),
                  response(assistant("Started.")))
    session_id = detached(fe, "-c", 'unified_exec="codex"', "--approval-policy", "never", "--sandbox", "read-only",
                          "-C", str(work), "start python")

    def on_screen(line: str) -> None:
        """Wait until a row of the terminal reads ``line`` (a locator: the page's CSP
        forbids the eval a polled JavaScript predicate needs)."""
        row = re.compile(r"^\s*" + re.escape(line) + r"\s*$")
        page.locator("#terminal .xterm-rows > div", has_text=row).first.wait_for()

    with fe.on_pty("attach", session_id) as person:
        person.read_until(b"Started.")
        open_session(page, web, session_id)
        page.wait_for_selector("#log .ev.agent:has-text('Started.')")
        page.locator("#log .ev.command .watch").first.click()
        on_screen(">>>")
        # Read-only until typing is turned on, and then it says where input goes.
        assert page.locator("#terminal-input").is_hidden()
        assert page.inner_text("#terminal-title").endswith("(read-only)")
        page.click("#terminal-type")
        assert "what you send goes to the command's input" in page.inner_text("#terminal-input .banner")
        assert page.inner_text("#terminal-title").endswith("(typing on: input goes to the command)")
        page.fill("#terminal-line", "print(6*7)")
        page.press("#terminal-line", "Enter")
        on_screen("42")
        page.locator("#log .ev.typed", has_text="(sluice web) typed into c1: print(6*7)\\n").wait_for()
        person.read_until(b"(sluice web) typed into c1: print(6*7)\\n")

        # Another frontend's typing shows under the terminal, and its effect in it.
        other = Client.connect(dmn.runtime, autostart=False, name="elsewhere")
        try:
            attached = other.attach(session_id, since=0)
            attached.submit(ExecCommandStdin("c1", "print('from' + ' elsewhere')\n"))
            typed = page.locator("#terminal-typed div")
            typed.filter(has_text="(elsewhere) typed into c1: print('from' + ' elsewhere')\\n").wait_for()
            on_screen("from elsewhere")
            person.read_until(b"(elsewhere) typed into c1: print('from' + ' elsewhere')\\n")
            # What is typed is text wherever it is shown (a comment to Python).
            attached.submit(ExecCommandStdin("c1", "#<img src=x onerror=window.pwned=1>\x1b]0;t\x07\n"))
            typed.filter(has_text="#<img src=x onerror=window.pwned=1>\\x1b]0;t\\x07\\n").wait_for()
            assert page.locator("#terminal-typed img, #log .ev.typed img").count() == 0
            assert page.evaluate("window.pwned") is None
            person.read_until(b"#<img src=x onerror=window.pwned=1>\\x1b]0;t\\x07\\n")
            page.screenshot(path=str(artefacts / "terminal-typing.png"))

            # Reopened, the view is read-only again and still says who typed what.
            page.click("#terminal-close")
            page.locator("#log .ev.command .watch").first.click()
            assert page.locator("#terminal-input").is_hidden()
            assert page.inner_text("#terminal-title").endswith("(read-only)")
            assert typed.count() == 3 and "(sluice web) typed into c1: print(6*7)\\n" in typed.first.inner_text()
            page.click("#terminal-type")

            # The command gone, typing ends with it.
            page.fill("#terminal-line", "exit()")
            page.press("#terminal-line", "Enter")
            page.wait_for_selector("#terminal-type:disabled")
            assert page.locator("#terminal-input").is_hidden()
            assert page.inner_text("#terminal-title").endswith("(ended)")
            person.write(b"\x04")
            assert person.wait() == 0
            attached.submit(Shutdown())
            collect(attached, "shutdown_complete")
        finally:
            other.close()


def test_the_page_outlives_a_daemon_restart_and_a_web_server_restart(server, browser, tmp_path) -> None:
    import socket

    with daemons() as factory:
        first = factory.start(executors=1, env={"SLUICE_HOME": short_tempdir("sl-web-home-")})
        fe = Frontends(first.runtime, server, tmp_path / "fe-home")
        with socket.socket() as probe:  # a port to come back on (the page's cookie is for this origin)
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        web = WebServer(fe, "--port", str(port))
        page = browser.new_page()
        try:
            page.set_default_timeout(WAIT_MS)
            page.goto(web.url)
            page.wait_for_selector("#status:has-text('connected to the daemon')")
            first.stop()
            page.wait_for_selector("#status.bad:has-text('daemon unreachable')")
            factory.start(executors=1, runtime=first.runtime, env={"SLUICE_HOME": short_tempdir("sl-web-home-")})
            page.wait_for_selector("#status:not(.bad):has-text('connected to the daemon')")

            server.script(response(assistant("Before.")))
            session_id = detached(fe, "--approval-policy", "never", "-C", str(tmp_path), "one")
            page.goto(f"{web.base}/#/s/{session_id}")
            page.wait_for_selector("#log .ev.agent:has-text('Before.')")
            before = seqs(page)
            web.close()
            page.wait_for_selector("#status.bad:has-text('web server is unreachable')")
            web = WebServer(fe, "--port", str(port))  # the same token, from the runtime dir
            page.wait_for_selector("#status:not(.bad):has-text('connected to the daemon')")
            server.script(response(assistant("After.")))
            assert fe.run("exec", "--session", session_id, "two").returncode == 0
            page.wait_for_selector("#log .ev.agent:has-text('After.')")
            after = seqs(page)
            # The stream went on from where it stopped: no event twice, none missing.
            assert after[:len(before)] == before and after == sorted(set(after)), after
            assert page.get_attribute("#log", "data-gaps") == "0"
            assert page.locator("#log .ev.user .md").all_inner_texts() == ["one", "two"]
        finally:
            page.close()
            web.close()


def test_start_a_session_from_the_page_and_shut_it_down(fe, server, work, page, web, artefacts) -> None:
    server.script(response(assistant("Started from the page.")))
    page.goto(f"{web.base}/#/")
    page.fill("#new input[name=cwd]", str(work))
    page.select_option("#new select[name=approval]", "never")
    page.select_option("#new select[name=sandbox]", "read-only")
    page.fill("#new textarea[name=prompt]", "hello from the browser")
    page.screenshot(path=str(artefacts / "new-session.png"))
    page.click("#new button")
    page.wait_for_selector("#log .ev.agent:has-text('Started from the page.')")
    session_id = page.evaluate("location.hash").removeprefix("#/s/")
    assert page.locator("#log .ev.user .md").inner_text() == "hello from the browser"
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#shutdown")
    page.wait_for_selector("#log .ev.turn:has-text('session shut down')")
    listed = fe.run("sessions", "--json")
    assert session_id not in listed.stdout


def test_a_long_session_opens_on_its_tail_and_earlier_events_come_on_demand(fe, server, work, page, web) -> None:
    from broker.web.app import TAIL_EVENTS

    count = TAIL_EVENTS + 500
    server.script(response(assistant("x" * count), deltas=["x"] * count))
    session_id = detached(fe, "--approval-policy", "never", "-C", str(work), "a long one")
    p = fe.run("attach", session_id, "--until-idle")
    assert p.returncode == 0, p.stderr
    open_session(page, web, session_id)
    page.wait_for_selector("#log .ev.agent")
    # The first events were not sent with the tail; the log, too short to scroll, asked
    # for them (the same would happen scrolling up).
    page.wait_for_selector("#log [data-seq='1']")
    assert page.locator("#log .ev.user .md").inner_text() == "a long one"
    assert page.get_attribute("#log", "data-gaps") == "0"


def test_an_mcp_call_and_its_hostile_result_render_as_text(fe, server, work, page, web, tmp_path) -> None:
    from tests.support.harness import SANDBOX_PYTHON

    source = (Path(__file__).resolve().parents[1] / "support" / "fake_mcp_server.py").read_text()
    with open(tmp_path / "fe-home" / "config.toml", "a") as config:
        config.write(f"[mcp_servers.fake]\ncommand = \"{SANDBOX_PYTHON}\"\nargs = ['-c', '''{source}''']\n")
    server.script(response(call("fake__echo", {"text": XSS}, "m1")), response(assistant("echoed")))
    session_id = detached(fe, "--approval-policy", "never", "--sandbox", "read-only", "-C", str(work), "echo it")
    open_session(page, web, session_id)
    page.wait_for_selector("#log .ev.agent:has-text('echoed')")
    calls = page.locator("#log .ev.mcp")
    assert calls.first.locator(".label").inner_text().lower() == "mcp tool fake.echo"
    shown = calls.all_inner_texts()
    assert XSS.replace('"', '\\"') in shown[0] and "MCP CALL DONE" in shown[1].upper()
    assert XSS.replace('"', '\\"') in shown[1]
    assert page.evaluate("window.pwned") is None
    assert page.locator("#log img, #log script, #log b, #log a").count() == 0


def test_a_model_name_that_looks_like_an_option_stays_a_name(fe, server, work, page, web) -> None:
    server.script(response(assistant("hi")))
    page.goto(f"{web.base}/#/")
    page.fill("#new input[name=cwd]", str(work))
    page.fill("#new input[name=model]", "--help")
    page.fill("#new textarea[name=prompt]", "hello")
    page.click("#new button")
    page.wait_for_selector("#log .ev.meta:has-text('model --help')")
