"""Rollout files under faults: a killed agent or daemon loses nothing recorded, and a full
``SLUICE_HOME`` is said to the user.

A real daemon (tests/support/harness.py), its agent talking to the scripted model
(tests/support/fake_model.py). The session is driven with the client library, so it stays
open between turns (``sluice exec`` would shut it down, which syncs the rollout anyway);
it is resumed with ``sluice exec -c experimental_resume=PATH``, and what the model is then
sent must be the conversation the rollout kept.

The full-disk tests mount a small tmpfs as the agent's ``$SLUICE_HOME/sessions`` (root
only; skipped otherwise) and unmount it at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import psutil
import pytest

from agent.instructions import is_environment_context
from broker.wire.protocol import TextInput, UserInput
from tests.support.fake_model import (
    FakeModelServer,
    assistant,
    call,
    conversation,
    gated,
    outputs_of,
    response,
    tag,
    user_item,
)
from tests.support.frontends import Frontends, configure_op, json_events
from tests.support.harness import short_tempdir, wait_for

pytestmark = pytest.mark.timeout(90)

EVENT_WAIT_S = 30.0


@pytest.fixture
def work(tmp_path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    (path / "a.txt").write_text("a\n")
    return path


@pytest.fixture
def agent_home() -> Path:
    return Path(short_tempdir("sl-rollout-home-"))


def next_of(session, predicate, what: str):
    """The session's next event that matches (the ones before it are skipped)."""
    seen = []
    deadline = EVENT_WAIT_S
    while True:
        event = session.next_event(deadline)
        if event is None:
            raise AssertionError(f"no {what} within {EVENT_WAIT_S:g} s; got {seen}")
        seen.append(tag(event))
        if predicate(event):
            return event


def task_end(session, sub_id: str):
    return next_of(session, lambda e: e.id == sub_id and tag(e) in ("task_complete", "turn_aborted", "error"),
                   f"end of task {sub_id}")


def agent_pid(handle) -> int:
    (pid,) = [p.pid for p in handle.descendants() if p.cmdline()[1:3] == ["-m", "agent"]]
    return pid


def rollout_of(home: Path, session_id: str) -> Path:
    (path,) = (home / "sessions").rglob(f"rollout-*-{session_id}.jsonl")
    return path


def parse(path: Path) -> list[dict]:
    """Every line of a rollout, parsed; a line that is not whole JSON fails the test."""
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n"), "the rollout ends in a partial line"
    return [json.loads(line) for line in text.splitlines()]


def two_turns_then_kill(handle, server: FakeModelServer, work: Path, kill,
                        said: list | None = None) -> tuple[str, list[dict]]:
    """Turn 1 (a command, then an answer) completes; turn 2's model request is held open;
    ``kill()`` (which returns once what it killed is dead; only then is the request let go);
    the event that tells the frontend goes into ``said``, if given.
    The session id and the model's input for turn 2 (the whole conversation)."""
    release = threading.Event()
    server.script(
        response(call("shell", {"command": ["bash", "-c", "echo one-two-three"]}, "c1")),
        response(assistant("The command said one-two-three.")),
        gated(response(assistant("never seen")), release),
    )
    try:
        client = handle.client()
        session = client.open_session(configure_op(server, work, sandbox="workspace-write"), sub_id="0")
        next_of(session, lambda e: tag(e) == "session_configured", "session_configured")
        first = session.submit(UserInput([TextInput("run the command")]))
        assert tag(task_end(session, first)) == "task_complete"
        session.submit(UserInput([TextInput("and now the second thing")]))
        wait_for(lambda: len(server.requests) == 3, EVENT_WAIT_S, "the second turn's model request")
        kill()
        if said is not None:
            said.append(next_of(session, lambda e: tag(e) == "error", "the error saying the session is gone"))
        return session.id, server.requests[2]["json"]["input"]
    finally:
        release.set()


