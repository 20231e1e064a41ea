"""The frontend client library: submit commands to the daemon, stream their output, wait.

Synchronous and single-threaded: nothing happens behind your back. The socket is pumped
while you wait (:meth:`Client.wait`, :meth:`Client.wait_all`, :meth:`Client.run`) or
when you call :meth:`Client.poll`; output callbacks run from inside those calls::

    from broker.client import Client

    with Client.connect() as client:          # starts a daemon if none is running
        result = client.run(["make", "-j2"], on_output=lambda call, stream, chunk: ...)
        print(result.returncode)

``on_output(call, stream, chunk)`` gets ``stream`` 1 (stdout) or 2 (stderr) and the chunk
as a memoryview straight out of the ZeroMQ frame (no copy): use it during the callback
or copy it with ``bytes(chunk)``. Output is acknowledged to the executor as the callbacks
return, so a slow callback slows only its own command, never the daemon.

Interrupts: inside ``with client.catch_signals():`` SIGINT/SIGTERM/SIGHUP are caught
through a wakeup fd that sits in the same poller as the socket, so a waiting
:meth:`Client.wait` raises :class:`Interrupted` the moment one arrives; the call keeps
running until you :meth:`Client.cancel` it.

Sessions with the agent (configure, submit, events): :meth:`Client.open_session`,
:meth:`Client.attach` and :meth:`Client.session` give a
:class:`broker.client_sessions.ClientSession`, :meth:`Client.list_sessions` lists what the
daemon hosts; see that module.

Errors: :class:`UsageError` for bad arguments (the message is one line, for a person),
:class:`DaemonError` when the daemon cannot be reached, refuses us, or goes away while
calls are in flight (they fail with it rather than hang).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import itertools
import os
import signal
import stat
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import msgspec
import zmq

from broker import wire
from broker.runtime import RuntimeDir, RuntimeDirError, RuntimeDirMissing, open_reused, read_file

__all__ = [
    "Call",
    "Client",
    "DaemonError",
    "DaemonStatus",
    "Interrupted",
    "Result",
    "SluiceError",
    "UsageError",
    "daemon_status",
    "make_request",
    "start_daemon",
    "stop_daemon",
]

# A daemon presumed dead after this many heartbeats without any message from it.
DEAD_AFTER_HEARTBEATS = 5
# Messages handled per pump before the wait loops look at signals and deadlines again.
DRAIN_BATCH = 512
# Blocking sends (run requests) give up after this long: the daemon is not reading.
SEND_TIMEOUT_MS = 10_000
# Largest capture limit we ask for: the exit message carries both captured streams and
# must stay under the broker's message size limit.
MAX_CAPTURE_LIMIT = wire.MAX_MESSAGE_SIZE // 4

RC_TIMED_OUT = 124
RC_SLUICE_ERROR = 125
RC_CANNOT_EXECUTE = 126
RC_NOT_FOUND = 127
RC_SIGNAL_BASE = 128
RC_ABORTED = 128 + signal.SIGINT


class SluiceError(Exception):
    """Base of the errors this module raises; ``str(e)`` is one line for a person."""


class UsageError(SluiceError, ValueError):
    """A bad argument (unknown mode, missing cwd, relative writable path, ...)."""


class DaemonError(SluiceError):
    """The daemon cannot be started or reached, refused us, or went away."""


class Interrupted(Exception):
    """A signal caught by :meth:`Client.catch_signals` arrived while waiting."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum


# -- results ----------------------------------------------------------------------------


@dataclass(slots=True)
class Result:
    """How a call ended.

    ``returncode`` folds it into one number, shell style:

    - 124 when the call timed out (``timeout_ms``),
    - 130 when it was cancelled (:meth:`Client.cancel`),
    - 128+N when the command was killed by signal N,
    - when the command never ran (``error`` is set): the code the sandbox gave
      (127 not found, 126 cannot execute or sandbox set-up failed), else 127 if the
      error says "not found", 126 for "permission denied", 125 for any other failure
      (executor, daemon),
    - otherwise the command's exit code.
    """

    call_id: str
    argv: list[str]
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    aborted: bool = False
    duration_s: float = 0.0
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_dropped: int = 0
    stderr_dropped: int = 0
    error: str | None = None

    @property
    def returncode(self) -> int:
        return shell_returncode(self)

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def error_returncode(error: str) -> int:
    """127 / 126 / 125 for a spawn error message (see :class:`Result`)."""
    low = error.lower()
    if "not found" in low:
        return RC_NOT_FOUND
    if "permission denied" in low or "exec format" in low:
        return RC_CANNOT_EXECUTE
    return RC_SLUICE_ERROR



def shell_returncode(r) -> int:
    """How a finished call (anything with exit_code, signal, timed_out, aborted, error)
    reads as one shell-style number: 124 timed out, 130 aborted, 128+N killed by signal
    N, the sandbox's code or 125-127 when it never ran, else the exit code."""
    if r.timed_out:
        return RC_TIMED_OUT
    if r.aborted:
        return RC_ABORTED
    if r.error is not None:
        # The sandbox reports 127 (not found) / 126 (cannot execute) itself.
        return r.exit_code if r.exit_code is not None else error_returncode(r.error)
    if r.signal is not None:
        return RC_SIGNAL_BASE + r.signal
    if r.exit_code is not None:
        return r.exit_code
    return RC_SLUICE_ERROR

