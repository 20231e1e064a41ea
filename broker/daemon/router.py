"""Message routing in the daemon: who is connected, which call runs where, the run queue.

The router is pure bookkeeping over one ROUTER socket. It never blocks and never
decodes what it merely forwards: a ``run`` body is decoded once (to refuse a bad request
before it occupies an executor), ``out`` bodies never. Everything an executor sends about
a call goes to the call's frontend as the original frames, and ``ack``/``cancel`` go the
other way the same way.

Peer loss is discovered in three ways, all ending in the same two paths
(:meth:`Router.drop_caller` / :meth:`Router.drop_executor`): a send that fails with
EHOSTUNREACH (ROUTER_MANDATORY), a peer that stops answering pings, and, for executors
and the agent the daemon spawned, the process exiting (reported by the supervisors).

Peers come over the local ipc socket (authenticated by the token in their hello) or,
when the daemon listens on tcp, over the network (authenticated by CurveZMQ and ZAP
before any message reaches us, see :mod:`broker.daemon.listener`). The router tells them apart only
by the :data:`REMOTE` byte the daemon puts in front of a network peer's identity; a
network peer may be a frontend or an executor, never the agent, and is never taken for
a process the daemon spawned. Which of the two it may be, ZAP decided by the allow-list
that holds its key (``--allow`` for frontends, ``--allow-executors`` for executors) and
attached to its messages: a hello asking for another role is refused, so a frontend's
key can never receive commands, nor an executor's key send them.

A caller's ``ack`` for a call's output is checked and held before it goes on to the
executor: it may not acknowledge more than the router forwarded (refused with an error
naming what was sent), and it is passed on only while the caller is not
:attr:`~broker.daemon.receipts.Receipts.behind` (its pongs have proven that all but a
bounded amount of what it was sent left the daemon, see :mod:`broker.daemon.receipts`),
and otherwise as soon as a pong catches up. An ack is the caller's word that it read;
this makes it a fact, so a caller that acknowledges output it never reads stops its
command's flow instead of filling the daemon's queue for it. Session acks get the same
treatment in :mod:`broker.daemon.sessions`. A caller whose process is stopped (Ctrl-Z) is not dropped
for missing pings until ``suspend_limit_s``; its commands wait on their windows.

Nothing the daemon accepted for a caller is dropped: what concerns its calls (``started``,
``out``, ``exit``, notices) goes out in order or waits, in order, in the caller's
``overflow`` while its queue is full. Held credit alone would not bound that: each of a
caller's calls has a window of its own, and many chatty calls fill any queue before
their windows do. So the moment a caller is behind (or has an overflow), every one of its
calls is put on ``hold`` at its executor, which stops reading the command's pipes (the
commands block on them) until the caller has caught up. What the daemon holds for one
caller is thus :data:`~broker.daemon.receipts.UNPROVEN_BYTES` plus what its executors sent
before the hold reached them; past :data:`CALLER_HOLD_BYTES` (a hold that came late)
``out`` for it is no longer kept: each call counts what it lost, its window is given
back, and the caller is told before the call's ``exit``, in one line. Exit statuses do not
count against that bound (:meth:`Router._held_output`): each carries its call's captured
output (at most its capture limit), so calls that end together send many MiB within one
round trip to a caller that reads, and its other calls' output would be lost to them.
They are never dropped, bound or not.

Session traffic (``submit``, ``event``, ``closed``, ``attach``, ``detach``, ``sessions`` and
acks that name a session) is routed by :class:`broker.daemon.sessions.Sessions`, which the
heartbeat also drives (to retry frontends whose queue was full). The agent peer that
hosts the sessions is the one the agent supervisor spawned (matched by pid at hello) once
it says ``serve``, and it is pinged like an executor: one that stops answering is killed.
"""

from __future__ import annotations

import hmac
import math
import os
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Protocol

import msgspec
import structlog
import zmq

from broker.daemon.listener import ALLOW_FLAGS, ROLES_PROPERTY
from broker.daemon.receipts import MESSAGE_COST, Receipts
from broker.daemon.sessions import Sessions
from broker.net.logging import Throttle
from broker.net.peer import DEAD_AFTER_HEARTBEATS, FRONTEND_SILENCE_S, HEARTBEAT_S, HELLO_FIRST
from broker.wire import frames as wire
from broker.wire import version
from broker.wire.direct import close_all
from broker.wire.results import DAEMON_SHUTTING_DOWN, DAEMON_STOPPED

log = structlog.get_logger(component="router")

# Idle frontends are pinged this rarely, only to notice ones that vanished.
IDLE_PING_EVERY = 30
QUEUE_LIMIT = 100_000
# ... and at most this many bytes of them (a run carries its argv and environment).
QUEUE_BYTES = 256 * 1024 * 1024
# A stopped (suspended) frontend keeps its commands this long by default.
SUSPEND_LIMIT_S = 3600.0
# What the daemon keeps for one caller that does not read, at most (its unproven bytes
# and its overflow but exit statuses, each message counted as
# broker.daemon.receipts.MESSAGE_COST more): past it, output for that caller is counted
# as lost, not kept. docs/faults.md: "under faults".
CALLER_HOLD_BYTES = 48 * 1024 * 1024
# Frames smaller than this are copied before they are held (see _kept).
_COPY_BELOW = 4096
# Dropped callers whose reason is remembered, at most.
DROPPED_KEPT = 256
# Headers are a few dozen bytes; anything bigger is garbage we need not decode.
MAX_HEADER_SIZE = 4096
# What a peer may send in one message at most, judged as it is received, before it is
# held (broker.net.zloop): a few parts more than any kind has, so a small mistake still
# gets the precise answer about frame counts, and a body of the largest size with its
# header. (The daemon's sockets add the routing identity: one part, 256 bytes at most.)
MAX_PARTS = 7
MAX_MESSAGE_BYTES = wire.MAX_MESSAGE_SIZE + MAX_HEADER_SIZE

# Frames after the routing identity, by kind, for what peers may send the broker.
FRAME_COUNT = {
    wire.HELLO: 2,
    wire.RUN: 2,
    wire.STARTED: 2,
    wire.OUT: 2,
    wire.EXIT: 2,
    wire.ACK: 1,
    wire.IN: 2,
    wire.RESIZE: 2,
    wire.SIGNAL: 1,
    wire.CANCEL: 1,
    wire.PING: 1,
    wire.PONG: 1,
    wire.BYE: 1,
    wire.SUBMIT: 2,
    wire.EVENT: 2,
    wire.CLOSED: 1,
    wire.SERVE: 1,
    wire.ATTACH: 1,
    wire.DETACH: 1,
    wire.SESSIONS: 1,
    wire.STATUS: 1,
}
# The daemon starts the routing identity of every peer that came over the network
# (tcp, CurveZMQ) with this byte, and strips it when sending. libzmq's own identities
# start with a zero byte, and the daemon drops local peers that picked this one.
REMOTE = b"\x01"
# The first byte of a direct run's caller's identity (broker.daemon.direct): no socket's.
DIRECT = b"\x02"

INTERACTIVE_FULL = (f"no executor can host another interactive command (each hosts at most "
                    f"{wire.INTERACTIVE_PER_EXECUTOR}); end some first")
