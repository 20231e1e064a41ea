"""The fast path of ``sluice run``: a direct run (run.sock, described in docs/protocol.md,
"Direct runs: run.sock"; its messages are :mod:`broker.wire.direct`'s).

When the local daemon is running, ``sluice run`` hands it the command over run.sock, with
pipes of its own as the command's stdout and stderr (and stdin, when the command reads
it), and moves the bytes between those and its own stdio
(:class:`landlock_helper.relay.Relay`: spliced where ours is a pipe or a file, so no
byte passes through Python). The command never gets a descriptor of the caller's: it can
reopen nothing of the caller's through /proc, change no file, set no flag on the
caller's pipe. This path loads neither pyzmq nor msgspec (stdlib only), so ``sluice
run`` starts fast.

Cancel (Ctrl-C, SIGTERM, SIGHUP), timeouts, limits, notices and the exit code are the
daemon's, exactly as for ``sluice run`` through the client library; a run this path
cannot do (no daemon running yet, a daemon without executors of its own) returns None
before anything ran, and ``sluice run`` takes the broker socket instead.
"""

from __future__ import annotations

import os
import socket
import time
from types import SimpleNamespace

from broker.cli.base import caught_signals, print_error, write_all
from broker.net.runtime import RuntimeDir
from broker.wire import direct
from broker.wire.results import new_call_id, shell_returncode
from broker.wire.run_args import json_fields
from landlock_helper.relay import Relay

# How long connecting to run.sock may take before sluice run takes the broker socket.
CONNECT_S = 2.0
# After the exit, how long relayed output may take to drain (its writers are dead by then).
DRAIN_S = 5.0
# What :meth:`DirectRun.wait` returns when the daemon refused before anything ran.
FALLBACK = object()


class DirectRun:
    """One direct run: :meth:`start` (None: not possible, use the broker socket), then :meth:`wait`."""

    def __init__(self, fields: dict, *, name: str = "sluice run", runtime: RuntimeDir | None = None,
                 screen=None) -> None:
        self.fields = fields
        self.name = name
        self.runtime = runtime or RuntimeDir.default()
        self.sock: socket.socket | None = None
        # screen: what output to a terminal passes (broker.cli.terminal_guard.relay_filter)
        self.relay = Relay(terminal_filter=screen)
        self.signum: int | None = None
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
        relay = self.relay
        try:
            outputs = {"stdout": relay.output(1), "stderr": relay.output(2)}
            theirs = [fd for fd in outputs.values() if fd is not None]
            if self.fields["stdin"]:
                theirs.append(relay.input(0))
            run = json_fields(self.fields)
            # Ours is /dev/null (or closed): the command gets the sandbox's own, nothing to relay.
            run["stdio_null"] = [name for name, fd in outputs.items() if fd is None]
            direct.send(sock, {"run": run, "call": new_call_id(), "name": self.name, "token": token}, theirs)
        except OSError:
            sock.close()
            relay.close()
            return False
        finally:
            relay.handed_over()  # the daemon has its own copies now
        self.sock = sock
        return True

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
            self.relay.close()
            if self.relay.error:
                print_error(self.relay.error)
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
            timeout = heard + direct.SILENT_LIMIT_S - time.monotonic()
            if deadline is not None:
                timeout = min(timeout, deadline - time.monotonic())
            if timeout <= 0 and deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError
            if timeout <= 0:
                return (f"the sluice daemon stopped answering (nothing heard for {direct.SILENT_LIMIT_S:g} s); "
                        "the command may still be running: `sluice daemon status` shows the daemon")
            # Stdin waits for the start: a refusal may fall back, and the broker socket reads it then.
            ready_r = self.relay.step([sock.fileno(), wake_r], timeout, feed=self.started)
            if not ready_r and deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError
            if wake_r in ready_r:
                _drain_wakeups(wake_r)
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
            self.relay.drain(DRAIN_S)
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

_EXIT_DEFAULTS = {"exit_code": None, "signal": None, "timed_out": False, "aborted": False, "duration_s": 0.0,
                  "stdout_dropped": 0, "stderr_dropped": 0, "error": None, "limit": None}


def _drain_wakeups(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except OSError:
        pass