OutputCallback = Callable[["Call", int, memoryview], object]
StartedCallback = Callable[["Call"], object]


class Call:
    """One submitted command. ``pid`` is set once the executor has started it."""

    __slots__ = (
        "call_id",
        "argv",
        "request",
        "on_output",
        "on_started",
        "pid",
        "executor",
        "result",
        "failure",
        "_unacked_bytes",
        "_unacked_chunks",
    )

    def __init__(self, call_id, argv, request, on_output, on_started) -> None:
        self.call_id: str = call_id
        self.argv: list[str] = argv
        self.request: wire.RunRequest = request
        self.on_output: OutputCallback | None = on_output
        self.on_started: StartedCallback | None = on_started
        self.pid: int | None = None
        self.executor: str = ""
        self.result: Result | None = None
        self.failure: DaemonError | None = None
        self._unacked_bytes = 0
        self._unacked_chunks = 0

    @property
    def started(self) -> bool:
        return self.pid is not None

    @property
    def done(self) -> bool:
        return self.result is not None or self.failure is not None

    def __repr__(self) -> str:
        state = "done" if self.done else ("running" if self.started else "queued")
        return f"<Call {self.call_id[:8]} {self.argv[:3]!r} {state}>"


# -- requests ---------------------------------------------------------------------------


def new_call_id() -> str:
    """A uuid4 in hex, without importing uuid (start-up time of ``sluice run``)."""
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    return b.hex()


def make_request(
    argv: Iterable[str],
    *,
    cwd: str | None = None,
    sandbox: str = "workspace-write",
    writable: Iterable[str] = (),
    network: bool = False,
    env: Mapping[str, str] | None = None,
    env_passthrough: Iterable[str] = (),
    timeout_ms: int | None = None,
    capture_limit: int = wire.DEFAULT_CAPTURE_LIMIT,
    check_paths: bool = True,
) -> wire.RunRequest:
    """Validate the arguments of :meth:`Client.submit`; raises :class:`UsageError`.

    ``check_paths=False`` skips checking that ``cwd`` and the writable paths exist here,
    for a command bound for another host's executor (which checks them there).

    ``env`` (default: ours) loses its secrets here, before it is sent
    (:mod:`landlock_helper.env`), except the names in ``env_passthrough``;
    ``landlock_helper.env.split_env(env, env_passthrough)[1]`` lists what goes.
    """
    if isinstance(argv, (str, bytes)):
        raise UsageError("the command must be a list of arguments, not a string")
    argv = list(argv)
    if not argv:
        raise UsageError("missing command")
    if not all(isinstance(a, str) for a in argv):
        raise UsageError("every command argument must be a string")
    if not argv[0]:
        raise UsageError("the command name is empty")

    if cwd is None:
        try:
            cwd = os.getcwd()
        except FileNotFoundError:
            raise UsageError("the current directory no longer exists; cd somewhere else or pass a cwd") from None
    cwd = os.path.abspath(cwd)
    if check_paths and not os.path.isdir(cwd):
        what = "is not a directory" if os.path.exists(cwd) else "does not exist"
        raise UsageError(f"working directory {cwd} {what}")

    roots = []
    for path in writable:
        if not isinstance(path, str) or not os.path.isabs(path):
            raise UsageError(f"writable path must be absolute: {path!r}")
        if check_paths and not os.path.exists(path):
            raise UsageError(f"writable path does not exist: {path}")
        roots.append(path)

    from landlock_helper.env import split_env
    from landlock_helper.policy import PolicyError, SandboxPolicy

    try:
        policy = SandboxPolicy.from_mode(sandbox, writable_roots=roots, network=network)
    except PolicyError as e:
        raise UsageError(str(e)) from None

    if timeout_ms is not None:
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms <= 0:
            raise UsageError(f"timeout must be a positive number of milliseconds, got {timeout_ms!r}")
    if isinstance(capture_limit, bool) or not isinstance(capture_limit, int) or not 0 <= capture_limit <= MAX_CAPTURE_LIMIT:
        raise UsageError(f"capture limit must be between 0 and {MAX_CAPTURE_LIMIT} bytes, got {capture_limit!r}")

    passthrough = list(env_passthrough)
    for name in passthrough:
        if not isinstance(name, str) or not name or "=" in name:
            raise UsageError(f"not an environment variable name: {name!r}")
    if env is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise UsageError("the environment must map names to strings")
    # Filtered here, before it leaves this process: the daemon and the executor (maybe on
    # another host) never see the caller's secrets, only what the command may have.
    env, _ = split_env(os.environ if env is None else env, passthrough)

    return wire.RunRequest(
        argv=argv,
        cwd=cwd,
        sandbox=wire.SandboxSpec(permissions=policy.to_json()["permissions"]),
        env=env,
        env_passthrough=passthrough,
        timeout_ms=timeout_ms,
        capture_limit=capture_limit,
    )


# -- the client -------------------------------------------------------------------------


