"""The command's stdio: pipes of sluice's own, and the one relay between them and the caller's.

A sandboxed command is never handed a descriptor of its caller's. Handed the caller's
pipe, it could reopen ``/proc/self/fd/0`` for writing (and type into the shell that feeds
its caller) or ``/proc/self/fd/1`` for reading (and take what other writers send down the
same pipe), or leave ``O_NONBLOCK`` on the caller's description; handed a file, it could
``fchmod``, ``utime`` or ``setxattr`` it, whatever the sandbox's mounts say (they govern
paths, not descriptors already open). So the command gets the ends of pipes made here (or
the sandbox's own /dev/null), and can do with its stdio only what such an end allows:
read its stdin, write its stdout and stderr, reopen nothing but that same pipe.

How the bytes move, by what the caller's descriptor is:

- /dev/null, or closed: nothing to move; :meth:`Relay.output` and :meth:`Relay.input`
  say None, and the command gets the /dev/null of its sandbox (read-only mounted there:
  nothing of it can be changed either).
- a pipe or a regular file: ``splice(2)``, so the bytes never pass through Python (a
  file's offset moves as the command writes, or as its stdin is read). Never blocking on
  the caller's pipe without setting a flag on it: ``SPLICE_F_NONBLOCK``.
- anything else (a terminal, a socket, a device): read and write; what goes to a
  terminal goes through :meth:`Relay._write`.

The caller's loop (``broker.cli.relay``'s, for ``sluice run``'s direct path and
``sluice sandbox``; ``python -m landlock_helper``'s own) waits for its own things in
:meth:`Relay.step`, which moves what is ready meanwhile. When the caller's end of an output goes away (a closed pipe, a hung-up
terminal), our read end is closed: the command's next write gets SIGPIPE, as in a shell
pipeline. Stdlib only, like the rest of the sandbox layer.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import stat
import termios
import time
from typing import Callable

# How much one splice or read moves at most.
CHUNK = 1 << 20
# Our pipes, and a caller's pipe we splice into, are widened to this where the system
# allows: a command writing in bulk runs further ahead of the relay, and one splice moves
# up to this much (the kernel's default is 64 KiB: 16 times the steps for the same bytes).
PIPE_SIZE = 1 << 20
# One step moves at most this much per stream, so that a stream that never runs dry (a
# file as destination never blocks) leaves the caller's loop its turn.
STEP_MAX = 64 << 20
# splice(2) is Linux's; elsewhere (macOS) every stream is copied.
_CAN_SPLICE = hasattr(os, "splice")
_FLAGS = os.SPLICE_F_NONBLOCK | os.SPLICE_F_MOVE if _CAN_SPLICE else 0
_DEV_NULL = os.makedev(1, 3)
# What a caller's descriptor is, for the relay.
NULL, SPLICE, COPY = "null", "splice", "copy"


def kind_of(fd: int) -> str | None:
    """:data:`NULL`, :data:`SPLICE` (a pipe or a regular file), :data:`COPY` (anything
    else), or None when ``fd`` is not open."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    if stat.S_ISCHR(st.st_mode) and st.st_rdev == _DEV_NULL:
        return NULL
    if _CAN_SPLICE and (stat.S_ISFIFO(st.st_mode) or stat.S_ISREG(st.st_mode)):
        return SPLICE
    return COPY


class _Stream:
    """Bytes from ``src`` to ``dst``; ``to_dst``: waiting for room in ``dst`` (else for
    bytes in ``src``); ``transform``: what the bytes pass through on the copy path (a
    terminal's output filter, or the keys filter of a pty's input), None: nothing."""

    __slots__ = ("src", "dst", "splice", "to_dst", "pending", "transform", "keep")

    def __init__(self, src: int, dst: int, kind: str, transform=None, keep: bool = False) -> None:
        self.src, self.dst = src, dst
        self.splice = kind == SPLICE
        self.to_dst = False
        self.pending = b""  # copy mode: read, not yet written
        self.transform = transform
        self.keep = keep  # a pty's master: closed with the relay, not at one stream's end

    def waits_on(self) -> int:
        return self.dst if self.to_dst else self.src


