"""Connecting a frontend socket to the daemon: hello, then welcome or refusal."""

from __future__ import annotations

import contextlib
import itertools
import os
import time

import zmq

from broker.client.errors import DaemonError
from broker.wire import frames as wire

# Blocking sends (run requests) give up after this long: the daemon is not reading.
SEND_TIMEOUT_MS = 10_000


def _new_socket(endpoint: str, remote=None, monitor: str | None = None) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    if remote is not None:
        remote.apply(sock)
    if monitor is not None:
        # Before connecting, so no handshake outcome is missed.
        sock.monitor(monitor, _HANDSHAKE_FAILED)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
    # Flow-control windows bound what is in flight per call; this bounds it per client.
    sock.setsockopt(zmq.RCVHWM, 1 << 20)
    sock.setsockopt(zmq.SNDHWM, 1 << 16)
    sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_MESSAGE_SIZE)
    sock.connect(endpoint)
    return sock


_HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
_monitor_ids = itertools.count(1)


def hello(endpoint: str, token: str, deadline: float, name: str = "client", remote=None):
    """(socket, Welcome) on success, (socket, message) if refused, (socket, None) on timeout.

    Over tcp a CurveZMQ handshake the daemon refuses raises :class:`DaemonError` at once:
    libzmq would otherwise retry it quietly until the deadline.
    """
    monitor = None
    address = f"inproc://sluice-hello-monitor-{os.getpid()}-{next(_monitor_ids)}" if remote is not None else None
    if address is not None:
        monitor = zmq.Context.instance().socket(zmq.PAIR)
        monitor.setsockopt(zmq.LINGER, 0)
        monitor.connect(address)
    try:
        sock = _new_socket(endpoint, remote, address)
    except BaseException:
        if monitor is not None:
            monitor.close(linger=0)
        raise
    try:
        return _await_welcome(sock, monitor, endpoint, token, deadline, name)
    except BaseException:
        sock.close(linger=0)
        raise
    finally:
        if monitor is not None:
            with contextlib.suppress(zmq.ZMQError):
                sock.disable_monitor()
            monitor.close(linger=0)


def _handshake_refusal(monitor: zmq.Socket, endpoint: str) -> str | None:
    from zmq.utils.monitor import recv_monitor_message

    while True:
        try:
            event = recv_monitor_message(monitor, zmq.NOBLOCK)["event"]
        except zmq.Again:
            return None
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return f"the daemon at {endpoint} refused our key (it is not in its allow-list)"
        if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            return f"{endpoint} does not speak CurveZMQ like a sluice daemon (is it one started with --listen?)"
        if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            return f"the CurveZMQ handshake with {endpoint} failed (is --server-key that daemon's public key?)"


def _await_welcome(sock: zmq.Socket, monitor: zmq.Socket | None, endpoint: str, token: str, deadline: float, name: str):
    greeting = wire.Hello(role=wire.ROLE_FRONTEND, token=token, pid=os.getpid(), name=name)
    try:
        sock.send_multipart(wire.message(wire.HELLO, body=greeting), zmq.NOBLOCK)
    except zmq.ZMQError:
        pass
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    if monitor is not None:
        poller.register(monitor, zmq.POLLIN)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return sock, None
        if not poller.poll(int(remaining * 1000) + 1):
            continue
        if monitor is not None:
            refusal = _handshake_refusal(monitor, endpoint)
            if refusal is not None:
                raise DaemonError(refusal)
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                h = wire.decode_header(frames[0])
                if h.kind == wire.WELCOME and len(frames) > 1:
                    return sock, wire.decode(wire.WELCOME, frames[1])
                if h.kind == wire.ERROR:
                    msg = wire.decode(wire.ERROR, frames[1]).message if len(frames) > 1 else "refused"
                    return sock, msg
            except wire.WireError:
                continue
