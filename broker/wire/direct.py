"""Direct runs: a local ``sluice run`` hands the daemon its own stdio, and the sandboxed
command writes to it with nobody in between. Stdlib only, so that the caller (a ``sluice
run`` that must start fast) imports neither pyzmq nor msgspec.

Two sockets carry it, both ``SOCK_SEQPACKET`` (one message per send, file descriptors
with the first), both JSON:

``run.sock`` in the runtime dir (:data:`SOCKET_NAME`), caller <-> daemon
    The caller connects (the runtime dir is the owner's alone, and the daemon checks the
    peer's uid too) and sends ``{"run": <RunRequest fields>, "call": ID, "name": NAME,
    "token": <the runtime dir's token>}`` with its stdout and stderr, and its stdin when the command reads it, as fds
    (:func:`stdio_names`: the run's ``stdio_null`` lists an output sent as no fd, which
    the command gets as the sandbox's own /dev/null). ``{"cancel": true}`` cancels; closing the connection does too.
    The daemon answers ``{"started": PID}``, ``{"notice": LINE}`` (a note that does not
    end the call), and last ``{"exit": <ExitStatus fields, no captured output>}`` or
    ``{"error": LINE}`` (the run was refused before it ran; with ``"fallback": true``
    nothing ran and the broker socket may do it), and ``{"ping": true}`` every heartbeat
    while the run is queued or running: a caller that hears nothing for
    :data:`SILENT_LIMIT_S` gives up on the daemon. The request's ``stdio_fds`` is true:
    the fds are the command's stdio.

the executor's fd channel, daemon -> executor
    A socketpair the daemon makes when it spawns an executor (``--fd-channel N``). Before
    it sends a ``run`` whose ``stdio_fds`` is set, it sends ``{"call": ID}`` with the
    fds here; a send on a unix socket is queued in the kernel before it returns, so they
    are there when the run arrives.

The fds are the ends of pipes the caller made for this run (it relays them to its own
stdio, :mod:`landlock_helper.relay`), and the daemon and the executor each take nothing
else (:func:`refused`): an anonymous pipe, stdout and stderr write-only ends, stdin a
read-only end. A file, a device or a terminal would let the command change what the
descriptor refers to (``fchmod`` on a file outside its writable roots, ioctls on a
terminal), a named FIFO is a file on some disk, and a pipe's other end would let it
read what it should write. The caller's own check is no boundary: any client of the
same user may speak this protocol.
"""

from __future__ import annotations

import array
import fcntl
import json
import os
import socket
import stat

from broker.wire import liveness

SOCKET_NAME = "run.sock"
# The order of the fds sent with a run: stdout, stderr, then stdin if the command reads it.
FD_ORDER = ("stdout", "stderr", "stdin")
# A caller that hears nothing from the daemon this long (it pings every heartbeat) takes it
# for hung, as a peer of the broker socket does (broker.wire.liveness).
SILENT_LIMIT_S = liveness.PATIENCE_S
# Largest message either way (a run request with its environment fits with room to spare).
MAX_MESSAGE = 1024 * 1024
_MAX_FDS = len(FD_ORDER)


class DirectError(Exception):
    """A direct-run message that is not one (bad JSON, too big, wrong fds)."""


def send(sock: socket.socket, message: dict, fds: tuple[int, ...] | list[int] = ()) -> None:
    """Send one message (and ``fds``); raises OSError (BlockingIOError on a full buffer)."""
    data = json.dumps(message, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE:
        raise DirectError(f"message of {len(data)} bytes (at most {MAX_MESSAGE})")
    if fds:
        sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.send(data)


def receive(sock: socket.socket) -> tuple[dict | None, list[int]]:
    """One message and the fds that came with it; ``(None, [])`` at the end of the
    connection. Raises :class:`DirectError` for a message that is not a JSON object (the
    fds it brought are closed first) and OSError (BlockingIOError: nothing there)."""
    data, ancillary, flags, _ = sock.recvmsg(MAX_MESSAGE + 1, socket.CMSG_SPACE(_MAX_FDS * 4 + 64))
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            a = array.array("i")
            a.frombytes(payload[: len(payload) - len(payload) % a.itemsize])
            fds.extend(a)
    try:
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise DirectError("message or its file descriptors cut short (too big)")
        if not data:
            if fds:
                raise DirectError("file descriptors without a message")
            return None, []
        try:
            message = json.loads(data)
        except (ValueError, RecursionError) as e:
            raise DirectError(f"not JSON: {e}") from None
        if not isinstance(message, dict):
            raise DirectError("not a JSON object")
    except DirectError:
        close_all(fds)
        raise
    for fd in fds:
        os.set_inheritable(fd, False)
    return message, fds


def stdio_names(stdin: bool, null=()) -> list[str]:
    """What the fds sent with a run are, in order: stdout and stderr less those in
    ``null`` (the sandbox's /dev/null), then stdin if the command reads it."""
    return [name for name in FD_ORDER[:3 if stdin else 2] if name not in null]


def refused(fds: list[int], names=FD_ORDER) -> str | None:
    """Why ``fds`` (named by ``names``) may not be a command's stdio, or None: each
    must be an anonymous pipe's end (not a named FIFO, whose inode is a file on some
    disk), write-only for stdout and stderr, read-only for stdin."""
    for name, fd in zip(names, fds):
        want, end = (os.O_RDONLY, "read") if name == "stdin" else (os.O_WRONLY, "write")
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode) or not os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                return f"the {name} sent is not a pipe (a direct run takes the ends of anonymous pipes only)"
            if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != want:
                return f"the {name} sent is not a pipe's {end} end (a direct run takes it open for {end}ing only)"
        except OSError as e:
            return f"the {name} sent cannot be checked: {e.strerror}"
    return None


def close_all(fds: list[int]) -> None:
    """Close ``fds`` and empty the list (so closing it twice closes nothing twice)."""
    while fds:
        try:
            os.close(fds.pop())
        except OSError:
            pass