class Client:
    """A frontend connection to the daemon. Not thread-safe; use one per thread."""

    def __init__(self, sock: zmq.Socket, runtime: RuntimeDir | None, welcome: wire.Welcome, remote=None) -> None:
        # The local daemon's runtime dir; None when connected to ``remote`` (broker.remote.Remote).
        self.runtime = runtime
        self.remote = remote
        self.peer_id = welcome.peer_id
        self.heartbeat_s = welcome.heartbeat_s if welcome.heartbeat_s > 0 else 1.0
        self._sock = sock
        self._calls: dict[str, Call] = {}
        self._broken: DaemonError | None = None
        self._last_rx = time.monotonic()
        self._ping_sent = 0.0
        # When the first ping since the daemon's last message went out (0: none since).
        self._first_ping = 0.0
        self._signals: collections.deque[int] = collections.deque()
        self._wake_r = -1
        self._poller = zmq.Poller()
        self._poller.register(sock, zmq.POLLIN)
        # Disconnect events tell us at once that the daemon went away (ipc: it exited).
        self._monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._poller.register(self._monitor, zmq.POLLIN)
        self._closed = False
        self._ready_fds: tuple[int, ...] = ()
        # Agent sessions this client submitted to (broker.client_sessions), made on first use.
        self._sessions = None

    # -- connecting ---------------------------------------------------------------------

    @classmethod
    def connect(
        cls,
        runtime: RuntimeDir | None = None,
        *,
        autostart: bool = True,
        timeout: float = 10.0,
        remote=None,
        name: str = "client",
    ) -> Client:
        """Connect to the daemon of ``runtime`` (default: the user's), starting one if needed.

        With ``remote`` (a :class:`broker.remote.Remote`), connect to that daemon over
        ``tcp://`` with CurveZMQ instead (never started from here). ``name`` is how the
        daemon and the other frontends see this client (``frontend-7 (name)``).
        """
        deadline = time.monotonic() + timeout
        if remote is not None:
            return cls._remote_handshake(remote, deadline, name)
        runtime = runtime or RuntimeDir.default()
        if _daemon_pid(runtime) is not None and _wait_serving(runtime, deadline) is not None:
            # Running, or was starting (its pid file appears once it serves).
            return cls._handshake(runtime, deadline, name)
        if not autostart:
            raise DaemonError(f"no daemon is running in {runtime.path}; start one with `sluice daemon start`")
        start_daemon(runtime, timeout=max(0.0, deadline - time.monotonic()), _probe=False)
        return cls._handshake(runtime, deadline, name)

    @classmethod
    def _remote_handshake(cls, remote, deadline: float, name: str) -> Client:
        sock, outcome = _hello(remote.endpoint, "", deadline, name, remote)
        if isinstance(outcome, wire.Welcome):
            return cls(sock, None, outcome, remote)
        sock.close(linger=0)
        if outcome is None:
            raise DaemonError(
                f"no answer from {remote.endpoint}: is a daemon listening there (`sluice daemon --listen`), "
                "and is it reachable from here?"
            )
        raise DaemonError(f"the daemon at {remote.endpoint} refused the connection: {_one_line(outcome)}")

    @classmethod
    def _handshake(cls, runtime: RuntimeDir, deadline: float, name: str = "client") -> Client:
        sent_token = None
        while True:
            token = runtime.read_token()
            sent_token = token
            sock, outcome = _hello(runtime.endpoint, token, deadline, name)
            if isinstance(outcome, wire.Welcome):
                return cls(sock, runtime, outcome)
            sock.close(linger=0)
            if outcome is None:
                raise DaemonError(f"the daemon in {runtime.path} did not answer within the timeout; see {runtime.log_path}")
            # A daemon that just restarted may have replaced the token under us: retry once it did.
            if runtime.read_token() != sent_token and time.monotonic() < deadline:
                continue
            raise DaemonError(f"the daemon refused the connection: {_one_line(outcome)}")

    # -- submitting ---------------------------------------------------------------------

    def submit(
        self,
        argv: Iterable[str],
        *,
        cwd: str | None = None,
        sandbox: str = "workspace-write",
        writable: Iterable[str] = (),
        network: bool = False,
        env: Mapping[str, str] | None = None,
        env_passthrough: Iterable[str] = (),
        timeout_ms: int | None = None,
        capture_limit: int = wire.DEFAULT_CAPTURE_LIMIT,
        on_output: OutputCallback | None = None,
        on_started: StartedCallback | None = None,
    ) -> Call:
        """Send a command to the daemon and return at once; see :func:`make_request`."""
        request = make_request(
            argv,
            cwd=cwd,
            sandbox=sandbox,
            writable=writable,
            network=network,
            env=env,
            env_passthrough=env_passthrough,
            timeout_ms=timeout_ms,
            capture_limit=capture_limit,
        )
        return self.submit_request(request, on_output=on_output, on_started=on_started)

    def submit_request(
        self,
        request: wire.RunRequest,
        *,
        on_output: OutputCallback | None = None,
        on_started: StartedCallback | None = None,
        call_id: str | None = None,
    ) -> Call:
        """Submit an already validated :class:`wire.RunRequest` (from :func:`make_request`)."""
        self._check_usable()
        call = Call(call_id or new_call_id(), list(request.argv), request, on_output, on_started)
        if call.call_id in self._calls:
            raise UsageError(f"call id {call.call_id} is already in flight")
        self._send([wire.header(wire.RUN, call.call_id), wire.encode(request)], block=True)
        self._calls[call.call_id] = call
        return call

    def cancel(self, call: Call) -> None:
        """Ask the daemon to kill the call's process tree; its result will say ``aborted``."""
        if call.done or self._broken is not None:
            return
        self._send([wire.header(wire.CANCEL, call.call_id)], block=False)

    # -- sessions -----------------------------------------------------------------------

    def open_session(self, op, *, sub_id: str = "0", timeout: float = 10.0):
        """A new agent session configured with ``op`` (a ``ConfigureSession``).

        Returns once the daemon has named it and attached us (its events, starting with
        ``session_configured`` for ``sub_id``, follow through
        :meth:`~broker.client_sessions.ClientSession.next_event`). Raises
        :class:`~broker.client_sessions.SessionError` if the daemon refuses.
        """
        from broker.client_sessions import open_session

        self._check_usable()
        return open_session(self, op, sub_id=sub_id, timeout=timeout)

    def attach(self, session_id: str, *, since: int | None = None, timeout: float = 10.0):
        """Subscribe to an existing session from event ``since`` on: 0 for all of it, None
        for the start of its current (or last) turn.

        Returns the :class:`~broker.client_sessions.ClientSession` once the daemon has
        answered (its ``info`` describes the session); attaching to one this client already
        follows re-positions it. Raises :class:`~broker.client_sessions.SessionError` with
        the daemon's message for an unknown session, :class:`UsageError` for a bad ``since``.
        """
        from broker.client_sessions import attach

        self._check_usable()
        return attach(self, session_id, since=since, timeout=timeout)

    def list_sessions(self, timeout: float = 10.0) -> wire.SessionList:
        """Every session the daemon hosts (:class:`wire.SessionInfo`), and how many frontends
        and executors are connected."""
        from broker.client_sessions import list_sessions

        self._check_usable()
        return list_sessions(self, timeout=timeout)

    def session(self, session_id: str):
        """An existing session by id; submitting to it attaches this client."""
        from broker.client_sessions import ClientSession

        table = self._session_table()
        found = table.by_id.get(session_id)
        if found is None:
            found = table.by_id[session_id] = ClientSession(self, session_id)
        return found

    def _session_table(self):
        if self._sessions is None:
            from broker.client_sessions import SessionTable

            self._sessions = SessionTable()
        return self._sessions

    def _submit(self, session_id: str, submission, *, corr: str = "") -> None:
        from broker.protocol import ConfigureSession, encode_msgpack

        self._check_usable()
        op = submission.op
        if isinstance(op, ConfigureSession) and isinstance(op.env, dict):
            # The commands' environment a program put in configure_session (sluice exec
            # built it under its policy; a bridge program or a library user may not have):
            # its secrets stay here, except the names it passes through on purpose.
            import msgspec

            from landlock_helper.env import filter_env

            passthrough = op.env_passthrough if isinstance(op.env_passthrough, list) else ()
            submission = msgspec.structs.replace(
                submission, op=msgspec.structs.replace(op, env=filter_env(op.env, passthrough)))
        self._send([wire.header(wire.SUBMIT, corr, session=session_id), encode_msgpack(submission)], block=True)

    def _next_session_event(self, session, timeout: float | None, fds, interruptible: bool):
        deadline = None if timeout is None else time.monotonic() + timeout
        fds = [fd for fd in fds if fd >= 0]
        for fd in fds:
            self._poller.register(fd, zmq.POLLIN)
        try:
            while True:
                if session.events:
                    event = session.events.popleft()
                    session._took(event)
                    return event
                if session.failure is not None:
                    raise session.failure
                self._check_usable()
                if interruptible and self._signals:
                    raise Interrupted(self._signals.popleft())
                remaining = None
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None
                self._pump(remaining)
                for fd in self._ready_fds:
                    if fd in fds:
                        return fd
        finally:
            for fd in fds:
                with contextlib.suppress(KeyError, ValueError):
                    self._poller.unregister(fd)
            self._ready_fds = ()

    # -- waiting ------------------------------------------------------------------------

    def wait(self, call: Call, timeout: float | None = None, *, interruptible: bool = True) -> Result:
        """Pump until ``call`` ends and return its result.

        Raises :class:`TimeoutError` after ``timeout`` seconds (the call goes on),
        :class:`DaemonError` if the daemon went away, and, inside :meth:`catch_signals`
        with ``interruptible``, :class:`Interrupted` as soon as a signal arrives.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while not call.done:
            if interruptible and self._signals:
                raise Interrupted(self._signals.popleft())
            remaining = None
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"call {call.call_id} still running after {timeout} s")
            self._pump(remaining)
        if call.failure is not None:
            raise call.failure
        return call.result  # type: ignore[return-value]

    def wait_all(self, calls: Iterable[Call], timeout: float | None = None, *, interruptible: bool = True) -> list[Result]:
        """Results of all ``calls``, in order; same errors as :meth:`wait`."""
        calls = list(calls)
        deadline = None if timeout is None else time.monotonic() + timeout
        results = []
        for call in calls:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            results.append(self.wait(call, remaining, interruptible=interruptible))
        return results

    def run(self, argv: Iterable[str], *, wait_timeout: float | None = None, **kw) -> Result:
        """:meth:`submit` then :meth:`wait`."""
        return self.wait(self.submit(argv, **kw), wait_timeout)

    def poll(self, timeout: float | None = 0.0) -> int:
        """Handle what has arrived, waiting up to ``timeout`` seconds for something; returns the count."""
        return self._pump(timeout)

    @property
    def in_flight(self) -> list[Call]:
        return list(self._calls.values())

    # -- signals ------------------------------------------------------------------------

    @contextlib.contextmanager
    def catch_signals(self, signums: Iterable[int] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)):
        """Catch ``signums`` (main thread only) so waits raise :class:`Interrupted` at once.

        Python's wakeup fd is put in the same poller as the socket: a signal wakes a
        blocked wait immediately, with no polling loop.
        """
        signums = list(signums)
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        old_handlers = {}
        try:
            for s in signums:
                old_handlers[s] = signal.signal(s, self._on_signal)
            self._wake_r = r
            self._poller.register(r, zmq.POLLIN)
            yield self
        finally:
            for s, h in old_handlers.items():
                signal.signal(s, h)
            signal.set_wakeup_fd(old_fd)
            with contextlib.suppress(KeyError, ValueError):
                self._poller.unregister(r)
            self._wake_r = -1
            os.close(r)
            os.close(w)

    def _on_signal(self, signum, frame) -> None:
        self._signals.append(signum)

    def take_signal(self) -> int | None:
        """The oldest caught signal not yet reported, if any."""
        return self._signals.popleft() if self._signals else None

    # -- closing ------------------------------------------------------------------------

    def close(self) -> None:
        """Cancel what is still running, say bye, close the socket."""
        if self._closed:
            return
        self._closed = True
        if self._broken is None:
            for call in list(self._calls.values()):
                self._send([wire.header(wire.CANCEL, call.call_id)], block=False)
            self._send([wire.header(wire.BYE)], block=False)
        with contextlib.suppress(zmq.ZMQError):
            self._sock.disable_monitor()
        self._monitor.close(linger=0)
        # A short linger lets the cancels and the bye reach a live daemon.
        self._sock.close(linger=0 if self._broken is not None else 200)
        self._fail_all(DaemonError("the client was closed"))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            with contextlib.suppress(Exception):
                self.close()

    # -- internals ----------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise DaemonError("the client is closed")
        if self._broken is not None:
            raise self._broken

    def _send(self, parts, *, block: bool) -> bool:
        try:
            if block:
                # SNDTIMEO bounds it: a daemon that stopped reading becomes an error, not a hang.
                self._sock.send_multipart(parts)
            else:
                self._sock.send_multipart(parts, zmq.NOBLOCK)
            return True
        except zmq.Again:
            if block:
                self._break(DaemonError("the daemon is not accepting requests (send timed out)"))
                raise self._broken  # type: ignore[misc]
            return False
        except zmq.ZMQError as e:
            if block:
                raise DaemonError(f"cannot send to the daemon: {e}") from None
            return False

    def _pump(self, timeout: float | None) -> int:
        n = self._drain()
        if n:
            return n
        watching = bool(self._calls or self._sessions)
        if watching:
            # Wake at least once per heartbeat while calls are in flight, to notice a dead daemon.
            hb = self.heartbeat_s
            timeout = hb if timeout is None else min(timeout, hb)
        ms = None if timeout is None else max(0, int(timeout * 1000 + 0.999))
        try:
            events = self._poller.poll(ms)
        except zmq.ZMQError as e:
            if e.errno == errno.EINTR:
                return 0
            raise
        ready = []
        for sock, _ in events:
            if sock is self._monitor:
                self._on_monitor()
            elif sock == self._wake_r:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self._wake_r, 512):
                        pass
            elif isinstance(sock, int):
                ready.append(sock)
        self._ready_fds = tuple(ready)
        n = self._drain()
        if watching and not n:
            self._check_alive()
        return n

    def _drain(self) -> int:
        sock = self._sock
        handle = self._handle
        n = 0
        while n < DRAIN_BATCH:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            n += 1
            handle(frames)
        if n:
            self._last_rx = time.monotonic()
            self._ping_sent = 0.0
            self._first_ping = 0.0
        return n

    def _handle(self, frames: list[zmq.Frame]) -> None:
        try:
            h = wire.decode_header(frames[0].buffer)
        except wire.WireError:
            return
        kind = h.kind
        if kind == wire.OUT:
            call = self._calls.get(h.corr)
            if call is None or len(frames) < 2:
                return
            chunk = frames[1].buffer
            size = len(chunk)
            call._unacked_bytes += size
            call._unacked_chunks += 1
            cb = call.on_output
            try:
                if cb is not None and size:
                    cb(call, h.stream, chunk)
            finally:
                if call._unacked_bytes >= wire.ACK_EVERY_BYTES or call._unacked_chunks >= wire.ACK_EVERY_CHUNKS:
                    self._ack(call)
        elif kind == wire.EXIT:
            call = self._calls.pop(h.corr, None)
            if call is None or len(frames) < 2:
                return
            try:
                st = wire.decode(wire.EXIT, frames[1].buffer)
            except wire.WireError as e:
                call.result = Result(call.call_id, call.argv, error=f"unreadable exit status: {e}")
                return
            # Result carries ExitStatus's fields under the same names.
            call.result = Result(call.call_id, call.argv, **msgspec.structs.asdict(st))
        elif kind == wire.STARTED:
            call = self._calls.get(h.corr)
            if call is None or len(frames) < 2:
                return
            try:
                st = wire.decode(wire.STARTED, frames[1].buffer)
            except wire.WireError:
                return
            call.pid = st.pid
            call.executor = st.executor
            if call.on_started is not None:
                call.on_started(call)
        elif kind == wire.EVENT:
            if len(frames) >= 2 and self._sessions is not None:
                self._sessions.on_event(h, frames[1].buffer)
        elif kind == wire.ATTACHED:
            if self._sessions is not None:
                self._sessions.on_attached(h, frames[1].buffer if len(frames) >= 2 else None)
        elif kind == wire.LAGGED:
            if self._sessions is not None:
                self._sessions.on_lagged(h)
        elif kind == wire.SESSIONS:
            if len(frames) >= 2 and self._sessions is not None:
                self._sessions.on_sessions(h, frames[1].buffer)
        elif kind == wire.PING:
            self._send([wire.header(wire.PONG)], block=False)
        elif kind == wire.ERROR:
            message = "the daemon reported an error"
            if len(frames) >= 2:
                with contextlib.suppress(wire.WireError):
                    message = wire.decode(wire.ERROR, frames[1].buffer).message
            call = self._calls.pop(h.corr, None) if h.corr else None
            if call is not None:
                call.result = Result(call.call_id, call.argv, error=message)
            elif h.corr:
                # A session request of ours, e.g. refused by a daemon too old to know it.
                if self._sessions is not None:
                    self._sessions.refuse(h.corr, message)
            else:
                # Not about one call: the daemon no longer knows us (e.g. it restarted).
                self._break(DaemonError(f"the daemon reported: {_one_line(message)}"))
        # pong, welcome and anything newer: nothing to do beyond the liveness stamp.

    def _ack(self, call: Call) -> None:
        # Acks are increments: bytes and chunks consumed since the previous ack.
        if self._send([wire.header(wire.ACK, call.call_id, n=call._unacked_bytes, seq=call._unacked_chunks)], block=False):
            call._unacked_bytes = 0
            call._unacked_chunks = 0

    def _on_monitor(self) -> None:
        from zmq.utils.monitor import recv_monitor_message

        while True:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError:
                return
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self._break(DaemonError("lost the connection to the daemon (it exited or was stopped)"))

    def _check_alive(self) -> None:
        now = time.monotonic()
        silence = now - self._last_rx
        hb = self.heartbeat_s
        if silence < hb:
            return
        if self.runtime is not None and not os.path.exists(self.runtime.socket_path):
            self._break(DaemonError("the daemon's socket is gone (the daemon exited)"))
            return
        # Counted from our first unanswered ping, not from the last message: a client that was
        # stopped itself (SIGSTOP, a suspended machine) must not take its own pause for the daemon's.
        if self._first_ping and now - self._first_ping > DEAD_AFTER_HEARTBEATS * hb:
            self._break(DaemonError(f"the daemon stopped answering (nothing for {silence:.1f} s)"))
            return
        if not self._ping_sent or now - self._ping_sent >= hb:
            self._ping_sent = now
            self._first_ping = self._first_ping or now
            self._send([wire.header(wire.PING)], block=False)

    def _break(self, error: DaemonError) -> None:
        if self._broken is None:
            self._broken = error
        self._fail_all(error)
        if self._sessions is not None:
            self._sessions.broken(error)

    def _fail_all(self, error: DaemonError) -> None:
        calls, self._calls = self._calls, {}
        for call in calls.values():
            call.failure = error


# -- the handshake ----------------------------------------------------------------------


def _new_socket(endpoint: str, remote=None, monitor: str | None = None) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    if remote is not None:
        remote.apply(sock)
    if monitor is not None:
        # Before connecting, so no handshake outcome is missed.
        sock.monitor(monitor, _HANDSHAKE_FAILED)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
    # Flow-control windows bound what is in flight per call; this bounds it per client.
    sock.setsockopt(zmq.RCVHWM, 1 << 20)
    sock.setsockopt(zmq.SNDHWM, 1 << 16)
    sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_MESSAGE_SIZE)
    sock.connect(endpoint)
    return sock


_HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
_monitor_ids = itertools.count(1)


def _hello(endpoint: str, token: str, deadline: float, name: str = "client", remote=None):
    """(socket, Welcome) on success, (socket, message) if refused, (socket, None) on timeout.

    Over tcp a CurveZMQ handshake the daemon refuses raises :class:`DaemonError` at once:
    libzmq would otherwise retry it quietly until the deadline.
    """
    monitor = None
    address = f"inproc://sluice-hello-monitor-{os.getpid()}-{next(_monitor_ids)}" if remote is not None else None
    if address is not None:
        monitor = zmq.Context.instance().socket(zmq.PAIR)
        monitor.setsockopt(zmq.LINGER, 0)
        monitor.connect(address)
    try:
        sock = _new_socket(endpoint, remote, address)
    except BaseException:
        if monitor is not None:
            monitor.close(linger=0)
        raise
    try:
        return _await_welcome(sock, monitor, endpoint, token, deadline, name)
    except BaseException:
        sock.close(linger=0)
        raise
    finally:
        if monitor is not None:
            with contextlib.suppress(zmq.ZMQError):
                sock.disable_monitor()
            monitor.close(linger=0)


def _handshake_refusal(monitor: zmq.Socket, endpoint: str) -> str | None:
    from zmq.utils.monitor import recv_monitor_message

    while True:
        try:
            event = recv_monitor_message(monitor, zmq.NOBLOCK)["event"]
        except zmq.Again:
            return None
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return f"the daemon at {endpoint} refused our key (it is not in its allow-list)"
        if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            return f"{endpoint} does not speak CurveZMQ like a sluice daemon (is it one started with --listen?)"
        if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            return f"the CurveZMQ handshake with {endpoint} failed (is --server-key that daemon's public key?)"


def _await_welcome(sock: zmq.Socket, monitor: zmq.Socket | None, endpoint: str, token: str, deadline: float, name: str):
    hello = wire.Hello(role=wire.ROLE_FRONTEND, token=token, pid=os.getpid(), name=name)
    try:
        sock.send_multipart(wire.message(wire.HELLO, body=hello), zmq.NOBLOCK)
    except zmq.ZMQError:
        pass
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    if monitor is not None:
        poller.register(monitor, zmq.POLLIN)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return sock, None
        if not poller.poll(int(remaining * 1000) + 1):
            continue
        if monitor is not None:
            refusal = _handshake_refusal(monitor, endpoint)
            if refusal is not None:
                raise DaemonError(refusal)
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                h = wire.decode_header(frames[0])
                if h.kind == wire.WELCOME and len(frames) > 1:
                    return sock, wire.decode(wire.WELCOME, frames[1])
                if h.kind == wire.ERROR:
                    msg = wire.decode(wire.ERROR, frames[1]).message if len(frames) > 1 else "refused"
                    return sock, msg
            except wire.WireError:
                continue


# -- managing the daemon ----------------------------------------------------------------


@dataclass(frozen=True)
class DaemonStatus:
    running: bool
    pid: int | None
    runtime_dir: str
    socket: str

    def describe(self) -> str:
        if self.running:
            return f"daemon running (pid {self.pid}, socket {self.socket})"
        return f"daemon not running (runtime dir {self.runtime_dir})"


def daemon_status(runtime: RuntimeDir | None = None) -> DaemonStatus:
    """Whether a daemon runs in ``runtime``; DaemonError if the runtime dir is not one of
    ours to trust (someone else's, too open, a symlink): its pid file means nothing."""
    runtime = runtime or RuntimeDir.default()
    pid = _daemon_pid(runtime)
    return DaemonStatus(pid is not None, pid, runtime.path, runtime.socket_path)


_started: list = []  # keeps background daemons' Popen objects (and their reaping) alive


def start_daemon(
    runtime: RuntimeDir | None = None,
    *,
    timeout: float = 10.0,
    args: Iterable[str] = (),
    _probe: bool = True,
) -> int:
    """Start a daemon in the background and wait until it answers; returns its pid.

    Its stdout/stderr are appended to the runtime dir's ``daemon.log`` (opened relative to
    the checked dir, never through a link, only a file of ours with one link). If another
    daemon wins the race to the runtime dir's lock, that one is waited for instead.
    Raises :class:`DaemonError` (with the last line of the log) if it dies, or if the
    runtime dir or its log is not ours to use.
    """
    runtime = runtime or RuntimeDir.default()
    deadline = time.monotonic() + timeout
    dir_fd = _checked_dir(runtime, create=True)
    import subprocess

    from broker.runtime import without_secrets

    # The caller's secrets (an API key exported for `sluice exec`) stay out of the daemon.
    env = without_secrets()
    env["SLUICE_RUNTIME_DIR"] = runtime.path
    # Run the same code as this client, installed or not.
    src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        log_fd = open_reused(dir_fd, "daemon.log", os.O_WRONLY | os.O_APPEND, shown=runtime.log_path)
    except RuntimeDirError as e:
        raise DaemonError(f"the daemon log: {e}") from None
    finally:
        os.close(dir_fd)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "broker", "daemon", *args],
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            cwd="/",
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as e:
        raise DaemonError(f"cannot start the daemon: {e.strerror}") from None
    finally:
        os.close(log_fd)
    _started.append(proc)
    pid = _wait_serving(runtime, deadline, proc)
    if _probe:
        sock, outcome = _hello(runtime.endpoint, runtime.read_token(), deadline)
        sock.close(linger=0)
        if outcome is None:
            raise DaemonError(f"the daemon did not answer within {timeout:g} s; see {runtime.log_path}")
        if not isinstance(outcome, wire.Welcome):
            raise DaemonError(f"the daemon refused the connection: {_one_line(outcome)}")
    return pid


