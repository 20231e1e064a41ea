"""Many frontends on one session, through the real daemon, agent process and executors,
with a scripted model: identical streams, attaching mid-turn, a stopped frontend that
catches up, attach/detach churn, approvals answered from another frontend, and replay
from the journal.

A module daemon (two executors, a private SLUICE_HOME) serves every test; each frontend
is a Client connection of its own (one is a process of its own: tests/support/session_probe.py).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest
import zmq

from broker.client import Client, SessionError
from broker.client.sessions import SessionTable
from broker.daemon import sessions as broker_sessions
from broker.wire import frames as wire
from broker.wire.protocol import (
    AskForApproval,
    ExecApproval,
    GetHistoryEntryRequest,
    ReviewDecision,
    TextInput,
    UserInput,
    encode_msgpack,
)
from tests.support.fake_model import assistant, call, gated, response
from tests.support.sessions import collect, configure_op, tag

pytestmark = pytest.mark.timeout(60)

PROBE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "session_probe.py")
# 64 MB in one command: eight times a frontend's window of unacknowledged bytes.
FLOOD_BYTES = 64 * 1024 * 1024
STOPPED_S = 10.0


@pytest.fixture
def frontends(dmn):
    """``connect(name)``: a Client of its own, closed at teardown."""
    clients = []

    def connect(name: str) -> Client:
        client = Client.connect(dmn.runtime, autostart=False, name=name)
        clients.append(client)
        return client

    yield connect
    for client in clients:
        client.close()


def fingerprint(events) -> list[tuple]:
    """What two frontends must agree on: (seq, type, id, the event as msgpack)."""
    return [(e.seq, tag(e), e.id, encode_msgpack(e)) for e in events]


def until_seq(session, seq: int, timeout: float = 20.0) -> list:
    return collect(session, lambda e: e.seq == seq, timeout)


def open_configured(client: Client, server, cwd, **fields):
    session = client.open_session(configure_op(server, str(cwd), **fields))
    collect(session, "session_configured")
    return session


def session_info(client: Client, session_id: str) -> wire.SessionInfo:
    return next(info for info in client.list_sessions().sessions if info.id == session_id)


@pytest.mark.parametrize("count", [2, 5])
def test_every_attached_frontend_sees_the_same_stream(dmn, server, frontends, tmp_path, count) -> None:
    server.script(response(call("shell", {"command": ["bash", "-c", "echo one; echo two >&2; echo three"]}, "c1")),
                  response(assistant("Done.")))
    owner = open_configured(frontends("owner"), server, tmp_path)
    watchers = [frontends(f"watcher {i}").attach(owner.id, since=0) for i in range(count - 1)]
    assert watchers[-1].info.seq == 1 and len(watchers[-1].info.frontends) == count
    owner.submit(UserInput([TextInput("run it")]))
    streams = [collect(w, "task_complete") for w in watchers]
    owned = collect(owner, "task_complete")
    assert any(tag(e) == "exec_command_output_delta" for e in owned)
    assert [e.seq for e in streams[0]] == list(range(1, len(streams[0]) + 1))
    for stream in streams:
        assert fingerprint(stream) == fingerprint(streams[0])
    assert fingerprint(owned) == fingerprint(streams[0][1:])


def test_attaching_mid_turn_from_zero_gets_the_whole_session_then_live_events(dmn, server, frontends, tmp_path) -> None:
    gate = threading.Event()
    server.script(response(call("shell", {"command": ["bash", "-c", "seq 1 200"]}, "c1")),
                  gated(response(assistant("Done.")), gate))
    owner = open_configured(frontends("owner"), server, tmp_path)
    owner.submit(UserInput([TextInput("count")]))
    before = collect(owner, "exec_command_end")
    late = frontends("late").attach(owner.id, since=0)
    # The turn waits for the model, after the command's end (and the token count before it).
    assert late.info.state == "running" and late.info.seq >= before[-1].seq
    replayed = until_seq(late, late.info.seq)
    gate.set()
    live = collect(late, "task_complete")
    seqs = [e.seq for e in replayed + live]
    assert seqs == list(range(1, len(seqs) + 1))
    owned = [*before, *collect(owner, "task_complete")]
    assert fingerprint(replayed + live)[1:] == fingerprint(owned)


def test_a_stopped_frontend_holds_up_nobody_and_catches_up_exactly(dmn, server, frontends, tmp_path) -> None:
    server.script(response(call("shell", {"command": ["head", "-c", str(FLOOD_BYTES), "/dev/zero"]}, "c1")),
                  response(assistant("Flooded.")))
    owner = open_configured(frontends("owner"), server, tmp_path)
    out = tmp_path / "probe.jsonl"
    probe = subprocess.Popen([sys.executable, PROBE, dmn.runtime.path, owner.id, str(out), "--since", "0"],
                             env=dmn.env, stdout=subprocess.PIPE, text=True)
    try:
        assert probe.stdout.readline().strip() == "attached"
        os.kill(probe.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        owner.submit(UserInput([TextInput("flood")]))
        owned = collect(owner, "task_complete", timeout=STOPPED_S)
        assert time.monotonic() - stopped < STOPPED_S
        flooded = sum(len(e.msg.chunk) for e in owned if tag(e) == "exec_command_output_delta")
        assert flooded == FLOOD_BYTES
        time.sleep(max(0.0, STOPPED_S - (time.monotonic() - stopped)))
        os.kill(probe.pid, signal.SIGCONT)
        assert probe.wait(40) == 0
    finally:
        if probe.poll() is None:
            os.kill(probe.pid, signal.SIGCONT)
            probe.kill()
            probe.wait()
    *lines, tail = [json.loads(line) for line in out.read_text().splitlines()]
    assert tail["lagged"] >= 1
    # The session_configured the owner took before, then exactly what the owner saw.
    assert [line["seq"] for line in lines] == list(range(1, len(lines) + 1))
    expected = [{"seq": e.seq, "type": tag(e), "id": e.id, "digest": zlib.crc32(encode_msgpack(e))} for e in owned]
    assert lines[1:] == expected


def test_a_frontend_that_was_stopped_itself_keeps_its_connection(dmn, server, frontends, tmp_path) -> None:
    client = frontends("sleeper")
    session = open_configured(client, server, tmp_path)
    # As after SIGSTOP / SIGCONT: the last message is long ago and nothing is queued yet.
    client.link.liveness.last_heard -= 30
    client.poll(0)
    assert session_info(client, session.id).frontends == [f"{client.peer_id} (sleeper)"]


def _vanishing_frontend(dmn, session_id: str) -> None:
    """A frontend that says hello, attaches and is gone (no bye, no detach)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(dmn.runtime.endpoint)
    try:
        hello = wire.Hello(role=wire.ROLE_FRONTEND, token=dmn.runtime.read_token(), pid=os.getpid(), name="vanishing")
        sock.send_multipart(wire.message(wire.HELLO, body=hello))
        sock.send_multipart([wire.header(wire.ATTACH, "c", session=session_id, seq=wire.SINCE_TURN)])
        while True:
            assert sock.poll(10_000)
            if wire.decode_header(sock.recv_multipart()[0]).kind == wire.ATTACHED:
                return
    finally:
        sock.close(linger=0)


