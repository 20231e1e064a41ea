"""The daemon's session bookkeeping in-process: a real Router and Sessions over a transport
that records what would be sent (and can refuse it like a full or vanished peer).

Fast and exact where the daemon tests cannot be: window and ``lagged``, ``zmq.Again``
and the heartbeat retry, events no longer kept, the journal, attach positions, first
answer wins, state, and that nothing of a frontend outlives it. A randomised run checks
the delivery promise (gap-free, no duplicates) under acks, stalls and re-attaches.
"""

from __future__ import annotations

import collections
import functools
import random
import re

import msgspec
import pytest
import zmq

from broker.daemon import receipts as receipts_module
from broker.daemon import router as router_module
from broker.daemon import sessions as sessions_module
from broker.daemon.journal import Journal
from broker.daemon.router import IDLE_PING_EVERY, Router
from broker.wire import frames as wire
from broker.wire.protocol import (
    AgentMessageDeltaEvent,
    AskForApproval,
    ConfigureSession,
    ErrorEvent,
    Event,
    ExecApproval,
    ExecApprovalRequestEvent,
    Interrupt,
    ModelProviderInfo,
    ReviewDecision,
    SessionConfiguredEvent,
    Submission,
    TaskCompleteEvent,
    TaskStartedEvent,
    TextInput,
    UserInput,
    decode_event_msgpack,
    decode_events_msgpack,
    decode_submission_msgpack,
    encode_msgpack,
)
from landlock_helper.policy import SandboxPolicy

pytestmark = pytest.mark.timeout(60)

TOKEN = "unit-test-token"
AGENT_PID = 4242
GAP = re.compile(r"events (\d+)\.\.(\d+) of this session are no longer kept; continuing at (\d+)$")


class Transport:
    """The router's send: records ``[header, body...]`` per identity as bytes; identities
    in ``full`` raise zmq.Again, in ``gone`` EHOSTUNREACH (a peer that vanished)."""

    def __init__(self) -> None:
        self.sent: dict[bytes, list[list[bytes]]] = collections.defaultdict(list)
        # The same, as the objects handed to the socket.
        self.objects: dict[bytes, list[list]] = collections.defaultdict(list)
        self.full: set[bytes] = set()
        self.gone: set[bytes] = set()

    def __call__(self, parts) -> None:
        identity = bytes(parts[0])
        if identity in self.gone:
            raise zmq.ZMQError(zmq.EHOSTUNREACH)
        if identity in self.full:
            raise zmq.Again()
        self.sent[identity].append([bytes(memoryview(p)) for p in parts[1:]])
        self.objects[identity].append(list(parts[1:]))


class _Agents:
    """The agent supervisor: the process with AGENT_PID is the one it spawned; ``status``:
    how it ended, once it has."""

    status: str | None = None

    def claim(self, peer) -> bool:
        return peer.pid == AGENT_PID

    def kill(self, peer) -> bool:
        return False

    def exited(self, peer) -> str | None:
        return self.status if peer.pid == AGENT_PID else None

    def ensure_started(self) -> None:
        pass