def check_rollout(path: Path, session_id: str, sent: list[dict]) -> list[dict]:
    """The rollout holds the meta line and then exactly what the model was sent for turn 2."""
    lines = parse(path)
    assert lines[0]["id"] == session_id
    items = lines[1:]
    assert is_environment_context(items[0])  # what the model is told first
    said = conversation(items)
    assert [i["type"] for i in said] == ["message", "function_call", "function_call_output", "message", "message"]
    assert said[0] == user_item("run the command") and said[-1] == user_item("and now the second thing")
    assert "one-two-three" in json.loads(said[2]["output"])["output"]
    assert [i["type"] for i in sent] == [i["type"] for i in items]
    for recorded, given in zip(items, sent, strict=True):
        assert {k: v for k, v in recorded.items() if k in given} == given
    return items


def resume(fe: Frontends, server: FakeModelServer, path: Path, work: Path) -> list[dict]:
    """``sluice exec`` resuming ``path``; what the model was sent."""
    server.script(response(assistant("Back, with everything.")))
    before = len(server.requests)
    p = fe.run("exec", "-c", f'experimental_resume="{path}"', "--approval-policy", "never", "-C", str(work),
               "what did the command say?")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "Back, with everything.\n"
    assert len(server.requests) == before + 1
    return server.requests[-1]["json"]["input"]


def test_agent_sigkilled_mid_turn_keeps_the_conversation_and_resumes(daemon_factory, work, agent_home,
                                                                    tmp_path) -> None:
    handle = daemon_factory.start(executors=1, env={"SLUICE_HOME": str(agent_home)})
    with FakeModelServer() as server:

        def kill() -> None:
            agent = psutil.Process(agent_pid(handle))
            agent.send_signal(signal.SIGKILL)
            wait_for(lambda: not _alive(agent), 10, "the agent to die")

        said: list = []
        session_id, sent = two_turns_then_kill(handle, server, work, kill, said)
        assert said[0].msg.message == (
            "the agent process died (killed by signal 9); this session is gone (its rollout file keeps the "
            "conversation: `sluice exec -c experimental_resume=PATH` goes on from it)")
        path = rollout_of(agent_home, session_id)
        items = check_rollout(path, session_id, sent)

        # The daemon restarts the agent for what comes next.
        fe = Frontends(handle.runtime, server, tmp_path / "fe-home")
        given = resume(fe, server, path, work)
        assert given[:len(items)] == sent
        # (After the environment again, if this exec's differs from the session's.)
        assert conversation(given[len(items):]) == [user_item("what did the command say?")]
        assert outputs_of({"input": given})["c1"] == conversation(items)[2]["output"]
        # The conversation goes on in the same file.
        after = parse(path)
        assert after[1:len(items) + 1] == items
        assert after[-1]["type"] == "message" and after[-1]["role"] == "assistant"


def test_daemon_sigkilled_keeps_the_conversation_and_resumes(daemon_factory, work, agent_home, tmp_path) -> None:
    handle = daemon_factory.start(executors=1, env={"SLUICE_HOME": str(agent_home)})
    children: list[psutil.Process] = []

    def kill() -> None:
        children.extend(handle.descendants())
        assert any(p.cmdline()[1:3] == ["-m", "agent"] for p in children)
        handle.proc.kill()
        handle.proc.wait(10)
        # The agent and the executors die with it (PR_SET_PDEATHSIG).
        wait_for(lambda: not [p for p in children if _alive(p)], 10, "the daemon's children to die")

    with FakeModelServer() as server:
        try:
            session_id, sent = two_turns_then_kill(handle, server, work, kill)
        finally:
            for p in children:
                with contextlib.suppress(psutil.Error):
                    p.kill()
        path = rollout_of(agent_home, session_id)
        items = check_rollout(path, session_id, sent)

        again = daemon_factory.start(executors=1, env={"SLUICE_HOME": str(agent_home)})
        given = resume(Frontends(again.runtime, server, tmp_path / "fe-home"), server, path, work)
        assert given[:len(items)] == sent
        assert conversation(given[len(items):]) == [user_item("what did the command say?")]