@pytest.mark.alone
def test_attach_detach_churn_and_vanished_frontends_leave_nothing_behind(dmn, server, frontends, tmp_path) -> None:
    owner_client = frontends("owner")
    owner = open_configured(owner_client, server, tmp_path)
    connected = owner_client.list_sessions().frontends
    cyclers = [frontends(f"cycler {i}") for i in range(3)]
    for i in range(1000):
        watcher = cyclers[i % 3].attach(owner.id, since=i % 2)
        assert watcher.info.seq == 1
        watcher.detach()
    for _ in range(100):
        _vanishing_frontend(dmn, owner.id)
    # The next event goes to the vanished frontends, which is how the daemon finds them out.
    owner.submit(GetHistoryEntryRequest(offset=0, log_id=0))
    collect(owner, "get_history_entry_response")
    deadline = time.monotonic() + 10
    while True:
        listing = owner_client.list_sessions()
        info = next(s for s in listing.sessions if s.id == owner.id)
        if listing.frontends == connected + 3 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert listing.frontends == connected + 3
    assert info.frontends == [f"{owner_client.peer_id} (owner)"]
    # Detached clients are not watching the session any more.
    assert all(not c._sessions for c in cyclers)


def test_an_approval_answered_from_another_frontend(dmn, server, frontends, tmp_path) -> None:
    gate = threading.Event()
    server.script(response(call("shell", {"command": ["touch", "made.txt"]}, "c1")),
                  gated(response(assistant("Made it.")), gate))
    owner = open_configured(frontends("owner"), server, tmp_path, approval_policy=AskForApproval.UNTRUSTED)
    second_client = frontends("second")
    second = second_client.attach(owner.id)
    owner.submit(UserInput([TextInput("make a file")]))
    (request,) = [e for e in collect(owner, "exec_approval_request") if tag(e) == "exec_approval_request"]
    collect(second, "exec_approval_request")
    assert session_info(second_client, owner.id).pending_approvals == ["c1"]
    second.submit(ExecApproval(request.id, ReviewDecision.APPROVED))
    by = f"{second_client.peer_id} (second)"
    for frontend in (owner, second):
        resolved = collect(frontend, "approval_resolved")[-1]
        assert (resolved.id, resolved.msg.call_id, resolved.msg.decision, resolved.msg.by) == (
            request.id, "c1", ReviewDecision.APPROVED, by)
    # The owner's late answer (an abort, which would end the turn) goes no further.
    late = owner.submit(ExecApproval(request.id, ReviewDecision.ABORT))
    error = collect(owner, lambda e: tag(e) == "error")[-1]
    assert (error.seq, error.id) == (None, late)
    assert error.msg.message == f"approval c1 was already answered by {by} (approved)"
    gate.set()
    for frontend in (owner, second):
        events = collect(frontend, "task_complete")
        assert "turn_aborted" not in [tag(e) for e in events]
    assert (tmp_path / "made.txt").exists()
    assert session_info(second_client, owner.id).state == "idle"