class Daemon:
    """A Router with Sessions and an agent that said serve; deferred work runs on ``settle``."""

    def __init__(self, journal_dir: str | None = None) -> None:
        self.transport = Transport()
        self.deferred: collections.deque = collections.deque()
        self.router = Router(TOKEN, defer=self.deferred.append, agent_supervisor=_Agents())
        self.router.transport = self.transport
        self.sessions = self.router.sessions
        self.sessions.journal_dir = journal_dir
        self._identities = 0
        # seq -> body, per session, as the agent emitted them
        self.published: dict[str, dict[int, bytes]] = collections.defaultdict(dict)
        self.agent = self.connect("agent", role=wire.ROLE_AGENT, pid=AGENT_PID)
        self.send(self.agent, wire.header(wire.SERVE))
        assert self.sessions.agent is not None

    def connect(self, name: str, *, role: str = wire.ROLE_FRONTEND, pid: int = 1) -> bytes:
        self._identities += 1
        identity = b"\x00" + self._identities.to_bytes(4, "big")
        hello = wire.Hello(role=role, token=TOKEN, pid=pid, name=name)
        self.send(identity, *wire.message(wire.HELLO, body=hello))
        assert self.kinds(identity)[-1] == wire.WELCOME
        return identity

    def send(self, identity: bytes, *parts: bytes, settle: bool = True) -> None:
        self.router.on_message([zmq.Frame(identity), *(zmq.Frame(p) for p in parts)])
        if settle:
            self.settle()

    def settle(self) -> None:
        while self.deferred:
            self.deferred.popleft()()

    def heartbeat(self) -> None:
        self.send(self.agent, wire.header(wire.PONG))  # the agent is alive
        self.router.heartbeat()
        self.settle()

    # -- frontends

    def open(self, frontend: bytes, cwd: str = "/work/project") -> str:
        op = ConfigureSession(
            provider=ModelProviderInfo(name="fake", base_url="http://127.0.0.1:9", env_key="K"),
            model="m", approval_policy=AskForApproval.ON_REQUEST,
            sandbox_policy=SandboxPolicy.from_mode("workspace-write"), cwd=cwd, api_key="sk-unit-secret",
        )
        self.submit(frontend, "", Submission("0", op), corr="c-open")
        # The last message but a receipts checkpoint (a ping) that may follow it.
        head, _ = [m for m in self.messages(frontend) if m[0].kind != wire.PING][-1]
        assert head.kind == wire.ATTACHED and head.corr == "c-open"
        return head.session

    def submit(self, frontend: bytes, session: str, submission: Submission, corr: str = "") -> None:
        self.send(frontend, wire.header(wire.SUBMIT, corr, session=session), encode_msgpack(submission))

    def attach(self, frontend: bytes, session: str, since: int = 0, corr: str = "c-attach") -> wire.Header:
        before = len(self.transport.sent[frontend])
        self.send(frontend, wire.header(wire.ATTACH, corr, session=session, seq=since))
        return next(h for h, _ in self.messages(frontend, start=before) if h.kind in (wire.ATTACHED, wire.EVENT))

    def ack(self, frontend: bytes, session: str, seq: int, n: int) -> None:
        self.send(frontend, wire.header(wire.ACK, session=session, seq=seq, n=n))

    # -- the agent

    def emit(self, session: str, msg, event_id: str = "t1", *, settle: bool = True) -> bytes:
        body = encode_msgpack(Event(event_id, msg))
        self.send(self.agent, wire.header(wire.EVENT, session=session), body, settle=settle)
        self.published[session][self.sessions.sessions[session].seq] = body
        return body

    def forwarded(self) -> list[Submission]:
        return [decode_submission_msgpack(f[1]) for f in self.transport.sent[self.agent]
                if wire.decode_header(f[0]).kind == wire.SUBMIT]

    # -- what a frontend got

    def messages(self, identity: bytes, start: int = 0) -> list[tuple[wire.Header, bytes | None]]:
        """What ``identity`` was sent (from its ``start``-th message on), an ``events`` batch
        as the ``event`` messages it stands for."""
        out = []
        for f in self.transport.sent[identity][start:]:
            head = wire.decode_header(f[0])
            if head.kind == wire.EVENTS:
                bodies = unpack_events(head, f[1])
                out += [(wire.Header(wire.EVENT, session=head.session, seq=head.seq + i), body)
                        for i, body in enumerate(bodies)]
            else:
                out.append((head, f[1] if len(f) > 1 else None))
        return out

    def batches(self, identity: bytes) -> list[wire.Header]:
        """The headers of the ``events`` messages ``identity`` was sent."""
        return [h for h in map(wire.decode_header, (f[0] for f in self.transport.sent[identity])) if h.kind == wire.EVENTS]

    def kinds(self, identity: bytes) -> list[str]:
        return [h.kind for h, _ in self.messages(identity)]

    def events(self, identity: bytes) -> list[tuple[int, Event]]:
        return [(h.seq, decode_event_msgpack(b)) for h, b in self.messages(identity) if h.kind == wire.EVENT]

    def seqs(self, identity: bytes) -> list[int]:
        return [seq for seq, _ in self.events(identity) if seq]


def unpack_events(head: wire.Header, body: bytes) -> list[bytes]:
    """The event bodies of an ``events`` message, as the agent sent them (checking the batch's shape)."""
    raws = msgspec.msgpack.decode(body, type=list[msgspec.Raw])
    assert body[:1] == b"\xdd" and len(raws) == head.n >= 1 and head.seq >= 1
    assert b"".join(bytes(r) for r in raws) == body[wire.EVENTS_HEAD_SIZE:]
    return [bytes(r) for r in raws]


@pytest.fixture
def small_window(monkeypatch):
    monkeypatch.setattr(wire, "SESSION_WINDOW_EVENTS", 8)
    monkeypatch.setattr(wire, "SESSION_WINDOW_BYTES", 1 << 20)


def delta(text: str = "x") -> AgentMessageDeltaEvent:
    return AgentMessageDeltaEvent(text)


# -- numbering, window, lagged ---------------------------------------------------------------


def test_a_frontend_a_window_behind_is_told_once_and_catches_up_from_the_log(small_window) -> None:
    d = Daemon()
    fast, slow = d.connect("fast"), d.connect("slow")
    session = d.open(fast)
    d.attach(slow, session, since=0)
    for i in range(20):
        d.emit(session, delta(str(i)))
        d.ack(fast, session, d.sessions.sessions[session].seq, 0)
    assert d.seqs(fast) == list(range(1, 21))
    # The window is 8: the slow one got 1..8, then one lagged naming the last seq sent.
    assert d.seqs(slow) == list(range(1, 9))
    lagged = [h for h, _ in d.messages(slow) if h.kind == wire.LAGGED]
    assert [(h.session, h.seq) for h in lagged] == [(session, 8)]
    d.ack(slow, session, 4, 0)
    assert d.seqs(slow) == list(range(1, 13))  # four acked: four more
    d.ack(slow, session, 12, 0)
    assert d.seqs(slow) == list(range(1, 21))
    # At the head with a full window it waits for its ack rather than lag again at once.
    sub = d.sessions.sessions[session].subscriptions[slow]
    assert not sub.live and sub.next_seq == 21
    d.ack(slow, session, 20, 0)
    assert sub.live and len([k for k in d.kinds(slow) if k == wire.LAGGED]) == 1
    d.emit(session, delta("live again"))
    assert d.seqs(slow)[-1] == 21
    assert [b for h, b in d.messages(slow) if h.kind == wire.EVENT] == [d.published[session][s] for s in range(1, 22)]


