"""The connections the daemon holds, kept within what its descriptors allow.

Every connection to the daemon's sockets costs a descriptor, and libzmq accepts them
on its own thread as fast as they come; when the process runs out, libzmq aborts it
(an ``EMFILE`` from ``accept`` on a unix socket is an assertion there). A socket cannot
be told to stop accepting without closing every connection it accepted, so the gate
keeps the count down instead:

- It follows every connection from the sockets' monitors (``ACCEPTED`` and
  ``DISCONNECTED`` carry the descriptor), and learns from each peer's hello which of
  them are peers (the descriptor a message came on, ``ZMQ_SRCFD``).
- A *stranger* (a connection that has not said a good hello, or whose peer the router
  has since dropped) is cut after :data:`STRANGER_S` seconds; every client says hello as
  soon as it connects. While the daemon holds more than :attr:`max_connections`
  connections, strangers are cut at once, oldest first. Cutting is ``shutdown(2)`` on
  the descriptor, after checking it is still the socket that was accepted (same inode):
  libzmq then closes it itself.
- Beyond :attr:`max_peers` peers, the router refuses a hello with a message that says
  so, so peers never take the room strangers are cut for.
- :meth:`stopped` says whether a peer is a local process that is stopped (Ctrl-Z): the
  kernel names the process at the other end (``SO_PEERCRED``), and the router keeps such
  a peer, which does not answer pings, instead of dropping it.

``max_connections`` leaves :func:`reserve` descriptors free below the soft limit (which
the daemon first raised to the hard one): room for the daemon's own files and for
connections accepted between a flood's start and the gate's reaction.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import struct
import time

import psutil
import structlog
import zmq
from zmq.utils.monitor import parse_monitor_message

from broker.net.logging import Throttle
from broker.net.zloop import ZSocket

log = structlog.get_logger(component="gate")

# A connection that has not said hello by then is cut.
STRANGER_S = 10.0
EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
_monitor_ids = itertools.count(1)


def reserve(fd_limit: int) -> int:
    """Descriptors kept free below ``fd_limit``: a quarter of it, between 256 and 4,096."""
    return min(max(256, fd_limit // 4), 4096)


class ConnectionGate:
    """Counts the daemon's connections and cuts strangers; see the module docstring.

    Monitor events arrive on their own socket, so they may lag behind the messages
    (a hello can be handled before its connection's ``ACCEPTED``), and a descriptor may
    have been closed and reused by then. So nothing here trusts an event about a
    descriptor: before cutting, the gate asks the kernel which socket the descriptor is
    now (its inode), and a socket whose inode belongs to a peer the router knows is
    never cut. At worst a stranger gets a little longer.
    """

    def __init__(self, fd_limit: int, *, stranger_s: float = STRANGER_S, clock=time.monotonic) -> None:
        self.max_connections = max(fd_limit - reserve(fd_limit), 16)
        self.max_peers = self.max_connections * 3 // 4
        self.stranger_s = stranger_s
        self._clock = clock
        # fd -> [inode, first seen]: what the monitors say is connected.
        self.connections: dict[int, list] = {}
        # Inodes of the sockets the router's peers said hello on -> their descriptor.
        self.peer_inodes: dict[int, int] = {}
        # Cut strangers only once a hello has shown that the descriptor of a message can be
        # known: a libzmq without ZMQ_SRCFD would make every peer look like a stranger.
        self._srcfd_known = False
        self._srcfd_warned = False
        self.cut = 0
        self._monitors: list[tuple[zmq.Socket, ZSocket]] = []
        self._throttle = Throttle(log)

    # ------------------------------------------------------------- sockets

    def watch(self, sock: zmq.Socket, ctx: zmq.Context, loop: asyncio.AbstractEventLoop, *,
              events: int = 0, also=None) -> None:
        """Follow ``sock``'s connections; monitor events in ``events`` go to ``also(event)``."""
        address = f"inproc://sluice-gate-{os.getpid()}-{next(_monitor_ids)}"
        sock.monitor(address, EVENTS | events)
        pair = ctx.socket(zmq.PAIR)
        pair.setsockopt(zmq.LINGER, 0)
        pair.connect(address)

        def on_event(frames: list[zmq.Frame]) -> None:
            try:
                event = parse_monitor_message([f.bytes for f in frames])
            except (RuntimeError, ValueError):
                return
            kind = event["event"]
            if kind == zmq.EVENT_ACCEPTED:
                self.accepted(int(event["value"]))
            elif kind == zmq.EVENT_DISCONNECTED:
                self.connections.pop(int(event["value"]), None)
            elif also is not None:
                also(event)

        self._monitors.append((sock, ZSocket(pair, on_event, loop)))

    def close(self) -> None:
        for sock, monitor in self._monitors:
            try:
                sock.disable_monitor()
            except zmq.ZMQError:
                pass
            monitor.close()
        self._monitors.clear()

    # -------------------------------------------------------------- events

    def accepted(self, fd: int) -> None:
        inode = _inode(fd)
        known = self.connections.get(fd)
        if known is None or known[0] != inode:
            self.connections[fd] = [inode, self._clock()]
        excess = len(self.connections) - self.max_connections
        if excess > 0:
            # A tenth more than needed, so a flood is not met with one full scan per connection.
            self._cut(excess + self.max_connections // 10, None, why="too many connections")

    def peer_joined(self, header_frame) -> int | None:
        """A good hello came on the connection ``header_frame`` was read from; returns the
        inode of its socket, to give to :meth:`peer_left` (None if it cannot be known)."""
        try:
            fd = header_frame.get(zmq.SRCFD)
        except (AttributeError, zmq.ZMQError, ValueError):
            fd = -1
        inode = _inode(fd) if isinstance(fd, int) and fd >= 0 else None
        if inode is None:
            if not self._srcfd_warned:
                self._srcfd_warned = True
                log.warning("libzmq does not say which connection a message came on: strangers are not cut")
            return None
        self._srcfd_known = True
        self.peer_inodes[inode] = fd
        return inode

    def peer_left(self, inode: int | None) -> None:
        """The peer on ``inode`` is gone from the router (it said bye, or was given up):
        its connection, if still open, is a stranger from now on, with a stranger's whole
        time to say hello again (a resumed executor is told "send hello first" on it; cut
        at once, it could lose that answer and wait out its patience instead)."""
        if inode is None:
            return
        fd = self.peer_inodes.pop(inode, None)
        known = self.connections.get(fd) if fd is not None else None
        if known is not None and known[0] == inode:
            known[1] = self._clock()

    def stopped(self, inode: int | None) -> bool:
        """True when the peer with ``inode`` is a local process that is stopped (Ctrl-Z,
        SIGSTOP, a debugger) with its connection still open: it will answer when resumed."""
        fd = self.peer_inodes.get(inode) if inode is not None else None
        if fd is None or _inode(fd) != inode:
            return False
        pid = _peer_pid(fd)
        if pid is None:
            return False
        try:
            return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
        except psutil.Error:
            return False

    def sweep(self) -> None:
        """Cut strangers that have had :attr:`stranger_s` to say hello (call it every heartbeat)."""
        self._cut(len(self.connections), self._clock() - self.stranger_s, why="no hello in time")
        self._throttle.flush()

    # ------------------------------------------------------------- cutting

    def _cut(self, n: int, before: float | None, *, why: str) -> None:
        """Cut up to ``n`` strangers, oldest first (only those first seen by ``before``)."""
        if not self._srcfd_known or n <= 0:
            return
        now = self._clock()
        strangers = []
        for fd, known in list(self.connections.items()):
            inode = _inode(fd)
            if inode is None:
                del self.connections[fd]  # closed; its DISCONNECTED is on the way
                continue
            if inode != known[0]:
                known[:] = [inode, now]  # a newer socket at that descriptor: its clock starts now
            if inode not in self.peer_inodes and (before is None or known[1] <= before):
                strangers.append((known[1], fd, inode))
        strangers.sort()
        cut = 0
        for _, fd, inode in strangers[:n]:
            if _shutdown(fd, inode):
                del self.connections[fd]
                cut += 1
        if cut:
            self.cut += cut
            self._throttle("warning", "connections cut", why=why, cut=cut, connections=len(self.connections),
                           peers=len(self.peer_inodes), max_connections=self.max_connections)


def _inode(fd: int) -> int | None:
    try:
        return os.fstat(fd).st_ino
    except OSError:
        return None


def _on_socket(fd: int, op, default):
    """``op(sock)`` on a socket object made from a duplicate of ``fd`` (closed after: ``fd``
    itself is libzmq's); ``default`` when anything fails."""
    try:
        dup = os.dup(fd)
    except OSError:
        return default
    try:
        sock = socket.socket(fileno=dup)
    except OSError:
        os.close(dup)
        return default
    with sock:
        try:
            return op(sock)
        except OSError:
            return default


def _peer_pid(fd: int) -> int | None:
    """The pid of the process at the other end of a local (unix) socket, from the kernel."""

    def pid(sock: socket.socket) -> int | None:
        if sock.family != socket.AF_UNIX:
            return None
        pid, _uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        return pid if pid > 0 else None

    return _on_socket(fd, pid, None)


def _shutdown(fd: int, inode: int | None) -> bool:
    """``shutdown(2)`` the socket at ``fd`` if it is still the one with ``inode``; libzmq
    notices and closes it. Never closes ``fd`` itself: libzmq owns it."""
    if inode is None or _inode(fd) != inode:
        return False

    def shut(sock: socket.socket) -> bool:
        sock.shutdown(socket.SHUT_RDWR)
        return True

    return _on_socket(fd, shut, False)
