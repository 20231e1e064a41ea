"""Direct runs: a local ``sluice run`` hands the daemon its own stdio, and the sandboxed
command writes to it with nobody in between. Stdlib only, so that the caller (a ``sluice
run`` that must start fast) imports neither pyzmq nor msgspec.

What the two sockets of a direct run carry (``run.sock`` in the runtime dir, caller <->
daemon, and the executor's fd channel, daemon -> executor), who may connect and why only
the ends of anonymous pipes are taken is described once, in docs/protocol.md ("Direct
runs: run.sock"). Here: the socket's name, a message sent and received with its fds
(:func:`send`, :func:`receive`), which fds a run sends (:func:`stdio_names`) and the
check the daemon and the executor each make of them (:func:`refused`).
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
