"""run.sock: direct runs for local callers (docs/protocol.md, "Direct runs: run.sock",
describes the protocol; :mod:`broker.wire.direct` has its messages).

A caller on this host connects, sends one run with its own stdio as file descriptors,
and gets its exit; everything else is the router's, as for any frontend. Each connection
is one :class:`~broker.daemon.router.DirectCaller` of the router (identity
:data:`~broker.daemon.router.DIRECT` + a number) with at most one call; the connection's
end is the caller's (its call is cancelled), and the caller's end (after the exit)
closes the connection. The fds must pass
:func:`broker.wire.direct.refused`, or the run is refused with nothing kept; they belong
to the call until the router hands them to an executor, and are closed with the
connection otherwise.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import os
import re
import socket
import struct

import structlog

from broker.daemon.router import DIRECT, NO_LOCAL_EXECUTOR, Call, DirectCaller, Router
from broker.net.logging import Throttle
from broker.wire import direct
from broker.wire import frames as wire
from broker.wire.version import SLUICE_VERSION

log = structlog.get_logger("broker.daemon.direct")
_throttle = Throttle(log)

_CALL_ID = re.compile(r"[0-9A-Za-z_-]{1,64}")
# A caller that said nothing this long after connecting is cut (a run comes at once).
FIRST_MESSAGE_S = 10.0
# Messages one connection may have waiting for the caller to read them.
BACKLOG_MAX = 256
# After accept failed (out of descriptors), the listener is left alone this long.
ACCEPT_PAUSE_S = 0.1


class _Connection:
    __slots__ = ("sock", "identity", "pid", "peer", "call", "fds", "backlog", "timer", "closed")

    def __init__(self, sock: socket.socket, identity: bytes, pid: int) -> None:
        self.sock = sock
        self.identity = identity
        self.pid = pid
        self.peer: DirectCaller | None = None
        self.call: Call | None = None
        self.fds: list[int] = []
        # Messages the caller's socket had no room for; while any wait, the loop watches
        # it for room (_flush).
        self.backlog: collections.deque[dict] = collections.deque()
        self.timer: asyncio.TimerHandle | None = None
        self.closed = False


class DirectRuns:
    """Serves run.sock on ``loop`` for ``router``; :meth:`deliver` is the router's send to
    its connections' callers."""

    def __init__(self, router: Router, listener: socket.socket, loop: asyncio.AbstractEventLoop, token: str) -> None:
        self.router = router
        self._token = token.encode()
        self.listener = listener
        self.loop = loop
        self.uid = os.getuid()
        self.connections: dict[bytes, _Connection] = {}
        self._next = 0
        self._paused: asyncio.TimerHandle | None = None
        self._listening = False
        self._closing = False
        listener.setblocking(False)
        self._listen(True)

    def _resume(self) -> None:
        self._paused = None
        if not self._closing:
            self._listen(True)

    # -- connections -------------------------------------------------------------------

    def _listen(self, on: bool) -> None:
        if on != self._listening:
            self._listening = on
            if on:
                self.loop.add_reader(self.listener.fileno(), self._accept)
            else:
                self.loop.remove_reader(self.listener.fileno())

    def _accept(self) -> None:
        for _ in range(64):  # a burst, then the loop's other work
            if len(self.connections) >= self.router.gate.max_peers:
                # Full: new callers wait in the listen backlog (and, once that is full,
                # take the broker socket) until a connection ends. Never a reset: a
                # caller must be able to tell a refused run from one that may have run.
                _throttle("warning", "direct runs: too many connections; not accepting for now",
                          connections=len(self.connections))
                self._listen(False)
                return
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                # Out of descriptors (the listener stays readable: do not spin on it).
                _throttle("warning", "cannot accept a direct run; trying again shortly", error=e.strerror)
                self._listen(False)
                self._paused = self.loop.call_later(ACCEPT_PAUSE_S, self._resume)
                return
            try:
                pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            except OSError:
                sock.close()
                continue
            if uid not in (self.uid, 0):
                _throttle("warning", "direct run from another user refused", uid=uid, pid=pid)
                sock.close()
                continue
            sock.setblocking(False)
            self._next += 1
            conn = _Connection(sock, DIRECT + self._next.to_bytes(8, "big"), pid)
            self.connections[conn.identity] = conn
            conn.timer = self.loop.call_later(FIRST_MESSAGE_S, self._end, conn, "said nothing")
            self.loop.add_reader(sock.fileno(), self._readable, conn)

    def _readable(self, conn: _Connection) -> None:
        try:
            message, fds = direct.receive(conn.sock)
        except (BlockingIOError, InterruptedError):
            return
        except direct.DirectError as e:
            if conn.peer is None:
                self._refuse(conn, f"bad direct run: {e}")
            else:
                _throttle("warning", "bad direct-run message dropped", reason=str(e))
            return
        except OSError as e:
            return self._end(conn, f"connection failed: {e.strerror}")
        if message is None:
            return self._end(conn, "closed its connection")
        if "run" in message:
            if conn.peer is not None:
                direct.close_all(fds)
                return self._send(conn, {"error": "one run per connection"})
            return self._run(conn, message, fds)
        direct.close_all(fds)
        if message.get("cancel") is True:
            if conn.peer is not None and conn.call is not None:
                self.router.cancel(conn.peer, conn.call.id)
            return
        _throttle("info", "unknown direct-run message dropped", keys=sorted(message)[:8])

    def _run(self, conn: _Connection, message: dict, fds: list[int]) -> None:
        if conn.timer is not None:
            conn.timer.cancel()
            conn.timer = None
        token = message.get("token")
        if not isinstance(token, str) or not hmac.compare_digest(token.encode("utf-8", "replace"), self._token):
            direct.close_all(fds)
            _throttle("warning", "direct run: authentication failed", pid=conn.pid)
            return self._refuse(conn, "authentication failed")
        fields = message["run"]
        call_id = message.get("call")
        name = message.get("name", "sluice run")
        if not isinstance(fields, dict) or not isinstance(call_id, str) or not _CALL_ID.fullmatch(call_id):
            direct.close_all(fds)
            return self._refuse(conn, "bad direct run: it needs a run object and a call id of 1-64 letters, digits, _ or -")
        try:
            request = wire.run_from_builtins({**fields, "stdio_fds": True})
        except wire.WireError as e:
            direct.close_all(fds)
            return self._refuse(conn, str(e))
        names = direct.stdio_names(request.stdin, request.stdio_null)
        if len(fds) != len(names):
            got = len(fds)
            direct.close_all(fds)
            return self._refuse(conn, f"a direct run sends {len(names)} file descriptors "
                                      f"({', '.join(names) or 'none'}), got {got}")
        why = direct.refused(fds, names)
        if why is not None:
            direct.close_all(fds)
            _throttle("warning", "direct run: refused its stdio", pid=conn.pid, why=why)
            return self._refuse(conn, why)
        if not self.router.supervisor.passes_fds():
            direct.close_all(fds)
            return self._refuse(conn, NO_LOCAL_EXECUTOR, fallback=True)
        name = wire.one_line(name, 80) if isinstance(name, str) and name.strip() else "sluice run"
        peer = self.router.join_direct(conn.identity, name, conn.pid, self.deliver)
        if isinstance(peer, str):
            direct.close_all(fds)
            return self._refuse(conn, peer)
        conn.peer = peer
        # The call shares this list: whoever closes them (the router, once they are the
        # executor's; we, at the end) empties it.
        conn.fds = fds
        self.router.run_direct(peer, call_id, request, fds)
        conn.call = peer.calls.get(call_id)

    def _refuse(self, conn: _Connection, why: str, *, fallback: bool = False) -> None:
        self._send(conn, {"error": why, **({"fallback": True} if fallback else {})})
        self.loop.remove_reader(conn.sock.fileno())  # nothing more is read from it
        self._end_soon(conn, "refused")

    # -- from the router ------------------------------------------------------------------

    def deliver(self, parts: list) -> None:
        """The router's send to a direct caller: ``[identity, header, body?]``; the exit and
        started messages are its executor's, as it sent them."""
        conn = self.connections.get(parts[0])
        if conn is None or conn.closed:
            return
        head = wire.decode_header(parts[1])
        kind = head.kind
        if kind == wire.EXIT:
            status = wire.decode(wire.EXIT, parts[2])
            self._send(conn, {"exit": wire.exit_builtins(status)})
            self._end_soon(conn, "done")
        elif kind == wire.ERROR:
            self._send(conn, {"error": wire.decode(wire.ERROR, parts[2]).message})
            if conn.peer is None or not conn.peer.calls:
                self._end_soon(conn, "refused")
        elif kind == wire.NOTICE:
            self._send(conn, {"notice": wire.decode(wire.NOTICE, parts[2]).message})
        elif kind == wire.STARTED:
            self._send(conn, {"started": wire.decode(wire.STARTED, parts[2]).pid, "sluice_version": SLUICE_VERSION})
        elif kind == wire.PING:
            self._send(conn, {"ping": True})  # the daemon is alive (the caller answers none)
        # ``out`` does not come (the command writes to its fds); nothing else is for a caller.

    # -- to the caller --------------------------------------------------------------------

    def _send(self, conn: _Connection, message: dict) -> None:
        if conn.closed:
            return
        if conn.backlog:
            if len(conn.backlog) < BACKLOG_MAX or "exit" in message or "error" in message:
                conn.backlog.append(message)
            return
        try:
            direct.send(conn.sock, message)
        except (BlockingIOError, InterruptedError):
            conn.backlog.append(message)
            self.loop.add_writer(conn.sock.fileno(), self._flush, conn)
        except OSError:
            pass  # it left: its end of file ends it

    def _flush(self, conn: _Connection) -> None:
        while conn.backlog:
            try:
                direct.send(conn.sock, conn.backlog[0])
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                conn.backlog.clear()
                break
            conn.backlog.popleft()
        self.loop.remove_writer(conn.sock.fileno())
        if conn.closed:
            conn.sock.close()

    # -- the end ---------------------------------------------------------------------------

    def _end_soon(self, conn: _Connection, why: str) -> None:
        # Not inside the router's send: dropping a peer there would pull the rug from it.
        self.loop.call_soon(self._end, conn, why)

    def _end(self, conn: _Connection, why: str) -> None:
        if conn.closed:
            return
        conn.closed = True
        self.connections.pop(conn.identity, None)
        if not self._listening and self._paused is None and not self._closing:
            self._listen(True)
        if conn.timer is not None:
            conn.timer.cancel()
            conn.timer = None
        self.loop.remove_reader(conn.sock.fileno())
        if conn.peer is not None:
            self.router.drop_caller(conn.peer, why)
        direct.close_all(conn.fds)
        if not conn.backlog:  # else _flush closes it once the last message is out
            conn.sock.close()

    def close(self) -> None:
        """Stop serving: every connection ends (after the router told its caller why)."""
        self._closing = True
        self._listen(False)
        if self._paused is not None:
            self._paused.cancel()
        for conn in list(self.connections.values()):
            self._end(conn, "the daemon is shutting down")
            if conn.backlog:  # no loop turn is left to flush it
                self.loop.remove_writer(conn.sock.fileno())
                conn.backlog.clear()
                conn.sock.close()
