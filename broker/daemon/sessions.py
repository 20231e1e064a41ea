"""Sessions in the daemon: event numbering, the log and journal, who gets which events, approvals.

The broker hosts every session in the one agent process it spawns (see
:class:`broker.daemon.supervisor.AgentSupervisor`). This module is the bookkeeping around that,
driven by the router (:mod:`broker.daemon.router`):

- ``submit`` from a frontend: an empty session id with ``configure_session`` creates a
  session (uuid4); a known id continues one. A session whose ``session_configured``
  names another id (it resumed a rollout, whose id it keeps, as in Codex) is called by
  that id from the next event on; the first one stays an alias (frontends that have not
  seen the event yet, and the agent, which knows the session by it). A frontend not attached to the session yet
  is attached at its head (told with ``attached``), and the submission goes to the agent
  as it came, at once, in arrival order; an interrupt is therefore never behind anything
  the broker holds. While the agent is starting, submissions wait in a bounded list.
- ``event`` from the agent: numbered with the session's next ``seq`` (in the header; the
  body is forwarded untouched), kept in a bounded memory log and in the session's
  journal on disk (:mod:`broker.daemon.journal`), and sent to every attached frontend
  in an ``events`` batch (see "Batches" below).
- ``attach`` from a frontend: subscribe from a given event on (``attached``, then a
  replay of what it asked for); ``detach``: unsubscribe; ``sessions``: list them all,
  except one whose ``configure_session`` was answered with an ``error`` and no
  ``session_configured`` (the agent lets go of it; it is not shown meanwhile).
- ``closed`` from the agent: it let go of the session (after ``shutdown``); forgotten.
- The agent going away (its process died, it stopped answering, it left): every session
  gets an ``error`` event saying so and is forgotten; the supervisor starts a new agent.

Delivery promise
----------------
A frontend's subscription to a session starts with ``attached`` (header ``seq`` = s).
From then on, for as long as it stays attached, it receives the session's numbered
events s+1, s+2, ... in order, each exactly once, with no gap, however slowly it reads
and whatever the other frontends do. The one exception is announced: when events it has
not been sent yet are no longer kept (in neither the memory log nor the journal), it
gets an unnumbered ``error`` event "events N..M of this session are no longer kept;
continuing at M+1", and the stream goes on at M+1. (An ``attach`` asking for events no
longer kept is attached at the oldest one kept, s + 1, and gets the same notice after
``attached`` to say why.)

How: a :class:`Subscription` is a cursor (the next seq to send) and a credit count (what
the frontend has not acknowledged yet). A *live* subscription is at the head and is sent
each event as it is published, while at most :data:`~broker.wire.frames.SESSION_WINDOW_EVENTS`
events / :data:`~broker.wire.frames.SESSION_WINDOW_BYTES` bytes are unacknowledged. One that
falls a window behind, or whose frontend's queue is full (``zmq.Again``), stops being
live: it gets one ``lagged`` message and from then on is *pumped*, sent its next events
from the memory log, else the journal, a bounded batch per loop turn and never past its
window, as its acks come (and, after ``zmq.Again``, on every heartbeat), until it reaches
the head and is live again. Every send goes out at the cursor and moves it past what it
carried, which is what makes the stream gap-free and duplicate-free; a slow frontend
costs the broker a cursor, never a queue, and never holds up the others.

Batches
-------
Numbered events go to frontends in ``events`` messages, each a run of consecutive events
(:class:`broker.daemon.journal.Block`). A published event is not sent at once: the
session is marked *dirty* and flushed at the end of the loop turn, so the events the
agent sent in one turn go out together, and more of them the further behind the broker
is (a lone event still leaves within the turn it came in). A flush builds the message
once and sends the same frame to every live subscription at that position (libzmq
shares it, nothing is copied or re-encoded per frontend); one whose window does not take
all of it is sent what fits and lags, as above. A session is flushed too before anything
else is said to its frontends or changes who they are (a submission's answer, an
attach, a detach, an error to one frontend, its new id, its end), so nothing overtakes
an event published before it. Catching up sends blocks as read: from the journal, the
bodies as stored on disk, one ``pread``, without looking at each event. A body from the
agent that is not one msgpack object is kept wrapped in a msgpack ``bin``, so the array
of the batch it goes in stays sound (the frontend reports it as an unreadable event).

Session state (:class:`~broker.wire.frames.SessionInfo`, for ``sluice sessions`` and ``attached``)
follows the heads of the events that pass: ``task_started`` makes a session running,
``task_complete``, ``turn_aborted`` or an ``error`` of the running task idle, and an
unanswered approval request waiting_for_approval. The first answer to an approval wins: it
goes to the agent and every frontend gets an ``approval_resolved`` event naming who gave
it; a later answer goes no further, and only its sender is told who was first.

Typing into a running command (``exec_command_stdin``) is taken only from a frontend
attached to the session (an earlier attach or submission; it does not attach by itself),
and the daemon writes the sender's name into its ``by`` before the agent gets it, so the
``exec_command_stdin_typed`` event every frontend sees names who typed, as
``approval_resolved`` names who answered.

What the broker itself reports about a session is an ``event`` whose body is a Codex
``Event`` with an ``error`` message, so a frontend shows it like any other error. Numbered
events carry no ``corr``: a replay could not repeat one.

Only heads are decoded (a submission's id, op type, ``cwd`` and approval fields, and the
whole of an ``exec_command_stdin``, to name its sender; an event's id, type, ``call_id``,
``model`` and ``session_id``): the rest, the API key of a
``configure_session`` and every output chunk included, passes through as bytes.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import os
import time
import uuid
from typing import TYPE_CHECKING, Protocol

import msgspec
import structlog
import zmq

from broker.daemon.journal import Block, Journal, JournalSpace
from broker.net.logging import Throttle
from broker.wire import frames as wire
from broker.wire.protocol import (
    NO_SESSION,
    ApprovalResolvedEvent,
    ErrorEvent,
    Event,
    ProtocolError,
    ReviewDecision,
    Submission,
    decode_submission_msgpack,
    encode_msgpack,
)
from broker.wire.results import DAEMON_SHUTTING_DOWN

if TYPE_CHECKING:
    from broker.daemon.router import Peer, Router

log = structlog.get_logger(component="sessions")

# Submissions held while the agent starts, at most (count, bytes); more is refused.
PENDING_LIMIT = 1000
PENDING_BYTES = 64 * 1024 * 1024
# Sessions one daemon hosts at most; fewer when descriptors are scarce (see :func:`max_sessions`).
MAX_SESSIONS = 10_000
# The memory log keeps at most this many recent events / bytes per session; the journal
# keeps many more on disk (and the rollout file the whole conversation).
LOG_EVENTS = 4096
LOG_BYTES = 8 * 1024 * 1024
# A frontend catching up is sent at most this much per loop turn, so that replaying to
# it never holds up the broker's other work for long.
PUMP_EVENTS = 4096
PUMP_BYTES = 4 * 1024 * 1024
# Why sending kept events to a frontend stopped (:meth:`Sessions._send_kept`).
_AT_HEAD, _WINDOW, _BUDGET, _STUCK, _GONE = "at head", "window full", "budget spent", "queue full", "gone"
_UNBOUNDED = 1 << 62
_CLEAN = object()
# Answered approvals a session remembers, to tell a late answer who was first.
ANSWERED_KEPT = 64

# Sessions just closed whose frontends still get the agent's late answers (to
# submissions that crossed the close), without a seq, like any "unknown session" error.
RECENTLY_CLOSED = 256

# Codex's answer to an op before configure_session.

_APPROVAL_ANSWERS = frozenset({"exec_approval", "patch_approval"})
_APPROVAL_REQUESTS = frozenset({"exec_approval_request", "apply_patch_approval_request"})
_TASK_ENDS = frozenset({"task_complete", "turn_aborted"})
_TYPING = "exec_command_stdin"

# The router's reasons for dropping a peer, as said of the agent.
_AGENT_WHY = {"said bye": "left", "unreachable": "became unreachable"}


def max_sessions(fd_limit: int) -> int:
    """How many sessions a daemon whose processes may each open ``fd_limit`` descriptors
    hosts: the agent keeps a session's files open (its rollout), a quarter of its limit."""
    return max(1, min(MAX_SESSIONS, fd_limit // 4))


class AgentStarter(Protocol):
    """What the sessions need from whoever spawns the agent."""

    def ensure_started(self) -> None:
        """Start the agent process unless it is running or about to be."""


# -- heads: the few fields the broker reads; msgspec skips the rest without decoding it


class _OpHead(msgspec.Struct):
    type: str
    # configure_session
    cwd: str | None = None
    # exec_approval / patch_approval: the request answered (its event id or call_id), the answer
    id: str | None = None
    decision: str | None = None


class _SubmissionHead(msgspec.Struct):
    id: str
    op: _OpHead


class _MsgHead(msgspec.Struct):
    type: str
    call_id: str | None = None
    model: str | None = None
    # session_configured: the id the agent gives the session (a resumed rollout's)
    session_id: str | None = None


class _EventHead(msgspec.Struct):
    id: str
    msg: _MsgHead


_submission_head = msgspec.msgpack.Decoder(_SubmissionHead)
_event_head = msgspec.msgpack.Decoder(_EventHead)
_opaque = msgspec.msgpack.Encoder()


def frontend_name(peer: Peer) -> str:
    """How other frontends see ``peer``: ``frontend-7 (sluice attach)``, or its bare id when unnamed."""
    return peer.peer_id if peer.name == peer.peer_id else f"{peer.peer_id} ({peer.name})"


def error_event(sub_id: str, message: str) -> bytes:
    """A Codex ``Event`` with an ``error`` message, as msgpack."""
    return encode_msgpack(Event(id=sub_id, msg=ErrorEvent(message)))


def approval_resolved_event(event_id: str, call_id: str, decision: str, by: str) -> bytes:
    """An ``approval_resolved`` event, as msgpack; ValueError if ``decision`` is not a ReviewDecision."""
    return encode_msgpack(Event(id=event_id, msg=ApprovalResolvedEvent(call_id, ReviewDecision(decision), by)))


def typed_by(body, by: str):
    """A frontend's ``exec_command_stdin`` with ``by`` naming who sent it (whatever the
    frontend put there is replaced): the agent announces the typing under that name. A
    body that does not decode goes as it came, for the agent to refuse."""
    try:
        submission = decode_submission_msgpack(body)
    except ProtocolError:
        return body
    return encode_msgpack(Submission(submission.id, msgspec.structs.replace(submission.op, by=by)))


def _gap_message(missing: int, first: int) -> str:
    return f"events {missing}..{first - 1} of this session are no longer kept; continuing at {first}"


class _Approval:
    """An approval request of the running task; once answered, the answer and who gave it."""

    __slots__ = ("event_id", "call_id", "decision", "by")

    def __init__(self, event_id: str, call_id: str) -> None:
        self.event_id = event_id
        self.call_id = call_id
        self.decision: str | None = None
        self.by = ""


class Session:
    """A session as the broker sees it: numbering, recent events, state, subscriptions."""

    __slots__ = (
        "id", "agent_key", "seq", "log", "log_bytes", "journal", "created", "cwd", "model",
        "task", "turn_start", "pending", "answered", "subscriptions", "configure_id", "configured", "refused",
        "announced_id",
    )

    def __init__(self, session_id: str, journal: Journal | None = None) -> None:
        # What frontends call the session: the daemon's uuid, or the id the agent gave it
        # in session_configured (a resumed rollout's). The agent knows it by ``agent_key``,
        # the daemon's uuid, for as long as it lives.
        self.id = session_id
        self.agent_key = session_id
        self.seq = 0
        # (seq, body frame), oldest first, consecutive; bounded by LOG_EVENTS and LOG_BYTES.
        self.log: collections.deque = collections.deque()
        self.log_bytes = 0
        self.journal = journal
        self.created = time.time()
        self.cwd = ""
        self.model = ""
        # The running task's submission id (the id its events carry); None when idle.
        self.task: str | None = None
        # The seq of the current (or last) task_started; 0 before the first.
        self.turn_start = 0
        # The running task's unanswered approval requests, by call_id, oldest first.
        self.pending: dict[str, _Approval] = {}
        # Answered requests, oldest first (bounded by ANSWERED_KEPT).
        self.answered: collections.OrderedDict[str, _Approval] = collections.OrderedDict()
        self.subscriptions: dict[bytes, Subscription] = {}
        # The configure_session that created it; refused: it answered with an error and
        # no session_configured (the agent lets go of it, and it is not listed meanwhile).
        self.configure_id: str | None = None
        self.configured = False
        self.refused = False
        self.announced_id: str | None = None

    # ---------------------------------------------------------------- events

    def append(self, body) -> int:
        """Number ``body`` as the next event, keep it (log and journal); returns its seq.

        A body that is not one msgpack object (its head does not decode) is kept as a
        msgpack ``bin`` holding it: it still reaches the frontends, which report it as an
        event they cannot read, and the array of an ``events`` batch it goes in stays sound."""
        self.seq += 1
        seq = self.seq
        try:
            head = wire.decode_with(_event_head, body, "event")
        except wire.WireError:
            head = None
            body = _opaque.encode(bytes(body))
        log_ = self.log
        log_.append((seq, body))
        self.log_bytes += len(body)
        while len(log_) > LOG_EVENTS or (self.log_bytes > LOG_BYTES and len(log_) > 1):
            _, old = log_.popleft()
            self.log_bytes -= len(old)
        if self.journal is not None:
            self.journal.append(seq, body)
        if head is not None:
            self._observe(seq, head)
        return seq

    def first_kept(self, seq: int) -> int:
        """The oldest event at or after ``seq`` still kept (log or journal); head + 1 when none is."""
        first = self.seq + 1
        if self.log:
            first = min(first, max(seq, self.log[0][0]))
        journal = self.journal
        if journal is not None and journal.first_seq <= journal.last_seq and seq <= journal.last_seq:
            first = min(first, max(seq, journal.first_seq))
        return first

    def read(self, seq: int, max_events: int, max_bytes: int) -> Block | None:
        """Kept events in order from ``seq`` on (from the oldest one kept after it when ``seq``
        itself is not): at most ``max_events``, each taken while fewer than ``max_bytes``
        bytes were (so at least one), from the memory log when it reaches back that far,
        else the journal (as stored, up to the end of a segment); None past the head."""
        start = self.first_kept(seq)
        log_ = self.log
        if self.journal is not None and (not log_ or start < log_[0][0]):
            block = self.journal.read(start, max_events, max_bytes)
            if block is not None:
                return block
            # A journal that fails to read turns itself off: the log is all there is now.
        if not log_ or start > self.seq:
            return None
        first = max(start, log_[0][0])
        parts = []
        ends = []
        size = 0
        for _, body in itertools.islice(log_, first - log_[0][0], None):
            parts.append(body)
            size += len(body)
            ends.append(size)
            if len(parts) >= max_events or size >= max_bytes:
                break
        return Block(first, parts, ends)

    def start_for(self, since: int) -> int:
        """The first seq an ``attach`` asking for ``since`` gets, within [1, head + 1]."""
        if since == wire.SINCE_TURN:
            since = self.turn_start
        return min(max(since, 1), self.seq + 1)

    # ----------------------------------------------------------------- state

    def _observe(self, seq: int, head: _EventHead) -> None:
        kind = head.msg.type
        if kind == "task_started":
            self.task = head.id
            self.turn_start = seq
        elif kind in _TASK_ENDS or (kind == "error" and head.id == self.task):
            # The agent drops a finished task's unanswered requests too.
            self.task = None
            self.pending.clear()
        elif kind in _APPROVAL_REQUESTS and head.msg.call_id:
            self.pending[head.msg.call_id] = _Approval(head.id, head.msg.call_id)
        elif kind == "session_configured":
            self.configured = True
            self.refused = False
            if head.msg.model:
                self.model = head.msg.model
            if head.msg.session_id:
                self.announced_id = head.msg.session_id
        if kind == "error" and not self.configured and head.id == self.configure_id:
            self.refused = True

    @property
    def state(self) -> str:
        if self.pending:
            return wire.STATE_WAITING
        return wire.STATE_IDLE if self.task is None else wire.STATE_RUNNING

    def approval(self, answer_id: str) -> _Approval | None:
        """The request an answer's ``id`` names (a call_id, or the request's event id as Codex
        frontends send): a pending one first, else the newest answered one."""
        found = self.pending.get(answer_id)
        if found is None:
            found = next((a for a in self.pending.values() if a.event_id == answer_id), None)
        if found is None:
            found = self.answered.get(answer_id)
        if found is None:
            found = next((a for a in reversed(self.answered.values()) if a.event_id == answer_id), None)
        return found

    def resolve(self, approval: _Approval, decision: str, by: str) -> None:
        del self.pending[approval.call_id]
        approval.decision = decision
        approval.by = by
        self.answered[approval.call_id] = approval
        while len(self.answered) > ANSWERED_KEPT:
            self.answered.popitem(last=False)

    def info(self) -> wire.SessionInfo:
        return wire.SessionInfo(
            id=self.id,
            cwd=self.cwd,
            model=self.model,
            state=self.state,
            frontends=[frontend_name(sub.peer) for sub in self.subscriptions.values()],
            created=self.created,
            seq=self.seq,
            turn_start=self.turn_start,
            pending_approvals=list(self.pending),
        )

    def close(self) -> None:
        """Drop the kept events (the journal's files included)."""
        self.log.clear()
        self.log_bytes = 0
        if self.journal is not None:
            self.journal.close()
            self.journal = None

    def __repr__(self) -> str:
        return f"<Session {self.id} seq={self.seq} {self.state} frontends={len(self.subscriptions)}>"


class Subscription:
    """One frontend's cursor in one session's events (see "Delivery promise" above)."""

    __slots__ = ("peer", "session", "next_seq", "acked", "unacked_bytes", "live", "active", "scheduled", "owes_notice",
                 "held_seq", "held_bytes")

    def __init__(self, peer: Peer, session: Session) -> None:
        self.peer = peer
        self.session = session
        self.next_seq = session.seq + 1
        # The last seq the frontend acknowledged, and the bytes sent since that it has not.
        self.acked = session.seq
        self.unacked_bytes = 0
        # At the head, sent each event as it is published; otherwise catching up (pumped).
        self.live = True
        # False once unsubscribed: a pump scheduled before then does nothing.
        self.active = True
        self.scheduled = False
        # A ``lagged`` message is due: it could not go out when the subscription fell behind.
        self.owes_notice = False
        # Acks not credited yet: the frontend was behind when they came.
        self.held_seq = 0
        self.held_bytes = 0

    @property
    def in_flight(self) -> int:
        return self.next_seq - 1 - self.acked

    @property
    def has_room(self) -> bool:
        return self.in_flight < wire.SESSION_WINDOW_EVENTS and self.unacked_bytes < wire.SESSION_WINDOW_BYTES

    def start_at(self, seq: int) -> None:
        """Send ``seq`` next, whatever was in flight (an ``attach``: the frontend drops what
        reaches it before ``attached``)."""
        self.next_seq = seq
        self.acked = seq - 1
        self.unacked_bytes = 0
        self.live = seq > self.session.seq
        self.owes_notice = False

    def fits(self, block: Block) -> bool:
        """Whether the window takes all of ``block`` (as :attr:`has_room` would, event by event)."""
        return (self.in_flight + block.count <= wire.SESSION_WINDOW_EVENTS
                and self.unacked_bytes + block.nbytes - block.last_size < wire.SESSION_WINDOW_BYTES)

    def sent(self, count: int, size: int) -> None:
        self.next_seq += count
        self.unacked_bytes += size

    def skip_to(self, seq: int) -> None:
        """Go on at ``seq``. The events skipped were never sent, so ``acked`` moves along to
        keep the count in flight as it was; acks for events from before the skip then count
        for nothing, and the first ack after it (one comes within a window) settles it."""
        in_flight = self.in_flight
        self.next_seq = seq
        self.acked = seq - 1 - in_flight

    def credit(self, seq: int, size: int) -> None:
        """The frontend has consumed the events up to ``seq``, ``size`` bytes since its last ack."""
        if seq > self.acked:
            self.acked = min(seq, self.next_seq - 1)
        # Nothing in flight is an exact reckoning: it also mends a frontend's miscounted bytes.
        self.unacked_bytes = 0 if self.in_flight == 0 else max(0, self.unacked_bytes - size)

    def __repr__(self) -> str:
        mode = "live" if self.live else "catching up"
        return f"<Subscription {self.peer.name} -> {self.session.id} next={self.next_seq} acked={self.acked} {mode}>"


class Sessions:
    """The sessions of one daemon; the router calls the ``on_*`` methods.

    ``journal_dir``: where sessions keep their journals, a path or a directory descriptor
    (None: memory log only); ``journal_space``: the cap on all of them together.
    """

    def __init__(self, router: Router, starter: AgentStarter | None = None, journal_dir: str | int | None = None,
                 journal_space: JournalSpace | None = None) -> None:
        self.router = router
        self.starter = starter
        self.journal_dir = journal_dir
        self.journal_space = journal_space
        self.max_sessions = MAX_SESSIONS
        self.sessions: dict[str, Session] = {}
        # A session's earlier id (the daemon's uuid) -> its id now, for sessions that took
        # their resumed rollout's id: frontends and the agent may still use the first one.
        self.aliases: dict[str, str] = {}
        # session id -> the routing identities of its frontends, for sessions closed lately (bounded).
        self.closed: collections.OrderedDict[str, list[bytes]] = collections.OrderedDict()
        # The agent process's peer once it said hello (candidate), then serve (agent).
        self.candidate: Peer | None = None
        self.agent: Peer | None = None
        self.pending: list[list] = []
        # Subscriptions whose last send found their frontend's queue full; retried each heartbeat.
        self.stuck: set[Subscription] = set()
        # Sessions with events published and not yet sent to their live subscriptions, in
        # the order they got them (an ordered set); flushed once per loop turn.
        self.dirty: dict[Session, None] = {}
        self._flush_scheduled = False
        self._throttle = Throttle(log)

    # ------------------------------------------------------------- frontends

    def on_submit(self, peer: Peer, head: wire.Header, frames: list) -> None:
        body = frames[2]
        try:
            submission = wire.decode_with(_submission_head, body, "submission")
        except wire.WireError as e:
            return self._tell(peer, head, "", f"invalid submission: {e.reason}")
        if self.router.closing:
            return self._tell(peer, head, submission.id, DAEMON_SHUTTING_DOWN)
        op = submission.op
        created = False
        if head.session:
            session = self._get(head.session)
            if session is None:
                return self._tell(peer, head, submission.id, f"unknown session {head.session}")
        elif op.type != "configure_session":
            return self._tell(peer, head, submission.id, NO_SESSION)
        elif len(self.sessions) >= self.max_sessions:
            self._throttle("warning", "session refused: too many sessions", sessions=len(self.sessions))
            return self._tell(peer, head, submission.id,
                              f"the daemon hosts {self.max_sessions} sessions already; shut some down")
        else:
            session = self._create()
            session.configure_id = submission.id
            created = True
            log.info("session created", session=session.id, frontend=peer.name)
        if op.type == _TYPING:
            # Typing into a running command is for a frontend that watches the session (it
            # sees what the command prints, and who else types), not a passer-by.
            if peer.identity not in session.subscriptions:
                return self._tell(peer, head, submission.id,
                                  f"attach to session {session.id} before typing into its commands")
            body = typed_by(body, frontend_name(peer))
        self._flush(session)  # what it publishes before the answer reaches its frontends first
        if op.type == "configure_session" and op.cwd:
            session.cwd = op.cwd
        if peer.identity not in session.subscriptions:
            self._send_attached(self._subscribe(peer, session), head.corr, session.seq)
        parts = [wire.header(wire.SUBMIT, head.corr, session=session.agent_key), body]
        if op.type in _APPROVAL_ANSWERS and op.id:
            self._answer_approval(peer, head, session, submission, parts)
        elif not self._forward(session, submission.id, parts) and created:
            # The agent never heard of it (the error event said why): no session is left behind.
            self._drop(session)
            self._forget(session)
            log.info("session refused", session=session.id, frontend=peer.name)

    def on_attach(self, peer: Peer, head: wire.Header, frames: list) -> None:
        """Subscribe ``peer`` from the event ``head.seq`` asks for (re-positioning it if it was)."""
        session = self._get(head.session)
        if session is None:
            return self._tell(peer, head, "", f"unknown session {head.session}")
        self._flush(session)  # what the frontend gets before ``attached`` belongs to its old position
        wanted = session.start_for(head.seq)
        first = session.first_kept(wanted)
        sub = self._subscribe(peer, session)
        sub.start_at(first)
        self._send_attached(sub, head.corr, first - 1)
        if first > wanted:
            # ``attached`` says where the stream starts; this says why not where asked.
            self._tell_laggard(sub, _gap_message(wanted, first))
        self._pump(sub)

    def on_detach(self, peer: Peer, head: wire.Header, frames: list) -> None:
        self._unsubscribe(peer, head.session)

    def on_list(self, peer: Peer, head: wire.Header, frames: list) -> None:
        """Answer ``sessions`` with every session's :class:`~broker.wire.frames.SessionInfo`."""
        router = self.router
        listing = wire.SessionList(
            sessions=[session.info() for session in self.sessions.values() if not session.refused],
            frontends=sum(1 for p in router.callers.values() if p.role == wire.ROLE_FRONTEND),
            executors=len(router.executors),
        )
        router.send(peer, [peer.identity, *wire.message(wire.SESSIONS, head.corr, listing)])

    def journal_bytes(self) -> int | None:
        """Bytes the session journals hold on disk; None when journaling is off."""
        directory = self.journal_dir
        if directory is None:
            return None
        total = 0
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    with contextlib.suppress(OSError):
                        total += entry.stat(follow_symlinks=False).st_size
        except OSError:
            return None
        return total

    def on_ack(self, peer: Peer, head: wire.Header, frames: list) -> None:
        """A session ack (``session`` set, no ``corr``): credit, and resume a frontend catching up."""
        session = self._get(head.session)
        sub = session.subscriptions.get(peer.identity) if session is not None else None
        if sub is None:
            return  # detached, or the session ended, while the ack was on its way
        sub.held_seq = max(sub.held_seq, head.seq)
        sub.held_bytes += max(0, head.n)
        self._credit(sub)

    def caught_up(self, peer: Peer) -> None:
        """A frontend that was behind is no longer: credit the acks it sent meanwhile."""
        for session_id in list(peer.sessions):
            session = self._get(session_id)
            sub = session.subscriptions.get(peer.identity) if session is not None else None
            if sub is not None:
                self._credit(sub)

    def _credit(self, sub: Subscription) -> None:
        """Credit a frontend's acks unless it is behind (then :meth:`caught_up` does): a
        frontend that acks events it never reads cannot make the broker queue more for it
        (as for calls, :meth:`broker.daemon.router.Router._pass_credit`)."""
        if not sub.active or not (sub.held_seq or sub.held_bytes) or sub.peer.receipts.behind:
            return
        sub.credit(sub.held_seq, sub.held_bytes)
        sub.held_seq = sub.held_bytes = 0
        if not sub.live and not sub.scheduled:
            self._pump(sub)

    def _get(self, session_id: str) -> Session | None:
        """The session known by ``session_id``, its id now or the one it had first."""
        session = self.sessions.get(session_id)
        if session is None and session_id in self.aliases:
            session = self.sessions.get(self.aliases[session_id])
        return session

    def _drop(self, session: Session) -> None:
        self.sessions.pop(session.id, None)
        self.aliases.pop(session.agent_key, None)

    def _adopt_id(self, session: Session) -> None:
        """The agent gave the session another id (it resumed a rollout): frontends call it
        that from now on. The event that said so went out under the old one, which stays
        an alias, so a frontend that has not seen it yet still reaches the session."""
        new_id, session.announced_id = session.announced_id, None
        if new_id is None or new_id == session.id:
            return
        if new_id in self.sessions or new_id in self.aliases:
            log.warning("session keeps its id: the one it announced is taken", session=session.id, announced=new_id)
            return
        old_id = session.id
        del self.sessions[old_id]
        self.sessions[new_id] = session
        session.id = new_id
        self.aliases[session.agent_key] = new_id
        for sub in session.subscriptions.values():
            sub.peer.sessions.discard(old_id)
            sub.peer.sessions.add(new_id)
        log.info("session takes its rollout's id", session=new_id, was=old_id)

    def _create(self) -> Session:
        session_id = str(uuid.uuid4())
        journal = None
        if self.journal_dir is not None:
            journal = Journal(self.journal_dir, session_id, space=self.journal_space)
        session = self.sessions[session_id] = Session(session_id, journal)
        return session

    def _subscribe(self, peer: Peer, session: Session) -> Subscription:
        sub = session.subscriptions.get(peer.identity)
        if sub is None:
            sub = session.subscriptions[peer.identity] = Subscription(peer, session)
            peer.sessions.add(session.id)
        return sub

    def _unsubscribe(self, peer: Peer, session_id: str) -> None:
        session = self._get(session_id)
        if session is not None:
            self._flush(session)  # events published before the detach are delivered
        sub = session.subscriptions.pop(peer.identity, None) if session is not None else None
        if sub is not None:
            self._deactivate(sub)
        peer.sessions.discard(session_id)
        if session is not None:
            peer.sessions.discard(session.id)

    def _deactivate(self, sub: Subscription) -> None:
        sub.active = False
        sub.live = False
        self.stuck.discard(sub)

    def _send_attached(self, sub: Subscription, corr: str, seq: int) -> None:
        peer, session = sub.peer, sub.session
        hdr = wire.header(wire.ATTACHED, corr, session=session.id, seq=seq, n=session.seq)
        self.router.send(peer, [peer.identity, hdr, wire.encode(session.info())])

    def _tell(self, peer: Peer, head: wire.Header, sub_id: str, message: str) -> None:
        """An error about a request, to this frontend only, outside the numbered stream (seq 0)."""
        session = self._get(head.session) if head.session else None
        if session is not None:
            self._flush(session)  # after the events published before it (an approval's resolution)
        self._throttle("info", "session request refused", reason=message, frontend=peer.name)
        hdr = wire.header(wire.EVENT, head.corr, session=head.session)
        self.router.send(peer, [peer.identity, hdr, error_event(sub_id, message)])

    # ------------------------------------------------------------- approvals

    def _answer_approval(self, peer: Peer, head: wire.Header, session: Session, submission, parts: list) -> None:
        """The first answer to a request wins: forwarded, and announced to every frontend."""
        op = submission.op
        approval = session.approval(op.id)
        if approval is None:
            self._forward(session, submission.id, parts)  # nothing pending: the agent ignores it
            return
        if approval.decision is not None:
            message = f"approval {approval.call_id} was already answered by {approval.by} ({approval.decision})"
            return self._tell(peer, head, submission.id, message)
        by = frontend_name(peer)
        try:
            resolved = approval_resolved_event(approval.event_id, approval.call_id, op.decision, by)
        except ValueError:
            self._forward(session, submission.id, parts)  # not an answer: the agent says what is wrong
            return
        if self._forward(session, submission.id, parts):
            session.resolve(approval, op.decision, by)
            self._publish(session, resolved)

    # ---------------------------------------------------------------- agent

    def _forward(self, session: Session, sub_id: str, parts: list) -> bool:
        """Hand a submission to the agent, or hold it while the agent starts; False if refused."""
        agent = self.agent
        if agent is None:
            held = sum(len(part) for waiting in self.pending for part in waiting)
            if len(self.pending) >= PENDING_LIMIT or held + sum(len(part) for part in parts) > PENDING_BYTES:
                self._publish_error(session, sub_id, "the daemon is busy starting its agent; try again")
                return False
            self.pending.append(parts)
            if self.starter is not None:
                self.starter.ensure_started()
            return True
        if self.router.send(agent, [agent.identity, *parts]):
            return True
        if not agent.gone:
            self._publish_error(session, sub_id, "the agent is not taking submissions (its queue is full); try again")
        return False

    def on_event(self, peer: Peer, head: wire.Header, frames: list) -> None:
        if peer is not self.agent:
            return self.router.reply_error(peer, head.corr, "only the daemon's agent process may send events")
        session = self._get(head.session)
        if session is None:
            identities = self.closed.get(head.session)
            if identities is None:
                self._throttle("debug", "event for an unknown session dropped", session=head.session)
                return
            # An answer to a submission that crossed the close (the agent says the
            # session is unknown): to its old frontends, outside the numbered stream.
            hdr = wire.header(wire.EVENT, head.corr, session=head.session)
            for identity in identities:
                frontend = self.router.peers.get(identity)
                if frontend is not None:
                    self.router.send(frontend, [identity, hdr, frames[2]])
            return
        self._publish(session, frames[2])
        if session.announced_id is not None:
            self._flush(session)  # the event that says so goes out under the id it had
            self._adopt_id(session)

    def on_closed(self, peer: Peer, head: wire.Header, frames: list) -> None:
        if peer is not self.agent:
            return self.router.reply_error(peer, head.corr, "only the daemon's agent process may close sessions")
        session = self._get(head.session)
        if session is None:
            return
        self._flush(session)
        self._drop(session)
        # Late answers come from the agent under its key for the session.
        self.closed[session.agent_key] = list(session.subscriptions)
        if len(self.closed) > RECENTLY_CLOSED:
            self.closed.popitem(last=False)
        for sub in session.subscriptions.values():
            if not sub.live:
                self._tell_laggard(sub, f"the session was shut down before events {sub.next_seq}..{session.seq} "
                                        "reached this frontend")
        self._forget(session)
        log.info("session closed", session=session.id, events=session.seq)

    def on_serve(self, peer: Peer, head: wire.Header, frames: list) -> None:
        if peer is not self.candidate:
            return self.router.reply_error(peer, head.corr, "only the daemon's agent process may host sessions")
        self.candidate = None
        self.agent_joined(peer)

    def agent_joined(self, peer: Peer) -> None:
        if self.agent is not None and self.agent is not peer:
            log.warning("a second agent process said hello; the first one keeps the sessions", name=peer.name)
            return
        self.agent = peer
        pending, self.pending = self.pending, []
        if pending:
            log.info("forwarding submissions that waited for the agent", count=len(pending))
        for parts in pending:
            if not self.router.send(peer, [peer.identity, *parts]):
                break

    def agent_lost(self, why: str) -> None:
        """The agent (or the process that was to become it) is gone, and its sessions with it."""
        self.agent = None
        self.pending.clear()
        sessions = list(self.sessions.values())
        if sessions:
            log.warning("sessions lost with the agent", count=len(sessions), why=why)
        # True since every item is written as it is recorded (agent.rollout).
        self._end_all(f"{why}; this session is gone (its rollout file keeps the conversation: "
                      "`sluice exec -c experimental_resume=PATH` goes on from it)")

    # ----------------------------------------------------------- publishing

    def _publish(self, session: Session, body) -> None:
        """Number ``body`` as the session's next event; it goes to the live subscriptions
        when the session is flushed, at the end of this loop turn (with the other events
        published meanwhile) or before anything else reaches its frontends."""
        session.append(body)
        if session.subscriptions and session not in self.dirty:
            self.dirty[session] = None
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self.router._defer(self._flush_all)

    def _publish_error(self, session: Session, sub_id: str, message: str) -> None:
        self._publish(session, error_event(sub_id, message))

    def _flush_all(self) -> None:
        self._flush_scheduled = False
        while self.dirty:
            self._flush(next(iter(self.dirty)))

    def _flush(self, session: Session) -> None:
        """Send the events published since the session was last flushed to every live
        subscription: one ``events`` message, built once, the same frame for every frontend
        at the same position; one whose window does not take it all gets what fits (then
        ``lagged``)."""
        if self.dirty.pop(session, _CLEAN) is _CLEAN:
            return
        head = session.seq
        shared = None
        for sub in list(session.subscriptions.values()):
            if not sub.live or sub.next_seq > head:
                continue
            if shared is None or shared[0].first != sub.next_seq:
                block = session.read(sub.next_seq, head - sub.next_seq + 1, _UNBOUNDED)
                shared = (block, *self._frames(session, block)) if block is not None else (None, None, None)
            block, hdr, body = shared
            if block is None or block.first != sub.next_seq or block.last != head or not sub.fits(block):
                # Not all of it, or not from where it is: as a frontend catching up would.
                sub.live = False
                status = self._send_kept(sub, _UNBOUNDED, _UNBOUNDED)
                if status == _AT_HEAD:
                    sub.live = True
                elif status != _GONE:
                    self._fall_behind(sub, stuck=status == _STUCK)
            elif not self._send(sub, block, hdr, body) and not sub.peer.gone:
                self._fall_behind(sub, stuck=True)

    def _frames(self, session: Session, block: Block) -> tuple[bytes, zmq.Frame]:
        """The header and body of an ``events`` message carrying ``block``; the body as a
        frame that libzmq shares between the frontends it goes to, without copying it."""
        hdr = wire.header(wire.EVENTS, session=session.id, seq=block.first, n=block.count)
        return hdr, zmq.Frame(wire.events_body(block.count, block.parts))

    def _send(self, sub: Subscription, block: Block, hdr: bytes | None = None, body=None) -> bool:
        peer = sub.peer
        if hdr is None:
            hdr, body = self._frames(sub.session, block)
        if not self.router.send(peer, [peer.identity, hdr, body]):
            return False
        sub.sent(block.count, block.nbytes)
        return True

    def _fall_behind(self, sub: Subscription, *, stuck: bool = False) -> None:
        """``sub`` stops being live; its frontend is told once (``lagged``) and the pump takes over."""
        sub.live = False
        sub.owes_notice = True
        if not self._notify_lagged(sub) or stuck:
            self._stuck(sub)
        # Otherwise its window is full: its acks resume it.

    def _notify_lagged(self, sub: Subscription) -> bool:
        peer = sub.peer
        hdr = wire.header(wire.LAGGED, session=sub.session.id, seq=sub.next_seq - 1)
        if self.router.send(peer, [peer.identity, hdr]):
            sub.owes_notice = False
        return not sub.owes_notice

    def _stuck(self, sub: Subscription) -> None:
        if sub.active and not sub.peer.gone:  # a vanished peer is dropped on the next loop turn
            self.stuck.add(sub)

    def _pump(self, sub: Subscription) -> None:
        """Send a catching-up subscription its next events: a bounded batch per loop turn,
        never past its window; it is live again once it reaches the head."""
        sub.scheduled = False
        self.stuck.discard(sub)
        if not sub.active or sub.live:
            return
        if sub.owes_notice and not self._notify_lagged(sub):
            return self._stuck(sub)
        status = self._send_kept(sub, PUMP_EVENTS, PUMP_BYTES)
        if status == _AT_HEAD:
            sub.live = True
        elif status == _BUDGET:
            self._schedule(sub)
        elif status == _STUCK:
            self._stuck(sub)
        # _WINDOW: the frontend's next ack resumes it.

    def _send_kept(self, sub: Subscription, budget_events: int, budget_bytes: int) -> str:
        """Send ``sub`` its next events from the log and journal, in blocks, while its
        window and the budget allow; says why it stopped (at the head, window full, budget
        spent, the frontend's queue full, or gone)."""
        session = sub.session
        while sub.has_room:
            if sub.next_seq > session.seq:
                return _AT_HEAD
            if budget_events <= 0 or budget_bytes <= 0:
                return _BUDGET
            block = session.read(
                sub.next_seq,
                min(budget_events, wire.SESSION_WINDOW_EVENTS - sub.in_flight),
                min(budget_bytes, wire.SESSION_WINDOW_BYTES - sub.unacked_bytes),
            )
            first = block.first if block is not None else session.seq + 1
            if first > sub.next_seq and not self._skip(sub, first):
                return _GONE if sub.peer.gone else _STUCK
            if block is not None:
                if not self._send(sub, block):
                    return _GONE if sub.peer.gone else _STUCK
                budget_events -= block.count
                budget_bytes -= block.nbytes
        return _WINDOW

    def _schedule(self, sub: Subscription) -> None:
        if not sub.scheduled:
            sub.scheduled = True
            self.router._defer(functools.partial(self._pump, sub))

    def _skip(self, sub: Subscription, first: int) -> bool:
        """Tell the frontend that events ``sub.next_seq .. first - 1`` are gone; go on at ``first``."""
        if not self._tell_laggard(sub, _gap_message(sub.next_seq, first)):
            return False
        self._throttle("warning", "events no longer kept were skipped for a frontend", session=sub.session.id,
                       frontend=sub.peer.name, first=sub.next_seq, last=first - 1)
        sub.skip_to(first)
        return True

    def _tell_laggard(self, sub: Subscription, message: str) -> bool:
        """An unnumbered error event to one subscription's frontend; False if it did not go out."""
        peer = sub.peer
        hdr = wire.header(wire.EVENT, session=sub.session.id)
        return self.router.send(peer, [peer.identity, hdr, error_event("", message)])

    def heartbeat(self) -> None:
        """Called every heartbeat: retry the subscriptions whose frontend's queue was full."""
        stuck, self.stuck = self.stuck, set()
        for sub in stuck:
            self._pump(sub)

    # ---------------------------------------------------------------- peers

    def peer_left(self, peer: Peer, why: str) -> None:
        """A frontend or agent peer was dropped by the router."""
        if peer is self.candidate:
            self.candidate = None
        if peer is self.agent:
            self.agent_lost(f"the agent process {_AGENT_WHY.get(why, why)}")
            return
        for session_id in list(peer.sessions):
            self._unsubscribe(peer, session_id)

    def _end_all(self, message: str) -> None:
        """Every session ends with ``message``: numbered for the frontends at the head, and
        unnumbered for those still catching up (they will never get there)."""
        sessions = list(self.sessions.values())
        self.sessions.clear()
        self.aliases.clear()
        for session in sessions:
            unanswered = ""
            if session.pending:  # say what ends unanswered, not just that it ends
                unanswered = (f"; the approval it waited for ({', '.join(session.pending)}) "
                              "ends unanswered")
            self._publish_error(session, "", message + unanswered)
            self._flush(session)
            for sub in session.subscriptions.values():
                if not sub.live:
                    self._tell_laggard(sub, message)
            self._forget(session)

    def _forget(self, session: Session) -> None:
        self._flush(session)  # its last events (an error saying why it ends) go out first
        for sub in session.subscriptions.values():
            self._deactivate(sub)
            sub.peer.sessions.discard(session.id)
        session.subscriptions.clear()
        session.close()

    def close(self, message: str) -> None:
        """The daemon is stopping: tell every session's frontends, then forget them all."""
        self._end_all(message)
        self.pending.clear()
