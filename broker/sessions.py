"""Sessions in the daemon: which frontends watch which session, event numbering, the agent.

The broker hosts every session in the one agent process it spawns (see
:class:`broker.supervisor.AgentSupervisor`). This module is the bookkeeping around that,
driven by the router (:mod:`broker.router`):

- ``submit`` from a frontend: an empty session id with ``configure_session`` creates a
  session (uuid4); a known id continues one. Either way the frontend is attached (told
  with ``attached``) and the submission goes to the agent as it came, at once, in
  arrival order; an interrupt is therefore never behind anything the broker holds.
  While the agent is starting, submissions wait in a bounded list.
- ``event`` from the agent: numbered with the session's next ``seq`` (in the header; the
  body frame is forwarded untouched, never decoded), remembered in a small bounded log,
  and sent to every attached frontend.
- ``closed`` from the agent: it let go of the session (after ``shutdown``); forgotten.
- The agent going away (its process died, it stopped answering, it left): every session
  gets an ``error`` event saying so and is forgotten; the supervisor starts a new agent.

What the broker itself reports about a session is an ``event`` whose body is a Codex
``Event`` with an ``error`` message, so a frontend shows it like any other error.

Only the head of a submission is decoded (its id and op type): the rest, the API key of a
``configure_session`` included, passes through as bytes.
"""

from __future__ import annotations

import collections
import time
import uuid
from typing import TYPE_CHECKING, Protocol

import msgspec
import structlog

from broker import wire
from broker.logging import Throttle

if TYPE_CHECKING:
    from broker.router import Peer, Router

log = structlog.get_logger(component="sessions")

# Submissions held while the agent starts; more is refused.
PENDING_LIMIT = 1000
# Sessions one daemon hosts at most.
MAX_SESSIONS = 10_000
# The per-session event log keeps at most this many recent events / bytes (for attach
# and replay; older events are in the session's rollout file).
LOG_EVENTS = 4096
LOG_BYTES = 8 * 1024 * 1024

# Sessions just closed whose frontends still get the agent's late answers (to
# submissions that crossed the close), without a seq, like any "unknown session" error.
RECENTLY_CLOSED = 256

# Codex's answer to an op before configure_session.
NO_SESSION = "No session initialized, expected 'ConfigureSession' as first Op"


# The router's reasons for dropping a peer, as said of the agent.
_AGENT_WHY = {"said bye": "left", "unreachable": "became unreachable"}


class AgentStarter(Protocol):
    """What the sessions need from whoever spawns the agent."""

    def ensure_started(self) -> None:
        """Start the agent process unless it is running or about to be."""


class _OpHead(msgspec.Struct):
    type: str


class _SubmissionHead(msgspec.Struct):
    id: str
    op: _OpHead


_head_decoder = msgspec.msgpack.Decoder(_SubmissionHead)


class Session:
    """A session as the broker sees it: its frontends, its event numbering, a bounded log."""

    __slots__ = ("id", "seq", "frontends", "log", "log_bytes", "created")

    def __init__(self, session_id: str) -> None:
        self.id = session_id
        self.seq = 0
        self.frontends: dict[bytes, Peer] = {}
        # (seq, body frame), oldest first; bounded by LOG_EVENTS and LOG_BYTES.
        self.log: collections.deque = collections.deque()
        self.log_bytes = 0
        self.created = time.time()

    def remember(self, seq: int, body) -> None:
        size = len(body)
        self.log.append((seq, body))
        self.log_bytes += size
        while len(self.log) > LOG_EVENTS or (self.log_bytes > LOG_BYTES and len(self.log) > 1):
            _, old = self.log.popleft()
            self.log_bytes -= len(old)

    def __repr__(self) -> str:
        return f"<Session {self.id} seq={self.seq} frontends={len(self.frontends)}>"


def error_event(sub_id: str, message: str) -> bytes:
    """A Codex ``Event`` with an ``error`` message, as msgpack."""
    from broker.protocol import ErrorEvent, Event, encode_msgpack

    return encode_msgpack(Event(id=sub_id, msg=ErrorEvent(message)))


