"""What every peer of the daemon does alike: the client (a frontend), the agent and the
executors.

A peer is a ZeroMQ DEALER connected to the daemon's ROUTER. It says hello (its role, the
auth token or, over tcp, its CurveZMQ key, its name) and waits for ``welcome`` or an
``error`` saying why not; then it answers ``ping`` with ``pong``, pings a daemon that has
been quiet for a heartbeat, says so when the daemon has been quiet for
:data:`WAITING_SAID_AFTER` heartbeats, and gives the daemon up only when its pings go
unanswered for :data:`PATIENCE_HEARTBEATS` heartbeats (:class:`Liveness`). The daemon side
of the same rules is :mod:`broker.daemon.router`.

Sans-io: the pieces here build and read messages and keep the clock;
:class:`broker.net.link.Link` applies them, one link for every peer, driven by the client
from a blocking poller and by the agent and the executors from their asyncio loops
(:mod:`broker.net.aiolink`).
"""

from __future__ import annotations

import itertools
import os
import time

import zmq

from broker.wire import frames as wire
from broker.wire import liveness
from broker.wire import version

# The liveness timeouts, one ordered set (see broker.wire.liveness).
HEARTBEAT_S = liveness.HEARTBEAT_S
DEAD_AFTER_HEARTBEATS = liveness.DEAD_AFTER_HEARTBEATS
FRONTEND_SILENCE_S = liveness.FRONTEND_SILENCE_S
WAITING_SAID_AFTER = liveness.WAITING_SAID_AFTER
PATIENCE_HEARTBEATS = liveness.PATIENCE_HEARTBEATS
# What the daemon answers a peer it does not know (it restarted, or dropped the peer).
HELLO_FIRST = "send hello first"
# The CurveZMQ handshake outcomes a tcp peer watches for: a refusal is one line at once,
# not a quiet retry until a deadline.
HANDSHAKE_FAILED_EVENTS = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
_monitor_ids = itertools.count(1)


def dealer(ctx: zmq.Context, *, sndhwm: int, rcvhwm: int, remote=None) -> zmq.Socket:
    """A DEALER with the options every peer sets (not yet connected): no linger, bounded
    queues, messages no larger than the daemon takes; CurveZMQ keys for a ``remote``
    (a :class:`broker.net.keys.Remote`)."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, sndhwm)
    sock.setsockopt(zmq.RCVHWM, rcvhwm)
    sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_MESSAGE_SIZE)
    if remote is not None:
        remote.apply(sock)
    return sock


def monitor(sock: zmq.Socket, events: int) -> zmq.Socket:
    """A PAIR socket that receives ``sock``'s monitor ``events``; made before ``sock``
    connects, so that no handshake outcome is missed."""
    address = f"inproc://sluice-monitor-{os.getpid()}-{next(_monitor_ids)}"
    sock.monitor(address, events)
    pair = sock.context.socket(zmq.PAIR)
    pair.setsockopt(zmq.LINGER, 0)
    pair.connect(address)
    return pair


def hello(role: str, token: str, name: str, *, slots: int = 0) -> list[bytes]:
    """The hello a peer of ``role`` opens with."""
    body = wire.Hello(role=role, token=token, pid=os.getpid(), name=name, slots=slots,
                      sluice_version=version.SLUICE_VERSION)
    return wire.message(wire.HELLO, body=body)


def reply_to_hello(kind: str, body) -> wire.Welcome | str | None:
    """What a message of ``kind`` (with ``body``, a buffer or None) says to a peer that
    said hello: the :class:`~broker.frames.Welcome`, the daemon's reason for refusing,
    or None if it is no answer to the hello (or does not decode)."""
    try:
        if kind == wire.WELCOME and body is not None:
            return wire.decode(wire.WELCOME, body)
        if kind == wire.ERROR:
            return wire.decode(wire.ERROR, body).message if body is not None else "refused"
    except wire.WireError:
        return None
    return None


def handshake_refusal(event: int, endpoint: str) -> str | None:
    """One line for a person about a CurveZMQ handshake ``event`` (None for other events)."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return f"the daemon at {endpoint} refused our key (it is not in its allow-list)"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        return f"{endpoint} does not speak CurveZMQ like a sluice daemon (is it one started with --listen?)"
    if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        return f"the CurveZMQ handshake with {endpoint} failed (is --server-key that daemon's public key?)"
    return None


PING = "ping"


class Liveness:
    """When to ping a quiet daemon, when to say one waits for it, and when to give it up.

    Any message from the daemon counts (:meth:`heard`). After a heartbeat of silence the
    peer pings, once per heartbeat; the daemon is dead when a ping has gone unanswered for
    ``dead_after`` heartbeats, counted from that first ping rather than from the daemon's
    last message, so a peer that was itself stopped (SIGSTOP, a suspended machine) does
    not take its own pause for the daemon's."""

    __slots__ = ("dead_after", "last_heard", "_ping_sent", "_first_ping", "_said")

    def __init__(self, dead_after: int | None = None) -> None:
        self.dead_after = dead_after or PATIENCE_HEARTBEATS  # read now: a test may shorten it
        self.last_heard = time.monotonic()
        self._ping_sent = 0.0
        self._first_ping = 0.0  # the first ping since the daemon's last message (0: none)
        self._said = 0  # heartbeats of silence when we last said we wait (0: not said)

    def heard(self) -> None:
        self.last_heard = time.monotonic()
        self._ping_sent = self._first_ping = 0.0
        self._said = 0

    def waiting(self, heartbeat_s: float) -> str | None:
        """One line to say (log, show) that the peer waits for a quiet daemon: once its pings
        have gone unanswered for :data:`WAITING_SAID_AFTER` heartbeats, then at every
        doubling of that; None when there is nothing new to say. Counted from the first
        unanswered ping, like the patience: a peer's own pause is not the daemon's."""
        if not self._first_ping:
            return None
        beats = int((time.monotonic() - self._first_ping) / heartbeat_s) + 1  # + the silence before it
        if beats < WAITING_SAID_AFTER or beats < 2 * self._said:
            return None
        self._said = beats
        return (f"the sluice daemon has not answered for {beats * heartbeat_s:.0f} s; waiting for it "
                f"(giving up after {(self.dead_after + 1) * heartbeat_s:.0f} s)")

    def silence(self) -> float:
        return time.monotonic() - self.last_heard

    def check(self, heartbeat_s: float, socket_path: str | None = None) -> str | None:
        """What to do now: None (nothing), :data:`PING` (send one), or else the reason to
        give the daemon up, one line for a person. ``socket_path``: a local daemon's
        socket file, whose disappearance means the daemon exited."""
        now = time.monotonic()
        silence = now - self.last_heard
        if silence < heartbeat_s:
            return None
        if socket_path is not None and not os.path.exists(socket_path):
            return "the daemon's socket is gone (the daemon exited)"
        if self._first_ping and now - self._first_ping > self.dead_after * heartbeat_s:
            return f"the daemon stopped answering (nothing for {silence:.1f} s)"
        if not self._ping_sent or now - self._ping_sent >= heartbeat_s:
            self._ping_sent = now
            self._first_ping = self._first_ping or now
            return PING
        return None
