"""One command in flight: its sandboxed process, its two pipes (or its terminal), its
flow-control window.

A call is finished when its pipes have hit EOF *and* every ``done_fd`` of the sandbox
is readable (the whole process tree is dead). Only then is ``exit`` sent, so a frontend
never sees ``exit`` before the last chunk, nor before the last setsid escapee is gone.

A run with ``tty`` gets a pty made here, outside the sandbox: the command has the slave
as its terminal, and the master is its one output stream (stdout), where its stdin is
written and its window size set. Reading the master fails with EIO once every process
holding the slave has gone: that is its end of file.

A run with ``fileops`` is the sandbox's file-operation builtin
(:mod:`landlock_helper.fileops`) instead of a program: the batch from the request is
its stdin, and its answer comes back as its stdout, like any command's output. With
``stdin`` (and an empty ``fileops``) the caller writes the batches there instead, one
after another's answer: a conversation in one sandboxed process.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import struct
import termios
import time
from typing import TYPE_CHECKING

import structlog

from broker.wire import direct
from broker.wire import frames as wire
from broker.wire.results import EXIT_TIMED_OUT
from executor.capture import Capture
from landlock_helper import filter_env
from landlock_helper.limits import Limits
from landlock_helper.outcome import PASSABLE_SIGNALS
from landlock_helper.spawn import SandboxError

# The builtin a run with ``fileops`` runs (landlock_helper.spawn.BUILTINS).
FILEOPS = "fileops"

if TYPE_CHECKING:
    from executor.worker import Worker

log = structlog.get_logger("executor.call")

# One os.read takes at most this much: big reads keep per-chunk overhead negligible.
READ_MAX = 1024 * 1024
PIPE_SIZE = 1024 * 1024
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
# SIGTERM first on cancel; SIGKILL after this many seconds if the tree still lives.
CANCEL_GRACE_S = 0.5
# poll() should answer as soon as done_fds are readable; if it lags, retry this often.
POLL_RETRY_S = 0.005
POLL_RETRIES = 400
# Each capped copy stays well inside one wire message, whatever the caller asked for.
CAPTURE_MAX = wire.MAX_MESSAGE_SIZE // 4
# Chatty output (a command flushing a byte at a time) would be one message per write
# through every hop. So after a small chunk, a stream's next read waits until PACE_S has
# passed since it was sent: what arrives meanwhile stays in the pipe and goes as one chunk.
# A line after a quiet spell is read at once (no added latency); only output that follows
# a small chunk within PACE_S waits, and at most that long. A big chunk means the reader
# is behind, not chatty: the next read comes at once, so bulk output never waits.
PACE_S = 0.001
PACE_BELOW = 16 * 1024


class _Stream:
    """The read end of one output pipe and what it has delivered so far."""

    __slots__ = ("fd", "header", "capture", "eof", "watching", "paced_until", "held")

    def __init__(self, fd: int, header: bytes, capture_limit: int) -> None:
        self.fd = fd
        # Prebuilt once: every chunk of this stream goes out as [header, chunk].
        self.header = header
        self.capture = Capture(capture_limit)
        self.eof = False
        self.watching = False
        # Loop time before which the next read waits (a small chunk went out just now).
        self.paced_until = 0.0
        # The timer of a read put off until paced_until (the pipe unwatched meanwhile).
        self.held = None


class Call:
    __slots__ = (
        "worker",
        "corr",
        "req",
        "proc",
        "streams",
        "unacked_bytes",
        "unacked_chunks",
        "on_hold",
        "timed_out",
        "aborted",
        "error",
        "started_at",
        "_loop",
        "_send",
        "_done_pending",
        "_tree_dead",
        "_draining",
        "_timers",
        "_poll_tries",
        "_finishing",
        "stdin",
        "_stdio",
        "_notes_fd",
    )

    def __init__(self, worker: Worker, corr: str, req: wire.RunRequest, stdio: list[int] | None = None) -> None:
        self.worker = worker
        # A direct run's stdio (stdout, stderr, stdin?): the ends of the caller's pipes
        # (checked by the worker), the command's as they are; then nothing is read here, and person-facing notes go to
        # ``_notes_fd`` (its stderr) instead of an ``out`` message.
        self._stdio = stdio
        self._notes_fd = -1
        self.corr = corr
        self.req = req
        self.proc = None
        self.streams: tuple[_Stream, ...] = ()
        self.unacked_bytes = 0
        self.unacked_chunks = 0
        # The broker holds the output (its frontend is behind): the window is shut.
        self.on_hold = False
        self.timed_out = False
        self.aborted = False
        self.error: str | None = None
        self.started_at = 0.0
        self._loop = worker.loop
        self._send = worker.send
        self._done_pending: set[int] = set()
        self._tree_dead = False
        # Set once a killed tree is dead: the pipes then hold a bounded remainder
        # (at most their capacity), which is read out without waiting for acks so
        # the exit can be reported even if nobody acks any more.
        self._draining = False
        self._timers: list = []
        self._poll_tries = 0
        self._finishing = False
        # The write end of the command's stdin when the caller sends it (``req.stdin``).
        self.stdin: _Stdin | None = None

    # -- start ---------------------------------------------------------------------

    def start(self) -> bool:
        """Spawn the command and report ``started``; on failure report ``exit`` with an error."""
        req = self.req
        if not req.argv:
            return self._fail("empty command")
        sandbox_cwd = req.sandbox_cwd or req.cwd
        if not os.path.isabs(sandbox_cwd):
            return self._fail(f"sandbox_cwd must be an absolute path: {sandbox_cwd}")
        # Again, though the sender filtered it: a sender of another version, or none.
        env = filter_env(os.environ if req.env is None else req.env, req.env_passthrough)
        if req.fileops is not None and (req.tty is not None or self._stdio is not None or (req.stdin and req.fileops)):
            return self._fail("a fileops run has no terminal or stdio of its own, and its batches come "
                              "either in the request or on its stdin")
        if req.tty is not None:
            return self._start_tty(req, env, sandbox_cwd)
        if self._stdio is not None:
            return self._start_direct(req, env, sandbox_cwd)
        fds: list[int] = []
        r_in = w_in = None
        try:
            r_out, w_out = os.pipe2(os.O_CLOEXEC)
            fds += (r_out, w_out)
            r_err, w_err = os.pipe2(os.O_CLOEXEC)
            fds += (r_err, w_err)
            if req.stdin or req.fileops is not None:
                r_in, w_in = os.pipe2(os.O_CLOEXEC)
                fds += (r_in, w_in)
        except OSError as e:
            _close_all(fds)
            return self._fail(f"cannot create pipes: {e.strerror}")
        for fd in (r_out, r_err):
            os.set_blocking(fd, False)
            try:
                fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_SIZE)
            except OSError:
                pass  # over the per-user pipe budget: the default size still works
        try:
            started = self._spawn(env, sandbox_cwd, (r_out, r_err, *((w_in,) if w_in is not None else ())),
                                  expected=(SandboxError,), stdout=w_out, stderr=w_err, stdin=r_in,
                                  builtin=None if req.fileops is None else FILEOPS)
        finally:
            # The child holds its own copies; ours would keep the pipes from EOF.
            _close_all((w_out, w_err, *((r_in,) if r_in is not None else ())))
        if not started:
            return False
        if w_in is not None:
            self.stdin = _Stdin(self, w_in)
            if req.fileops is not None and not req.stdin:
                self.stdin.preload(req.fileops)
        return self._started(r_out, r_err)

    def _start_tty(self, req: wire.RunRequest, env: dict, sandbox_cwd: str) -> bool:
        try:
            master, slave = os.openpty()
        except OSError as e:
            return self._fail(f"cannot make a terminal: {e.strerror}")
        try:
            os.set_inheritable(master, False)
            _set_size(master, req.tty.rows, req.tty.cols)
            w_in = os.dup(master) if req.stdin else None
        except OSError as e:
            _close_all((master, slave))
            return self._fail(wire.one_line(e.strerror) or "unknown error")
        try:
            if not self._spawn(env, sandbox_cwd, (master, *((w_in,) if w_in is not None else ())),
                               stdout=slave, stderr=slave, stdin=slave, tty=True):
                return False
        finally:
            os.close(slave)  # ours would keep the master from its end of file
        os.set_blocking(master, False)
        if w_in is not None:
            self.stdin = _Stdin(self, w_in)
        return self._started(master, None)

    def _start_direct(self, req: wire.RunRequest, env: dict, sandbox_cwd: str) -> bool:
        stdio, self._stdio = self._stdio, []
        # An output without an fd is the sandbox's own /dev/null (None).
        given = dict(zip(direct.stdio_names(req.stdin, req.stdio_null), stdio))
        stdout, stderr, stdin = given.get("stdout"), given.get("stderr"), given.get("stdin")
        try:
            if stderr is not None:
                self._notes_fd = os.dup(stderr)
            started = self._spawn(env, sandbox_cwd, (), stdout=stdout, stderr=stderr, stdin=stdin)
        except OSError as e:
            started = self._fail(wire.one_line(e.strerror) or "unknown error")
        finally:
            _close_all(stdio)  # the sandbox holds its own copies
        if not started:
            self._release()
            return False
        return self._started(None, None)

    def _spawn(self, env: dict, sandbox_cwd: str, ours: tuple, *, expected=(OSError, SandboxError), **stdio) -> bool:
        """Start the command with ``stdio`` (:attr:`proc`); False when it could not start:
        its exit said why, and ``ours`` (our ends of its stdio) are closed."""
        req = self.req
        self.started_at = time.monotonic()
        try:
            # disk-write-cwd means sandbox_cwd (the session's directory), not where it runs.
            self.proc = self.worker.spawn(req.argv, cwd=req.cwd, env=env, policy=req.sandbox,  # checked as decoded
                                          sandbox_cwd=os.path.normpath(sandbox_cwd), readable=req.readable,
                                          limits=req.limits or Limits(), **stdio)
            return True
        except expected as e:
            why = wire.one_line(e.strerror if isinstance(e, OSError) else e) or "unknown error"
        except Exception as e:  # a spawn failure must never take the worker down
            log.exception("spawn failed", corr=self.corr)
            why = wire.one_line(f"cannot start command: {e}")
        _close_all(ours)
        return self._fail(why)

    def _started(self, out_fd: int | None, err_fd: int | None) -> bool:
        """Report ``started`` and start reading ``out_fd`` (and ``err_fd``, None for a
        terminal); both None: a direct run, whose output is not ours to read."""
        req, proc = self.req, self.proc
        self._send(wire.message(wire.STARTED, self.corr, wire.Started(pid=proc.pid, executor=self.worker.name)))
        limit = min(req.capture_limit, CAPTURE_MAX)
        if out_fd is None:
            self.streams = ()
        else:
            out = _Stream(out_fd, wire.header(wire.OUT, self.corr, stream=wire.STDOUT), limit)
            self.streams = (out,) if err_fd is None else (
                out, _Stream(err_fd, wire.header(wire.OUT, self.corr, stream=wire.STDERR), limit))
        loop = self._loop
        self._done_pending = set(proc.done_fds)
        for fd in proc.done_fds:
            loop.add_reader(fd, self._on_done_fd, fd)
        if req.timeout_ms is not None:
            self._timers.append(loop.call_later(max(0, req.timeout_ms) / 1000, self._on_timeout))
        self.update_readers()
        if not self._done_pending:
            self._on_tree_dead()
        return True

    def _fail(self, message: str) -> bool:
        """The command never ran: an exit with an error and no exit code."""
        self._send(wire.message(wire.EXIT, self.corr, wire.ExitStatus(error=message)))
        return False

    # -- output ----------------------------------------------------------------------

    def _on_readable(self, s: _Stream) -> None:
        if not self._draining:
            now = self._loop.time()
            if now < s.paced_until:
                self._hold(s, s.paced_until)
                return
            # The other stream's held bytes came first: they go first, so stdout and
            # stderr interleave as they do without pacing.
            for o in self.streams:
                if o.held is not None:
                    self._end_hold(o)
            if not s.watching:  # the window closed on the other stream's bytes
                return
        self._read(s)

    def _hold(self, s: _Stream, until: float) -> None:
        if s.watching:
            self._loop.remove_reader(s.fd)
            s.watching = False
        s.held = self._loop.call_at(until, self._end_hold, s)

    def _end_hold(self, s: _Stream) -> None:
        """Read what a held stream gathered; hold it again while it stays chatty."""
        if s.held is not None:
            s.held.cancel()
            s.held = None
        if s.fd < 0:
            return
        if self._window_open() and self._read(s) and not self._draining and self._loop.time() < s.paced_until:
            # A small chunk just went: read again a pace from now, without watching
            # the pipe in between (a quiet pipe returns to being watched then).
            self._hold(s, s.paced_until)
        else:
            self.update_readers()

    def _read(self, s: _Stream) -> bool:
        """One read of ``s``, sent on as one chunk; True if a chunk went."""
        room = wire.WINDOW_BYTES - self.unacked_bytes
        try:
            # Never read past the window: at most WINDOW_BYTES stay unacknowledged.
            chunk = os.read(s.fd, READ_MAX if (room >= READ_MAX or self._draining) else room)
        except BlockingIOError:
            return False
        except OSError as e:
            if e.errno != errno.EIO:  # EIO: a terminal nobody holds any more
                log.warning("pipe read failed", corr=self.corr, error=e.strerror)
            chunk = b""
        if not chunk:
            self._on_eof(s)
            return False
        self._send([s.header, chunk])
        s.capture.add(chunk)
        if len(chunk) < PACE_BELOW and self.req.fileops is None:  # one answer, then EOF: nothing to gather
            s.paced_until = self._loop.time() + PACE_S
        self.unacked_bytes += len(chunk)
        self.unacked_chunks += 1
        if not self._window_open():
            self.update_readers()
        return True

    def _window_open(self) -> bool:
        return self._draining or (
            self.unacked_bytes < wire.WINDOW_BYTES
            and self.unacked_chunks < wire.WINDOW_CHUNKS
            and not self.worker.congested
            and not self.on_hold
        )

    def _on_eof(self, s: _Stream) -> None:
        s.eof = True
        if s.held is not None:
            s.held.cancel()
            s.held = None
        if s.watching:
            self._loop.remove_reader(s.fd)
            s.watching = False
        os.close(s.fd)
        s.fd = -1
        self._maybe_finish()

    def update_readers(self) -> None:
        """Watch the pipes exactly when output may flow: window open and socket not congested."""
        want = self._window_open()
        loop = self._loop
        for s in self.streams:
            # A held stream is read by its timer, not by watching.
            w = want and not s.eof and s.held is None
            if w != s.watching:
                if w:
                    loop.add_reader(s.fd, self._on_readable, s)
                else:
                    loop.remove_reader(s.fd)
                s.watching = w

    def hold_output(self, on: bool) -> None:
        """The broker's ``hold``: its frontend is behind, no more output until it is not."""
        self.on_hold = on
        self.update_readers()

    def ack(self, nbytes: int, nchunks: int) -> None:
        self.unacked_bytes = max(0, self.unacked_bytes - max(0, nbytes))
        self.unacked_chunks = max(0, self.unacked_chunks - max(0, nchunks))
        self.update_readers()

    # -- ending ------------------------------------------------------------------------

    def cancel(self) -> None:
        """SIGTERM the tree, SIGKILL after a short grace; report aborted with the real status."""
        if self.aborted:
            return
        self.aborted = True
        if self._tree_dead:
            self._start_draining()
            return
        self._signal(self.proc.terminate)
        self._timers.append(self._loop.call_later(CANCEL_GRACE_S, self._kill))

    def abort(self, error: str) -> None:
        """Kill at once (the executor is going away); report aborted with ``error``."""
        self.aborted = True
        self.error = error
        if self._tree_dead:
            self._start_draining()
        else:
            self._kill()

    def abandon(self, error: str) -> None:
        """Kill at once and report to nobody: the broker this call came from is gone, and
        has failed (or will fail) the call on its side."""
        self._send = _discard
        self.abort(error)

    def _on_timeout(self) -> None:
        if self._tree_dead:
            return
        self.timed_out = True
        self._kill()

    def _kill(self) -> None:
        if not self._tree_dead:
            self._signal(self.proc.kill)

    def _signal(self, how) -> None:
        try:
            how()
        except Exception as e:
            log.warning("signalling the command failed", corr=self.corr, error=wire.one_line(e))

    def _on_done_fd(self, fd: int) -> None:
        self._loop.remove_reader(fd)
        self._done_pending.discard(fd)
        if not self._done_pending:
            self._on_tree_dead()

    def _on_tree_dead(self) -> None:
        self._tree_dead = True
        for t in self._timers:
            t.cancel()
        self._timers.clear()
        if self.aborted or self.timed_out:
            self._start_draining()
        else:
            self._maybe_finish()

    def _start_draining(self) -> None:
        self._draining = True
        for s in self.streams:  # the remainder is read out at once, unpaced
            if s.held is not None:
                s.held.cancel()
                s.held = None
        self.update_readers()
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        if self._finishing or not self._tree_dead:
            return
        for s in self.streams:
            if not s.eof:
                return
        self._finishing = True
        self._finish()

    def _finish(self) -> None:
        try:
            outcome = self.proc.poll()
        except Exception as e:
            log.warning("poll failed", corr=self.corr, error=wire.one_line(e))
            outcome = None
            self._poll_tries = POLL_RETRIES
        if outcome is None:
            self._poll_tries += 1
            if self._poll_tries < POLL_RETRIES:
                self._loop.call_later(POLL_RETRY_S, self._finish)
                return
        duration = time.monotonic() - self.started_at
        out = self.streams[0] if self.streams else None
        err = self.streams[1] if len(self.streams) > 1 else None
        if outcome is not None and outcome.notes:
            note = "".join(f"{line}\n" for line in outcome.notes).encode()
            if self._notes_fd >= 0:
                _write_quietly(self._notes_fd, note)
            else:
                self._send([wire.header(wire.OUT, self.corr, stream=wire.STDERR), note])
            if err is not None:
                err.capture.add(note)
        if outcome is None:
            exit_code = signal = None
            error = self.error or "the command's exit status is unavailable"
        elif self.timed_out:
            exit_code, signal = EXIT_TIMED_OUT, None
            error = self.error or outcome.error
        else:
            exit_code, signal = outcome.exit_code, outcome.signal
            error = self.error or outcome.error
        status = wire.ExitStatus(
            exit_code=exit_code,
            signal=signal,
            timed_out=self.timed_out,
            aborted=self.aborted,
            duration_s=duration,
            stdout=out.capture.value() if out is not None else b"",
            stderr=err.capture.value() if err is not None else b"",
            stdout_dropped=out.capture.dropped if out is not None else 0,
            stderr_dropped=err.capture.dropped if err is not None else 0,
            error=error,
            limit=outcome.limit if outcome is not None else None,
        )
        self._send(wire.message(wire.EXIT, self.corr, status))
        self._release()
        self.worker.call_finished(self)

    def resize(self, rows: int, cols: int) -> None:
        """The terminal's new size (the command gets SIGWINCH); nothing without a terminal."""
        if self.req.tty is not None and self.streams and self.streams[0].fd >= 0:
            try:
                _set_size(self.streams[0].fd, rows, cols)
            except OSError as e:
                log.warning("resizing the terminal failed", corr=self.corr, error=e.strerror)

    def pass_signal(self, sig: int) -> None:
        """``sig`` to the command's process group (as Ctrl-C on a terminal sends SIGINT);
        a signal that may not be passed, or one for a command that has ended, is dropped."""
        if sig in PASSABLE_SIGNALS and self.proc is not None and not self._tree_dead and not self.aborted:
            self._signal(lambda: self.proc.signal_command(sig))

    def feed_stdin(self, data) -> None:
        """The next bytes of the command's stdin from the caller (empty: end of file)."""
        if self.stdin is not None and self.stdin.acks:
            self.stdin.feed(data)

    def _release(self) -> None:
        loop = self._loop
        if self.stdin is not None:
            self.stdin.close()
        if self._notes_fd >= 0:
            os.close(self._notes_fd)
            self._notes_fd = -1
        if self._stdio:  # a direct run that never started
            _close_all(self._stdio)
            self._stdio = []
        for s in self.streams:
            if s.held is not None:
                s.held.cancel()
                s.held = None
            if s.watching:
                loop.remove_reader(s.fd)
                s.watching = False
            if s.fd >= 0:
                os.close(s.fd)
                s.fd = -1
        for fd in self._done_pending:
            loop.remove_reader(fd)
        self._done_pending.clear()
        for t in self._timers:
            t.cancel()
        self._timers.clear()
        if self.proc is not None:
            try:
                self.proc.close()
            except Exception as e:
                log.warning("releasing the sandbox failed", corr=self.corr, error=wire.one_line(e))