def _wait_serving(runtime: RuntimeDir, deadline: float, proc=None) -> int | None:
    """Wait until a daemon serves in ``runtime`` (its pid file names it); returns its pid.

    Without ``proc``: None if the daemon that was starting went away instead. With
    ``proc`` (the daemon we just spawned): DaemonError if it died and no other took over.
    """
    dir_fd = _checked_dir(runtime)
    if dir_fd is None:
        if proc is None:
            return None
        raise DaemonError(f"the runtime dir {runtime.path} went away while the daemon was starting")
    try:
        delay = 0.002
        while True:
            pid = _serving_pid(dir_fd)
            if pid is not None:
                return pid
            if _starting_pid(dir_fd) is None and (proc is None or proc.poll() is not None):
                if proc is None:
                    return None
                raise DaemonError(f"the daemon exited at start (status {proc.returncode}): {_last_log_line(runtime)}")
            if time.monotonic() >= deadline:
                raise DaemonError(f"the daemon did not start in time: {_last_log_line(runtime)}")
            # Start-up takes a few hundred milliseconds; files are all there is to watch.
            time.sleep(delay)
            delay = min(delay * 2, 0.025)
    finally:
        os.close(dir_fd)


def stop_daemon(runtime: RuntimeDir | None = None, *, timeout: float = 10.0) -> int | None:
    """SIGTERM the running daemon and wait for it to exit (SIGKILL after ``timeout``).

    Returns the pid it stopped, or None if none was running.
    """
    runtime = runtime or RuntimeDir.default()
    pid = _daemon_pid(runtime)
    if pid is None:
        return None
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return pid
    except PermissionError:
        raise DaemonError(f"not allowed to signal the daemon (pid {pid})") from None
    if not _wait_gone(pid, timeout):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if not _wait_gone(pid, 5.0):
            raise DaemonError(f"the daemon (pid {pid}) did not exit")
    return pid


