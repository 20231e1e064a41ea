"""The fast path of ``sluice run``: a direct run (:mod:`broker.wire.direct`).

When the local daemon is running, ``sluice run`` hands it the command and its own
stdout and stderr (and stdin, when the command reads it) over run.sock: the sandboxed
command writes to them itself, as it would outside sluice, and this process only waits
for the exit. Its output is then as fast as the pipe it was given, and this path loads
neither pyzmq nor msgspec (stdlib only), so ``sluice run`` starts fast.

What goes to the sandbox as it is: an anonymous pipe. A terminal, a file or anything
else is relayed here through a pipe of ours (:func:`broker.wire.direct.passable` says
why), so the command sees a pipe, as it does through the broker socket. Cancel
(Ctrl-C, SIGTERM, SIGHUP), timeouts, limits, notices and the exit code are the daemon's,
exactly as for ``sluice run`` through the client library; a run this path cannot do (no
daemon running yet, a daemon without executors of its own) returns None before anything
ran, and ``sluice run`` takes the broker socket instead.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import time
from types import SimpleNamespace

from broker.cli.base import caught_signals, print_error, read_stdin, write_all
from broker.net.runtime import RuntimeDir
from broker.wire import direct
from broker.wire.results import new_call_id, shell_returncode
from broker.wire.run_args import json_fields

# How long connecting to run.sock may take before sluice run takes the broker socket.
CONNECT_S = 2.0
# How much one read of a relayed stream takes.
RELAY_READ = 256 * 1024
# After the exit, how long relayed output may take to drain (its writers are dead by then).
DRAIN_S = 5.0
# What :meth:`DirectRun.wait` returns when the daemon refused before anything ran.
FALLBACK = object()


class _Relay:
    """A pipe between the command and one of our fds that cannot go to it as it is."""

    __slots__ = ("src", "dst", "pending", "open")

    def __init__(self, src: int, dst: int) -> None:
        self.src, self.dst = src, dst
        self.pending = b""  # stdin only: read from our fd, not yet into the pipe
        self.open = True


class DirectRun:
    """One direct run: :meth:`start` (None: not possible, use the broker socket), then :meth:`wait`."""

    def __init__(self, fields: dict, *, name: str = "sluice run", runtime: RuntimeDir | None = None,
                 guards: dict | None = None) -> None:
        self.fields = fields
        self.guards = guards or {}  # our fd -> its TerminalGuard (broker.cli.terminal_guard), for a terminal
        self.name = name
        self.runtime = runtime or RuntimeDir.default()
        self.sock: socket.socket | None = None
        self.outputs: list[_Relay] = []  # command -> our stdout/stderr
        self.stdin: _Relay | None = None  # our stdin -> command
        self.signum: int | None = None
        self.stdout_closed = False
        self.daemon_version = ""
        self.started = False
        self._cancelled = False

    # -- start --------------------------------------------------------------------------

    def start(self) -> bool:
        """Hand the run to the daemon; False (nothing sent, nothing left open) if there is
        no run.sock to hand it to."""
        token = self.runtime.read_token()  # checks the runtime dir is ours, as the client library does
        if not token:
            return False
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.settimeout(CONNECT_S)  # a daemon too busy to accept: the broker socket waits better
            sock.connect(os.path.join(self.runtime.path, direct.SOCKET_NAME))
            sock.settimeout(None)
        except OSError:
            sock.close()
            return False
        theirs: list[int] = []
        try:
            for fd in (1, 2):
                theirs.append(self._output(fd))
            if self.fields["stdin"]:
                theirs.append(self._input(0))
            direct.send(sock, {"run": json_fields(self.fields), "call": new_call_id(), "name": self.name,
                               "token": token}, theirs)
        except OSError:
            sock.close()
            self._close_relays()
            return False
        finally:
            for fd in theirs:
                if fd not in (0, 1, 2):
                    os.close(fd)  # the daemon has its own copies now
        self.sock = sock
        return True

    def _output(self, fd: int) -> int:
        if direct.passable(fd):
            return fd
        r, w = os.pipe2(os.O_CLOEXEC)
        self.outputs.append(_Relay(r, fd))
        return w

    def _input(self, fd: int) -> int:
        if direct.passable(fd):
            return fd
        r, w = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(w, False)
        self.stdin = _Relay(fd, w)
        return r

    # -- wait ---------------------------------------------------------------------------

    def wait(self, cancel_wait_s: float):
        """The exit (a namespace of :class:`~broker.wire.frames.ExitStatus`'s fields and
        ``returncode``), an error line, or :data:`FALLBACK` (the daemon cannot do a direct
        run and nothing ran: use the broker socket); Ctrl-C and friends cancel the run and wait up to
        ``cancel_wait_s`` for its end (then :class:`TimeoutError`)."""
        try:
            with caught_signals(self._on_signal) as wake:
                return self._wait(wake, cancel_wait_s)
        finally:
            self._close_relays()
            if self.sock is not None:
                self.sock.close()

    def _on_signal(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum

    def _wait(self, wake_r: int, cancel_wait_s: float):
        sock = self.sock
        deadline = None
        heard = time.monotonic()
        while True:
            if self.signum is not None and not self._cancelled:
                self._cancel()
                deadline = time.monotonic() + cancel_wait_s
            readers = [sock.fileno(), wake_r, *(r.src for r in self.outputs if r.open)]
            writers = []
            stdin = self.stdin
            if stdin is not None and stdin.open and self.started:  # not before: a refusal may fall back
                (writers if stdin.pending else readers).append(stdin.dst if stdin.pending else stdin.src)
            timeout = heard + direct.SILENT_LIMIT_S - time.monotonic()
            if deadline is not None:
                timeout = min(timeout, deadline - time.monotonic())
            if timeout <= 0 and deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError
            if timeout <= 0:
                return (f"the sluice daemon stopped answering (nothing heard for {direct.SILENT_LIMIT_S:g} s); "
                        "the command may still be running: `sluice daemon status` shows the daemon")
            try:
                ready_r, ready_w, _ = select.select(readers, writers, [], timeout)
            except InterruptedError:
                continue
            if not ready_r and not ready_w and deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError
            if wake_r in ready_r:
                _drain_wakeups(wake_r)
            for relay in self.outputs:
                if relay.open and relay.src in ready_r:
                    self._relay_out(relay)
            if stdin is not None and stdin.open and (stdin.src in ready_r or stdin.dst in ready_w):
                self._relay_in(stdin)
            if sock.fileno() in ready_r:
                heard = time.monotonic()
                result = self._message()
                if result is not None:
                    return result

    def _message(self):
        try:
            message, fds = direct.receive(self.sock)
        except (BlockingIOError, InterruptedError):
            return None
        except (OSError, direct.DirectError) as e:
            return f"the connection to the sluice daemon failed: {e}"
        direct.close_all(fds)
        if message is None:
            return "the sluice daemon went away before the command finished"
        if "exit" in message:
            self._drain_outputs()
            status = SimpleNamespace(**{**_EXIT_DEFAULTS, **message["exit"]})
            status.returncode = shell_returncode(status)
            return status
        if "error" in message:
            if message.get("fallback") is True and not self.started:
                return FALLBACK
            return str(message["error"])
        if "notice" in message:
            self._say(f"sluice: {message['notice']}")
        elif "started" in message:
            self.started = True
            self.daemon_version = str(message.get("sluice_version", ""))
        return None

    def _say(self, line: str) -> None:
        try:
            write_all(2, f"{line}\n".encode())
        except OSError:
            pass

    def _cancel(self) -> None:
        self._cancelled = True
        try:
            direct.send(self.sock, {"cancel": True})
        except OSError:
            pass  # gone: its end says so

    # -- relays ---------------------------------------------------------------------------

    def _relay_out(self, relay: _Relay) -> None:
        try:
            data = os.read(relay.src, RELAY_READ)
        except BlockingIOError:
            return
        if not data:
            relay.open = False
            return
        if relay.dst == 1 and self.stdout_closed:
            return
        guard = self.guards.get(relay.dst)
        try:
            write_all(relay.dst, guard.feed(data) if guard else data)
        except OSError as e:
            if relay.dst != 1:
                return  # our stderr is gone: nothing to tell anyone
            # A closed pipe or a hung-up terminal: like a command writing into a closed
            # pipe, stop it. Anything else (a full disk) is said, not swallowed.
            if not isinstance(e, BrokenPipeError) and e.errno != errno.EIO:
                print_error(f"writing the output failed: {e.strerror}; the command is cancelled")
            self.stdout_closed = True
            if not self._cancelled:
                self._cancel()

    def _relay_in(self, relay: _Relay) -> None:
        if not relay.pending:
            try:
                data = read_stdin(relay.src, RELAY_READ)
            except BlockingIOError:
                return
            if not data:
                self._end_stdin(relay)
                return
            relay.pending = data
        try:
            n = os.write(relay.dst, relay.pending)
        except BlockingIOError:
            return
        except OSError:  # the command closed its stdin (or exited): the rest goes nowhere
            self._end_stdin(relay)
            return
        relay.pending = relay.pending[n:]

    def _end_stdin(self, relay: _Relay) -> None:
        relay.open = False
        relay.pending = b""
        os.close(relay.dst)
        relay.dst = -1

    def _drain_outputs(self) -> None:
        """After the exit: what the command wrote last, until each pipe's end."""
        deadline = time.monotonic() + DRAIN_S
        while any(r.open for r in self.outputs):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                ready, _, _ = select.select([r.src for r in self.outputs if r.open], [], [], left)
            except InterruptedError:
                continue
            for relay in self.outputs:
                if relay.open and relay.src in ready:
                    self._relay_out(relay)

    def _close_relays(self) -> None:
        for relay in self.outputs:
            if relay.src >= 0:
                os.close(relay.src)
                relay.src = -1
        self.outputs = []
        stdin, self.stdin = self.stdin, None
        if stdin is not None and stdin.dst >= 0:
            os.close(stdin.dst)


_EXIT_DEFAULTS = {"exit_code": None, "signal": None, "timed_out": False, "aborted": False, "duration_s": 0.0,
                  "stdout_dropped": 0, "stderr_dropped": 0, "error": None, "limit": None}


def _drain_wakeups(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except OSError:
        pass

