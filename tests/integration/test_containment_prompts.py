"""Containment of what a person is asked and what an answer hands out: the agent's side.

An approval is the only way out of the sandbox, so a question must show what would run,
and an answer must hand out no more than it showed. Each test first shows the attack
working where it should (against the old treatment of the text, or with the protection
switched off), then contained, as the person at a real terminal sees it (``sluice exec``
and ``sluice attach`` on a pty, tests/support/frontends.py, against a real daemon and the
scripted model) or as the agent's events say it (a Session over a real daemon and the
real sandbox, tests/support/fake_model.py).

- A justification, a workdir or a command word cannot make the question show another
  command: the last lines above the question are the real command and its directory,
  and the model's text is shown escaped, on one line, labelled as the model's.
- One "retry without sandbox" approval does not hand out an unsandboxed interactive
  shell: each input for a session running without the sandbox is asked for, showing
  the input and the session.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import time
from pathlib import Path

import pytest

import agent.tool_calls
from agent.exec_runner import BrokerRunner
from broker.cli.render import INTERACTIVE, NO_SANDBOX, command_text, safe_text, visible
from broker.wire.protocol import (
    RETRY_WITHOUT_SANDBOX_REASON,
    AskForApproval,
    ExecApproval,
    ReviewDecision,
    UnifiedExecSettings,
)
from landlock_helper.policy import SandboxPolicy
from tests.support.fake_model import FakeModelServer, Harness, assistant, call, outputs_of, response, tag

pytestmark = pytest.mark.timeout(90)

# Forty line breaks, then a line that reads as sluice's own.
SPOOF = "needed for the build" + "\n" * 40 + "The agent asks to run `ls -la`"
ROWS = 24


def above_question(seen: bytes) -> list[str]:
    """The lines on the terminal above the last approval question, oldest first (a status
    line cleared with ``\\r\\x1b[K`` counts as cleared)."""
    text = bytes(seen).decode("utf-8", "replace")
    before = text[:text.rindex("Allow? [y]es")]
    assert before.endswith("\r\n"), "the question starts a line of its own"
    return [line.rsplit("\x1b[K", 1)[-1] for line in before.split("\r\n")[:-1]]


def last_rows(lines: list[str], cols: int = 80) -> list[str]:
    """What a terminal of :data:`ROWS` rows shows of ``lines`` above a question: long lines
    wrap, and the oldest rows scroll away."""
    rows = [line[at:at + cols] for line in lines for at in range(0, max(len(line), 1), cols)]
    return rows[-(ROWS - 1):]


# -- class 6: the question shows the real command ------------------------------------------


def test_a_justification_of_forty_newlines_cannot_scroll_the_command_off_the_question(fe, server, work) -> None:
    real = ["bash", "-lc", "touch pwned.txt"]
    # The attack, against the old treatment (control characters escaped, line breaks kept
    # and the justification after the command): the command scrolls off a 24-row
    # terminal, and the last line above the question names another one.
    old = safe_text(f"The agent asks to run `{command_text(real)}` in {work} ({SPOOF}).").split("\n")
    assert "touch pwned.txt" not in "".join(last_rows(old)) and old[-1] == "The agent asks to run `ls -la`)."

    server.script(response(call("shell", {"command": real, "with_escalated_permissions": True,
                                           "justification": SPOOF}, "c1")),
                  response(assistant("Fine.")))
    with fe.on_pty("exec", "--sandbox", "read-only", "--approval-policy", "on-request", "-C", str(work),
                   "build it") as person:
        lines = above_question(person.read_until(b"Allow? [y]es"))
        assert lines[-3:] == [NO_SANDBOX, "  command: bash -lc 'touch pwned.txt'", f"  in: {work}"]
        assert "  command: bash -lc 'touch pwned.txt'" in last_rows(lines)
        # The model's words: one line, escaped, labelled, and nowhere else.
        said = [line for line in lines if "ls -la" in line]
        assert said == ['  the model says: "needed for the build' + "\\n" * 40 + 'The agent asks to run `ls -la`"']
        person.write(b"n\n")
        person.read_until(b"denied: the model is told so")
        assert person.wait() == 0
    assert not (work / "pwned.txt").exists()
    assert outputs_of(server.requests[1]["json"])["c1"] == "exec command rejected by user"


def test_a_workdir_of_newlines_and_slash_look_alikes_cannot_fake_the_retry_question(fe, server, work) -> None:
    # A directory the model made (any name but "/" and NUL is one): its lines read as the
    # end of a question about `ls -la` in the user's project, "/" drawn with U+2215.
    name = f"x\n{NO_SANDBOX}\n  command: ls -la\n  in: \u2215home\u2215user\u2215project"
    workdir = work / name
    workdir.mkdir()
    old = safe_text(f"The agent asks to run `touch made.txt` in {workdir} ({RETRY_WITHOUT_SANDBOX_REASON}).")
    assert old.split("\n")[-2:] == ["  command: ls -la", "  in: \u2215home\u2215user\u2215project (command failed; "
                                                        "retry without sandbox?)."]

    server.script(response(call("shell", {"command": ["touch", "made.txt"], "workdir": name}, "c1")),
                  response(assistant("Could not.")))
    with fe.on_pty("exec", "--sandbox", "read-only", "--approval-policy", "on-failure", "-C", str(work),
                   "make a file") as person:
        lines = above_question(person.read_until(b"Allow? [y]es"))
        shown = visible(str(workdir))
        assert "\\u2215home\\u2215user\\u2215project" in shown and "\\n  command: ls -la\\n" in shown
        assert lines[-3:] == [NO_SANDBOX, "  command: touch made.txt", f"  in: {shown}"]
        assert "  command: ls -la" not in lines and not any("\u2215" in line for line in lines)
        person.write(b"n\n")
        person.read_until(b"denied: the model is told so")
        assert person.wait() == 0
    assert not (workdir / "made.txt").exists()


def test_a_bidi_override_in_a_command_word_is_shown_escaped_in_attach(fe, server, work) -> None:
    # U+202E draws what follows right to left: "touch pwned.txt #<RLO> txt.seton tac"
    # reads as "touch pwned.txt # cat notes.txt" where bidi is honoured; the old
    # treatment passed it through.
    script = "touch pwned.txt #\u202e txt.seton tac"
    assert "\u202e" in safe_text(script)
    server.script(response(call("shell", {"command": ["bash", "-lc", script]}, "c1")), response(assistant("Ok.")))
    p = fe.run("exec", "--detach", "--sandbox", "read-only", "--approval-policy", "untrusted", "-C", str(work), "go")
    assert p.returncode == 0, p.stderr
    with fe.on_pty("attach", p.stdout.strip()) as person:
        seen = person.read_until(b"Allow? [y]es")
        lines = above_question(seen)
        assert lines[-2:] == ["  command: bash -lc 'touch pwned.txt #\\u202e txt.seton tac'", f"  in: {work}"]
        assert "\u202e".encode() not in seen
        person.write(b"n\n")
        person.read_until(b"denied: the model is told so")
        person.read_until(b"Ok.")
        person.write(b"\x04")
        assert person.wait() == 0
    assert not (work / "pwned.txt").exists()


# -- class 7: one retry approval does not hand out an interactive shell ----------------------

# Fails the way sandbox denials fail inside the sandbox; outside it, becomes a shell.
PROBE = 'if touch "$1/probe" 2>/dev/null; then exec sh -i; fi\necho "probe: Permission denied" >&2\nexit 1\n'
RETRIED_SESSION = 1001  # the sandboxed try was session 1000


def _probe_script(tools: str, outside: str, pwned: str) -> list:
    if tools == "codex":
        return [
            response(call("exec_command", {"cmd": f"sh ./probe.sh {outside}", "tty": True, "login": False,
                                           "yield_time_ms": 5000}, "c1")),
            response(call("write_stdin", {"session_id": RETRIED_SESSION, "chars": f"touch {pwned}\n",
                                          "yield_time_ms": 1500}, "c2")),
            response(assistant("Done.")),
        ]
    return [
        response(call("unified_exec", {"input": ["sh", "./probe.sh", outside], "timeout_ms": 5000}, "c1")),
        response(call("unified_exec", {"input": [f"touch {pwned}\n"], "session_id": str(RETRIED_SESSION),
                                       "timeout_ms": 1500}, "c2")),
        response(assistant("Done.")),
    ]


def _wait_exists(path: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


async def _until_exists(path: str, timeout: float = 15.0) -> None:
    await asyncio.to_thread(_wait_exists, path, timeout)


@pytest.mark.parametrize("tools", ["codex", "seed"])
@pytest.mark.parametrize("protected", [False, True], ids=["protection-off", "protected"])
def test_a_retry_approval_does_not_hand_out_an_unsandboxed_shell(dmn, tmp_path, outside, monkeypatch,
                                                                 tools: str, protected: bool) -> None:
    pwned = os.path.join(outside, "pwned")
    if not protected:
        # The old path: input to a running session was never asked for.
        monkeypatch.setattr(agent.tool_calls, "input_needs_approval", lambda *args: False)
    with FakeModelServer() as server:
        server.script(*_probe_script(tools, outside, pwned))

        async def main() -> None:
            runner = await BrokerRunner.connect(dmn.runtime)
            h = Harness(server, runner, tmp_path)
            (h.cwd / "probe.sh").write_text(PROBE)
            try:
                await h.configure(sandbox_policy=SandboxPolicy.from_mode("workspace-write"),
                                  approval_policy=AskForApproval.ON_FAILURE,
                                  unified_exec=UnifiedExecSettings(tools=tools))
                sub = await h.say("run the probe")
                retry = await h.until(lambda e: tag(e) == "exec_approval_request", timeout=30)
                # The retry says that what it approves keeps running as an interactive session.
                assert retry.msg.reason == RETRY_WITHOUT_SANDBOX_REASON and retry.msg.interactive
                assert retry.msg.stdin is None
                await h.submit(ExecApproval(sub, ReviewDecision.APPROVED))
                if not protected:
                    # The model's input runs with the user's rights, nobody asked.
                    await _until_exists(pwned)
                    assert tag(await h.done(sub, timeout=30)) == "task_complete"
                    assert len(h.of("exec_approval_request")) == 1
                    return
                after = len(h.events)
                question = await h.until(lambda e: tag(e) == "exec_approval_request", timeout=30, after=after)
                assert question.msg.stdin == f"touch {pwned}\n" and question.msg.process_id == str(RETRIED_SESSION)
                assert question.msg.command == retry.msg.command and question.msg.cwd == retry.msg.cwd
                assert question.msg.interactive
                # The session asked about runs unsandboxed: the probe wrote outside the roots.
                await _until_exists(os.path.join(outside, "probe"))
                assert not os.path.exists(pwned)
                await h.submit(ExecApproval(sub, ReviewDecision.DENIED))
                assert tag(await h.done(sub, timeout=30)) == "task_complete"
            finally:
                await h.session.aclose()
                await runner.aclose()

        asyncio.run(main())
        answers: dict[str, str] = {}
        for request in server.requests:
            answers.update(outputs_of(request["json"]))
    # The probe really ran unsandboxed after the retry (the attack's precondition).
    assert os.path.exists(os.path.join(outside, "probe"))
    assert os.path.exists(pwned) is not protected
    if protected:
        assert answers["c2"] == "write_stdin rejected by user"


def test_the_person_at_the_terminal_sees_the_session_and_the_input_last(fe, server, work, outside) -> None:
    pwned = os.path.join(outside, "pwned")
    (work / "probe.sh").write_text(PROBE)
    config = Path(fe.env["SLUICE_HOME"]) / "config.toml"
    config.write_text('unified_exec = "codex"\n' + config.read_text())
    server.script(*_probe_script("codex", outside, pwned))
    with fe.on_pty("exec", "--sandbox", "workspace-write", "--approval-policy", "on-failure", "-C", str(work),
                   "run the probe") as person:
        lines = above_question(person.read_until(b"Allow? [y]es"))
        command = f"  command: /bin/bash -c {shlex.quote(f'sh ./probe.sh {outside}')}"
        assert lines[-4:] == [INTERACTIVE, NO_SANDBOX, command, f"  in: {work}"]
        person.write(b"y\n")
        lines = above_question(person.read_until(b"Allow? [y]es", count=2, timeout=40))
        assert lines[-4:] == [
            "What it types runs with your full access to files and network; approving lets this input through, "
            "and asks again for the next.",
            f"  session {RETRIED_SESSION} runs: {command[len('  command: '):]}", f"  in: {work}",
            f"  input: touch {pwned}\\n"]
        _wait_exists(os.path.join(outside, "probe"))  # the session runs unsandboxed
        assert not os.path.exists(pwned)
        person.write(b"n\n")
        person.read_until(b"denied: the model is told so")
        person.read_until(b"Done.")
        assert person.wait() == 0
    assert os.path.exists(os.path.join(outside, "probe")) and not os.path.exists(pwned)