NO_LOCAL_EXECUTOR = "the daemon runs no executor of its own (started with --executors 0): no direct run"
# A run queued while no executor is connected is told so (see :meth:`Router.heartbeat`),
# and fails after this long by default (``sluice daemon --executor-wait``).
EXECUTOR_WAIT_S = 30.0
NO_EXECUTOR = ("no executor is connected to the daemon (`sluice daemon status` shows them); "
               "this command waits for one")
STILL_STARTING = "the daemon's executors are still starting (the machine is busy); this command waits for them"
# Heartbeats a queued call waits in silence for executors that are on their way (started,
# not yet joined) before it is told why it waits: a daemon just started by this very
# command has them on their way, and on a loaded machine they take seconds.
STARTING_GRACE = 10


class Supervisor(Protocol):
    """What the router needs from whoever spawned the executors."""

    def claim(self, peer: Peer) -> bool:
        """Link an executor's hello to a process we spawned (matched by pid)."""

    def kill(self, peer: Peer) -> bool:
        """SIGKILL the process behind ``peer``, if we spawned it."""

    def restarting(self) -> str | None:
        """One line on executors being restarted, for a command that waits for one."""

    def starting(self) -> bool:
        """Whether an executor it spawned is on its way (started, not yet said hello)."""

    def passes_fds(self, peer: Peer | None = None) -> bool:
        """Whether it can hand ``peer`` file descriptors (None: any executor it runs)."""

    def pass_fds(self, peer: Peer, call_id: str, fds: list[int]) -> str | None:
        """Hand ``peer`` a direct run's stdio ahead of the run; None, or why it could not."""

    def exited(self, peer: Peer) -> str | None:
        """How the process behind ``peer`` ended, if we spawned it and it has (waiting a
        moment for it): None otherwise."""


class _NoSupervisor:
    def claim(self, peer: Peer) -> bool:
        return False

    def kill(self, peer: Peer) -> bool:
        return False

    def restarting(self) -> str | None:
        return None

    def starting(self) -> bool:
        return False

    def passes_fds(self, peer: Peer | None = None) -> bool:
        return False

    def pass_fds(self, peer: Peer, call_id: str, fds: list[int]) -> str | None:
        return "no executor of this daemon's own"

    def exited(self, peer: Peer) -> str | None:
        return None


class Gate(Protocol):
    """What the router needs from whoever counts the connections (:mod:`broker.daemon.gate`)."""

    max_peers: int

    def peer_joined(self, header_frame) -> int | None:
        """The connection a hello came on is a peer's; returns a handle for :meth:`peer_left`."""

    def peer_left(self, handle: int | None) -> None:
        """That peer is gone."""

    def stopped(self, handle: int | None) -> bool:
        """That peer is a stopped process (it will answer when resumed)."""


class _NoGate:
    max_peers = 1 << 30

    def peer_joined(self, header_frame) -> int | None:
        return None

    def peer_left(self, handle: int | None) -> None:
        pass

    def stopped(self, handle: int | None) -> bool:
        return False


class Peer:
    """A DEALER that said a good hello (:meth:`from_hello`), or a :class:`DirectCaller`.
    ``calls`` holds the calls it is party to."""

    __slots__ = ("identity", "role", "name", "pid", "peer_id", "slots", "calls", "seen", "gone", "handlers", "sessions",
                 "key", "connection", "stopped_since", "receipts", "overflow", "overflow_bytes", "overflow_exits",
                 "holding", "deliver")

    def __init__(self, identity: bytes, role: str, name: str, pid: int, peer_id: str, tick: int, handlers: dict,
                 slots: int = 0) -> None:
        self.identity = identity
        self.role = role
        self.name = name or peer_id
        self.pid = pid
        self.peer_id = peer_id
        self.slots = slots if role == wire.ROLE_EXECUTOR else 0
        # Where what the router sends it goes; None: the router's transport (a socket).
        self.deliver: Callable[[list], None] | None = None
        self.calls: dict[str, Call] = {}
        # Ids of the sessions a frontend is attached to.
        self.sessions: set[str] = set()
        self.seen = tick
        # Set the moment a send finds it unreachable; it is dropped on the next loop turn.
        self.gone = False
        self.handlers = handlers
        # A peer that came over the network: its CurveZMQ public key (Z85), as ZAP let it in.
        self.key = ""
        # The gate's handle of the connection it said hello on.
        self.connection: int | None = None
        # The tick since which it has been a stopped process (None: it is not).
        self.stopped_since: int | None = None
        # What it provably received of what we sent it (callers only: they ack output).
        self.receipts = Receipts() if role != wire.ROLE_EXECUTOR else None
        # Call traffic for it that its full queue refused, in order (each message with
        # whether it is an exit status), what that costs and of it the exit statuses;
        # whether its calls are on hold at their executors (it is behind, or has overflow).
        self.overflow: deque[tuple[list, bool]] = deque()
        self.overflow_bytes = self.overflow_exits = 0
        self.holding = False

    @classmethod
    def from_hello(cls, identity: bytes, hello: wire.Hello, peer_id: str, tick: int, handlers: dict) -> Peer:
        return cls(identity, hello.role, hello.name, hello.pid, peer_id, tick, handlers, hello.slots)

    def __repr__(self) -> str:
        return f"<Peer {self.role} {self.name} pid={self.pid}>"


class DirectCaller(Peer):
    """A direct run's caller (:mod:`broker.daemon.direct`): a connection to run.sock that
    run.sock's server checked (same user, the token), not a socket peer. It said no hello
    and answers no ping: its connection's end is its end. What the router sends it goes to
    ``deliver`` (the connection's), never through the router's transport."""

    __slots__ = ()

    def __init__(self, identity: bytes, name: str, pid: int, peer_id: str, tick: int, handlers: dict,
                 deliver: Callable[[list], None]) -> None:
        super().__init__(identity, wire.ROLE_FRONTEND, name, pid, peer_id, tick, handlers)
        self.deliver = deliver


class Call:
    """One ``run`` in flight: queued (``frames`` held) or running at ``executor``.

    ``caller`` becomes None when the frontend vanished; the call then lives on only until
    its executor reports the cancelled command's exit, so the slot stays counted.
    """

    __slots__ = ("id", "caller", "executor", "frames", "sent", "sent_chunks", "acked", "acked_chunks", "held",
                 "held_chunks", "interactive", "queued_at", "noticed", "fds", "cancelled", "lost", "lost_chunks",
                 "unsent", "unsent_chunks")

    def __init__(self, call_id: str, caller: Peer, frames: list, *, interactive: bool = False, tick: int = 0,
                 fds: list[int] | None = None) -> None:
        self.id = call_id
        # A direct run's stdio (the caller's own fds), handed to the executor with the run
        # and closed here then; a list its connection shares (broker.daemon.direct), which
        # closes them if they never were. None: not a direct run.
        self.fds = fds
        # The router's tick when it was queued; whether its caller was told why it waits.
        self.queued_at = tick
        self.noticed = False
        # Takes no slot of its executor (``RunRequest.interactive``).
        self.interactive = interactive
        self.caller: Peer | None = caller
        self.executor: Peer | None = None
        self.frames: list | None = frames
        # Output forwarded to the caller, what it acknowledged and what of that is not yet
        # passed on to the executor (held while the caller is behind).
        self.sent = self.sent_chunks = 0
        self.acked = self.acked_chunks = 0
        self.held = self.held_chunks = 0
        # Its caller asked to cancel it (its end is then theirs, not the daemon's shutdown's).
        self.cancelled = False
        # Output not kept for a caller past CALLER_HOLD_BYTES (it is told at the exit), and
        # of it what is still to be credited back to the executor (nobody will ack it).
        self.lost = self.lost_chunks = 0
        self.unsent = self.unsent_chunks = 0