class Sessions:
    """The sessions of one daemon; the router calls the ``on_*`` methods."""

    def __init__(self, router: Router, starter: AgentStarter | None = None) -> None:
        self.router = router
        self.starter = starter
        self.sessions: dict[str, Session] = {}
        # session id -> the frontends it had, for sessions closed lately (bounded).
        self.closed: collections.OrderedDict[str, list[Peer]] = collections.OrderedDict()
        # The agent process's peer once it said hello (candidate), then serve (agent).
        self.candidate: Peer | None = None
        self.agent: Peer | None = None
        self.pending: list[list] = []
        self._throttle = Throttle(log)

    # ------------------------------------------------------------- frontends

    def on_submit(self, peer: Peer, head: wire.Header, frames: list) -> None:
        body = frames[2]
        try:
            sub = _head_decoder.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            return self._tell(peer, head, "", f"invalid submission: {e}")
        if self.router.closing:
            return self._tell(peer, head, sub.id, "the sluice daemon is shutting down")
        session_id = head.session
        if not session_id:
            if sub.op.type != "configure_session":
                return self._tell(peer, head, sub.id, NO_SESSION)
            if len(self.sessions) >= MAX_SESSIONS:
                return self._tell(peer, head, sub.id, f"the daemon hosts {MAX_SESSIONS} sessions already; shut some down")
            session_id = str(uuid.uuid4())
            session = self.sessions[session_id] = Session(session_id)
            log.info("session created", session=session_id, frontend=peer.name)
        else:
            session = self.sessions.get(session_id)
            if session is None:
                return self._tell(peer, head, sub.id, f"unknown session {session_id}")
        if peer.identity not in session.frontends:
            self.attach(peer, session, head.corr)
        parts = [wire.header(wire.SUBMIT, head.corr, session=session_id), body]
        agent = self.agent
        if agent is None:
            if len(self.pending) >= PENDING_LIMIT:
                return self._publish_error(session, sub.id, "the daemon is busy starting its agent; try again")
            self.pending.append(parts)
            if self.starter is not None:
                self.starter.ensure_started()
            return
        if not self.router.send(agent, [agent.identity, *parts]) and not agent.gone:
            self._publish_error(session, sub.id, "the agent is not taking submissions (its queue is full); try again")

    def attach(self, peer: Peer, session: Session, corr: str = "") -> None:
        session.frontends[peer.identity] = peer
        peer.sessions.add(session.id)
        self.router.send(peer, [peer.identity, wire.header(wire.ATTACHED, corr, session=session.id, seq=session.seq)])

    def detach(self, peer: Peer, session_id: str) -> None:
        session = self.sessions.get(session_id)
        if session is not None:
            session.frontends.pop(peer.identity, None)
        peer.sessions.discard(session_id)

    def _tell(self, peer: Peer, head: wire.Header, sub_id: str, message: str) -> None:
        """An error about a session that does not exist: to this frontend only, seq 0."""
        self._throttle("info", "submission refused", reason=message, frontend=peer.name)
        hdr = wire.header(wire.EVENT, head.corr, session=head.session)
        self.router.send(peer, [peer.identity, hdr, error_event(sub_id, message)])

    # ---------------------------------------------------------------- agent

    def on_event(self, peer: Peer, head: wire.Header, frames: list) -> None:
        if peer is not self.agent:
            return self.router.reply_error(peer, head.corr, "only the daemon's agent process may send events")
        session = self.sessions.get(head.session)
        if session is None:
            frontends = self.closed.get(head.session)
            if frontends is None:
                self._throttle("debug", "event for an unknown session dropped", session=head.session)
                return
            # An answer to a submission that crossed the close (the agent says the
            # session is unknown): to its old frontends, outside the numbered stream.
            hdr = wire.header(wire.EVENT, head.corr, session=head.session)
            for frontend in frontends:
                self.router.send(frontend, [frontend.identity, hdr, frames[2]])
            return
        self._publish(session, frames[2], head.corr)

    def on_closed(self, peer: Peer, head: wire.Header, frames: list) -> None:
        if peer is not self.agent:
            return self.router.reply_error(peer, head.corr, "only the daemon's agent process may close sessions")
        session = self.sessions.pop(head.session, None)
        if session is not None:
            self.closed[session.id] = list(session.frontends.values())
            if len(self.closed) > RECENTLY_CLOSED:
                self.closed.popitem(last=False)
            self._forget(session)
            log.info("session closed", session=session.id, events=session.seq)

    def _publish(self, session: Session, body, corr: str = "") -> None:
        session.seq += 1
        seq = session.seq
        session.remember(seq, body)
        hdr = wire.header(wire.EVENT, corr, session=session.id, seq=seq)
        send = self.router.send
        for frontend in list(session.frontends.values()):
            send(frontend, [frontend.identity, hdr, body])

    def _publish_error(self, session: Session, sub_id: str, message: str) -> None:
        self._publish(session, error_event(sub_id, message))

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
        self.sessions.clear()
        if sessions:
            log.warning("sessions lost with the agent", count=len(sessions), why=why)
        message = f"{why}; this session is gone (its rollout file keeps the conversation)"
        for session in sessions:
            self._publish_error(session, "", message)
            self._forget(session)

    # ---------------------------------------------------------------- peers

    def peer_left(self, peer: Peer, why: str) -> None:
        """A frontend or agent peer was dropped by the router."""
        if peer is self.candidate:
            self.candidate = None
        if peer is self.agent:
            self.agent_lost(f"the agent process {_AGENT_WHY.get(why, why)}")
            return
        for session_id in list(peer.sessions):
            self.detach(peer, session_id)

    def _forget(self, session: Session) -> None:
        for frontend in session.frontends.values():
            frontend.sessions.discard(session.id)
        session.frontends.clear()
        session.log.clear()

    def close(self, message: str) -> None:
        """The daemon is stopping: tell every session's frontends, then forget them all."""
        for session in list(self.sessions.values()):
            self._publish_error(session, "", message)
            self._forget(session)
        self.sessions.clear()
        self.pending.clear()