def test_unknown_sessions_and_bad_positions_are_refused(dmn, frontends) -> None:
    client = frontends("refused")
    with pytest.raises(SessionError, match="^unknown session 5b0a8c52-0000-4000-8000-000000000000$"):
        client.attach("5b0a8c52-0000-4000-8000-000000000000")
    from broker.client import UsageError

    with pytest.raises(UsageError, match="since"):
        client.attach("anything", since=-3)


def test_replay_from_before_the_memory_log_comes_from_the_journal(dmn, server, frontends, tmp_path) -> None:
    deltas = [f"word{i} " for i in range(broker_sessions.LOG_EVENTS + 1000)]
    server.script(response(assistant("".join(deltas)), deltas=deltas))
    owner = open_configured(frontends("owner"), server, tmp_path)
    owner.submit(UserInput([TextInput("talk a lot")]))
    owned = collect(owner, "task_complete")
    late = frontends("late").attach(owner.id, since=0)
    head = late.info.seq
    assert head > broker_sessions.LOG_EVENTS + 1000
    replayed = until_seq(late, head)
    assert [e.seq for e in replayed] == list(range(1, head + 1))
    assert fingerprint(replayed[1:]) == fingerprint(owned)
    assert Path(dmn.runtime.path, "journal").is_dir()


def test_since_n_from_the_journal_comes_in_few_large_batches_in_order(dmn, server, frontends, tmp_path,
                                                                      monkeypatch) -> None:
    deltas = [f"w{i} " for i in range(broker_sessions.LOG_EVENTS + 3000)]
    server.script(response(assistant("".join(deltas)), deltas=deltas))
    owner = open_configured(frontends("owner"), server, tmp_path)
    owner.submit(UserInput([TextInput("talk a lot")]))
    owned = collect(owner, "task_complete")
    batches = []
    on_events = SessionTable.on_events

    def counting(self, head, body) -> None:
        batches.append((head.seq, head.n))
        on_events(self, head, body)

    monkeypatch.setattr(SessionTable, "on_events", counting)
    since = 1234  # long gone from the memory log: from the journal
    late = frontends("late").attach(owner.id, since=since)
    head = late.info.seq
    replayed = until_seq(late, head)
    assert [e.seq for e in replayed] == list(range(since, head + 1))
    assert fingerprint(replayed) == fingerprint([e for e in owned if e.seq >= since])
    # Consecutive runs, one after the other; far fewer messages than events, and the
    # client's acks (in the middle of batches) kept the window open: it never lagged.
    assert [seq for seq, _ in batches] == list(itertools.accumulate([since] + [n for _, n in batches[:-1]]))
    assert sum(n for _, n in batches) == head - since + 1
    assert len(batches) < (head - since + 1) // 100
    assert late.lagged == 0