def test_unacknowledged_bytes_bound_a_frontend_too(monkeypatch) -> None:
    monkeypatch.setattr(wire, "SESSION_WINDOW_BYTES", 10_000)
    d = Daemon()
    reader = d.connect("reader")
    session = d.open(reader)
    for _ in range(10):
        d.emit(session, delta("y" * 3000))
    # Sending stops once 10 000 bytes are out: four events of ~3 kB (the fourth crosses it).
    assert d.seqs(reader) == [1, 2, 3, 4]
    d.ack(reader, session, 4, 12_500)
    assert d.seqs(reader) == list(range(1, 9))


def test_a_full_queue_stalls_only_that_frontend_until_a_heartbeat(small_window) -> None:
    d = Daemon()
    ok, stuck = d.connect("ok"), d.connect("stuck")
    session = d.open(ok)
    d.attach(stuck, session, since=1)
    d.transport.full.add(stuck)
    for i in range(5):
        d.emit(session, delta(str(i)))
    assert d.seqs(ok) == [1, 2, 3, 4, 5] and d.seqs(stuck) == []
    sub = d.sessions.sessions[session].subscriptions[stuck]
    assert not sub.live and sub in d.sessions.stuck
    d.heartbeat()  # still full: nothing lost, still stuck
    assert sub in d.sessions.stuck and d.seqs(stuck) == []
    d.transport.full.discard(stuck)
    d.heartbeat()
    assert d.kinds(stuck)[-6] == wire.LAGGED and d.seqs(stuck) == [1, 2, 3, 4, 5]
    assert sub.live and not d.sessions.stuck


def test_replay_goes_out_in_bounded_batches_per_loop_turn(monkeypatch) -> None:
    monkeypatch.setattr(sessions_module, "PUMP_EVENTS", 10)
    d = Daemon()
    opener, late = d.connect("opener"), d.connect("late")
    session = d.open(opener)
    for i in range(35):
        d.emit(session, delta(str(i)))
    d.send(late, wire.header(wire.ATTACH, "c", session=session, seq=0), settle=False)
    assert len(d.seqs(late)) == 10 and len(d.deferred) == 1
    d.deferred.popleft()()
    assert len(d.seqs(late)) == 20
    d.settle()
    assert d.seqs(late) == list(range(1, 36))


# -- batches -----------------------------------------------------------------------------------


def test_events_of_one_loop_turn_go_out_together_the_same_frame_to_every_frontend() -> None:
    d = Daemon()
    fronts = [d.connect(f"f{i}") for i in range(3)]
    session = d.open(fronts[0])
    for front in fronts[1:]:
        d.attach(front, session, since=0)
    for i in range(5):  # one loop turn: nothing is sent before it ends
        d.emit(session, delta(str(i)), settle=False)
    assert not any(d.batches(f) for f in fronts)
    d.settle()
    bodies = []
    for front in fronts:
        (batch,) = d.batches(front)
        assert (batch.session, batch.seq, batch.n) == (session, 1, 5)
        bodies.append(d.transport.objects[front][-1][1])
    assert bodies[0] is bodies[1] is bodies[2]  # built once, shared
    assert [b for h, b in d.messages(fronts[2]) if h.kind == wire.EVENT] == [d.published[session][s] for s in range(1, 6)]
    # A lone event goes at the end of the turn it came in, alone.
    d.emit(session, delta("alone"))
    assert [(h.seq, h.n) for h in d.batches(fronts[1])] == [(1, 5), (6, 1)]


def test_a_live_frontend_gets_what_its_window_takes_of_a_batch_then_lags(small_window) -> None:
    d = Daemon()
    roomy, tight = d.connect("roomy"), d.connect("tight")
    session = d.open(roomy)
    d.attach(tight, session, since=0)
    for i in range(5):
        d.emit(session, delta(str(i)))
    d.ack(roomy, session, 5, 0)
    for i in range(6):
        d.emit(session, delta(str(i)), settle=False)
    d.settle()
    assert [(h.seq, h.n) for h in d.batches(roomy)][-1] == (6, 6)
    # The tight one has 5 in flight of a window of 8: three more, then lagged at 8.
    assert d.seqs(tight) == list(range(1, 9))
    assert [(h.kind, h.seq) for h, _ in d.messages(tight)][-1] == (wire.LAGGED, 8)
    d.ack(tight, session, 8, 0)
    assert d.seqs(tight) == list(range(1, 12))


