"""``sluice sessions``, ``sluice exec --detach`` and ``sluice attach`` as people and scripts run them.

Real processes throughout: a daemon with its agent process, the command line as a
subprocess (on pipes, or on a pseudo-terminal where a person would type), and a scripted
model on loopback (:mod:`tests.fake_model`). One daemon serves the module; sessions the
tests leave open stay in it, so listings are checked for what a test made, not for all.
"""

from __future__ import annotations

import datetime
import json
import os
import random
import select
import subprocess
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from broker.wire.protocol import ExecApproval, ReviewDecision, TextInput, UserInput
from tests.support.fake_model import assistant, call, gated, response, user_item
from tests.support.frontends import Frontends, JsonLines, configure_op, json_events, submission_line, tag
from tests.support.harness import sluice_argv, subprocess_env, wait_for

pytestmark = pytest.mark.timeout(60)


def open_session(client, server, cwd: Path, **kwargs):
    """A configured session (its session_configured read)."""
    session = client.open_session(configure_op(server, cwd, **kwargs))
    event = session.next_event(20)
    assert event is not None and tag(event) == "session_configured", event
    return session


def detached(fe: Frontends, *args: str) -> str:
    """``sluice exec --detach ...``: the session id it printed."""
    started = time.monotonic()
    p = fe.run("exec", "--detach", *args)
    assert p.returncode == 0, p.stderr
    assert time.monotonic() - started < 15
    session_id = p.stdout.strip()
    assert p.stdout == session_id + "\n" and str(uuid.UUID(session_id)) == session_id
    return session_id


# -- sluice sessions ----------------------------------------------------------------------


def test_sessions_lists_two_sessions_for_people_and_as_json(dmn, fe, server, work, tmp_path) -> None:
    client = dmn.client()
    other = tmp_path / "other"
    other.mkdir()
    first = open_session(client, server, work)
    second = open_session(client, server, other)

    p = fe.run("sessions")
    assert p.returncode == 0 and p.stderr == "", p.stderr
    header, *rows = p.stdout.splitlines()
    assert header.split() == ["ID", "STATE", "MODEL", "FRONTENDS", "AGE", "CWD"]
    mine = {row.split()[0]: row.split() for row in rows if row.split()[0] in (first.id, second.id)}
    assert mine[first.id][1:4] == ["idle", "test-model", "1"] and mine[first.id][5] == str(work)
    assert mine[second.id][5] == str(other) and mine[second.id][4].endswith("s")

    p = fe.run("sessions", "--json")
    assert p.returncode == 0, p.stderr
    listed = {row["id"]: row for row in map(json.loads, p.stdout.splitlines())}
    row = listed[first.id]
    assert list(row) == ["id", "cwd", "model", "state", "frontends", "created", "created_at", "seq", "turn_start",
                         "pending_approvals"]
    assert (row["cwd"], row["model"], row["state"], row["seq"], row["pending_approvals"]) == (
        str(work), "test-model", "idle", 1, [])
    assert len(row["frontends"]) == 1 and row["frontends"][0].startswith(client.peer_id)
    created = datetime.datetime.fromisoformat(row["created_at"].replace("Z", "+00:00"))
    assert row["created_at"].endswith("Z") and abs(created.timestamp() - row["created"]) < 0.001
    assert abs(row["created"] - time.time()) < 60
    assert listed[second.id]["cwd"] == str(other)


def test_without_a_daemon_sessions_and_attach_say_so_and_start_none(runtime_dir) -> None:
    env = subprocess_env(runtime_dir)
    for args in (["sessions"], ["sessions", "--json"]):
        p = subprocess.run([*sluice_argv(), *args], env=env, capture_output=True, text=True, timeout=30)
        assert p.returncode == 3, (args, p.stderr)
        assert p.stdout == "" and p.stderr.count("\n") == 1 and "no daemon is running" in p.stderr
    assert not os.path.exists(runtime_dir.pid_path)


# -- exec --detach, attach --------------------------------------------------------------