class RunQueue:
    """The runs waiting for an executor, oldest first, with the bytes they hold (bounded
    in both: :data:`QUEUE_LIMIT` runs, :data:`QUEUE_BYTES` bytes)."""

    __slots__ = ("_calls", "bytes")

    def __init__(self) -> None:
        self._calls: OrderedDict[str, Call] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._calls)

    def values(self):
        return self._calls.values()

    def has_room(self, size: int) -> bool:
        return len(self._calls) < QUEUE_LIMIT and self.bytes + size <= QUEUE_BYTES

    def push(self, call: Call, *, first: bool = False) -> None:
        self._calls[call.id] = call
        self.bytes += _size(call.frames)
        if first:
            self._calls.move_to_end(call.id, last=False)

    def first(self) -> Call:
        return next(iter(self._calls.values()))

    def pop_first(self) -> Call:
        _, call = self._calls.popitem(last=False)
        self.bytes -= _size(call.frames)
        return call

    def remove(self, call: Call) -> None:
        del self._calls[call.id]
        self.bytes -= _size(call.frames)

    def clear(self) -> None:
        self._calls.clear()
        self.bytes = 0


def _stopped_by_shutdown(frames: list) -> list:
    """An executor's ``exit`` while the daemon shuts down: a command it aborted for that is
    said to have been ended by the shutdown (:data:`DAEMON_STOPPED`, its own exit code),
    not cancelled, which its caller did not ask for."""
    try:
        status = wire.decode(wire.EXIT, frames[2])
    except wire.WireError:
        return frames
    if not status.aborted:
        return frames  # it ended on its own meanwhile
    return [*frames[:2], wire.encode(msgspec.structs.replace(status, aborted=False, error=DAEMON_STOPPED))]


def _kept(frames: list) -> list:
    """``frames`` fit to be held (queued for a peer that does not read, or in the run
    queue): small ones copied out. libzmq receives small messages into a shared buffer
    (8 KiB) that each of them keeps alive while it lives, so ten thousand queued
    40-byte headers would hold 80 MiB; copies hold what they are."""
    return [f.bytes if len(f) < _COPY_BELOW and not isinstance(f, bytes) else f for f in frames]


def _size(frames: list | None) -> int:
    return sum(len(f) for f in frames) if frames else 0


