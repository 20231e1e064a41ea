"""Agent sessions through the real daemon and the client library: numbering, sharing, errors,
history and compaction, the agent process's life.

A module daemon (two executors, a private SLUICE_HOME) serves most tests; the agent it
spawns on the first submission serves them all. Tests that kill the agent start their own.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from broker.client import SessionError
from broker.wire.protocol import (
    AddToHistory,
    Compact,
    GetHistoryEntryRequest,
    Shutdown,
    TextInput,
    UserInput,
)
from tests.support.fake_model import FakeModelServer, assistant, call, conversation, gated, response, user_item
from tests.support.harness import daemons, short_tempdir, wait_for
from tests.support.sessions import collect, configure_op, tag

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def home():
    path = short_tempdir("sl-home-")
    yield Path(path)


@pytest.fixture(scope="module")
def dmn(home):
    with daemons() as factory:
        yield factory.start(executors=2, env={"SLUICE_HOME": str(home)})


def test_events_are_numbered_and_reach_every_attached_frontend(dmn, server, tmp_path) -> None:
    server.script(response(call("shell", {"command": ["bash", "-c", "echo one; echo two"]}, "c1")),
                  response(assistant("Done.")), response(assistant("Again.")))
    first = dmn.client()
    session = first.open_session(configure_op(server, str(tmp_path)))
    configured = collect(session, "session_configured")
    assert configured[-1].seq == 1 and str(configured[-1].msg.session_id) == session.id
    sub = session.submit(UserInput([TextInput("go")]))
    events = collect(session, "task_complete")
    assert [e.seq for e in events] == list(range(2, 2 + len(events)))
    assert all(e.id == sub for e in events)
    assert b"".join(e.msg.chunk for e in events if tag(e) == "exec_command_output_delta") == b"one\ntwo\n"

    # A second frontend joins by submitting; from then on both see the same events.
    second = dmn.client()
    joined = second.session(session.id)
    sub2 = joined.submit(UserInput([TextInput("again")]))
    seen_by_second = collect(joined, "task_complete")
    seen_by_first = collect(session, "task_complete")
    assert joined.last_seq == session.last_seq
    assert [(e.seq, tag(e)) for e in seen_by_first] == [(e.seq, tag(e)) for e in seen_by_second]
    assert seen_by_first[0].seq == events[-1].seq + 1 and seen_by_first[0].id == sub2
    session.submit(Shutdown())
    assert tag(collect(session, "shutdown_complete")[-1]) == "shutdown_complete"
    # The agent let go of it: the broker forgot it.
    session.submit(UserInput([TextInput("more")]))
    (error,) = collect(session, "error")
    assert error.msg.message == f"unknown session {session.id}" and error.seq is None


def test_session_errors_come_as_error_events(dmn, server, tmp_path) -> None:
    client = dmn.client()
    ghost = client.session("5b0a8c52-0000-4000-8000-000000000000")
    sub = ghost.submit(UserInput([TextInput("hello?")]))
    (error,) = collect(ghost, "error")
    assert error.id == sub and "unknown session" in error.msg.message
    with pytest.raises(SessionError, match="No session initialized"):
        client.open_session(UserInput([TextInput("no configure first")]))
    session = client.open_session(configure_op(server, "relative/dir"))
    (error,) = collect(session, "error")
    assert error.id == "0" and "cwd is not absolute" in error.msg.message


def test_history_and_compact_through_the_daemon(dmn, server, tmp_path, home) -> None:
    summary = "SUMMARY: the user said hello; nothing else happened."
    server.script(response(assistant("Hello!")), response(assistant(summary)), response(assistant("Still here.")))
    client = dmn.client()
    session = client.open_session(configure_op(server, str(tmp_path)))
    configured = collect(session, "session_configured")[-1].msg
    session.submit(AddToHistory("first line typed"))
    session.submit(AddToHistory("second line typed"))
    # The appends are handled before the lookup: one session's submissions go in order.
    session.submit(GetHistoryEntryRequest(offset=configured.history_entry_count + 1,
                                          log_id=configured.history_log_id))
    response_event = collect(session, "get_history_entry_response")[-1].msg
    if configured.history_log_id == 0:  # no history file before this test: ask again, by its inode
        session.submit(GetHistoryEntryRequest(offset=1, log_id=(home / "history.jsonl").stat().st_ino))
        response_event = collect(session, "get_history_entry_response")[-1].msg
    assert response_event.entry is not None and response_event.entry.text == "second line typed"
    assert response_event.entry.session_id == session.id
    assert (home / "history.jsonl").stat().st_mode & 0o777 == 0o600

    session.submit(UserInput([TextInput("hello")]))
    collect(session, "task_complete")
    compact = session.submit(Compact())
    events = collect(session, lambda e: e.id == compact and tag(e) == "task_complete")
    assert any(tag(e) == "agent_message" and e.msg.message == "Compact task completed" for e in events)
    session.submit(UserInput([TextInput("still there?")]))
    collect(session, "task_complete")
    body = server.requests[-1]["json"]
    said = conversation(body["input"])  # after the environment context, told again
    assert said[0]["content"][0]["text"] == summary and said[-1] == user_item("still there?")
    assert "summarising a conversation" in server.requests[1]["json"]["instructions"]
    session.submit(Shutdown())
    collect(session, "shutdown_complete")


def test_killed_agent_is_reported_and_replaced(daemon_factory, tmp_path) -> None:
    handle = daemon_factory.start(executors=1, env={"SLUICE_HOME": str(tmp_path / "home")})
    release = threading.Event()
    with FakeModelServer() as server:
        server.script(gated(response(assistant("never seen")), release), response(assistant("Back.")))
        client = handle.client()
        session = client.open_session(configure_op(server, str(tmp_path)))
        collect(session, "session_configured")
        session.submit(UserInput([TextInput("wait")]))
        collect(session, "task_started")
        wait_for(lambda: server.requests, what="the model's first request")
        (pid,) = handle.agent_pids()
        os.kill(pid, signal.SIGKILL)
        user_message, error = collect(session, "error")
        assert tag(user_message) == "user_message" and user_message.msg.message == "wait"
        assert error.msg.message.startswith("the agent process died (killed by signal 9)")
        release.set()

        again = client.open_session(configure_op(server, str(tmp_path)))
        collect(again, "session_configured")
        again.submit(UserInput([TextInput("hello")]))
        assert collect(again, "task_complete")[-1].msg.last_agent_message == "Back."
        (new_pid,) = handle.agent_pids()
        assert new_pid != pid


def test_a_resumed_rollout_keeps_its_session_id_and_the_daemon_uses_it(dmn, server, tmp_path, home) -> None:
    server.script(response(assistant("First.")), response(assistant("Resumed.")), response(assistant("Third.")))
    client = dmn.client()
    first = client.open_session(configure_op(server, str(tmp_path)))
    original = first.id
    first.submit(UserInput([TextInput("hi")]))
    collect(first, "task_complete")
    first.submit(Shutdown())
    collect(first, "shutdown_complete")
    (rollout,) = (home / "sessions").rglob(f"rollout-*-{original}.jsonl")

    resumed = client.open_session(configure_op(server, str(tmp_path), resume_path=str(rollout)))
    configured = collect(resumed, "session_configured")[-1]
    # As in Codex: the session is the rollout's, and the daemon calls it that from now on.
    # (The id it was created with stays an alias here; by the time open_session returns,
    # session_configured may have come in with the attachment, so resumed.id may be either.)
    assert str(configured.msg.session_id) == original == resumed.id
    (uuid_given,) = {sid for sid, s in client.session_table().by_id.items() if s is resumed} - {original}
    listed = [info.id for info in client.list_sessions().sessions]
    assert original in listed and uuid_given not in listed
    resumed.submit(UserInput([TextInput("again")]))
    events = collect(resumed, "task_complete")
    assert events[-1].msg.last_agent_message == "Resumed."
    assert [e.seq for e in events] == list(range(configured.seq + 1, configured.seq + 1 + len(events)))

    # Another frontend attaches by that id and gets the whole stream (the journal's and
    # the memory log's), session_configured included; submitting by it works too.
    other = dmn.client()
    watcher = other.attach(original, since=0)
    replay = collect(watcher, "task_complete")
    assert [e.seq for e in replay] == list(range(1, len(replay) + 1))
    assert str(replay[0].msg.session_id) == original and watcher.id == original
    assert [e.msg.message for e in replay if tag(e) == "user_message"] == ["again"]
    watcher.submit(UserInput([TextInput("from the other one")]))
    assert collect(watcher, "task_complete")[-1].msg.last_agent_message == "Third."
    assert collect(resumed, "task_complete")[-1].msg.last_agent_message == "Third."
    # The first id still reaches it (a frontend that had not seen session_configured yet).
    assert other.attach(uuid_given, since=None).info.id == original
    resumed.submit(Shutdown())
    collect(resumed, "shutdown_complete")


@pytest.mark.parametrize("bad", ["relative cwd", "unreadable op"])
def test_a_session_whose_configuration_failed_is_not_listed(dmn, server, tmp_path, bad) -> None:
    client = dmn.client()
    if bad == "relative cwd":
        op = configure_op(server, "relative/dir")
    else:
        op = configure_op(server, str(tmp_path), model=123)  # the agent cannot read it
    session = client.open_session(op)
    (error,) = collect(session, "error")
    assert "cwd is not absolute" in error.msg.message if bad == "relative cwd" else "model" in error.msg.message
    assert session.id not in [info.id for info in client.list_sessions().sessions]
    # Nor is it there for long: it is forgotten, not only hidden.
    session.submit(UserInput([TextInput("hello?")]))
    (gone,) = collect(session, "error")
    assert gone.msg.message == f"unknown session {session.id}"