def test_exec_detach_then_attach_since_0_sees_the_whole_turn(fe, server, work) -> None:
    server.script(response(call("shell", {"command": ["echo", "hi"]}, "c1")), response(assistant("Said hi.")))
    session_id = detached(fe, "--approval-policy", "never", "--sandbox", "read-only", "-C", str(work), "say hi")

    p = fe.run("attach", session_id, "--until-idle", "--json", "--since", "0")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert list(json.loads(lines[0])) == ["id", "msg", "seq"]
    events = json_events(p.stdout)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    tags = [tag(e) for e in events]
    # What was asked is replayed like the rest: later Codex's user_message.
    assert tags[:3] == ["session_configured", "task_started", "user_message"] and tags[-1] == "task_complete"
    assert json.loads(lines[2])["msg"] == {"type": "user_message", "message": "say hi"}
    for expected in ("exec_command_begin", "exec_command_output_delta", "exec_command_end", "agent_message"):
        assert expected in tags
    assert events[-1].msg.last_agent_message == "Said hi."
    # And a person attaching sees it as one line.
    shown = fe.run("attach", session_id, "--until-idle", "--since", "0")
    assert shown.returncode == 0 and "\nuser: say hi\n" in shown.stderr, shown.stderr

    # exec --session (by a prefix) joins live: nothing of the first turn again.
    server.script(response(assistant("Again.")))
    p = fe.run("exec", "--session", session_id[:8], "--json", "once more")
    assert p.returncode == 0, p.stderr
    more = json_events(p.stdout)
    assert more[0].seq == events[-1].seq + 1 and tag(more[0]) == "task_started"
    assert tag(more[-1]) == "task_complete" and more[-1].msg.last_agent_message == "Again."


def test_attach_json_takes_submissions_from_stdin_and_skips_bad_lines(dmn, fe, server, work) -> None:
    client = dmn.client()
    session = open_session(client, server, work)
    server.script(response(assistant("Two.")))
    stdin = submission_line("in-1", UserInput([TextInput("second")])) + b'{"id": 7}\n\nnot json\n'
    p = fe.run("attach", session.id, "--json", "--until-idle", input=stdin)
    assert p.returncode == 0, p.stderr
    ours = [tag(e) for e in json_events(p.stdout) if e.id == "in-1"]
    assert ours[0] == "task_started" and ours[-1] == "task_complete"
    errors = p.stderr.splitlines()
    assert len(errors) == 2 and errors[0].startswith("sluice: error: line 2: ") and errors[1].startswith(
        "sluice: error: line 4: ")
    assert server.requests[-1]["json"]["input"][-1] == user_item("second")


def test_attach_by_prefix_and_unknown_or_ambiguous_prefixes(dmn, fe, server, work) -> None:
    client = dmn.client()
    by_first: dict[str, str] = {}
    while True:  # at most 17 sessions until two share a first digit
        # Configured (its model known) before it is attached to and its header read.
        session_id = open_session(client, server, work).id
        if session_id[0] in by_first:
            break
        by_first[session_id[0]] = session_id
    p = fe.run("attach", session_id[:13], "--until-idle")
    assert p.returncode == 0, p.stderr
    assert f"sluice attach: session {session_id}, {work}, model test-model, idle" in p.stderr

    p = fe.run("attach", session_id[0])
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert f"'{session_id[0]}' matches " in p.stderr and "give more of the id" in p.stderr
    p = fe.run("attach", "zz")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "no session 'zz'" in p.stderr


# -- many frontends -------------------------------------------------------------------


def test_approval_answered_by_one_attach_is_dropped_by_the_other(fe, server, work) -> None:
    server.script(response(call("shell", {"command": ["touch", "made.txt"]}, "c1")), response(assistant("Made it.")))
    session_id = detached(fe, "--approval-policy", "untrusted", "--sandbox", "workspace-write", "-C", str(work),
                          "make a file")
    with fe.on_pty("attach", session_id) as person:
        person.read_until(b"Allow? [y]es")
        assert b"  command: touch made.txt\r\n" in person.seen
        script = fe.popen("attach", session_id, "--json", "--until-idle")
        try:
            out = JsonLines(script)
            request = out.until(lambda e: tag(e) == "exec_approval_request")
            script.stdin.write(submission_line("answer-1", ExecApproval(request.id, ReviewDecision.APPROVED)))
            script.stdin.close()
            assert script.wait(20) == 0, script.stderr.read()
            events = out.rest()
        finally:
            if script.poll() is None:
                script.kill()
                script.wait()
            script.stdout.close()
            script.stderr.close()
        (resolved,) = [e.msg for e in events if tag(e) == "approval_resolved"]
        assert resolved.call_id == "c1" and resolved.decision == ReviewDecision.APPROVED
        assert resolved.by.endswith("(sluice attach)")
        assert tag(events[-1]) == "task_complete"

        person.read_until(f"{resolved.by} answered: approved".encode())
        person.read_until(b"Made it.")
        assert person.seen.count(b"Allow? [y]es") == 1  # the question was dropped, not asked again
        person.write(b"\x04")
        assert person.wait() == 0
    assert (work / "made.txt").exists()