def _wait_gone(pid: int, timeout: float) -> bool:
    import psutil

    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return True
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap_started()
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.01)
    return False


def _reap_started() -> None:
    for p in list(_started):
        if p.poll() is not None:
            _started.remove(p)


def _checked_dir(runtime: RuntimeDir, *, create: bool = False) -> int | None:
    """A descriptor of the runtime dir once it passed :func:`broker.runtime.open_dir`'s
    checks; None if it does not exist (and not ``create``); DaemonError if it is not ours
    to trust: a pid file or socket in someone else's dir means nothing, and signalling or
    talking to what it names could hurt."""
    try:
        return runtime.open(create=create)
    except RuntimeDirMissing:
        return None
    except RuntimeDirError as e:
        raise DaemonError(str(e)) from None


def _daemon_pid(runtime: RuntimeDir) -> int | None:
    """The pid of the daemon serving, or starting, in ``runtime``; None if there is none."""
    dir_fd = _checked_dir(runtime)
    if dir_fd is None:
        return None
    try:
        return _serving_pid(dir_fd) or _starting_pid(dir_fd)
    finally:
        os.close(dir_fd)


def _serving_pid(dir_fd: int) -> int | None:
    # The daemon writes its pid file once bound (after a fresh token) and removes it on exit.
    _reap_started()
    return _live_pid_in(dir_fd, "daemon.pid")


