"""Connecting a frontend socket to the daemon: hello, then welcome or refusal."""

from __future__ import annotations

import contextlib
import time

import zmq

from broker.client.errors import DaemonError
from broker.net import peer
from broker.wire import frames as wire

# Blocking sends (run requests) give up after this long: the daemon is not reading.
SEND_TIMEOUT_MS = 10_000
# Over tcp: connections refused for this long (nothing listens there) end the attempt.
REFUSED_FOR_S = 1.0
_MONITORED = peer.HANDSHAKE_FAILED_EVENTS | zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED


def hello(endpoint: str, token: str, deadline: float, name: str = "client", remote=None):
    """(socket, Welcome) on success, (socket, message) if refused, (socket, None) on timeout.

    Over tcp a CurveZMQ handshake the daemon refuses raises :class:`DaemonError` at once:
    libzmq would otherwise retry it quietly until the deadline.
    """
    # Flow-control windows bound what is in flight per call; the queues bound it per client.
    sock = peer.dealer(zmq.Context.instance(), sndhwm=1 << 16, rcvhwm=1 << 20, remote=remote)
    sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
    monitor = None
    try:
        if remote is not None:
            monitor = peer.monitor(sock, _MONITORED)
        sock.connect(endpoint)
        return _await_welcome(sock, monitor, endpoint, token, deadline, name)
    except BaseException:
        sock.close(linger=0)
        raise
    finally:
        if monitor is not None:
            with contextlib.suppress(zmq.ZMQError):
                sock.disable_monitor()
            monitor.close(linger=0)


class _Attempt:
    """What the monitor said of a tcp connection attempt so far."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.connected = False
        self.retried = False


def _handshake_refusal(monitor: zmq.Socket, endpoint: str, attempt: _Attempt) -> str | None:
    # Here, not at the top: zmq.utils.monitor imports asyncio, which only tcp clients need.
    from zmq.utils.monitor import recv_monitor_message

    while True:
        try:
            event = recv_monitor_message(monitor, zmq.NOBLOCK)["event"]
        except zmq.Again:
            break
        if event == zmq.EVENT_CONNECTED:
            attempt.connected = True
        elif event == zmq.EVENT_CONNECT_RETRIED:
            attempt.retried = True
        refusal = peer.handshake_refusal(event, endpoint)
        if refusal is not None:
            return refusal
    if attempt.retried and not attempt.connected and time.monotonic() - attempt.started >= REFUSED_FOR_S:
        return (f"cannot connect to {endpoint}: nothing accepts connections there "
                "(is a daemon listening there, `sluice daemon --listen`, and is the port right?)")
    return None


def _await_welcome(sock: zmq.Socket, monitor: zmq.Socket | None, endpoint: str, token: str, deadline: float, name: str):
    try:
        sock.send_multipart(peer.hello(wire.ROLE_FRONTEND, token, name), zmq.NOBLOCK)
    except zmq.ZMQError:
        pass
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    attempt = _Attempt()
    if monitor is not None:
        poller.register(monitor, zmq.POLLIN)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return sock, None
        if monitor is not None:
            # Wake by the time refused connections have lasted long enough to give up.
            remaining = min(remaining, max(0.05, REFUSED_FOR_S - (time.monotonic() - attempt.started)))
        poller.poll(int(remaining * 1000) + 1)
        if monitor is not None:
            refusal = _handshake_refusal(monitor, endpoint, attempt)
            if refusal is not None:
                raise DaemonError(refusal)
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                kind = wire.decode_header(frames[0]).kind
            except wire.WireError:
                continue
            outcome = peer.reply_to_hello(kind, frames[1] if len(frames) > 1 else None)
            if outcome is not None:
                return sock, outcome