def alive(argv: list[str]) -> bool:
    for proc in psutil.process_iter(["cmdline"]):
        if proc.info["cmdline"] == argv:
            return True
    return False


def test_ctrl_c_on_a_terminal_interrupts_the_turn_and_ctrl_d_detaches(dmn, fe, server, work) -> None:
    sleeper = ["sleep", f"{random.randint(1000, 9999)}.{random.randint(100, 999)}"]
    release = threading.Event()
    server.script(
        response(call("shell", {"command": ["bash", "-c", f"echo go; {' '.join(sleeper)}"]}, "c1")),
        gated(response(assistant("Carrying on.")), release),
    )
    session_id = detached(fe, "--approval-policy", "never", "--sandbox", "workspace-write", "-C", str(work), "wait")
    try:
        with fe.on_pty("attach", session_id) as person:
            person.read_until(b"go\r\n")
            wait_for(lambda: alive(sleeper), what="the command to run")
            person.write(b"\x03")
            person.read_until(b"interrupting the turn")
            client = dmn.client()
            wait_for(lambda: [s.state for s in client.list_sessions().sessions if s.id == session_id] == ["idle"],
                     what="the turn to end")
            wait_for(lambda: not alive(sleeper), what="the command's tree to die")
            assert person.proc.poll() is None  # one Ctrl-C interrupts; it does not leave

            person.write(b"carry on\n")
            wait_for(lambda: len(server.requests) == 2, what="the follow-up to reach the model")
            person.write(b"\x04")
            assert person.wait() == 0
            assert b"detached; the session goes on" in person.seen
    finally:
        release.set()
    assert server.requests[1]["json"]["input"][-1] == user_item("carry on")
    # The turn went on without anyone attached.
    p = fe.run("attach", session_id, "--until-idle", "--json")
    assert p.returncode == 0, p.stderr
    events = json_events(p.stdout)
    assert tag(events[0]) == "task_started" and events[-1].msg.last_agent_message == "Carrying on."


# -- a script waiting for a detached task ---------------------------------------------------


SESSIONS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "sessions.md"
PATCH = "*** Begin Patch\n*** Add File: build.txt\n+passing\n*** End Patch"


def documented_script() -> str:
    """docs/sessions.md's example of a script waiting for a detached task, as written there."""
    (line,) = [line for line in SESSIONS_PAGE.read_text().splitlines()
               if line.startswith("id=$(sluice exec --detach") and "sluice attach" in line]
    return line


def run_script(fe: Frontends, script: str, work: Path) -> subprocess.CompletedProcess:
    """``script`` as a script runs it: bash, in ``work``, no terminal anywhere."""
    return subprocess.run(["bash", "-c", script], cwd=work, env=fe.env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=45)


def test_the_documented_script_for_a_detached_task_runs_to_its_end(fe, server, work) -> None:
    script = documented_script()
    assert "--approval-policy never" in script  # a policy under which nothing waits
    server.script(response(call("apply_patch", {"input": PATCH}, "p1")), response(assistant("The build passes.")))
    p = run_script(fe, script.replace("sluice ", f"{' '.join(sluice_argv())} "), work)
    assert p.returncode == 0, p.stderr
    events = json_events((work / "events.jsonl").read_text())
    assert tag(events[-1]) == "task_complete" and events[-1].msg.last_agent_message == "The build passes."
    assert (work / "build.txt").read_text() == "passing\n"