class Router:
    """Routes one ROUTER socket's traffic. Call :meth:`on_message` for each message."""

    def __init__(
        self,
        token: str,
        *,
        defer: Callable[[Callable[[], None]], object],
        supervisor: Supervisor | None = None,
        agent_supervisor=None,
        heartbeat_s: float = HEARTBEAT_S,
        gate: Gate | None = None,
        suspend_limit_s: float = SUSPEND_LIMIT_S,
        executor_wait_s: float = EXECUTOR_WAIT_S,
    ) -> None:
        self._token = token.encode()
        self._defer = defer
        self.supervisor: Supervisor = supervisor or _NoSupervisor()
        # Spawns the agent process (claim, kill, ensure_started); None: no sessions hosted.
        self.agent_supervisor = agent_supervisor
        self.sessions = Sessions(self, agent_supervisor)
        self.heartbeat_s = heartbeat_s
        # Heartbeats a frontend with calls in flight may be silent (see liveness.FRONTEND_SILENCE_S).
        self.frontend_beats = max(DEAD_AFTER_HEARTBEATS, math.ceil(FRONTEND_SILENCE_S / heartbeat_s))
        self.gate: Gate = gate or _NoGate()
        self.suspend_limit_s = suspend_limit_s
        self.executor_wait_s = executor_wait_s
        # Queued calls whose callers have not been told why they wait (no executor).
        self._unnoticed: list[Call] = []
        # Routing identities of callers dropped for a reason they should hear if they speak
        # again (a stopped frontend resumed too late), instead of "send hello first".
        # Their connection stays a peer's to the gate meanwhile (not cut as a stranger's
        # before the resumed client could read why).
        self._dropped: OrderedDict[bytes, tuple[str, int | None]] = OrderedDict()
        # Set by the daemon once the socket exists: a non-blocking multipart send.
        self.transport: Callable[[list], None] | None = None
        self.peers: dict[bytes, Peer] = {}
        self.executors: dict[bytes, Peer] = {}
        self.callers: dict[bytes, Peer] = {}
        self.calls: dict[str, Call] = {}
        self.queue = RunQueue()
        self.tick = 0
        self.closing = False
        self._lost: list[Peer] = []
        self._next_peer = 0
        self._throttle = Throttle(log)
        # What ``status`` answers beyond the router's own state: set by the daemon
        # (socket, listen, log, runtime_dir, executors_wanted as DaemonInfo's fields).
        self.about: dict = {}
        self.started = time.monotonic()
        self._executor_handlers = {
            wire.STARTED: self._on_call_event,
            wire.OUT: self._on_call_event,
            wire.EXIT: self._on_exit,
            wire.ACK: self._on_call_event,
            wire.PING: self._on_ping,
            wire.PONG: self._on_pong,
            wire.BYE: self._on_bye,
            wire.HELLO: self._on_second_hello,
        }
        caller_handlers = {
            wire.RUN: self._on_run,
            wire.ACK: self._on_ack,
            wire.IN: self._to_executor,
            wire.RESIZE: self._to_executor,
            wire.SIGNAL: self._to_executor,
            wire.CANCEL: self._on_cancel,
            wire.PING: self._on_ping,
            wire.PONG: self._on_pong,
            wire.BYE: self._on_bye,
            wire.HELLO: self._on_second_hello,
        }
        self._frontend_handlers = {
            **caller_handlers,
            wire.SUBMIT: self.sessions.on_submit,
            wire.ATTACH: self.sessions.on_attach,
            wire.DETACH: self.sessions.on_detach,
            wire.SESSIONS: self.sessions.on_list,
            wire.STATUS: self._on_status,
        }
        self._agent_handlers = {
            **caller_handlers,
            wire.EVENT: self.sessions.on_event,
            wire.CLOSED: self.sessions.on_closed,
            wire.SERVE: self.sessions.on_serve,
        }

    # ----------------------------------------------------------------- inbound

    def on_message(self, frames: list) -> None:
        """Entry point for every message; a bug or bad input never escapes into the loop."""
        try:
            self._handle(frames)
        except Exception:
            self._throttle("exception", "internal error while handling a message", exc_info=True)

    def _handle(self, frames: list) -> None:
        n = len(frames)
        if n < 2:
            return self._malformed(frames[0].bytes if n else b"", "message without a header frame")
        identity = frames[0].bytes
        peer = self.peers.get(identity)
        if len(frames[1]) > MAX_HEADER_SIZE:
            return self._malformed(identity, f"header frame of {len(frames[1])} bytes", peer=peer)
        try:
            head = wire.decode_header(frames[1])
        except wire.WireError as e:
            return self._malformed(identity, str(e), peer=peer)
        if peer is None:
            return self._from_stranger(identity, head, frames)
        peer.seen = self.tick
        kind = head.kind
        if FRAME_COUNT.get(kind) != n - 1:
            if kind in FRAME_COUNT:
                why = f"{kind} takes {FRAME_COUNT[kind]} frame(s) after the identity, got {n - 1}"
            else:
                why = f"unknown message kind {wire.one_line(repr(kind), 80)}"
            return self._malformed(identity, why, peer=peer, corr=head.corr)
        handler = peer.handlers.get(kind)
        if handler is None:
            return self._malformed(identity, f"{peer.role} may not send {kind}", peer=peer, corr=head.corr)
        handler(peer, head, frames)

    def refused(self, identity: bytes, too_many_parts: bool) -> None:
        """The socket refused a message of ``identity``'s unread (:data:`MAX_PARTS`,
        :data:`MAX_MESSAGE_BYTES`): its sender is told, a peer stays a peer."""
        peer = self.peers.get(identity)
        why = f"more than {MAX_PARTS} parts" if too_many_parts else f"more than {MAX_MESSAGE_BYTES} bytes"
        self._throttle("warning", "oversized message refused unread", reason=why, peer=peer.name if peer else None)
        message = (f"message refused unread: {why} (the daemon takes at most {MAX_PARTS} parts "
                   f"and {MAX_MESSAGE_BYTES} bytes in one message)")
        if peer is not None:
            self._reply_error(peer, "", message)
        else:
            self._send_stranger(identity, "", message)

    def _malformed(self, identity: bytes, why: str, *, peer: Peer | None = None, corr: str = "") -> None:
        self._throttle("warning", "malformed message dropped", reason=why, peer=peer.name if peer else None)
        if peer is not None:
            self._reply_error(peer, corr, f"malformed message: {why}")

    # ------------------------------------------------------------------- hello

    def _from_stranger(self, identity: bytes, head: wire.Header, frames: list) -> None:
        if head.kind != wire.HELLO:
            self._throttle("info", "message before hello dropped", kind=wire.one_line(head.kind, 80))
            return self._send_stranger(identity, head.corr, self._dropped.get(identity, (HELLO_FIRST,))[0])
        if len(frames) != 3:
            self._malformed(identity, "hello without exactly one body frame")
            return self._send_stranger(identity, head.corr, "malformed message: hello takes exactly one body frame")
        try:
            hello = wire.decode(wire.HELLO, frames[2])
        except wire.WireError as e:
            self._throttle("warning", "bad hello", reason=str(e))
            return self._send_stranger(identity, head.corr, f"bad hello: {e}")
        key = ""
        if identity[:1] == REMOTE:
            # Over the network the CurveZMQ handshake was the authentication; the token is not used.
            key = _user_id(frames[1])
            if not key:
                self._throttle("warning", "remote peer without a CurveZMQ key refused", role=hello.role, name=hello.name)
                return self._send_stranger(identity, head.corr, "authentication failed")
            if hello.role == wire.ROLE_AGENT:
                self._throttle("warning", "remote agent refused", key=key, name=hello.name)
                return self._send_stranger(
                    identity, head.corr, "the agent role is not available over the network; connect as a frontend or an executor"
                )
            allowed = _property(frames[1], ROLES_PROPERTY).split(",")
            if hello.role not in allowed:
                return self._wrong_role(identity, head.corr, hello, key, _property(frames[1], "Peer-Address"), allowed)
        elif not hmac.compare_digest(hello.token.encode("utf-8", "replace"), self._token):
            self._throttle("warning", "authentication failed", role=hello.role, pid=hello.pid, name=hello.name)
            return self._send_stranger(identity, head.corr, "authentication failed")
        if hello.version != wire.PROTOCOL_VERSION:
            return self._send_stranger(
                identity,
                head.corr,
                f"protocol version {hello.version} is not supported (this daemon speaks {wire.PROTOCOL_VERSION})",
            )
        if hello.role not in wire.ROLES:
            return self._send_stranger(
                identity, head.corr, f"unknown role {hello.role!r}; expected one of {', '.join(wire.ROLES)}"
            )
        if hello.role == wire.ROLE_EXECUTOR and hello.slots < 1:
            return self._send_stranger(identity, head.corr, "an executor must offer at least one slot")
        if len(self.peers) >= self.gate.max_peers:
            self._throttle("warning", "peer refused: too many peers", peers=len(self.peers), role=hello.role)
            return self._send_stranger(
                identity, head.corr,
                f"the sluice daemon has too many clients connected ({len(self.peers)}); try again when some have left",
            )
        self._register(identity, hello, head.corr, key)
        self.peers[identity].connection = self.gate.peer_joined(frames[1])

    def _wrong_role(self, identity: bytes, corr: str, hello: wire.Hello, key: str, address: str,
                    allowed: list[str]) -> None:
        allowed = [role for role in allowed if role]
        self._throttle("warning", "remote peer refused: its key is not allowed in that role", address=address,
                       key=key, role=hello.role, allowed=allowed, name=hello.name)
        flag = ALLOW_FLAGS.get(hello.role)
        where = f"; to join as {hello.role}, its .key file must be in the daemon's {flag} directory" if flag else ""
        if allowed:
            message = (f"this key is allowed to join the daemon as {' and '.join(allowed)} only, "
                       f"not as {hello.role!r}{where}")
        else:
            message = f"this key is not allowed to join the daemon as {hello.role!r}{where}"
        self._send_stranger(identity, corr, message)

    def _register(self, identity: bytes, hello: wire.Hello, corr: str, key: str = "") -> None:
        self._next_peer += 1
        peer_id = f"{hello.role}-{self._next_peer}"
        if hello.role == wire.ROLE_EXECUTOR:
            peer = Peer.from_hello(identity, hello, peer_id, self.tick, self._executor_handlers)
            self.executors[identity] = peer
        else:
            handlers = self._agent_handlers if hello.role == wire.ROLE_AGENT else self._frontend_handlers
            peer = Peer.from_hello(identity, hello, peer_id, self.tick, handlers)
            self.callers[identity] = peer
        self.peers[identity] = peer
        peer.key = key
        if key:
            spawned = False  # its pid is another host's: never matched to a process we spawned
        elif peer.role == wire.ROLE_EXECUTOR:
            spawned = self.supervisor.claim(peer)
        elif peer.role == wire.ROLE_AGENT and self.agent_supervisor is not None:
            spawned = self.agent_supervisor.claim(peer)
        else:
            spawned = False
        log.info(
            "peer joined", role=peer.role, name=peer.name, pid=peer.pid, peer_id=peer_id,
            slots=peer.slots or None, spawned=spawned or None, key=key or None,
            version=hello.sluice_version or None,
        )
        welcome = wire.Welcome(peer_id=peer_id, heartbeat_s=self.heartbeat_s, sluice_version=version.SLUICE_VERSION)
        self._send(peer, [identity, *wire.message(wire.WELCOME, corr, welcome)])
        if peer.role == wire.ROLE_EXECUTOR:
            self._dispatch()
        elif spawned:
            self.sessions.candidate = peer

    def join_direct(self, identity: bytes, name: str, pid: int, deliver: Callable[[list], None]) -> DirectCaller | str:
        """A direct run's caller (:mod:`broker.daemon.direct`, which checked who it is), or
        why it cannot join. ``identity`` starts with :data:`DIRECT` (no socket peer's)."""
        if len(self.peers) >= self.gate.max_peers:
            self._throttle("warning", "peer refused: too many peers", peers=len(self.peers), role="direct")
            return f"the sluice daemon has too many clients connected ({len(self.peers)}); try again when some have left"
        self._next_peer += 1
        peer = DirectCaller(identity, name, pid, f"direct-{self._next_peer}", self.tick, self._frontend_handlers,
                            deliver)
        self.peers[identity] = peer
        self.callers[identity] = peer
        log.info("peer joined", role=peer.role, name=peer.name, pid=pid, peer_id=peer.peer_id, direct=True)
        return peer

    def _on_second_hello(self, peer: Peer, head: wire.Header, frames: list) -> None:
        self._reply_error(peer, head.corr, "already said hello")

    def _on_status(self, peer: Peer, head: wire.Header, frames: list) -> None:
        """Answer ``status`` with a :class:`~broker.wire.frames.DaemonInfo`."""
        executors = []
        for executor in self.executors.values():
            interactive = sum(1 for call in executor.calls.values() if call.interactive)
            executors.append(wire.ExecutorInfo(
                name=executor.name, pid=executor.pid, remote=bool(executor.key), slots=executor.slots,
                busy=len(executor.calls) - interactive, interactive=interactive))
        sessions = self.sessions
        info = wire.DaemonInfo(
            sluice_version=version.SLUICE_VERSION,
            pid=os.getpid(),
            uptime_s=round(time.monotonic() - self.started, 3),
            executors=executors,
            queued=len(self.queue),
            frontends=sum(1 for p in self.callers.values() if p.role == wire.ROLE_FRONTEND),
            sessions=len(sessions.sessions),
            max_sessions=sessions.max_sessions,
            journal_bytes=sessions.journal_bytes(),
            agent_running=sessions.agent is not None,
            **self.about,
        )
        self._send(peer, [peer.identity, *wire.message(wire.STATUS, head.corr, info)])

    # ------------------------------------------------------- caller -> executor

    def _on_run(self, peer: Peer, head: wire.Header, frames: list) -> None:
        call_id = head.corr
        if self.closing:
            return self._reply_error(peer, call_id, DAEMON_SHUTTING_DOWN)
        if not call_id:
            return self._reply_error(peer, call_id, "run needs a call id (header corr)")
        try:
            request = wire.decode(wire.RUN, frames[2])
        except wire.WireError as e:
            return self._reply_error(peer, call_id, f"bad run request: {e}")
        if request.stdio_fds:
            return self._reply_error(peer, call_id, "stdio_fds is for a direct run (the daemon's run.sock), not a message")
        self._accept_run(peer, call_id, request, _kept(frames[1:]))

    def run_direct(self, peer: Peer, call_id: str, request: wire.RunRequest, fds: list[int]) -> None:
        """A direct run (:mod:`broker.daemon.direct`): ``fds`` are the command's stdio."""
        if self.closing:
            return self._reply_error(peer, call_id, DAEMON_SHUTTING_DOWN)
        if request.tty is not None or not request.stdio_fds:
            return self._reply_error(peer, call_id, "a direct run has stdio_fds set and no terminal")
        self._accept_run(peer, call_id, request, wire.message(wire.RUN, call_id, request), fds)

    def _accept_run(self, peer: Peer, call_id: str, request: wire.RunRequest, frames: list,
                    fds: list[int] | None = None) -> None:
        if call_id in self.calls:
            return self._reply_error(peer, call_id, f"call id {call_id} is already in flight")
        if not self.queue.has_room(_size(frames)):
            self._throttle("warning", "run refused: queue full", queued=len(self.queue), queued_bytes=self.queue.bytes)
            return self._reply_error(peer, call_id, "daemon busy: too many commands queued; try again later")
        direct = fds is not None
        if direct and not self.supervisor.passes_fds():
            return self._reply_error(peer, call_id, NO_LOCAL_EXECUTOR)
        if request.interactive:
            # Never behind commands waiting for a slot; queued only while no executor is there.
            executor = self._executor_for(True, direct)
            if executor is None and self.executors:
                return self._reply_error(peer, call_id, INTERACTIVE_FULL)
        else:
            executor = None if self.queue else self._executor_for(False, direct)
        call = Call(call_id, peer, frames, interactive=request.interactive, tick=self.tick, fds=fds)
        self.calls[call_id] = call
        peer.calls[call_id] = call
        if executor is None:
            self.queue.push(call)
            note = self.supervisor.restarting()
            if note:
                self._notice(call, f"{note}; this command waits for it")
            elif not self.executors and not self.supervisor.starting():
                self._notice(call, NO_EXECUTOR)
            elif not self.executors:
                self._unnoticed.append(call)  # the heartbeat tells it, should none come
        else:
            self._assign(call, executor)

    def _notice(self, call: Call, note: str) -> None:
        call.noticed = True
        caller = call.caller
        if caller is not None:
            self._to_caller(caller, [caller.identity, *wire.message(wire.NOTICE, call.id, wire.ErrorMsg(note))])

    def _wait_for_executors(self) -> None:
        """Each heartbeat: a queued call waiting a second or more while no executor is
        connected is told so; after ``executor_wait_s`` it fails."""
        waiting, self._unnoticed = self._unnoticed, []
        if self.executors:
            return
        starting = self.supervisor.starting()
        for call in waiting:
            if self.calls.get(call.id) is not call or call.executor is not None:
                continue
            if self.tick - call.queued_at < (STARTING_GRACE if starting else 2):
                self._unnoticed.append(call)
            elif not call.noticed:
                self._notice(call, STILL_STARTING if starting else NO_EXECUTOR)
        limit = self.executor_wait_s / self.heartbeat_s
        for call in list(self.queue.values()):
            if self.tick - call.queued_at < limit:
                break
            self.queue.remove(call)
            del self.calls[call.id]
            self._fail(call, f"no executor joined the daemon within {self.executor_wait_s:g} s; the command "
                             "did not run (`sluice daemon status` shows the executors; a daemon started with "
                             "--executors 0 runs commands only on executors that join it)")

    def _on_ack(self, peer: Peer, head: wire.Header, frames: list) -> None:
        """Credit for a call's output, passed on to its executor: never more than was
        forwarded, and only while the caller is not behind (see the module docstring): so
        output a caller acknowledges but never reads cannot pile up here."""
        if head.session and not head.corr:
            return self.sessions.on_ack(peer, head, frames)
        call = self.calls.get(head.corr)
        if call is None or call.caller is not peer or call.executor is None:
            return
        n, chunks = head.n, head.seq
        if n < 0 or chunks < 0 or call.acked + call.held + n > call.sent or \
                call.acked_chunks + call.held_chunks + chunks > call.sent_chunks:
            self._throttle("warning", "ack beyond what was sent refused", peer=peer.name, call=call.id)
            return self._reply_error(
                peer, call.id, f"ack of {n} bytes / {chunks} chunks refused: only "
                f"{call.sent - call.acked - call.held} bytes / {call.sent_chunks - call.acked_chunks - call.held_chunks} "
                "chunks were sent and not yet acknowledged",
            )
        call.held += n
        call.held_chunks += chunks
        self._pass_credit(call)

    def _pass_credit(self, call: Call) -> None:
        caller, executor = call.caller, call.executor
        if caller is None or executor is None or not (call.held or call.held_chunks or call.unsent_chunks) \
                or caller.receipts.behind:
            return  # when behind, the pong that catches up passes it on (_on_pong)
        n, chunks = call.held, call.held_chunks
        call.acked += n
        call.acked_chunks += chunks
        call.held = call.held_chunks = 0
        n, chunks = n + call.unsent, chunks + call.unsent_chunks
        call.unsent = call.unsent_chunks = 0
        self._send(executor, [executor.identity, wire.header(wire.ACK, call.id, n=n, seq=chunks)])

    def _to_executor(self, peer: Peer, head: wire.Header, frames: list) -> None:
        """``in`` (the next bytes of a call's stdin), ``resize`` (its terminal's new size) and
        ``signal`` (one for its process group), to its executor as they came. The caller's stdin window
        (:data:`~broker.wire.frames.STDIN_WINDOW_BYTES`, acked by the executor) bounds what
        is in flight; what comes for a call not running (yet, or any more) is dropped."""
        call = self.calls.get(head.corr)
        if call is None or call.caller is not peer or call.executor is None:
            return
        executor = call.executor
        self._send(executor, [executor.identity, *frames[1:]])

    def _on_cancel(self, peer: Peer, head: wire.Header, frames: list) -> None:
        self.cancel(peer, head.corr)

    def cancel(self, peer: Peer, call_id: str) -> None:
        """``peer`` cancels its call ``call_id``: at its executor, or out of the queue."""
        call = self.calls.get(call_id)
        if call is None or call.caller is not peer:
            return  # already finished: the exit is on its way or delivered
        executor = call.executor
        if executor is not None:
            call.cancelled = True
            self._send(executor, [executor.identity, wire.header(wire.CANCEL, call.id)])
            return
        self.queue.remove(call)
        del self.calls[call.id]
        del peer.calls[call.id]
        self._to_caller(peer, [peer.identity, *wire.message(wire.EXIT, call.id, wire.ExitStatus(aborted=True))],
                        exit=True)

    # ------------------------------------------------------- executor -> caller

    def _on_call_event(self, peer: Peer, head: wire.Header, frames: list) -> None:
        """``started``, ``out`` and ``ack`` (of stdin): the hot path. Forward the frames as
        they are; count the output forwarded, which the caller's acks may not exceed."""
        call = self.calls.get(head.corr)
        if call is None or call.executor is not peer:
            return self._stray(peer, head)
        caller = call.caller
        if caller is None:
            return
        if head.kind != wire.OUT:
            self._to_caller(caller, [caller.identity, *_kept(frames[1:])])
        elif self._held_output(caller) > CALLER_HOLD_BYTES:
            # Not kept: counted, and its window given back once the caller catches up.
            call.lost += len(frames[2])
            call.lost_chunks += 1
            call.unsent += len(frames[2])
            call.unsent_chunks += 1
        elif self._to_caller(caller, [caller.identity, *_kept(frames[1:])]) is not None:
            call.sent += len(frames[2])
            call.sent_chunks += 1

    def _on_exit(self, peer: Peer, head: wire.Header, frames: list) -> None:
        call = self.calls.get(head.corr)
        if call is None or call.executor is not peer:
            return self._stray(peer, head)
        caller = call.caller
        if caller is not None:
            if self.closing and not call.cancelled:
                frames = _stopped_by_shutdown(frames)
            self._tell_lost(call)
            self._to_caller(caller, [caller.identity, *_kept(frames[1:])], exit=True)
            caller.calls.pop(call.id, None)
        del self.calls[call.id]
        del peer.calls[call.id]
        self._dispatch()

    def _stray(self, peer: Peer, head: wire.Header) -> None:
        # Normal after a frontend vanished or a call was failed early; not worth a warning.
        self._throttle("debug", "message for an unknown call dropped", kind=head.kind, corr=head.corr, peer=peer.name)

    # ---------------------------------------------------------------- liveness

    def _on_ping(self, peer: Peer, head: wire.Header, frames: list) -> None:
        self._send(peer, [peer.identity, wire.header(wire.PONG, head.corr)])

    def _on_pong(self, peer: Peer, head: wire.Header, frames: list) -> None:
        # ``seen`` was updated on receipt; a caller's pong may prove receipt of what came before.
        if peer.receipts is not None and peer.receipts.confirm(head.corr):
            self._flush_overflow(peer)
            for call in list(peer.calls.values()):
                self._pass_credit(call)
            self.sessions.caught_up(peer)

    def _ping(self, peer: Peer) -> None:
        """A ping; to a caller, a checkpoint of :class:`~broker.daemon.receipts.Receipts`."""
        if isinstance(peer, DirectCaller):
            peer.seen = self.tick  # it answers none: it is there while its connection is
        corr = peer.receipts.checkpoint() if peer.receipts is not None else ""
        self._send(peer, [peer.identity, wire.header(wire.PING, corr)])

    def _on_bye(self, peer: Peer, head: wire.Header, frames: list) -> None:
        if peer.role == wire.ROLE_EXECUTOR:
            self.drop_executor(peer, f"executor {peer.name} left while running this command")
        else:
            self.drop_caller(peer, "said bye")

    def heartbeat(self, caught_up: bool = True) -> None:
        """Called every heartbeat: ping, and give up on peers that stopped answering.

        ``caught_up``: the daemon has read all its input. While it has not, no peer is
        judged silent: its answer may be waiting in our own queue (a flood, a stall of
        ours), and a heartbeat that was not a fair chance does not count against it."""
        self.tick += 1
        tick = self.tick
        if not caught_up:
            self._throttle("info", "the daemon is behind on its input: no peer is judged silent this heartbeat")
            for peer in self.peers.values():
                peer.seen += 1
        for executor in list(self.executors.values()):
            if tick - executor.seen > DEAD_AFTER_HEARTBEATS:
                log.warning("executor hung: no reply to pings", name=executor.name, pid=executor.pid)
                self.drop_executor(
                    executor,
                    f"executor {executor.name} stopped responding (no heartbeat for "
                    f"{DEAD_AFTER_HEARTBEATS * self.heartbeat_s:g} s) while running this command; "
                    "the command was not re-run",
                )
                self.supervisor.kill(executor)
            else:
                self._ping(executor)
        agent = self.sessions.agent
        if agent is not None:
            if tick - agent.seen > DEAD_AFTER_HEARTBEATS:
                log.warning("agent hung: no reply to pings", name=agent.name, pid=agent.pid)
                self.drop_caller(agent, f"stopped responding (no heartbeat for {DEAD_AFTER_HEARTBEATS * self.heartbeat_s:g} s)")
                if self.agent_supervisor is not None:
                    self.agent_supervisor.kill(agent)
            else:
                self._ping(agent)
        idle_sweep = tick % IDLE_PING_EVERY == 0
        for caller in list(self.callers.values()):
            if caller.overflow:
                self._flush_overflow(caller)
            if caller is agent:
                continue
            if caller.calls:
                if tick - caller.seen > self.frontend_beats:
                    if not self._suspended(caller, tick):
                        self.drop_caller(caller, "stopped answering pings")
                        continue
                else:
                    caller.stopped_since = None
            elif not idle_sweep:
                continue
            self._ping(caller)
        if self.queue or self._unnoticed:
            self._wait_for_executors()
        self.sessions.heartbeat()
        self._throttle.flush()

    def _suspended(self, caller: Peer, tick: int) -> bool:
        """A caller that stopped answering because its process is stopped (Ctrl-Z) is kept,
        its commands waiting on their flow-control windows, up to ``suspend_limit_s``."""
        if not self.gate.stopped(caller.connection):
            return False
        if caller.stopped_since is None:
            caller.stopped_since = tick
            log.info("frontend stopped: its commands wait for it", name=caller.name, pid=caller.pid,
                     calls=len(caller.calls), limit_s=self.suspend_limit_s)
            return True
        if (tick - caller.stopped_since) * self.heartbeat_s <= self.suspend_limit_s:
            return True
        why = (f"this client was stopped (suspended) for more than {self.suspend_limit_s:g} s, the daemon's limit "
               "(sluice daemon --suspend-limit); its commands were cancelled")
        self._dropped[caller.identity] = (why, caller.connection)
        if len(self._dropped) > DROPPED_KEPT:
            self.gate.peer_left(self._dropped.popitem(last=False)[1][1])
        self.drop_caller(caller, f"stopped for more than {self.suspend_limit_s:g} s", keep_connection=True)
        return True

    # ------------------------------------------------------------ peer loss

    def drop_caller(self, peer: Peer, why: str, *, keep_connection: bool = False) -> None:
        """Forget a frontend: queued calls vanish, running ones are cancelled at their executors."""
        if self.peers.get(peer.identity) is not peer:
            return
        del self.peers[peer.identity]
        del self.callers[peer.identity]
        if not keep_connection:
            self.gate.peer_left(peer.connection)
        peer.gone = True
        peer.overflow.clear()
        peer.overflow_bytes = peer.overflow_exits = 0
        cancelled = 0
        for call in peer.calls.values():
            call.caller = None
            executor = call.executor
            if executor is None:
                self.queue.remove(call)
                del self.calls[call.id]
            else:
                cancelled += 1
                self._send(executor, [executor.identity, wire.header(wire.CANCEL, call.id)])
        peer.calls.clear()
        level = "warning" if cancelled else "info"
        getattr(log, level)("peer left", role=peer.role, name=peer.name, pid=peer.pid, why=why, cancelled=cancelled)
        self.sessions.peer_left(peer, why)

    def drop_executor(self, peer: Peer, error: str) -> None:
        """Forget an executor; each of its calls ends at once with ``error``."""
        if self.peers.get(peer.identity) is not peer:
            return
        del self.peers[peer.identity]
        del self.executors[peer.identity]
        self.gate.peer_left(peer.connection)
        peer.gone = True
        calls = list(peer.calls.values())
        peer.calls.clear()
        for call in calls:
            del self.calls[call.id]
            self._fail(call, error)
        log.info("executor left", name=peer.name, pid=peer.pid, failed_calls=len(calls))
        self._dispatch()

    def executor_died(self, peer: Peer | None, name: str, reason: str) -> None:
        """The supervisor saw the process behind ``peer`` exit."""
        if peer is not None:
            self.drop_executor(peer, f"executor {name} died ({reason}) while running this command")

    def agent_died(self, peer: Peer | None, name: str, reason: str) -> None:
        """The agent supervisor saw the agent process exit."""
        if peer is not None and peer is self.sessions.agent:
            self.drop_caller(peer, f"died ({reason})")
            return
        if peer is not None:
            self.drop_caller(peer, f"died ({reason})")
        if self.sessions.pending:
            # It never said hello: what waited for it cannot be served by it.
            self.sessions.agent_lost(f"the agent process failed to start ({reason}); see the daemon log")

    def _fail(self, call: Call, error: str) -> None:
        caller = call.caller
        if caller is None:
            return
        caller.calls.pop(call.id, None)
        self._tell_lost(call)
        self._to_caller(caller, [caller.identity, *wire.message(wire.EXIT, call.id, wire.ExitStatus(error=error))],
                        exit=True)

    def _vanished(self, peer: Peer) -> None:
        # Dropping a peer sends to others, whose failure may drop more peers; doing it on a
        # later loop turn keeps that from happening in the middle of someone's iteration.
        if peer.gone:
            return
        peer.gone = True
        self._lost.append(peer)
        if len(self._lost) == 1:
            self._defer(self._drop_lost)

    def _drop_lost(self) -> None:
        lost, self._lost = self._lost, []
        for peer in lost:
            # A process of ours that died is said to have died, and how (its connection
            # closes a moment before its pidfd tells the supervisor).
            if peer.role == wire.ROLE_EXECUTOR:
                status = self.supervisor.exited(peer)
                if status is not None:
                    self.drop_executor(peer, f"executor {peer.name} died ({status}) while running this command")
                    continue
                self.drop_executor(
                    peer, f"executor {peer.name} became unreachable while running this command; the command was not re-run"
                )
                self.supervisor.kill(peer)
            else:
                ours = peer is self.sessions.agent and self.agent_supervisor is not None
                status = self.agent_supervisor.exited(peer) if ours else None
                self.drop_caller(peer, "unreachable" if status is None else f"died ({status})")

    # ----------------------------------------------------------- scheduling

    def _executor_for(self, interactive: bool, direct: bool = False) -> Peer | None:
        """The executor with the most free slots, or for an interactive call the one that
        hosts the fewest interactive calls (below :data:`~broker.wire.frames.INTERACTIVE_PER_EXECUTOR`);
        for a direct run, one the daemon can hand file descriptors (one it spawned)."""
        best = None
        best_room = 0
        for executor in self.executors.values():
            if direct and not self.supervisor.passes_fds(executor):
                continue
            hosted = sum(1 for call in executor.calls.values() if call.interactive)
            if interactive:
                room = wire.INTERACTIVE_PER_EXECUTOR - hosted
            else:
                room = executor.slots - (len(executor.calls) - hosted)
            if room > best_room and not executor.gone:
                best, best_room = executor, room
        return best

    def _dispatch(self) -> None:
        queue = self.queue
        while queue:
            first = queue.first()
            interactive = first.interactive
            executor = self._executor_for(interactive, first.fds is not None)
            if executor is None:
                if not interactive:
                    return
                call = queue.pop_first()  # every executor hosts its most
                del self.calls[call.id]
                self._fail(call, INTERACTIVE_FULL)
                continue
            self._assign(queue.pop_first(), executor)

    def _assign(self, call: Call, executor: Peer) -> None:
        direct = call.fds is not None
        if direct:
            # Before the run: queued in the kernel at once, so there when the run arrives.
            handed = self.supervisor.pass_fds(executor, call.id, call.fds)
            close_all(call.fds)  # ours, either way; the list empties (its connection shares it)
            if handed is not None:
                del self.calls[call.id]
                return self._fail(call, f"cannot hand the command's stdio to executor {executor.name}: {handed}")
        frames, call.frames = call.frames, None
        call.executor = executor
        executor.calls[call.id] = call
        if self._send(executor, [executor.identity, *frames]):
            if call.caller is not None and call.caller.holding:
                self._send(executor, [executor.identity, wire.header(wire.HOLD, call.id, n=1)])
            return
        del executor.calls[call.id]
        call.executor = None
        if executor.gone and not direct:
            # It vanished under us; another executor (or a replacement) can take the call.
            call.frames = frames
            self.queue.push(call, first=True)
        else:
            del self.calls[call.id]
            self._fail(call, f"executor {executor.name} is not accepting work (its queue is full)")

    # ------------------------------------------------------------- shutdown

    def close(self) -> None:
        """Refuse new runs and submissions, end the queued runs, end the sessions."""
        self.closing = True
        self.sessions.close(DAEMON_SHUTTING_DOWN)
        queued = list(self.queue.values())
        self.queue.clear()
        for call in queued:
            del self.calls[call.id]
            self._fail(call, DAEMON_STOPPED)

    def fail_all(self, error: str = DAEMON_STOPPED) -> None:
        """End every call still in flight: the daemon is exiting.

        Calls still running at this point are at executors we did not spawn (or that
        ignored SIGKILL); they are told to cancel, since nobody will read the output.
        """
        for call in list(self.calls.values()):
            self._fail(call, error)
            executor = call.executor
            if executor is not None:
                executor.calls.pop(call.id, None)
                self._send(executor, [executor.identity, wire.header(wire.CANCEL, call.id)])
        self.calls.clear()
        self.queue.clear()

    # --------------------------------------------------------------- output

    def _to_caller(self, caller: Peer, parts: list, *, exit: bool = False) -> bool | None:
        """Send what concerns a call to its caller, in order, never dropped: True if it went
        out, False if it waits in the caller's overflow (a full queue), None if the caller
        is gone. Holds the caller's calls when it falls behind. ``exit``: it is an exit
        status (it does not count against what is kept of output, see :meth:`_held_output`)."""
        if caller.gone:
            return None
        if not caller.overflow and self._send(caller, parts, keep=True, exit=exit):
            went = True
        elif caller.gone:
            return None
        else:
            caller.overflow.append((parts, exit))
            cost = _size(parts) + MESSAGE_COST
            caller.overflow_bytes += cost
            if exit:
                caller.overflow_exits += cost
            went = False
        if not caller.holding and (caller.overflow or caller.receipts.behind):
            self._hold(caller, True)
        return went

    def _unheld(self, caller: Peer) -> int:
        """What the daemon holds for ``caller`` that it has not proven received (bytes)."""
        receipts = caller.receipts
        return receipts.sent - receipts.proven + caller.overflow_bytes

    def _held_output(self, caller: Peer) -> int:
        """What :meth:`_unheld` counts but exit statuses: what :data:`CALLER_HOLD_BYTES`
        bounds (see the module's docstring)."""
        return caller.receipts.unproven_output + caller.overflow_bytes - caller.overflow_exits

    def _flush_overflow(self, caller: Peer) -> None:
        """Send what waits in ``caller``'s overflow, as far as its queue takes; once it is
        empty and the caller not behind, its calls go on."""
        overflow = caller.overflow
        while overflow and self._send(caller, overflow[0][0], keep=True, exit=overflow[0][1]):
            parts, exit = overflow.popleft()
            cost = _size(parts) + MESSAGE_COST
            caller.overflow_bytes -= cost
            if exit:
                caller.overflow_exits -= cost
        if caller.holding and not overflow and not caller.receipts.behind:
            self._hold(caller, False)

    def _hold(self, caller: Peer, hold: bool) -> None:
        """Put ``caller``'s running calls on hold at their executors (they stop reading the
        commands' output), or let them go on."""
        caller.holding = hold
        # Rate-limited: a client that reads, slowly, may be held and let go many times a second.
        event = "frontend behind: its commands are held" if hold else "frontend caught up: its commands go on"
        self._throttle("info", event, name=caller.name, pid=caller.pid, calls=len(caller.calls), queued_bytes=self._unheld(caller))
        for call in caller.calls.values():
            executor = call.executor
            if executor is not None:
                self._send(executor, [executor.identity, wire.header(wire.HOLD, call.id, n=int(hold))])

    def _tell_lost(self, call: Call) -> None:
        """Before a call's exit: one line on the output its caller did not get, if any."""
        if call.lost:
            self._to_caller(call.caller, [call.caller.identity, *wire.message(wire.NOTICE, call.id, wire.ErrorMsg(
                f"{call.lost} bytes of this command's output ({call.lost_chunks} chunks) were lost: this client did "
                f"not read them in time, and the daemon keeps at most {CALLER_HOLD_BYTES >> 20} MiB for a client"))])

    def _send(self, peer: Peer, parts: list, *, keep: bool = False, exit: bool = False) -> bool:
        """Non-blocking send to a known peer; False (and handled) when it did not go out.
        ``exit``: it is an exit status (see :class:`~broker.daemon.receipts.Receipts`)."""
        if peer.gone:
            return False
        try:
            (peer.deliver or self.transport)(parts)
        except zmq.Again:
            # Its queue is full. The caller decides: call traffic waits in order (``keep``),
            # session events are replayed later, anything else is lost to that peer.
            if not keep:
                self._throttle("warning", "peer not reading: its queue is full, message not sent", peer=peer.name,
                               role=peer.role)
        except zmq.ZMQError as e:
            if e.errno == zmq.EHOSTUNREACH:
                self._vanished(peer)
            else:
                self._throttle("warning", "send failed", peer=peer.name, error=str(e))
        else:
            if peer.receipts is not None and peer.receipts.count(_size(parts) - len(parts[0]), exit=exit):
                self._ping(peer)
                if peer.receipts.behind and not peer.holding and peer.calls:
                    self._hold(peer, True)
            return True
        return False

    def send(self, peer: Peer, parts: list) -> bool:
        """Send ``parts`` (identity first) to ``peer`` without blocking; False if it did not go out."""
        return self._send(peer, parts)

    def reply_error(self, peer: Peer, corr: str, message: str) -> None:
        self._reply_error(peer, corr, message)

    def _reply_error(self, peer: Peer, corr: str, message: str) -> None:
        self._send(peer, [peer.identity, *wire.message(wire.ERROR, corr, wire.ErrorMsg(message))])

    def _send_stranger(self, identity: bytes, corr: str, message: str) -> None:
        try:
            self.transport([identity, *wire.message(wire.ERROR, corr, wire.ErrorMsg(message))])
        except zmq.ZMQError:
            pass  # it left, or does not read: nothing we owe it


def _user_id(frame) -> str:
    """The User-Id libzmq attached to a message from the network: the peer's Z85 public key."""
    return _property(frame, "User-Id")


def _property(frame, name: str) -> str:
    """A metadata property libzmq attached to a message from the network ("" if none)."""
    try:
        return frame.get(name) or ""
    except (AttributeError, zmq.ZMQError):
        return ""