def _alive(p: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    return False


# -- a full SLUICE_HOME -----------------------------------------------------------------


@pytest.fixture
def small_sessions_dir(agent_home):
    """A 64 KiB tmpfs mounted as ``agent_home/sessions``, unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    sessions = agent_home / "sessions"
    sessions.mkdir(mode=0o700)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(sessions)],
                       capture_output=True, text=True, timeout=10)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {p.stderr.strip() or p.returncode}")
    try:
        yield sessions
    finally:
        subprocess.run(["umount", "-l", str(sessions)], capture_output=True, timeout=10)


def fill(directory: Path, leave: int = 0) -> None:
    """Fill ``directory``'s filesystem up to ``leave`` bytes free."""
    with open(directory / "filler", "wb") as f:
        with contextlib.suppress(OSError):
            while True:
                free = os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize
                if free <= leave:
                    break
                f.write(b"\0" * min(4096, free - leave))
                f.flush()
    assert os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize <= leave


@pytest.mark.parametrize("when", ["at-start", "mid-turn"])
@pytest.mark.parametrize("json_mode", [False, True], ids=["human", "json"])
def test_full_sluice_home_is_one_line_and_a_failed_exec(daemon_factory, work, agent_home, small_sessions_dir,
                                                       tmp_path, when, json_mode) -> None:
    # at-start: not even the session's first line fits; mid-turn: it does, and the
    # model's long answer does not.
    fill(small_sessions_dir, leave=0 if when == "at-start" else 4096)
    handle = daemon_factory.start(executors=1, env={"SLUICE_HOME": str(agent_home)})
    answer = "long answer " * 1000 if when == "mid-turn" else "short answer"
    with FakeModelServer() as server:
        server.script(response(assistant(answer)))
        fe = Frontends(handle.runtime, server, tmp_path / "fe-home")
        p = fe.run("exec", *(["--json"] if json_mode else []), "--approval-policy", "never", "-C", str(work), "hello")
    assert p.returncode == 1, p.stderr
    lines = [line for line in p.stderr.splitlines() if "rollout" in line]
    assert len(lines) == 1, p.stderr
    (rollout,) = [r for r in small_sessions_dir.rglob("rollout-*.jsonl")] or [None]
    if when == "at-start":
        assert rollout is None  # no empty file left behind
        assert "rollout: no space left on device: " + str(small_sessions_dir) in lines[0]
    else:
        assert lines[0].endswith(f"rollout: no space left on device: {rollout}")
        # What fitted is there, in whole lines; nothing after the failure.
        kept = parse(rollout)
        assert is_environment_context(kept[1]) and kept[2:] == [user_item("hello")]
    if json_mode:
        events = json_events(p.stdout)
        errors = [e.msg.message for e in events if tag(e) == "error"]
        assert len(errors) == 1 and errors[0].startswith("rollout: no space left on device: ")
        assert lines[0] == f"sluice: error: {errors[0]}"
        # The session went on: the task completed.
        assert "task_complete" in [tag(e) for e in events]
    else:
        assert lines[0].startswith("error: rollout: no space left on device: ")
        assert p.stdout == answer + "\n"  # the session went on


# -- a rollout that is cut or corrupt ------------------------------------------------------


def first_session(handle, server: FakeModelServer, fe: Frontends, work: Path, home: Path) -> Path:
    """One real ``sluice exec`` turn whose answer has non-ASCII text; its rollout."""
    server.script(response(assistant("Noted: naïve €uro.")))
    p = fe.run("exec", "--approval-policy", "never", "-C", str(work), "remember the euro")
    assert p.returncode == 0, p.stderr
    (path,) = (home / "sessions").rglob("rollout-*.jsonl")
    assert [i["type"] for i in conversation(parse(path)[1:])] == ["message", "message"]
    return path


def resume_exec(fe: Frontends, path: Path, work: Path) -> subprocess.CompletedProcess:
    return fe.run("exec", "-c", f'experimental_resume="{path}"', "--approval-policy", "never", "-C", str(work),
                  "and now?")


def test_a_last_line_cut_inside_a_utf8_character_is_dropped_on_resume(daemon_factory, work, agent_home,
                                                                      tmp_path) -> None:
    handle = daemon_factory.start(executors=1, env={"SLUICE_HOME": str(agent_home)})
    with FakeModelServer() as server:
        fe = Frontends(handle.runtime, server, tmp_path / "fe-home")
        path = first_session(handle, server, fe, work, agent_home)
        whole = path.read_bytes()
        # The agent killed in the middle of writing a line with a euro sign in it.
        line = json.dumps(assistant("a long answer, €100"), ensure_ascii=False).encode()
        path.write_bytes(whole + line[:line.index("€".encode()) + 2])
        with pytest.raises(UnicodeDecodeError):
            path.read_text(encoding="utf-8")  # what used to make it unreadable

        server.script(response(assistant("Back.")))
        p = resume_exec(fe, path, work)
        assert p.returncode == 0, p.stderr
        assert p.stdout == "Back.\n" and "rollout" not in p.stderr
        sent = conversation(server.requests[-1]["json"]["input"])
        assert [i["type"] for i in sent] == ["message", "message", "message"]
        assert sent[1]["content"][0]["text"] == "Noted: naïve €uro." and sent[2] == user_item("and now?")
        # The cut was taken off the file before the session went on writing to it.
        assert path.read_bytes().startswith(whole) and parse(path)[-1]["role"] == "assistant"


def test_a_corrupt_middle_line_is_said_with_file_and_line_and_skipped(daemon_factory, work, agent_home,
                                                                     tmp_path) -> None:
    handle = daemon_factory.start(executors=1, env={"SLUICE_HOME": str(agent_home)})
    with FakeModelServer() as server:
        fe = Frontends(handle.runtime, server, tmp_path / "fe-home")
        path = first_session(handle, server, fe, work, agent_home)
        lines = path.read_bytes().split(b"\n")
        assert b"remember" in lines[2]  # after the session line and the environment context
        lines[2] = lines[2].replace(b"remember", b"rem\xffmber")  # one bad byte on line 3
        path.write_bytes(b"\n".join(lines))

        server.script(response(assistant("Back.")))
        p = resume_exec(fe, path, work)
        assert p.returncode == 0, p.stderr
        assert p.stdout == "Back.\n"
        said = [line for line in p.stderr.splitlines() if "rollout" in line]
        assert said == [f"- rollout {path}: line 3 not readable (corrupt), skipped; "
                        "the conversation goes on without them"], p.stderr
        sent = conversation(server.requests[-1]["json"]["input"])
        assert [i["type"] for i in sent] == ["message", "message"]
        assert sent[0]["role"] == "assistant" and sent[1] == user_item("and now?")


def test_a_rollout_that_cannot_be_resumed_is_one_line_and_a_failed_exec(daemon_factory, work, agent_home,
                                                                       tmp_path) -> None:
    handle = daemon_factory.start(executors=1, env={"SLUICE_HOME": str(agent_home)})
    with FakeModelServer() as server:
        fe = Frontends(handle.runtime, server, tmp_path / "fe-home")
        path = first_session(handle, server, fe, work, agent_home)
        path.write_bytes(b"\xff" + path.read_bytes())  # its session line is corrupt
        asked = len(server.requests)

        p = resume_exec(fe, path, work)
        assert p.returncode == 1, p.stderr
        assert p.stdout == ""
        errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
        assert errors == [f"error: could not resume the session: rollout {path} does not start with a "
                          "session line"], p.stderr
        # No fresh conversation in its place: the model was not asked, no new rollout.
        assert len(server.requests) == asked
        assert list((agent_home / "sessions").rglob("rollout-*.jsonl")) == [path]
        # The daemon keeps no session for it.
        client = handle.client()
        wait_for(lambda: client.list_sessions().sessions == [], 10, "the refused session to be forgotten")