def test_a_script_attach_with_nobody_to_answer_says_so_at_once(fe, server, work) -> None:
    """The same script under the default policy (read-only, on-request): the patch asks.
    Nobody attached can answer, so attach says so in one line and exits 1 instead of
    waiting forever; a person attaching on a terminal can still answer afterwards."""
    server.script(response(call("apply_patch", {"input": PATCH}, "p1")), response(assistant("The build passes.")))
    argv = " ".join(sluice_argv())
    script = (f'id=$({argv} exec --detach "make the build pass") && echo "$id" > id.txt && '
              f'{argv} attach "$id" --until-idle --json > events.jsonl')
    started = time.monotonic()
    p = run_script(fe, script, work)
    assert p.returncode == 1, p.stderr
    assert time.monotonic() - started < 20
    detach_note, line = p.stderr.splitlines()  # exec --detach's, then attach's one line
    assert detach_note.startswith("sluice: the task goes on in the daemon"), p.stderr
    assert line.startswith("sluice: error: the agent asks to apply a patch to build.txt") and (
        "no attached frontend can answer" in line and "--approval-policy never" in line), line
    events = json_events((work / "events.jsonl").read_text())
    assert tag(events[-2]) == "apply_patch_approval_request" and tag(events[-1]) == "error"
    # Human output says the same line, and the session still waits for someone to answer.
    session_id = (work / "id.txt").read_text().strip()
    shown = fe.run("attach", session_id, "--until-idle")
    assert shown.returncode == 1 and shown.stderr.splitlines()[-1].startswith(
        "error: the agent asks to apply a patch to build.txt"), shown.stderr
    with fe.on_pty("attach", session_id) as person:
        person.read_until(b"Allow? [y]es")
        person.write(b"y\n")
        person.read_until(b"The build passes.")
        person.write(b"\x04")
        assert person.wait() == 0
    assert (work / "build.txt").read_text() == "passing\n"


def test_a_script_attach_waits_while_a_person_who_can_answer_is_attached(fe, server, work) -> None:
    server.script(response(call("apply_patch", {"input": PATCH}, "p1")), response(assistant("Answered.")))
    session_id = detached(fe, "-C", str(work), "make the build pass")
    with fe.on_pty("attach", session_id) as person:
        person.read_until(b"Allow? [y]es")
        script = fe.popen("attach", session_id, "--until-idle", "--json", stdin=subprocess.DEVNULL)
        try:
            said = read_until(script.stderr.fileno(), b" to answer\n")
            assert script.poll() is None
            person.write(b"y\n")
            assert script.wait(20) == 0
            said += script.stderr.read()
        finally:
            if script.poll() is None:
                script.kill()
                script.wait()
            script.stdout.close()
            script.stderr.close()
        (line,) = said.decode().splitlines()
        assert line.startswith("sluice: the agent asks to apply a patch to build.txt") and (
            "; waiting for frontend-" in line and line.endswith(" (sluice attach) to answer")), line
        person.write(b"\x04")
        assert person.wait() == 0


def read_until(fd: int, needle: bytes, timeout: float = 20.0) -> bytes:
    """What ``fd`` gives until ``needle`` came."""
    got = b""
    deadline = time.monotonic() + timeout
    while needle not in got:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise AssertionError(f"no {needle!r} within {timeout} s: {got!r}")
        data = os.read(fd, 65536)
        if not data:
            raise AssertionError(f"end of output before {needle!r}: {got!r}")
        got += data
    return got


# -- sluice sessions close --------------------------------------------------------------------


def test_sessions_close_shuts_a_session_down_and_attached_frontends_see_it(dmn, fe, server, work) -> None:
    server.script(response(call("shell", {"command": ["touch", "made.txt"]}, "c1")), response(assistant("Never.")))
    session_id = detached(fe, "--approval-policy", "untrusted", "-C", str(work), "make a file")
    watcher = fe.popen("attach", session_id, "--json", stdin=subprocess.PIPE)
    try:
        out = JsonLines(watcher)
        out.until(lambda e: tag(e) == "exec_approval_request")
        p = fe.run("sessions", "close", session_id[:8])
        assert (p.returncode, p.stdout, p.stderr) == (0, "", f"sluice: session {session_id} closed\n")
        out.until(lambda e: tag(e) == "shutdown_complete")
        assert watcher.wait(20) == 1  # shut down by someone else
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    assert session_id not in [s.id for s in dmn.client().list_sessions().sessions]
    assert not (work / "made.txt").exists()

    p = fe.run("sessions", "close", session_id)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith(f"sluice: error: no session '{session_id}' ("), p.stderr
    p = fe.run("sessions", "close")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "needs the session's ID" in p.stderr