def test_a_catching_up_frontend_gets_the_journal_in_blocks_as_stored(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(sessions_module, "LOG_EVENTS", 5)
    d = Daemon(journal_dir=str(tmp_path))
    opener, late = d.connect("opener"), d.connect("late")
    session = d.open(opener)
    for i in range(1000):
        d.emit(session, delta(f"event {i}"))
    d.attach(late, session, since=0)
    assert [(h.seq, h.n) for h in d.batches(late)] == [(1, 1000)]  # one window, one message
    assert d.seqs(late) == list(range(1, 1001))
    assert [b for h, b in d.messages(late) if h.kind == wire.EVENT] == [d.published[session][s] for s in range(1, 1001)]


def test_a_body_that_is_not_one_msgpack_object_keeps_its_batch_readable() -> None:
    d = Daemon()
    reader = d.connect("reader")
    session = d.open(reader)
    good = encode_msgpack(Event("t1", delta("fine")))
    for body in (good, b"\x92", good + b"\x01", good):  # an array missing its items; trailing bytes
        d.send(d.agent, wire.header(wire.EVENT, session=session), body, settle=False)
    d.settle()
    (batch,) = d.batches(reader)
    bodies = unpack_events(batch, d.transport.sent[reader][-1][1])
    assert bodies[0] == bodies[3] == good
    assert msgspec.msgpack.decode(bodies[1]) == b"\x92" and msgspec.msgpack.decode(bodies[2]) == good + b"\x01"
    events = decode_events_msgpack(d.transport.sent[reader][-1][1])
    assert [type(e).__name__ for e in events] == ["Event", "ProtocolError", "ProtocolError", "Event"]


def test_the_event_that_renames_a_session_goes_out_under_its_old_id() -> None:
    d = Daemon()
    reader = d.connect("reader")
    session = d.open(reader)
    d.emit(session, delta("before"), settle=False)
    configured = SessionConfiguredEvent(session_id="11111111-2222-3333-4444-555555555555", model="m",
                                        history_log_id=0, history_entry_count=0)
    d.send(d.agent, wire.header(wire.EVENT, session=session), encode_msgpack(Event("0", configured)), settle=False)
    d.send(d.agent, wire.header(wire.EVENT, session=session), encode_msgpack(Event("t1", delta("after"))), settle=False)
    d.settle()
    assert [(h.session, h.seq, h.n) for h in d.batches(reader)] == [
        (session, 1, 2), ("11111111-2222-3333-4444-555555555555", 3, 1)]


# -- what is kept: the memory log and the journal ------------------------------------------------


def test_events_no_longer_kept_are_skipped_with_a_notice(small_window, monkeypatch) -> None:
    monkeypatch.setattr(sessions_module, "LOG_EVENTS", 5)
    d = Daemon(journal_dir=None)
    opener, slow = d.connect("opener"), d.connect("slow")
    session = d.open(opener)
    d.attach(slow, session, since=0)
    for i in range(30):
        d.emit(session, delta(str(i)))
    assert d.seqs(slow) == list(range(1, 9))
    d.ack(slow, session, 8, 0)
    notices = [e.msg.message for seq, e in d.events(slow) if not seq]
    assert notices == ["events 9..25 of this session are no longer kept; continuing at 26"]
    assert d.seqs(slow) == [*range(1, 9), *range(26, 31)]
    # A late attach asking for more than is kept: attached says where the stream starts.
    late = d.connect("late")
    head = d.attach(late, session, since=3)
    assert (head.kind, head.seq, head.n) == (wire.ATTACHED, 25, 30)
    assert [e.msg.message for seq, e in d.events(late) if not seq] == [
        "events 3..25 of this session are no longer kept; continuing at 26"]
    assert d.seqs(late) == list(range(26, 31))


def test_the_journal_serves_what_the_memory_log_no_longer_holds(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(sessions_module, "LOG_EVENTS", 5)
    d = Daemon(journal_dir=str(tmp_path))
    opener, late = d.connect("opener"), d.connect("late")
    session = d.open(opener)
    for i in range(100):
        d.emit(session, delta(f"event {i}"))
    assert len(d.sessions.sessions[session].log) == 5
    assert d.attach(late, session, since=0).seq == 0
    assert d.seqs(late) == list(range(1, 101))
    assert [b for h, b in d.messages(late) if h.kind == wire.EVENT] == [d.published[session][s] for s in range(1, 101)]
    assert list(tmp_path.iterdir())
    d.sessions.close("stopping")
    assert not list(tmp_path.iterdir())  # a session's journal goes with it


# -- attach, detach ---------------------------------------------------------------------------


def test_attach_positions(small_window) -> None:
    d = Daemon()
    opener, other = d.connect("opener"), d.connect("other")
    session = d.open(opener)
    assert d.attach(other, session, since=wire.SINCE_TURN).seq == 0  # no turn yet: from the start
    d.emit(session, SessionConfiguredEvent(session_id=session, model="gpt-test", history_log_id=0,
                                           history_entry_count=0), "0")
    d.emit(session, TaskStartedEvent())
    d.emit(session, delta())
    head = d.attach(other, session, since=wire.SINCE_TURN, corr="c2")
    assert (head.kind, head.corr, head.seq, head.n) == (wire.ATTACHED, "c2", 1, 3)
    info = wire.decode(wire.ATTACHED, d.messages(other)[-3][1])
    assert (info.state, info.model, info.turn_start, info.seq) == ("running", "gpt-test", 2, 3)
    assert d.seqs(other)[-2:] == [2, 3]
    # Past the head: live from the next event, nothing replayed.
    before = len(d.seqs(other))
    assert d.attach(other, session, since=99).seq == 3
    assert len(d.seqs(other)) == before and d.sessions.sessions[session].subscriptions[other].live
    # Re-positioning backwards replays again, from there.
    assert d.attach(other, session, since=2).seq == 1
    assert d.seqs(other)[-2:] == [2, 3]
    # Unknown: an unnumbered error answering the attach, and no subscription.
    head = d.attach(other, "no-such-session", corr="c3")
    (_, error), = [(s, e) for s, e in d.events(other)[-1:]]
    assert (head.kind, head.corr, head.seq) == (wire.EVENT, "c3", 0)
    assert error.msg.message == "unknown session no-such-session"


def test_detach_stops_the_events_and_the_session_goes_on() -> None:
    d = Daemon()
    a, b = d.connect("a"), d.connect("b")
    session = d.open(a)
    d.attach(b, session, since=0)
    d.send(b, wire.header(wire.DETACH, session=session))
    d.emit(session, delta())
    assert d.seqs(a) == [1] and d.seqs(b) == []
    d.send(a, wire.header(wire.DETACH, session=session))
    assert session in d.sessions.sessions and not d.sessions.sessions[session].subscriptions
    # Submitting attaches again, at the head.
    d.submit(b, session, Submission("b.1", UserInput([TextInput("hi")])), corr="c-b")
    assert [(h.kind, h.seq) for h, _ in d.messages(b)][-1] == (wire.ATTACHED, 1)
    assert d.forwarded()[-1].id == "b.1"


def test_a_thousand_attach_cycles_and_vanished_frontends_leave_nothing_behind(small_window) -> None:
    d = Daemon()
    owner = d.connect("owner")
    session = d.open(owner)
    for _ in range(20):
        d.emit(session, delta())
    cyclers = [d.connect(f"cycler {i}") for i in range(3)]
    for i in range(1000):
        frontend = cyclers[i % 3]
        d.attach(frontend, session, since=i % 25)
        if i % 7 == 0:
            d.ack(frontend, session, 20, 0)
        d.send(frontend, wire.header(wire.DETACH, session=session))
    # Frontends that attach (some stalled, some lagging) and vanish, or say bye.
    for i in range(300):
        frontend = d.connect(f"vanishing {i}")
        d.attach(frontend, session, since=i % 21)
        if i % 3 == 0:
            d.transport.full.add(frontend)
        if i % 2:
            d.send(frontend, wire.header(wire.BYE))
        else:
            d.transport.gone.add(frontend)
    # The vanished are found out when an event goes to them, or by the router's sweep of
    # idle frontends (those waiting for acks get no events).
    d.emit(session, delta())
    for _ in range(IDLE_PING_EVERY):
        d.heartbeat()
    state = d.sessions.sessions[session]
    assert list(state.subscriptions) == [owner]
    assert set(d.router.peers) == {d.agent, owner, *cyclers}
    assert set(d.router.callers) == set(d.router.peers)
    assert not d.sessions.stuck and not d.deferred
    assert all(not d.router.peers[c].sessions for c in cyclers)
    d.send(owner, wire.header(wire.SESSIONS, "c-list"))
    listing = wire.decode(wire.SESSIONS, d.messages(owner)[-1][1])
    assert listing.frontends == 4 and listing.sessions[0].frontends == ["frontend-2 (owner)"]


def test_a_frontend_catching_up_when_the_session_closes_is_told() -> None:
    d = Daemon()
    a, b = d.connect("a"), d.connect("b")
    session = d.open(a)
    d.attach(b, session, since=0)
    d.transport.full.add(b)
    d.emit(session, delta())
    d.transport.full.discard(b)
    d.send(d.agent, wire.header(wire.CLOSED, session=session))
    assert [e.msg.message for seq, e in d.events(b)] == [
        "the session was shut down before events 1..1 reached this frontend"]
    assert session not in d.sessions.sessions and not d.sessions.stuck and not d.router.peers[b].sessions


@pytest.mark.parametrize(("status", "why"), [("killed by signal 9", "died (killed by signal 9)"),
                                              (None, "became unreachable")])
def test_an_agent_found_unreachable_is_said_to_have_died_and_how_when_it_has(status, why) -> None:
    """Its connection closes as it dies, a moment before its pidfd says so: a send that
    finds it gone asks the supervisor how it ended, so every frontend reads the exit."""
    d = Daemon()
    a = d.connect("a")
    session = d.open(a)
    d.router.agent_supervisor.status = status
    d.transport.gone.add(d.agent)
    d.submit(a, session, Submission("1", Interrupt()))
    [event] = [e for _, e in d.events(a) if isinstance(e.msg, ErrorEvent)]
    assert event.msg.message.startswith(f"the agent process {why}; this session is gone"), event.msg.message
    assert session not in d.sessions.sessions and d.sessions.agent is None


# -- state and approvals ------------------------------------------------------------------------


def test_state_follows_the_events(small_window) -> None:
    d = Daemon()
    a = d.connect("sluice attach")
    session = d.open(a, cwd="/home/me/project")
    state = d.sessions.sessions[session]
    info = state.info()
    assert (info.cwd, info.state, info.frontends) == ("/home/me/project", "idle", ["frontend-2 (sluice attach)"])
    d.emit(session, TaskStartedEvent(), "t1")
    assert state.state == "running" and state.turn_start == 1
    d.emit(session, ExecApprovalRequestEvent("call-1", ["rm", "x"], "/w"), "t1")
    assert state.state == "waiting_for_approval" and state.info().pending_approvals == ["call-1"]
    d.emit(session, TaskCompleteEvent(None), "t1")
    assert state.state == "idle" and not state.pending
    d.emit(session, TaskStartedEvent(), "t2")
    d.emit(session, ErrorEvent("some other submission's error"), "x9")
    assert state.state == "running"
    d.emit(session, ErrorEvent("the model failed"), "t2")
    assert state.state == "idle" and state.turn_start == 4


def test_the_first_answer_to_an_approval_wins() -> None:
    d = Daemon()
    first, second = d.connect("first"), d.connect("second")
    session = d.open(first)
    d.attach(second, session, since=0)
    d.emit(session, TaskStartedEvent(), "t1")
    d.emit(session, ExecApprovalRequestEvent("call-1", ["touch", "f"], "/w"), "t1")
    forwarded = len(d.forwarded())
    d.submit(second, session, Submission("s.1", ExecApproval("t1", ReviewDecision.APPROVED)))
    assert d.forwarded()[-1].op == ExecApproval("t1", ReviewDecision.APPROVED)
    for frontend in (first, second):
        seq, resolved = d.events(frontend)[-1]
        assert seq == 3 and resolved.id == "t1"
        assert (resolved.msg.call_id, resolved.msg.decision, resolved.msg.by) == (
            "call-1", ReviewDecision.APPROVED, "frontend-3 (second)")
    assert d.sessions.sessions[session].state == "running"
    # The late answer goes nowhere but back to its sender.
    d.submit(first, session, Submission("f.1", ExecApproval("t1", ReviewDecision.DENIED)))
    assert len(d.forwarded()) == forwarded + 1
    seq, error = d.events(first)[-1]
    assert seq == 0 and error.id == "f.1"
    assert error.msg.message == "approval call-1 was already answered by frontend-3 (second) (approved)"
    assert d.seqs(second)[-1] == 3 and d.sessions.sessions[session].seq == 3
    # By call_id too; and an answer matching nothing goes to the agent as it is.
    d.submit(first, session, Submission("f.2", ExecApproval("call-1", ReviewDecision.DENIED)))
    assert len(d.forwarded()) == forwarded + 1
    d.submit(first, session, Submission("f.3", ExecApproval("nothing", ReviewDecision.DENIED)))
    assert d.forwarded()[-1].id == "f.3"


# -- the delivery promise, at random -------------------------------------------------------------


class SimFrontend:
    """Reads what the daemon sent one frontend, in order, as the client library does, and
    checks the stream: consecutive seqs from each ``attached``, bodies as published, gaps
    only where a notice names them."""

    def __init__(self, d: Daemon, identity: bytes, session: str) -> None:
        self.d, self.identity, self.session = d, identity, session
        self.read = 0
        self.expected: int | None = None
        self.last = 0
        self.events = self.bytes = 0
        self.received = 0

    def attach(self, since: int) -> None:
        self.drain(ack=False)
        self.d.attach(self.identity, self.session, since=since)
        # The client drops (and never acks) what came before ``attached``.
        sent = self.d.transport.sent[self.identity]
        self.read = max(i for i, f in enumerate(sent) if wire.decode_header(f[0]).kind == wire.ATTACHED)

    def detach(self) -> None:
        self.drain()
        self.d.send(self.identity, wire.header(wire.DETACH, session=self.session))
        self.expected = None

    def drain(self, limit: int | None = None, *, ack: bool = True) -> int:
        sent = self.d.transport.sent[self.identity]
        taken = 0
        while self.read < len(sent) and (limit is None or taken < limit):
            frames = sent[self.read]
            self.read += 1
            taken += 1
            self._take(wire.decode_header(frames[0]), frames[1] if len(frames) > 1 else None, ack)
        return taken

    def flush_ack(self) -> None:
        if self.expected is not None and self.events:
            self._ack()

    def _take(self, head: wire.Header, body: bytes | None, ack: bool) -> None:
        if head.session != self.session:
            return
        if head.kind == wire.ATTACHED:
            self.expected = head.seq + 1
            self.last = head.seq
            self.events = self.bytes = 0
        elif head.kind == wire.EVENTS:
            for seq, event in enumerate(unpack_events(head, body), head.seq):
                assert self.expected is not None and seq == self.expected, (seq, self.expected)
                assert event == self.d.published[self.session][seq]
                self.expected += 1
                self.last = seq
                self.received += 1
                self.events += 1
                self.bytes += len(event)
                if ack and self.events >= 3:
                    self._ack()
        elif head.kind == wire.EVENT and head.seq:
            raise AssertionError("numbered events come in batches")
        elif head.kind == wire.EVENT:
            # Either events skipped from here on, or (after ``attached``) why the stream
            # does not start where asked; it goes on where the notice says either way.
            gap = GAP.match(decode_event_msgpack(body).msg.message)
            assert gap and int(gap[3]) == int(gap[2]) + 1
            assert self.expected in (int(gap[1]), int(gap[3])), (gap[0], self.expected)
            self.expected = int(gap[3])

    def _ack(self) -> None:
        n, self.events, self.bytes = self.bytes, 0, 0
        self.d.ack(self.identity, self.session, self.last, n)


@pytest.mark.parametrize("journal", [False, True], ids=["memory-log-only", "journal"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_streams_stay_gap_free_under_random_acks_stalls_and_reattaches(tmp_path, monkeypatch, journal, seed) -> None:
    monkeypatch.setattr(wire, "SESSION_WINDOW_EVENTS", 12)
    monkeypatch.setattr(wire, "SESSION_WINDOW_BYTES", 3000)
    monkeypatch.setattr(sessions_module, "LOG_EVENTS", 30)
    monkeypatch.setattr(sessions_module, "LOG_BYTES", 6000)
    monkeypatch.setattr(sessions_module, "PUMP_EVENTS", 5)
    # A small journal rotates away old events, so gaps happen with it too.
    monkeypatch.setattr(sessions_module, "Journal", functools.partial(Journal, max_bytes=40_000))
    rng = random.Random(seed)
    d = Daemon(journal_dir=str(tmp_path) if journal else None)
    owner = d.connect("owner")
    session = d.open(owner)
    sims = [SimFrontend(d, d.connect(f"sim {i}"), session) for i in range(4)]
    for sim in sims:
        sim.attach(0)
    head = d.sessions.sessions[session]
    for _ in range(3000):
        roll = rng.random()
        sim = rng.choice(sims)
        if roll < 0.35:
            for _ in range(rng.randint(1, 8)):
                d.emit(session, delta("z" * rng.randint(0, 400)))
        elif roll < 0.75:
            if sim.expected is not None:
                sim.drain(rng.randint(1, 20))
        elif roll < 0.85:
            d.transport.full ^= {sim.identity}
        elif roll < 0.92:
            d.heartbeat()
        elif roll < 0.97:
            if sim.expected is not None and sim.identity not in d.transport.full:
                sim.attach(rng.choice([0, wire.SINCE_TURN, rng.randint(1, head.seq + 2)]))
        elif sim.expected is None:
            if sim.identity not in d.transport.full:
                sim.attach(rng.randint(0, head.seq + 1))
        elif sim.identity not in d.transport.full:
            sim.detach()
    d.transport.full.clear()
    for _ in range(1000):
        d.heartbeat()
        if not any(sim.drain() for sim in sims):
            for sim in sims:
                sim.flush_ack()
            if not any(sim.drain() for sim in sims):
                break
    for sim in sims:
        assert sim.expected in (None, head.seq + 1)
    assert sum(sim.received for sim in sims) > 1000


def test_a_session_the_agent_cannot_be_given_is_not_kept() -> None:
    d = Daemon()
    frontend = d.connect("fe")
    d.transport.full.add(d.agent)  # the agent's queue is full: the configure cannot go out
    op = ConfigureSession(provider=ModelProviderInfo(name="fake"), model="m", approval_policy=AskForApproval.NEVER,
                          sandbox_policy=SandboxPolicy.from_mode("read-only"), cwd="/work/project")
    d.submit(frontend, "", Submission("0", op), corr="c-open")
    (error,) = [e for _, e in d.events(frontend)]
    assert "not taking submissions" in error.msg.message
    assert d.sessions.sessions == {}


def _pings(d: Daemon, identity: bytes) -> list[str]:
    """The nonces of the checkpoint pings ``identity`` was sent, oldest first."""
    return [h.corr for h, _ in d.messages(identity) if h.kind == wire.PING]


def _last_error(d: Daemon, identity: bytes) -> str:
    return [wire.decode(wire.ERROR, b).message for h, b in d.messages(identity) if h.kind == wire.ERROR][-1]


@pytest.fixture
def small_receipts(monkeypatch):
    """A caller is behind after 1,000 unproven bytes; a checkpoint every 300."""
    monkeypatch.setattr(receipts_module, "UNPROVEN_BYTES", 1000)
    monkeypatch.setattr(receipts_module, "CHECK_EVERY", 300)
    monkeypatch.setattr(receipts_module, "MESSAGE_COST", 0)


def test_call_acks_beyond_what_was_sent_are_refused_and_credit_waits_for_proof_of_receipt(small_receipts) -> None:
    d = Daemon()
    frontend = d.connect("fe")
    executor = b"\x00ex"
    d.send(executor, *wire.message(wire.HELLO, body=wire.Hello(role=wire.ROLE_EXECUTOR, token=TOKEN, pid=2, slots=1)))
    d.send(frontend, *wire.message(wire.RUN, "c1", wire.RunRequest(argv=["yes"], cwd="/",
                                                                    sandbox=SandboxPolicy.from_mode("read-only"))))
    for _ in range(3):
        d.send(executor, wire.header(wire.OUT, "c1", stream=wire.STDOUT), b"y\n" * 50)

    def acks_at_executor() -> list[tuple[int, int]]:
        return [(h.n, h.seq) for h, _ in d.messages(executor) if h.kind == wire.ACK]

    d.send(frontend, wire.header(wire.ACK, "c1", n=301, seq=1))  # more bytes than the 300 sent
    assert "refused" in _last_error(d, frontend)
    assert acks_at_executor() == []
    d.send(frontend, wire.header(wire.ACK, "c1", n=200, seq=2))  # not behind: passed on at once
    assert acks_at_executor() == [(200, 2)]
    for _ in range(10):  # 1,000 more bytes sent, and the frontend answers no ping
        d.send(executor, wire.header(wire.OUT, "c1", stream=wire.STDOUT), b"y\n" * 50)
    d.send(frontend, wire.header(wire.ACK, "c1", n=1000, seq=10))
    assert acks_at_executor() == [(200, 2)]  # held: the frontend is behind
    d.send(frontend, wire.header(wire.PONG, "0123456789abcdef"))  # a nonce it never received
    assert acks_at_executor() == [(200, 2)]
    pings = _pings(d, frontend)
    assert len(pings) >= 3
    d.send(frontend, wire.header(wire.PONG, pings[-1]))  # everything up to the last ping arrived
    assert acks_at_executor() == [(200, 2), (1000, 10)]
    d.send(frontend, wire.header(wire.ACK, "c1", n=101, seq=1))  # only 100 bytes are unacknowledged
    assert "refused" in _last_error(d, frontend)


def test_output_past_the_hold_bound_is_counted_lost_but_exit_statuses_never_fill_it(small_receipts, monkeypatch):
    monkeypatch.setattr(router_module, "CALLER_HOLD_BYTES", 5000)
    d = Daemon()
    frontend = d.connect("fe")
    executor = b"\x00ex"
    d.send(executor, *wire.message(wire.HELLO, body=wire.Hello(role=wire.ROLE_EXECUTOR, token=TOKEN, pid=2, slots=3)))
    for call in ("c1", "c2", "c3"):
        d.send(frontend, *wire.message(wire.RUN, call, wire.RunRequest(argv=["yes"], cwd="/",
                                                                         sandbox=SandboxPolicy.from_mode("read-only"))))

    def out(call: str) -> None:
        d.send(executor, wire.header(wire.OUT, call, stream=wire.STDOUT), b"y" * 100)

    def outs(call: str) -> int:
        return sum(h.kind == wire.OUT and h.corr == call for h, _ in d.messages(frontend))

    def notices() -> list[tuple[str, str]]:
        return [(h.corr, wire.decode(wire.NOTICE, b).message) for h, b in d.messages(frontend) if h.kind == wire.NOTICE]

    # Calls that end together: each exit carries the call's captured output, together
    # more than the bound, sent within one round trip to a caller that reads. Another
    # call's output is still kept.
    for call in ("c1", "c2"):
        d.send(executor, *wire.message(wire.EXIT, call, wire.ExitStatus(exit_code=0, stdout=b"y" * 3000)))
    out("c3")
    assert outs("c3") == 1 and notices() == []
    d.send(frontend, wire.header(wire.PONG, _pings(d, frontend)[-1]))  # it read all that
    # Its output itself past the bound, to a caller that proves no receipt: counted, not kept.
    for _ in range(60):
        out("c3")
    forwarded = outs("c3") - 1
    assert 0 < forwarded < 50
    d.send(executor, *wire.message(wire.EXIT, "c3", wire.ExitStatus(exit_code=0)))
    lost = 60 - forwarded
    assert notices() == [("c3", f"{lost * 100} bytes of this command's output ({lost} chunks) were lost: this client "
                                "did not read them in time, and the daemon keeps at most 0 MiB for a client")]


def test_session_acks_wait_for_proof_of_receipt_too(small_receipts) -> None:
    d = Daemon()
    frontend = d.connect("fe")
    session = d.open(frontend)
    for i in range(12):
        d.emit(session, delta("x" * 100))
    seq = d.sessions.sessions[session].seq
    sub = d.sessions.sessions[session].subscriptions[frontend]
    d.ack(frontend, session, seq, 12 * 100)
    assert sub.acked < seq and sub.held_seq == seq  # behind: the ack waits
    d.send(frontend, wire.header(wire.PONG, _pings(d, frontend)[-1]))
    assert sub.acked == seq and sub.held_seq == 0


def _run(d: Daemon, frontend: bytes, call_id: str, *, interactive: bool) -> None:
    request = wire.RunRequest(argv=["cat"], cwd="/", sandbox=SandboxPolicy.from_mode("read-only"),
                              interactive=interactive)
    d.send(frontend, *wire.message(wire.RUN, call_id, request))


def test_interactive_runs_take_no_slot_and_are_refused_beyond_what_executors_host(monkeypatch) -> None:
    monkeypatch.setattr(wire, "INTERACTIVE_PER_EXECUTOR", 2)
    d = Daemon()
    frontend = d.connect("fe")
    _run(d, frontend, "i0", interactive=True)  # no executor yet: it waits like any run
    executors = [b"\x00ex1", b"\x00ex2"]
    for pid, executor in enumerate(executors, 10):
        d.send(executor, *wire.message(wire.HELLO, body=wire.Hello(role=wire.ROLE_EXECUTOR, token=TOKEN, pid=pid,
                                                                     slots=1)))
    for i in range(1, 4):
        _run(d, frontend, f"i{i}", interactive=True)
    _run(d, frontend, "p1", interactive=False)
    _run(d, frontend, "p2", interactive=False)  # both slots taken by p1, p2: interactive ones took none

    def runs(executor: bytes) -> list[str]:
        return [h.corr for h, _ in d.messages(executor) if h.kind == wire.RUN]

    assert sorted(runs(executors[0]) + runs(executors[1])) == ["i0", "i1", "i2", "i3", "p1", "p2"]
    assert all(len([c for c in runs(e) if c.startswith("i")]) == 2 for e in executors)  # spread evenly
    _run(d, frontend, "i4", interactive=True)
    assert "interactive command" in _last_error(d, frontend)
    _run(d, frontend, "p3", interactive=False)  # waits for a slot, like any run
    assert "p3" not in runs(executors[0]) + runs(executors[1])
    d.send(executors[0], *wire.message(wire.EXIT, "i0", wire.ExitStatus(exit_code=0)))
    _run(d, frontend, "i5", interactive=True)  # room again, and not behind the queued p3
    assert "i5" in runs(executors[0])
    d.send(frontend, wire.header(wire.RESIZE, "i5"), wire.encode(wire.Winsize(50, 132)))
    resized = [b for h, b in d.messages(executors[0]) if h.kind == wire.RESIZE]
    assert [wire.decode(wire.RESIZE, b) for b in resized] == [wire.Winsize(50, 132)]
