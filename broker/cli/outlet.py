"""Our stdout or stderr as the place a command's output goes through the broker socket,
written without blocking ``sluice run``: :class:`Outlet`.

A pipe that its reader does not empty (``sluice run -- yes | sleep 60``) must not stop
sluice from seeing the command's end (its timeout, a signal, Ctrl-C). So a pipe is
written through a descriptor of its own, opened again through ``/proc/self/fd`` with
``O_NONBLOCK``: a new open file description, so the flag is not set on the one the
shell and the other processes of the pipeline share. What the pipe does not take now
waits in :attr:`Outlet.pending` (the caller holds the command's output back meanwhile:
:meth:`broker.client.Client.hold_output`). Anything else (a terminal, a file, a pipe that
cannot be opened again) is written as it always was, blocking.
"""

from __future__ import annotations

import os
import stat

from broker.cli.base import widen_pipe, write_all


class Outlet:
    """One of our output descriptors (``fd``); see the module docstring."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        # Ours, non-blocking, for the same pipe; -1: write to fd, blocking.
        self._own = _reopen_nonblocking(fd)
        self.pending = bytearray()
        self.closed = False

    @property
    def waiting(self) -> int:
        """The descriptor to wait on until it takes more, or -1 when nothing is pending."""
        return self._own if self.pending else -1

    def write(self, data) -> None:
        """Write ``data`` after what is pending; what a pipe does not take now is kept.
        Raises OSError (a closed pipe: BrokenPipeError)."""
        if self.pending:
            self.pending += data
        elif self._own < 0:
            write_all(self.fd, data)
        else:
            n = _write_some(self._own, data)
            if n < len(data):
                self.pending += memoryview(data)[n:]

    def flush(self) -> None:
        """Write as much of what is pending as the pipe takes now; raises OSError."""
        if self.pending:
            del self.pending[:_write_some(self._own, self.pending)]

    def finish(self) -> None:
        """Write what is pending, waiting for the pipe as long as it takes; raises OSError."""
        if self.pending:
            data, self.pending = bytes(self.pending), bytearray()
            write_all(self.fd, data)

    def close(self) -> None:
        """Drop what is pending; no more is written."""
        self.closed = True
        self.pending.clear()
        if self._own >= 0:
            os.close(self._own)
            self._own = -1


def _reopen_nonblocking(fd: int) -> int:
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return -1
        own = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # no /proc, not ours to open again, its reader gone: write as before
        return -1
    widen_pipe(own)  # a reader keeping up then takes a chunk in one write
    return own


def _write_some(fd: int, data) -> int:
    try:
        return os.write(fd, data)
    except BlockingIOError:
        return 0