class _Stdin:
    """The write end of a command's stdin: what the caller sends goes into the pipe as the
    command reads it, and is acked to the caller as it does (its window bounds what waits
    here). A command that closes its stdin or exits makes the rest go nowhere, acked all
    the same so the caller never waits for it."""

    __slots__ = ("call", "fd", "buffer", "eof", "unacked", "writing", "acks")

    def __init__(self, call: Call, fd: int) -> None:
        self.call = call
        self.fd = fd
        os.set_blocking(fd, False)
        self.buffer = bytearray()
        self.eof = False
        # Bytes taken from the buffer (written, or dropped) and not yet acked to the caller.
        self.unacked = 0
        self.writing = False
        self.acks = True

    def preload(self, data: bytes) -> None:
        """All of the command's stdin, from the run request itself (a fileops batch):
        written as the command reads it, then end of file; nobody waits for acks."""
        self.acks = False
        self.buffer += data
        self.eof = True
        self._write()

    def feed(self, data) -> None:
        if len(data) == 0:
            self.eof = True
        elif self.fd < 0:
            self._ack(len(data), now=True)  # the command does not read any more
            return
        elif len(self.buffer) + len(data) > 2 * wire.STDIN_WINDOW_BYTES:
            # More than the window allows: a caller that does not wait for acks. It gets
            # end of file here rather than the daemon's memory.
            log.warning("stdin beyond the window: closed", corr=self.call.corr)
            self._ack(len(self.buffer) + len(data), now=True)
            self.buffer.clear()
            self.close()
            return
        else:
            self.buffer += data
        self._write()

    def _write(self) -> None:
        if self.fd < 0:
            return
        while self.buffer:
            try:
                n = os.write(self.fd, self.buffer)
            except BlockingIOError:
                break
            except OSError:  # EPIPE: the command closed its stdin or is gone
                self._ack(len(self.buffer), now=True)
                self.buffer.clear()
                self.close()
                return
            del self.buffer[:n]
            self._ack(n, now=not self.buffer)
        want = bool(self.buffer)
        if want != self.writing:
            if want:
                self.call._loop.add_writer(self.fd, self._write)
            else:
                self.call._loop.remove_writer(self.fd)
            self.writing = want
        if not self.buffer and self.eof:
            self.close()

    def _ack(self, n: int, *, now: bool) -> None:
        if not self.acks:
            return
        self.unacked += n
        if self.unacked and (now or self.unacked >= wire.STDIN_ACK_EVERY_BYTES):
            self.call._send([wire.header(wire.ACK, self.call.corr, n=self.unacked)])
            self.unacked = 0

    def close(self) -> None:
        if self.fd < 0:
            return
        if self.writing:
            self.call._loop.remove_writer(self.fd)
            self.writing = False
        os.close(self.fd)
        self.fd = -1


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _discard(parts) -> None:
    pass


def _write_quietly(fd: int, data: bytes) -> None:
    """A few lines to a caller's own stderr, never blocking: only if its pipe has room now
    (the fd is shared with the caller: its blocking mode is not ours to change)."""
    try:
        if select.select([], [fd], [], 0)[1]:
            os.write(fd, data[: select.PIPE_BUF])
    except (OSError, ValueError):
        pass


def _close_all(fds) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