class Relay:
    """The command's side of its stdio (:meth:`output`, :meth:`input`, :meth:`terminal`),
    then the bytes moved by :meth:`step` until :meth:`drain`; :meth:`close` at the end.

    ``terminal_filter``: makes, for each output that goes to a terminal, the streaming
    filter (``bytes -> bytes``) its bytes pass through; None: they go as they are.
    """

    def __init__(self, *, terminal_filter: Callable[[], Callable[[bytes], bytes]] | None = None) -> None:
        self.outputs: list[_Stream] = []  # the command's -> the caller's
        self.stdin: _Stream | None = None  # the caller's -> the command's
        self.theirs: list[int] = []  # the command's ends, until handed over
        self.mine: list[int] = []  # our ends, closed by close()
        self.master: int | None = None  # a pty's (:meth:`terminal`)
        self.error: str | None = None  # the first failure of the caller's stdin or stdout, for the caller to say
        self._filter = terminal_filter

    # -- the command's side -------------------------------------------------------------

    def output(self, fd: int) -> int | None:
        """What the command writes to in place of our output ``fd``: a pipe's write end
        relayed to ``fd``, or None (``fd`` is /dev/null or closed: the sandbox's own
        /dev/null, and nothing to relay)."""
        kind = kind_of(fd)
        if kind in (None, NULL):
            return None
        r, w = self._pipe()
        os.set_blocking(r, False)  # ours: read until it is empty, in either mode
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            _widen(fd)  # one splice moves what the caller's pipe has room for
        screen = self._filter() if self._filter is not None and kind == COPY and os.isatty(fd) else None
        self.outputs.append(_Stream(r, fd, kind, screen))
        self.theirs.append(w)
        return w

    def input(self, fd: int) -> int | None:
        """What the command reads in place of our input ``fd``: a pipe's read end fed
        from ``fd`` as the command reads it (end of file included), or None (``fd`` is
        /dev/null or closed: the sandbox's own /dev/null)."""
        kind = kind_of(fd)
        if kind in (None, NULL):
            return None
        r, w = self._pipe()
        os.set_blocking(w, False)
        self.stdin = _Stream(fd, w, kind)
        self.theirs.append(r)
        return r

    def terminal(self, keys: int = 0, screen: int = 1, key_filter: Callable[[bytes], bytes] | None = None) -> int:
        """A pty made here, whose slave (returned) is the command's stdin, stdout and
        stderr: ``keys`` typed go to its master (through ``key_filter``, which may keep
        some), what it shows goes to ``screen``."""
        self.master, slave = os.openpty()
        self.theirs.append(slave)
        self.mine.append(slave)
        os.set_blocking(self.master, False)
        out = self._filter() if self._filter is not None else None
        self.outputs.append(_Stream(self.master, screen, COPY, out, keep=True))
        self.stdin = _Stream(keys, self.master, COPY, key_filter, keep=True)
        return slave

    def handed_over(self) -> None:
        """The command has its ends (or will never have them): ours go."""
        for fd in self.theirs:
            self._close(fd)
        self.theirs = []

    def _pipe(self) -> tuple[int, int]:
        r, w = os.pipe2(os.O_CLOEXEC)
        self.mine += [r, w]
        _widen(w)
        return r, w

    def _close(self, fd: int) -> None:
        if fd in self.mine:
            self.mine.remove(fd)
            os.close(fd)

    # -- moving bytes --------------------------------------------------------------------

    @property
    def open_outputs(self) -> bool:
        return any(s.src >= 0 for s in self.outputs)

    def step(self, extra=(), timeout: float | None = None, *, feed: bool = True) -> list[int]:
        """Wait up to ``timeout`` for any of ``extra`` or for bytes to move; move them;
        return which of ``extra`` are readable. ``feed=False``: stdin waits."""
        streams = [s for s in self.outputs if s.src >= 0]
        if feed and self.stdin is not None and self.stdin.dst >= 0:
            streams.append(self.stdin)
        rlist, wlist = list(extra), []
        for s in streams:
            (wlist if s.to_dst else rlist).append(s.waits_on())
        try:
            readable, writable, _ = select.select(rlist, wlist, [], timeout)
        except InterruptedError:
            return []
        for s in streams:
            if s.waits_on() in (writable if s.to_dst else readable):
                self._in(s) if s is self.stdin else self._out(s)
        return [fd for fd in extra if fd in readable]

    def drain(self, timeout: float | None = None) -> None:
        """After the command's whole tree is dead: what is left in each output, up to its
        end (or until ``timeout``, for a caller whose reader has stopped reading)."""
        stdin, self.stdin = self.stdin, None
        if stdin is not None and not stdin.keep:
            self._close(stdin.dst)
        left = float("inf") if timeout is None else timeout
        deadline = time.monotonic() + left
        while self.open_outputs and left > 0:
            self.step(timeout=None if timeout is None else left)
            left = deadline - time.monotonic()

    def _out(self, s: _Stream) -> None:
        s.to_dst = False
        moved = 0
        while moved < STEP_MAX:
            try:
                if s.splice:
                    n = os.splice(s.src, s.dst, CHUNK, flags=_FLAGS)
                else:
                    data = _read(s.src)
                    n = len(data)
                    if n:
                        self._write(s, data)
            except BlockingIOError:
                # Our pipe is empty, or the caller's is full: wait for the one it is.
                s.to_dst = s.splice and _waiting(s.src) > 0
                return
            except OSError as e:
                if s.splice and e.errno == errno.EINVAL:
                    s.splice = False  # a file opened O_APPEND, or one splice cannot write: copy
                    continue
                self._lost(s, e)
                return
            if n == 0:
                self._end_output(s)
                return
            if n < CHUNK:
                return  # our pipe is empty, or the caller's full: the next select says which
            moved += n

    def _lost(self, s: _Stream, e: OSError) -> None:
        """The caller's end of an output failed: the command's next write there gets
        SIGPIPE (a closed pipe, a hung-up terminal: as in a shell); a failure of another
        kind (a full disk) is said too."""
        if s.dst == 1 and self.error is None and e.errno not in (errno.EPIPE, errno.EIO):
            self.error = f"writing the output failed: {e.strerror}"
        self._end_output(s)

    def _end_output(self, s: _Stream) -> None:
        if not s.keep:
            self._close(s.src)
        s.src = -1

    def _write(self, s: _Stream, data: bytes) -> None:
        """The copy path (a terminal, a socket, a device): what goes to a terminal passes
        its stream's filter here, and nowhere else."""
        _write_all(s.dst, data if s.transform is None else s.transform(data))

    def _in(self, s: _Stream) -> None:
        if s.splice:
            try:
                n = os.splice(s.src, s.dst, CHUNK, flags=_FLAGS)
            except BlockingIOError:
                # Bytes but no room (wait for room), or room but no bytes (wait for bytes).
                s.to_dst = not s.to_dst
                return
            except OSError as e:
                return self._end_stdin(s, None if e.errno == errno.EPIPE else e)
            if n == 0:
                return self._end_stdin(s)
            s.to_dst = False
            return
        if not s.pending:
            try:
                data = _read(s.src)
            except BlockingIOError:
                return
            except OSError as e:
                return self._end_stdin(s, e)
            if not data:
                return self._end_stdin(s)
            s.pending = data if s.transform is None else s.transform(data)
            if not s.pending:
                return  # all kept by the filter
        try:
            n = os.write(s.dst, s.pending)
        except BlockingIOError:
            n = 0
        except OSError:  # the command closed its stdin (or exited): the rest goes nowhere
            return self._end_stdin(s)
        s.pending = s.pending[n:]
        s.to_dst = bool(s.pending)

    def _end_stdin(self, s: _Stream, failed: OSError | None = None) -> None:
        """End of file for the command (after a failed read of ours too, which is said)."""
        if failed is not None and self.error is None:
            self.error = f"reading stdin failed: {failed.strerror}; the command gets end of file"
        s.pending = b""
        if not s.keep:
            self._close(s.dst)
        s.dst = -1

    def close(self) -> None:
        """Every fd of ours goes (the caller's are the caller's)."""
        for fd in list(self.mine):
            self._close(fd)
        if self.master is not None:
            os.close(self.master)
            self.master = None
        for s in self.outputs:
            s.src = -1
        if self.stdin is not None:
            self.stdin.dst = -1


def _widen(fd: int) -> None:
    """Make ``fd``'s pipe hold :data:`PIPE_SIZE` if it holds less (a property of the pipe,
    not of anyone's description, as sluice run widens a pipe on its stdin)."""
    try:
        if fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) < PIPE_SIZE:
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    except (OSError, AttributeError):  # AttributeError: not Linux
        pass  # over the user's pipe quota: the size it has works too, in more steps


def _waiting(fd: int) -> int:
    """How many bytes a pipe holds."""
    try:
        return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, bytes(4)), "little", signed=True)
    except OSError:
        return 0


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, CHUNK)
    except OSError as e:
        if e.errno == errno.EIO:  # a pty's master once every end of its terminal is closed
            return b""
        raise


def _write_all(fd: int, data) -> None:
    """Write all of ``data``, waiting out a descriptor that someone set non-blocking."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            select.select([], [fd], [])
