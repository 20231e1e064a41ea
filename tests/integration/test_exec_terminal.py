"""``sluice exec`` (and attach, bridge) as a person sees them: approvals they can judge,
output that cannot drive their terminal, clear errors, little noise, a sign of life.

The terminal tests run the frontend on a real pty (tests/support/frontends.py OnPty)
against a real daemon and the scripted model (tests/support/fake_model.py).
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from tests.support.fake_model import assistant, call, gated, outputs_of, response
from tests.support.frontends import Frontends
from tests.support.harness import sluice_argv, subprocess_env

pytestmark = pytest.mark.timeout(60)

HELLO = 'def greet(name):\n    print("Hello " + name)\n\n\ngreet("world")\n'
PATCH = ("*** Begin Patch\n*** Update File: hello.py\n@@\n def greet(name):\n-    print(\"Hello \" + name)\n"
         "+    print(f\"Hello, {name}!\")\n*** Add File: test_hello.py\n+from hello import greet\n+\n+\n"
         "+def test_greet(capsys):\n+    greet(\"you\")\n+    assert capsys.readouterr().out == \"Hello, you!\\n\"\n"
         "*** End Patch")


@pytest.fixture
def work(tmp_path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    (path / "hello.py").write_text(HELLO)
    return path


def coloured(fe: Frontends) -> Frontends:
    fe.env.pop("NO_COLOR", None)
    fe.env["TERM"] = "xterm-256color"
    return fe


def escalated(command: list[str], call_id: str, why: str = "it writes outside the sandbox") -> dict:
    return call("shell", {"command": command, "with_escalated_permissions": True, "justification": why}, call_id)


# -- approvals a person can judge ---------------------------------------------------------


def test_a_patch_approval_shows_a_coloured_diff_confirms_the_answer_and_sums_up(fe, server, work) -> None:
    server.script(response(call("apply_patch", {"input": PATCH}, "p1")), response(assistant("Fixed; test added.")))
    with coloured(fe).on_pty("exec", "--sandbox", "workspace-write", "--approval-policy", "untrusted",
                             "-C", str(work), "greet properly") as person:
        seen = person.read_until(b"Allow? [y]es")
        assert b"The agent asks to apply a patch to 2 files:" in seen
        assert f"  files: hello.py, test_hello.py\x1b[0m\r\n\x1b[1m  in: {work}\x1b[0m\r\nAllow?".encode() in seen
        assert b"--- a/hello.py\x1b[0m\r\n\x1b[1m+++ b/hello.py" in seen
        assert b"\x1b[36m@@ -1,3 +1,3 @@\x1b[0m" in seen
        assert b"\x1b[31m-    print(\"Hello \" + name)\x1b[0m" in seen
        assert b"\x1b[32m+    print(f\"Hello, {name}!\")\x1b[0m" in seen
        assert b"--- /dev/null" in seen and b"\x1b[32m+def test_greet(capsys):\x1b[0m" in seen
        assert not (work / "test_hello.py").exists()
        person.write(b"y\n")
        person.read_until(b"approved: applying the patch")
        seen = person.read_until(b"[patch applied: 2 files changed, +7 -1 (M hello.py, A test_hello.py)]")
        assert person.wait() == 0
    assert (work / "hello.py").read_text() == HELLO.replace('"Hello " + name', 'f"Hello, {name}!"')


def test_an_escalation_says_without_the_sandbox_when_asked_and_when_it_runs(fe, server, work) -> None:
    script = "echo one\necho two > out.txt"
    server.script(
        response(escalated(["bash", "-lc", script], "c1")),
        response(escalated(["touch", "no.txt"], "c2")),
        response(assistant("Done.")),
    )
    with fe.on_pty("exec", "--sandbox", "read-only", "--approval-policy", "on-request", "-C", str(work),
                   "write") as person:
        seen = person.read_until(b"Allow? [y]es")
        # The script line by line, and the command and its directory last.
        assert b'The agent asks to run a command without the sandbox.\r\n' in seen
        assert b'  the model says: "it writes outside the sandbox"\r\n  Its bash script, line by line:\r\n' in seen
        assert b"\r\n    echo one\r\n    echo two > out.txt\r\n" in seen
        assert (f"If approved, it runs WITHOUT the sandbox: with your full access to files and network.\r\n"
                f"  command: bash -lc 'echo one\\necho two > out.txt'\r\n  in: {work}\r\nAllow?").encode() in seen
        person.write(b"y\n")
        person.read_until(b"approved: running it without the sandbox\r\n")
        seen = person.read_until(b"(running WITHOUT the sandbox, as approved)")
        assert b"$ bash script:\r\n    echo one\r\n    echo two > out.txt\r\n" in seen
        person.read_until(b"Allow? [y]es", count=2)
        person.write(b"n\n")
        person.read_until(b"denied: the model is told so\r\n")
        assert person.wait() == 0
    assert (work / "out.txt").read_text() == "two\n" and not (work / "no.txt").exists()
    assert outputs_of(server.requests[2]["json"])["c2"] == "exec command rejected by user"


def test_a_long_script_is_cut_in_the_question_and_v_shows_it_whole(fe, server, work) -> None:
    script = "\n".join(f"echo line-{i:02d}" for i in range(60))
    server.script(response(escalated(["bash", "-lc", script], "c1")), response(assistant("Fine.")))
    with fe.on_pty("exec", "--sandbox", "read-only", "--approval-policy", "on-request", "-C", str(work),
                   "count") as person:
        seen = person.read_until(b"[v]iew in full: ")
        assert b"    echo line-29\r\n" in seen and b"    echo line-30" not in seen
        assert b"... 30 more lines ([v] shows them all)" in seen
        person.write(b"v\n")
        seen = person.read_until(b"Allow? [y]es", count=2)
        assert b"    echo line-59\r\n" in seen and seen.endswith(b"[n]o / abort: ")  # nothing left to view
        person.write(b"n\n")
        person.read_until(b"denied: the model is told so")
        assert person.wait() == 0


def test_control_sequences_are_escaped_in_exec_and_kept_by_run(fe, server, work) -> None:
    server.script(
        response(call("shell", {"command": ["printf", "\\033[31mred\\033]0;title\\007\\n"]}, "c1")),
        response(assistant("\x1b]52;c;cHduZWQ=\x07Done \x1b[2J\u009b1m.")),
    )
    p = fe.run("exec", "--sandbox", "workspace-write", "--approval-policy", "never", "-C", str(work), "colour")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "\\x1b]52;c;cHduZWQ=\\x07Done \\x1b[2J\\x9b1m.\n"
    assert "\\x1b[31mred\\x1b]0;title\\x07\n" in p.stderr
    assert "\x1b" not in p.stdout + p.stderr and "\u009b" not in p.stdout
    # The JSON view carries the bytes as they are (base64 for output).
    raw = subprocess.run(fe.argv("run", "--", "printf", "\\033[31mred"), env=fe.env, capture_output=True,
                         timeout=30)
    assert raw.returncode == 0 and raw.stdout == b"\x1b[31mred"


# -- sessions and prompts -------------------------------------------------------------------


def test_an_unknown_session_is_one_error_everywhere_and_starts_no_daemon(runtime_dir, fe) -> None:
    env = subprocess_env(runtime_dir)
    commands = (["exec", "--session", "abc123", "go on"], ["attach", "abc123"], ["bridge", "--session", "abc123"])
    for args in commands:
        p = subprocess.run([*sluice_argv(), *args], env=env, capture_output=True, text=True, timeout=30)
        assert (p.returncode, p.stderr) == (
            2, "sluice: error: no session 'abc123' (no daemon is running, so there are no sessions)\n"), args
    assert not os.path.exists(runtime_dir.pid_path)
    # With a daemon: the same words for the same mistake, whatever the command.
    said = set()
    for args in commands:
        p = fe.run(*args)
        assert p.returncode == 2 and p.stderr.count("\n") == 1, (args, p.stderr)
        said.add(p.stderr)
    (line,) = said
    assert line.startswith("sluice: error: no session 'abc123' (")


@pytest.mark.parametrize("via", ["argv", "stdin"])
def test_a_prompt_that_is_not_utf8_is_refused_and_leaves_no_session(dmn, fe, server, work, via) -> None:
    client = dmn.client()
    before = {s.id for s in client.list_sessions().sessions}
    prompt = b"fix caf\xe9 please"
    argv = [os.fsencode(a) for a in fe.argv("exec", "-C", str(work))] + ([prompt] if via == "argv" else [b"-"])
    p = subprocess.run(argv, env=fe.env, input=prompt if via == "stdin" else b"", capture_output=True, timeout=30)
    assert p.returncode == 2 and p.stdout == b""
    assert p.stderr.count(b"\n") == 1 and b"is not valid UTF-8 (byte 0xe9 at offset 7)" in p.stderr, p.stderr
    assert {s.id for s in client.list_sessions().sessions} == before
    assert server.requests == []


# -- less noise, and a sign of life ------------------------------------------------------


def test_token_counts_once_unless_verbose_and_no_repeated_hints(fe, server, work) -> None:
    for verbose in ((), ("-v",)):
        server.script(
            response(call("shell", {"command": ["touch", "x"]}, "c1")),
            response(call("shell", {"command": ["touch", "y"]}, "c2")),
            response(assistant("Both denied.")),
        )
        p = fe.run("exec", *verbose, "--approval-policy", "untrusted", "-C", str(work), "touch two")
        assert p.returncode == 0, p.stderr
        assert p.stderr.count("tokens: ") == (3 if verbose else 1), p.stderr
        assert p.stderr.count("there is no terminal to ask") == 2
        assert p.stderr.count("run on a terminal, or choose --approval-policy") == 1


def test_waiting_for_the_model_shows_a_status_line_on_a_terminal_only(fe, server, work) -> None:
    release = threading.Event()
    server.script(gated(response(assistant("Thought it over.")), release))
    try:
        with fe.on_pty("exec", "--approval-policy", "never", "-C", str(work), "think") as person:
            person.read_until(b"working (")
            release.set()
            seen = person.read_until(b"Thought it over.")
            assert person.wait() == 0
            # Cleared before the answer: the status line's start, then the answer.
            at = seen.rindex(b"working (")
            assert b"\r\x1b[K" in seen[at:seen.index(b"Thought it over.")]
    finally:
        release.set()
    release = threading.Event()
    server.script(gated(response(assistant("Quietly.")), release))
    threading.Timer(1.0, release.set).start()
    with fe.on_pty("exec", "--json", "--approval-policy", "never", "-C", str(work), "think") as person:
        assert person.wait() == 0
        assert b"working" not in person.seen and b'"type":"task_complete"' in person.seen
    server.script(gated(response(assistant("Piped.")), release := threading.Event()))
    threading.Timer(1.0, release.set).start()
    p = fe.run("exec", "--approval-policy", "never", "-C", str(work), "think")
    assert p.returncode == 0 and "working" not in p.stderr


def test_attach_asks_the_same_question_and_confirms(fe, server, work) -> None:
    server.script(
        response(call("apply_patch", {"input": PATCH}, "p1")),
        response(escalated(["bash", "-lc", "echo hi > made.txt"], "c1")),
        response(assistant("Both done.")),
    )
    p = fe.run("exec", "--detach", "--sandbox", "read-only", "--approval-policy", "untrusted", "-C", str(work), "go")
    assert p.returncode == 0, p.stderr
    session_id = p.stdout.strip()
    with fe.on_pty("attach", session_id) as person:
        seen = person.read_until(b"Allow? [y]es")
        assert b"The agent asks to apply a patch to 2 files:" in seen and b"  files: hello.py, test_hello.py" in seen
        assert b"+    print(f\"Hello, {name}!\")" in seen and b"+def test_greet(capsys):" in seen
        # Under read-only the patch is written in the sandbox only once the workspace is granted.
        assert b"If approved, the agent may also write anywhere beneath" in seen
        person.write(b"y\n")
        person.read_until(b"approved: applying the patch\r\n")
        person.read_until(b"[patch applied: 2 files changed, +7 -1 (M hello.py, A test_hello.py)]")
        seen = person.read_until(b"Allow? [y]es", count=2)
        assert f"  command: bash -lc 'echo hi > made.txt'\r\n  in: {work}\r\nAllow?".encode() in seen
        assert b"If approved, it runs WITHOUT the sandbox" in seen
        person.write(b"y\n")
        person.read_until(b"approved: running it without the sandbox\r\n")
        person.read_until(b"$ echo hi > made.txt\r\n  (running WITHOUT the sandbox, as approved)\r\n")
        person.read_until(b"Both done.")
        person.write(b"\x04")
        assert person.wait() == 0
    assert (work / "made.txt").read_text() == "hi\n"
