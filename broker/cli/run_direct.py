"""The fast transport of ``sluice run``: a direct run (run.sock, described in
docs/protocol.md, "Direct runs: run.sock"; its messages are :mod:`broker.wire.direct`'s).

When the local daemon is running, ``sluice run`` hands it the command over run.sock, with
pipes of its own as the command's stdout and stderr (and stdin, when the command reads
it), and moves the bytes between those and its own stdio in the relay loop that
``sluice sandbox`` uses too (:mod:`broker.cli.relay`: spliced where ours is a pipe or a
file, so no byte passes through Python). The command never gets a descriptor of the caller's: it can
reopen nothing of the caller's through /proc, change no file, set no flag on the
caller's pipe. This path loads neither pyzmq nor msgspec (stdlib only), so ``sluice
run`` starts fast.

Cancel (Ctrl-C, SIGTERM, SIGHUP), timeouts, limits, notices and the exit code are the
daemon's, exactly as for ``sluice run`` through the client library; a run this path
cannot do (no daemon running yet, a daemon without executors of its own) raises
:class:`NotRun` before anything ran, and ``sluice run`` takes the broker socket instead.
"""

from __future__ import annotations

import os
import socket
import time
from types import SimpleNamespace

from broker.cli.base import CliExit, announce_version, fail, print_error
from broker.cli.home_writes import HomeWrites
from broker.cli.relay import RelayLoop
from broker.net.runtime import RuntimeDir
from broker.wire import direct
from broker.wire.results import EXIT_SLUICE, new_call_id, shell_returncode
from broker.wire.run_args import json_fields

# How long connecting to run.sock may take before sluice run takes the broker socket.
CONNECT_S = 2.0
# After the exit, how long relayed output may take to drain (its writers are dead by then).
DRAIN_S = 5.0


class NotRun(Exception):
    """The daemon cannot run the command directly, and nothing ran: the broker socket can."""


class DirectRun:
    """A :class:`~broker.cli.run.Transport`: :meth:`run` hands the command to the daemon
    over run.sock and relays it (:class:`~broker.cli.relay.RelayLoop`, whose
    :class:`~broker.cli.relay.Running` it is) to its end."""

    # A closed stdout of ours reaches the command itself (SIGPIPE on its next write, as in a shell).
    stdout_closed = False

    def __init__(self, fields: dict, *, name: str = "sluice run", runtime: RuntimeDir | None = None,
                 screen=None, watch: HomeWrites | None = None) -> None:
        self.fields = fields
        self.name = name
        self.runtime = runtime or RuntimeDir.default()
        self.sock: socket.socket | None = None
        # screen: what output to a terminal passes (broker.cli.terminal_guard.relay_filter)
        self.loop = RelayLoop(screen=screen, watch=watch)
        self.relay = self.loop.relay
        self.started = False
        self.daemon_version = ""
        self._heard = 0.0
        self._cancel_wait_s = 0.0
        self._deadline: float | None = None

    @staticmethod
    def serves(args, remote) -> bool:
        """Whether a direct run does what ``args`` ask: our pipes and files relayed to a
        command of the local daemon (``remote`` is None). A terminal of its own (``-t``),
        Ctrl-C passed on (``-i``) and events (``--json``) are the broker socket's, as is
        every run ``--via-broker`` asks to go through it."""
        return remote is None and not (args.tty or args.interactive or args.json or args.via_broker)

    @property
    def signum(self) -> int | None:
        """The signal that told us to stop the command, if one did."""
        return self.loop.signum

    def run(self, cancel_wait_s: float):
        """The command's end: a namespace of :class:`~broker.wire.frames.ExitStatus`'s
        fields and ``returncode``. Ctrl-C and friends cancel the run and wait up to
        ``cancel_wait_s`` for its end (then :class:`TimeoutError`). Raises
        :class:`NotRun` when there is no run.sock to hand it to or the daemon cannot do a
        direct run, and :class:`~broker.cli.base.CliExit` when it failed (said)."""
        try:
            with self.loop.signals():
                if not self._start():
                    raise NotRun
                self._cancel_wait_s = cancel_wait_s
                self._heard = time.monotonic()
                result = self.loop.run(self)
        finally:
            self.loop.close()
            if self.sock is not None:
                self.sock.close()
        if self.daemon_version:
            announce_version(self.daemon_version, None)
        if isinstance(result, str):
            raise CliExit(fail(result, EXIT_SLUICE))
        return result

    # -- start --------------------------------------------------------------------------

    def _start(self) -> bool:
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
            stdin, stdout, stderr = self.loop.stdio(self.fields["stdin"])
            outputs = {"stdout": stdout, "stderr": stderr}
            theirs = [fd for fd in (stdout, stderr, stdin) if fd is not None]
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

    # -- as the relay loop's Running ---------------------------------------------------

    @property
    def feeds(self) -> bool:
        # Stdin waits for the start: a refusal may fall back, and the broker socket reads it then.
        return self.started

    def watched(self) -> tuple[int, ...]:
        return (self.sock.fileno(),)

    def timeout(self) -> float:
        timeout = self._heard + direct.SILENT_LIMIT_S - time.monotonic()
        if self._deadline is not None:
            timeout = min(timeout, self._deadline - time.monotonic())
        return max(timeout, 0.0)

    def heard(self, ready: list[int]):
        """The exit, an error line, or None; raises :class:`NotRun` for a refusal before
        the start, and TimeoutError once a cancelled run outlived the wait for it."""
        if self.sock.fileno() in ready:
            self._heard = time.monotonic()
            result = self._message()
            if result is not None:
                return result
        now = time.monotonic()
        if self._deadline is not None and now >= self._deadline:
            raise TimeoutError
        if now >= self._heard + direct.SILENT_LIMIT_S:
            return (f"the sluice daemon stopped answering (nothing heard for {direct.SILENT_LIMIT_S:g} s); "
                    "the command may still be running: `sluice daemon status` shows the daemon")
        return None

    def stop(self, signum: int) -> None:
        self._deadline = time.monotonic() + self._cancel_wait_s
        try:
            direct.send(self.sock, {"cancel": True})
        except OSError:
            pass  # gone: its end says so

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
                raise NotRun(message["error"])
            return str(message["error"])
        if "notice" in message:
            print_error(str(message["notice"]))
        elif "started" in message:
            self.started = True
            self.daemon_version = str(message.get("sluice_version", ""))
        return None


_EXIT_DEFAULTS = {"exit_code": None, "signal": None, "timed_out": False, "aborted": False, "duration_s": 0.0,
                  "stdout_dropped": 0, "stderr_dropped": 0, "error": None, "limit": None}