def _starting_pid(dir_fd: int) -> int | None:
    # The lock holder also writes its pid into the lock file, before anything else.
    # (Not /proc/locks: reading it waits for an RCU grace period, tens of milliseconds.)
    return _live_pid_in(dir_fd, "daemon.lock")


def _live_pid_in(dir_fd: int, name: str) -> int | None:
    """The pid in the file ``name`` if that process is alive and is the one that wrote it.

    A file left by a daemon that was killed may name a pid since reused: a process
    that started after the file was written cannot have written it.
    """
    got = read_file(dir_fd, name, 32)
    if got is None:
        return None
    try:
        pid = int(got[0].strip() or 0)
    except ValueError:
        return None
    written = got[1].st_mtime
    if pid <= 0:
        return None
    started = _start_time(pid)
    if started is None:
        return None
    # Slack for clock granularity: boot time and start ticks are coarse.
    return pid if started <= written + 2.0 else None


_boot_time: float | None = None


def _start_time(pid: int) -> float | None:
    """When ``pid`` started (epoch seconds), 0.0 if unknown, None if dead or a zombie."""
    global _boot_time
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    except OSError:  # no /proc (macOS): existence is all we can tell
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return 0.0
    fields = raw[raw.rindex(b")") + 2 :].split()  # fields from the 3rd (state) on
    if fields[0] in (b"Z", b"X"):
        return None
    if _boot_time is None:
        try:
            with open("/proc/stat", "rb") as f:
                for line in f:
                    if line.startswith(b"btime "):
                        _boot_time = float(line.split()[1])
                        break
        except OSError:
            pass
        if _boot_time is None:
            return 0.0
    return _boot_time + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def _last_log_line(runtime: RuntimeDir) -> str:
    tail = _log_tail(runtime)
    if tail is None:
        return f"(no log at {runtime.log_path})"
    lines = [ln for ln in tail.decode("utf-8", "replace").splitlines() if ln.strip()]
    return _one_line(lines[-1]) if lines else f"(empty log {runtime.log_path})"


def _log_tail(runtime: RuntimeDir, size: int = 8192) -> bytes | None:
    """The last ``size`` bytes of ``daemon.log``, read like every file in the runtime dir."""
    try:
        dir_fd = runtime.open()
    except RuntimeDirError:
        return None
    try:
        fd = os.open("daemon.log", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    finally:
        os.close(dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            return None
        return os.pread(fd, size, max(0, st.st_size - size))
    except OSError:
        return None
    finally:
        os.close(fd)


def _one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= 400 else text[:397] + "..."
