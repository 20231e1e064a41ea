"""``sluice bridge``: Submissions in on stdin, Events out on stdout, as a program in any language drives it.

Real processes: a daemon with its agent, the bridge as a subprocess on pipes, a scripted
model on loopback (:mod:`tests.fake_model`).
"""

from __future__ import annotations

import json
import select
import time

import pytest

from broker.wire.protocol import Shutdown, TextInput, UserInput
from tests.support.fake_model import assistant, call, response, user_item
from tests.support.frontends import Frontends, JsonLines, configure_op, json_events, submission_line, tag
from tests.support.harness import daemons, reap, short_tempdir

pytestmark = pytest.mark.timeout(60)

NO_SESSION = "No session initialized, expected 'ConfigureSession' as first Op"


@pytest.fixture(scope="module")
def dmn():
    with daemons() as factory:
        yield factory.start(executors=1, env={"SLUICE_HOME": short_tempdir("sl-bridge-home-")})


def test_bridge_configures_takes_input_answers_bad_lines_and_attaches(fe, server, tmp_path) -> None:
    server.script(response(assistant("Hello from the bridge.")), response(assistant("Second.")))
    stdin = b"".join([
        submission_line("early", UserInput([TextInput("too soon")])),
        b"{not json\n",
        submission_line("cfg", configure_op(server, tmp_path)),
        submission_line("t1", UserInput([TextInput("hello")])),
        b'{"id":"x","op":{"type":"warp_drive"}}\n',
    ])
    p = fe.run("bridge", input=stdin)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert json.loads(lines[0]) == {"id": "early", "msg": {"type": "error", "message": NO_SESSION}}
    line2 = json.loads(lines[1])
    assert list(line2) == ["id", "msg"] and line2["id"] == "" and line2["msg"]["message"].startswith("line 2: ")
    bad5 = [json.loads(line) for line in lines if '"line 5: ' in line]
    assert bad5 and bad5[0]["msg"]["message"] == "line 5: unknown op type 'warp_drive'"
    stderr = p.stderr.splitlines()
    assert len(stderr) == 2 and stderr[0].startswith("sluice: error: line 2: ")
    assert stderr[1] == "sluice: error: line 5: unknown op type 'warp_drive'"

    events = [e for e in json_events(p.stdout) if e.seq is not None]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert tag(events[0]) == "session_configured" and events[0].id == "cfg"
    turn = [tag(e) for e in events if e.id == "t1"]
    assert turn[0] == "task_started" and turn[-1] == "task_complete"
    assert events[-1].msg.last_agent_message == "Hello from the bridge."
    session_id = str(events[0].msg.session_id)

    # --session attaches (by a prefix): the last turn is replayed, then the program goes on.
    proc = fe.popen("bridge", "--session", session_id[:8])
    try:
        out = JsonLines(proc)
        proc.stdin.write(submission_line("t2", UserInput([TextInput("again")])))
        proc.stdin.flush()
        out.until(lambda e: e.id == "t2" and tag(e) == "task_complete")
        proc.stdin.write(submission_line("bye", Shutdown()))
        proc.stdin.close()
        assert proc.wait(20) == 0, proc.stderr.read()
        events = out.rest()
    finally:
        reap(proc)
    assert events[0].id == "t1" and tag(events[0]) == "task_started"
    assert [e.seq for e in events] == list(range(events[0].seq, events[0].seq + len(events)))
    assert tag(events[-1]) == "shutdown_complete" and events[-1].id == "bye"
    assert server.requests[-1]["json"]["input"][-1] == user_item("again")

    p = fe.run("bridge", "--session", session_id)
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    (line,) = p.stdout.splitlines()
    assert json.loads(line)["msg"]["message"].startswith(f"no session '{session_id}'")


def test_bridge_says_when_the_daemon_goes_away(server, tmp_path) -> None:
    with daemons() as factory:
        handle = factory.start(executors=1, env={"SLUICE_HOME": str(tmp_path / "agent-home")})
        fe = Frontends(handle.runtime, server, tmp_path / "fe-home")
        proc = fe.popen("bridge")
        try:
            proc.stdin.write(submission_line("cfg", configure_op(server, tmp_path)))
            proc.stdin.flush()
            fd = proc.stdout.fileno()
            assert select.select([fd], [], [], 20)[0]
            assert b'"session_configured"' in proc.stdout.readline()
            started = time.monotonic()
            handle.stop()
            assert proc.wait(20) == 125
            assert time.monotonic() - started < 15
            events = json_events(proc.stdout.read())
            assert tag(events[-1]) == "error" and events[-1].id == ""
            assert "sluice: error: " in proc.stderr.read().decode()
        finally:
            reap(proc)


def test_bridge_with_only_a_configure_shows_the_session_then_ends(fe, server, tmp_path) -> None:
    p = fe.run("bridge", input=submission_line("only", configure_op(server, tmp_path)))
    assert p.returncode == 0 and p.stderr == "", p.stderr
    (event,) = json_events(p.stdout)
    assert tag(event) == "session_configured" and event.id == "only" and event.seq == 1
    p = fe.run("bridge", input="")
    assert (p.returncode, p.stdout, p.stderr) == (0, "", "")


@pytest.mark.parametrize("mode, writes", [("workspace-write", True), ("read-only", False)])
def test_bridge_takes_a_sandbox_mode_name_as_the_policy(fe, server, tmp_path, mode, writes) -> None:
    """A program that writes ``"sandbox_policy": "workspace-write"``, as a person would,
    gets that mode's policy (the daemon and the agent see the permission list)."""
    work = tmp_path / "work"
    work.mkdir()
    server.script(response(call("shell", {"command": ["touch", "made.txt"]}, "c1")),
                  response(assistant("Done.")))
    configure = json.loads(submission_line("cfg", configure_op(server, work)))
    configure["op"]["sandbox_policy"] = mode
    stdin = json.dumps(configure).encode() + b"\n" + submission_line("t1", UserInput([TextInput("make it")]))
    p = fe.run("bridge", input=stdin)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    events = json_events(p.stdout)
    assert tag(events[0]) == "session_configured", events[0]
    (end,) = [e for e in events if tag(e) == "exec_command_end"]
    assert (end.msg.exit_code == 0) == writes, end.msg
    assert (work / "made.txt").exists() == writes


def test_bridge_refuses_an_unknown_sandbox_mode_in_one_line(fe, server, tmp_path) -> None:
    configure = json.loads(submission_line("cfg", configure_op(server, tmp_path)))
    configure["op"]["sandbox_policy"] = "workspace-writable"
    p = fe.run("bridge", input=json.dumps(configure).encode() + b"\n")
    assert p.returncode == 0, p.stderr
    (event,) = json_events(p.stdout)
    assert tag(event) == "error" and "unknown sandbox mode 'workspace-writable'" in event.msg.message
    assert "read-only, workspace-write, danger-full-access" in event.msg.message
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
