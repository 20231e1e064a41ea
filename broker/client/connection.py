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
return, so a slow callback slows only its own command, never the daemon. A callback
whose destination is full need not block the client: it keeps a copy and calls
:meth:`Client.hold_output`, and the command is held back (after a window) until
:meth:`Client.release_output`, while the client goes on pumping (the call's exit,
signals, other calls); :meth:`Client.wait_io` waits for the destination to take more.

Interrupts: inside ``with client.catch_signals():`` SIGINT/SIGTERM/SIGHUP are caught
through a wakeup fd that sits in the same poller as the socket, so a waiting
:meth:`Client.wait` raises :class:`Interrupted` the moment one arrives; the call keeps
running until you :meth:`Client.cancel` it.

Sessions with the agent (configure, submit, events): :meth:`Client.open_session`,
:meth:`Client.attach` and :meth:`Client.session` give a
:class:`broker.client.sessions.ClientSession`, :meth:`Client.list_sessions` lists what the
daemon hosts; see that module.

Errors: :class:`UsageError` for bad arguments (the message is one line, for a person),
:class:`DaemonError` when the daemon cannot be reached, refuses us, or goes away while
calls are in flight (they fail with it rather than hang).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import signal
import time
from collections.abc import Callable, Iterable

import msgspec
import zmq

from broker.client.control import daemon_pid, start_daemon, wait_serving
from broker.client.errors import DaemonError, Interrupted, UsageError
from broker.client.handshake import hello
from broker.client.requests import make_request, winsize
from broker.client.sessions import ClientSession, SessionTable, attach, list_sessions, open_session
from broker.net.calls import CallTable, PeerCall, error_message
from broker.net.link import Link
from broker.net.runtime import RuntimeDir
from broker.net.signals import ENDING_SIGNALS, caught_signals
from broker.wire import frames as wire
from broker.wire.results import new_call_id
from landlock_helper.limits import format_size

# Messages handled per pump before the wait loops look at signals and deadlines again.
DRAIN_BATCH = 512
_NOBLOCK = int(zmq.NOBLOCK)


def close_sockets() -> None:
    """Close every socket of this process's clients and send what they still hold (a closed
    client's cancels and bye) within their linger, as the interpreter's teardown would: for
    a program that leaves without it (:func:`os._exit`)."""
    zmq.Context.instance().destroy()


# -- results ----------------------------------------------------------------------------


class Result(wire.ExitStatus, frozen=True, kw_only=True):
    """How a call ended (:class:`broker.wire.frames.ExitStatus`, with ``returncode``
    folding it into one shell-style number: 124 timed out, 130 cancelled, 128+N killed by
    signal N, 125-127 when it never ran, else the exit code), and which call it was."""

    call_id: str = ""
    argv: list[str] = []


OutputCallback = Callable[["Call", int, memoryview], object]
StartedCallback = Callable[["Call"], object]


class Call(PeerCall):
    """One submitted command. ``pid`` is set once the executor has started it.

    ``notes``: what the daemon said about the call that does not end it (one line each,
    e.g. that it waits for an executor being restarted); ``on_notice(call, note)``, if
    set, is called with each as it comes."""

    __slots__ = ("argv", "on_output", "on_started", "on_notice", "notes", "result", "failure")

    def __init__(self, call_id, argv, request, on_output, on_started) -> None:
        super().__init__(call_id, request)
        self.argv: list[str] = argv
        self.on_output: OutputCallback | None = on_output
        self.on_started: StartedCallback | None = on_started
        self.on_notice: Callable[[Call, str], object] | None = None
        self.notes: list[str] = []
        self.result: Result | None = None
        self.failure: DaemonError | None = None

    def output(self, stream: int, chunk: memoryview) -> None:
        if self.on_output is not None:
            self.on_output(self, stream, chunk)

    def began(self) -> None:
        if self.on_started is not None:
            self.on_started(self)

    def noted(self, note: str) -> None:
        self.notes.append(note)
        if self.on_notice is not None:
            self.on_notice(self, note)

    def ended(self, status: wire.ExitStatus) -> None:
        self.result = Result(call_id=self.call_id, argv=self.argv, **msgspec.structs.asdict(status))

    @property
    def started(self) -> bool:
        return self.pid is not None

    @property
    def done(self) -> bool:
        return self.result is not None or self.failure is not None

    def __repr__(self) -> str:
        state = "done" if self.done else ("running" if self.started else "queued")
        return f"<Call {self.call_id[:8]} {self.argv[:3]!r} {state}>"


# -- the client -------------------------------------------------------------------------


class Client:
    """A frontend connection to the daemon. Not thread-safe; use one per thread."""

    def __init__(self, sock: zmq.Socket, runtime: RuntimeDir | None, welcome: wire.Welcome, remote=None,
                 name: str = "client") -> None:
        # The local daemon's runtime dir; None when connected to ``remote`` (broker.net.keys.Remote).
        self.runtime = runtime
        self.remote = remote
        self.peer_id = welcome.peer_id
        # The daemon's sluice release ("" from a daemon older than that field).
        self.daemon_version = welcome.sluice_version
        # The pid of the daemon :meth:`connect` started in the background for us, if it did.
        self.started_daemon: int | None = None
        self.heartbeat_s = welcome.heartbeat_s if welcome.heartbeat_s > 0 else 1.0
        self._sock = sock
        self._calls = CallTable(self._send_now)
        # The link's rules (pings, liveness, an error about no call); this client is its blocking shell.
        self.link = Link(self._send_now, role=wire.ROLE_FRONTEND, name=name,
                         socket_path=runtime.socket_path if runtime else None)
        self.link.welcomed(welcome)
        self.link.on_broken.append(lambda error: self._break(DaemonError(str(error))))
        self.link.on_waiting = self._say_waiting
        for kind in (wire.OUT, wire.EXIT, wire.STARTED, wire.ACK, wire.NOTICE):
            self.link.on(kind, self._calls.receive)
        for kind in (wire.EVENTS, wire.EVENT, wire.ATTACHED, wire.LAGGED, wire.SESSIONS):
            self.link.on(kind, self._on_session_news)
        self.link.on(wire.STATUS, self._on_status)
        self.link.on(wire.ERROR, self._on_error)
        self._broken: DaemonError | None = None
        self._signals: collections.deque[int] = collections.deque()
        self._wake_r = -1
        self._poller = zmq.Poller()
        self._poller.register(sock, zmq.POLLIN)
        # Disconnect events tell us at once that the daemon went away (ipc: it exited).
        self._monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._poller.register(self._monitor, zmq.POLLIN)
        self._closed = False
        self._ready_fds: tuple[int, ...] = ()
        # Agent sessions this client submitted to (broker.client.sessions), made on first use.
        self._sessions = None
        # ``status`` requests in flight: corr -> the answer's body, or an error message (str).
        self._asked: dict[str, object] = {}

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

        With ``remote`` (a :class:`broker.net.keys.Remote`), connect to that daemon over
        ``tcp://`` with CurveZMQ instead (never started from here). ``name`` is how the
        daemon and the other frontends see this client (``frontend-7 (name)``).
        """
        deadline = time.monotonic() + timeout
        if remote is not None:
            return cls._remote_handshake(remote, deadline, name)
        runtime = runtime or RuntimeDir.default()
        if daemon_pid(runtime) is not None and wait_serving(runtime, deadline) is not None:
            # Running, or was starting (its pid file appears once it serves).
            return cls._handshake(runtime, deadline, name)
        if not autostart:
            raise DaemonError(f"no daemon is running in {runtime.path}; start one with `sluice daemon start`")
        pid = start_daemon(runtime, timeout=max(0.0, deadline - time.monotonic()), _probe=False)
        client = cls._handshake(runtime, deadline, name)
        client.started_daemon = pid
        return client

    @classmethod
    def _remote_handshake(cls, remote, deadline: float, name: str) -> Client:
        sock, outcome = hello(remote.endpoint, "", deadline, name, remote)
        if isinstance(outcome, wire.Welcome):
            return cls(sock, None, outcome, remote, name)
        sock.close(linger=0)
        if outcome is None:
            raise DaemonError(
                f"no answer from {remote.endpoint}: is a daemon listening there (`sluice daemon --listen`), "
                "and is it reachable from here?"
            )
        raise DaemonError(f"the daemon at {remote.endpoint} refused the connection: {wire.one_line(outcome)}")

    @classmethod
    def _handshake(cls, runtime: RuntimeDir, deadline: float, name: str = "client") -> Client:
        sent_token = None
        while True:
            token = runtime.read_token()
            sent_token = token
            sock, outcome = hello(runtime.endpoint, token, deadline, name)
            if isinstance(outcome, wire.Welcome):
                return cls(sock, runtime, outcome, name=name)
            sock.close(linger=0)
            if outcome is None:
                raise DaemonError(f"the daemon in {runtime.path} did not answer within the timeout; see {runtime.log_path}")
            # A daemon that just restarted may have replaced the token under us: retry once it did.
            if runtime.read_token() != sent_token and time.monotonic() < deadline:
                continue
            raise DaemonError(f"the daemon refused the connection: {wire.one_line(outcome)}")

    # -- submitting ---------------------------------------------------------------------

    def submit(self, argv: Iterable[str], *, on_output: OutputCallback | None = None,
               on_started: StartedCallback | None = None, **args) -> Call:
        """Send a command to the daemon and return at once; ``args`` as for
        :func:`make_request` (their names and defaults: :class:`broker.wire.run_args.RunArgs`;
        ``memory="512M"``, ``pids_limit=256``, ``file_size="1G"``, ``cpu_time=60``: the
        command's resource limits; ``result.limit`` says which one it hit; ``stdin=True``:
        feed its stdin with :meth:`write_stdin` and :meth:`close_stdin`; ``tty=(rows,
        cols)``: a pty in the sandbox is its terminal, all its output comes as stream 1,
        :meth:`resize` changes its size; ``interactive=True``: it waits for input and
        takes no executor slot)."""
        request = make_request(argv, **args)
        return self.submit_request(request, on_output=on_output, on_started=on_started)

    # -- a command's stdin --------------------------------------------------------------

    def stdin_room(self, call: Call) -> int:
        """How many bytes of stdin :meth:`write_stdin` takes for ``call`` now: 0 before the
        command started, after end of file, or while a window's worth is unacknowledged
        (the executor acks as the command reads)."""
        return self._calls.stdin_room(call) if call.started else 0

    def write_stdin(self, call: Call, data) -> int:
        """Send the start of ``data`` to ``call``'s stdin, as much as :meth:`stdin_room`
        allows; returns how many bytes went (pump and call again for the rest)."""
        if call.stdin_closed:
            raise UsageError("stdin of this call is closed (or was not asked for: submit with stdin=True)")
        n = min(len(data), self.stdin_room(call))
        if n:
            self.send_frames(self._calls.stdin(call, memoryview(data)[:n]), block=True)
        return n

    def close_stdin(self, call: Call) -> None:
        """End of file on ``call``'s stdin (after what was written)."""
        parts = self._calls.close_stdin(call)
        if parts is not None:
            self.send_frames(parts, block=True)

    def resize(self, call: Call, rows: int, cols: int) -> None:
        """Change the window size of ``call``'s terminal (a call submitted with ``tty``);
        the command gets SIGWINCH if the size changed. Before the command started, the size is sent once it
        has; after it ended, nothing is sent. Raises :class:`UsageError` for a call
        without a terminal or a size out of range (1..65535)."""
        size = winsize(rows, cols)
        if call.request.tty is None:
            raise UsageError("this call has no terminal to resize (submit it with tty=(rows, cols))")
        parts = self._calls.resize(call, size)
        if parts is not None:
            self.send_frames(parts, block=True)

    def signal_command(self, call: Call, signum: int) -> None:
        """Send ``signum`` to ``call``'s command's process group, as a terminal sends Ctrl-C
        to its foreground job (``sluice run -i`` passes its SIGINT so): the command decides
        what it does with it, unlike :meth:`cancel`, which kills its whole tree. Before the
        command started, or after it ended, nothing is sent. Raises :class:`UsageError` for
        a signal that cannot be passed (see :data:`landlock_helper.outcome.PASSABLE_SIGNALS`)."""
        from landlock_helper.outcome import PASSABLE_SIGNALS

        if signum not in PASSABLE_SIGNALS:
            names = ", ".join(sorted(signal.Signals(s).name for s in PASSABLE_SIGNALS))
            raise UsageError(f"signal {signum} cannot be sent to a command (these can: {names})")
        if call.started and not call.done:
            self.send_frames([wire.header(wire.SIGNAL, call.call_id, n=int(signum))], block=True)

    def wait_io(self, fds, timeout: float | None = None, *, writable=(), interruptible: bool = True) -> tuple[int, ...]:
        """Handle what arrives from the daemon until one of ``fds`` is readable, one of
        ``writable`` writable, or ``timeout`` passes (or something arrived); returns the
        ready ones. Raises like :meth:`wait` (:class:`Interrupted` inside :meth:`catch_signals`)."""
        self.check_usable()
        if interruptible and self._signals:
            raise Interrupted(self._signals.popleft())
        watched: dict[int, int] = {}
        for fd in fds:
            if fd >= 0:
                watched[fd] = zmq.POLLIN
        for fd in writable:
            if fd >= 0:
                watched[fd] = watched.get(fd, 0) | zmq.POLLOUT
        for fd, events in watched.items():
            self._poller.register(fd, events)
        try:
            self._pump(timeout)
            return tuple(fd for fd in self._ready_fds if fd in watched)
        finally:
            for fd in watched:
                with contextlib.suppress(KeyError, ValueError):
                    self._poller.unregister(fd)
            self._ready_fds = ()

    def hold_output(self, call: Call) -> None:
        """Acknowledge none of ``call``'s output until :meth:`release_output`: for an
        ``on_output`` that keeps a chunk its destination cannot take yet. The executor
        stops the command once a window of output (:data:`~broker.wire.frames.WINDOW_BYTES`)
        is unacknowledged, so what is held stays within about that."""
        call.output_held = True

    def release_output(self, call: Call) -> None:
        """Acknowledge the output :meth:`hold_output` held back, and every chunk as its
        callback returns again."""
        if not call.output_held:
            return
        parts = self._calls.release(call)
        if parts is not None:
            # Blocking: with the window full, nothing else would bring the ack that resumes it.
            self.send_frames(parts, block=True)

    def submit_request(
        self,
        request: wire.RunRequest,
        *,
        on_output: OutputCallback | None = None,
        on_started: StartedCallback | None = None,
        call_id: str | None = None,
    ) -> Call:
        """Submit an already validated :class:`wire.RunRequest` (from :func:`make_request`)."""
        self.check_usable()
        call = Call(call_id or new_call_id(), list(request.argv), request, on_output, on_started)
        if call.call_id in self._calls.calls:
            raise UsageError(f"call id {call.call_id} is already in flight")
        try:
            self.send_frames(self._calls.run(call), block=True)
        except BaseException:
            self._calls.calls.pop(call.call_id, None)
            raise
        return call

    def cancel(self, call: Call) -> None:
        """Ask the daemon to kill the call's process tree; its result will say ``aborted``."""
        if call.done or self._broken is not None:
            return
        self.send_frames([wire.header(wire.CANCEL, call.call_id)], block=False)

    # -- sessions -----------------------------------------------------------------------

    def open_session(self, op, *, sub_id: str = "0", timeout: float = 10.0):
        """A new agent session configured with ``op`` (a ``ConfigureSession``).

        Returns once the daemon has named it and attached us (its events, starting with
        ``session_configured`` for ``sub_id``, follow through
        :meth:`~broker.client.sessions.ClientSession.next_event`). Raises
        :class:`~broker.client.sessions.SessionError` if the daemon refuses.
        """
        self.check_usable()
        return open_session(self, op, sub_id=sub_id, timeout=timeout)

    def attach(self, session_id: str, *, since: int | None = None, timeout: float = 10.0):
        """Subscribe to an existing session from event ``since`` on: 0 for all of it, None
        for the start of its current (or last) turn.

        Returns the :class:`~broker.client.sessions.ClientSession` once the daemon has
        answered (its ``info`` describes the session); attaching to one this client already
        follows re-positions it. Raises :class:`~broker.client.sessions.SessionError` with
        the daemon's message for an unknown session, :class:`UsageError` for a bad ``since``.
        """
        self.check_usable()
        return attach(self, session_id, since=since, timeout=timeout)

    def list_sessions(self, timeout: float = 10.0) -> wire.SessionList:
        """Every session the daemon hosts (:class:`wire.SessionInfo`), and how many frontends
        and executors are connected."""
        self.check_usable()
        return list_sessions(self, timeout=timeout)

    def daemon_info(self, timeout: float = 10.0) -> wire.DaemonInfo:
        """What the daemon says about itself (:class:`wire.DaemonInfo`): its version, pid,
        uptime, socket, executors, sessions. :class:`DaemonError` when it does not answer
        or is too old to know the question."""
        self.check_usable()
        corr = new_call_id()
        self._asked[corr] = None
        try:
            self.send_frames([wire.header(wire.STATUS, corr)], block=True)
            deadline = time.monotonic() + timeout
            while self._asked[corr] is None:
                self.check_usable()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DaemonError(f"the daemon did not answer the status request within {timeout:g} s")
                self.poll(remaining)
            answer = self._asked[corr]
        finally:
            self._asked.pop(corr, None)
        if isinstance(answer, str):
            raise DaemonError(f"the daemon cannot tell its status: {answer}")
        try:
            return wire.decode(wire.STATUS, answer)
        except wire.WireError as e:
            raise DaemonError(f"the daemon's status is unreadable: {e}") from None

    def session(self, session_id: str):
        """An existing session by id; submitting to it attaches this client."""
        table = self.session_table()
        found = table.by_id.get(session_id)
        if found is None:
            found = table.by_id[session_id] = ClientSession(self, session_id)
        return found

    def session_table(self):
        if self._sessions is None:
            self._sessions = SessionTable()
        return self._sessions

    def send_submission(self, session_id: str, submission, *, corr: str = "") -> None:
        """Send a Codex Submission to ``session_id`` (for :mod:`broker.client.sessions`)."""
        # The Codex types here, not at the top: `sluice run` never needs them.
        from broker.wire.protocol import ConfigureSession, encode_msgpack

        self.check_usable()
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
        self.send_frames([wire.header(wire.SUBMIT, corr, session=session_id), encode_msgpack(submission)], block=True)

    def next_session_event(self, session, timeout: float | None, fds, interruptible: bool):
        deadline = None if timeout is None else time.monotonic() + timeout
        fds = [fd for fd in fds if fd >= 0]
        for fd in fds:
            self._poller.register(fd, zmq.POLLIN)
        drained = False
        try:
            while True:
                if session.events:
                    event = session.events.popleft()
                    session._took(event)
                    return event
                if session.failure is not None:
                    raise session.failure
                self.check_usable()
                if interruptible and self._signals:
                    raise Interrupted(self._signals.popleft())
                remaining = None
                if deadline is not None:
                    # Past the deadline (timeout=0 included) only once the socket has been
                    # read to its end: what has arrived counts as available now.
                    remaining = max(0.0, deadline - time.monotonic())
                    if not remaining and drained:
                        return None
                drained = self._pump(remaining) < DRAIN_BATCH
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
        drained = False
        while not call.done:
            if interruptible and self._signals:
                raise Interrupted(self._signals.popleft())
            remaining = None
            if deadline is not None:
                remaining = max(0.0, deadline - time.monotonic())
                if not remaining and drained:  # as next_session_event: the socket read first
                    raise TimeoutError(f"call {call.call_id} still running after {timeout} s")
            drained = self._pump(remaining) < DRAIN_BATCH
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
        return list(self._calls.calls.values())

    # -- signals ------------------------------------------------------------------------

    @contextlib.contextmanager
    def catch_signals(self, signums: Iterable[int] = ENDING_SIGNALS):
        """Catch ``signums`` (main thread only) so waits raise :class:`Interrupted` at once.

        Python's wakeup fd is put in the same poller as the socket: a signal wakes a
        blocked wait immediately, with no polling loop.
        """
        with caught_signals(self._on_signal, list(signums)) as r:
            self._wake_r = r
            self._poller.register(r, zmq.POLLIN)
            try:
                yield self
            finally:
                with contextlib.suppress(KeyError, ValueError):
                    self._poller.unregister(r)
                self._wake_r = -1

    def _on_signal(self, signum, frame) -> None:
        self._signals.append(signum)

    # -- closing ------------------------------------------------------------------------

    def close(self) -> None:
        """Cancel what is still running, say bye, close the socket."""
        if self._closed:
            return
        self._closed = True
        if self._broken is None:
            for call_id in list(self._calls.calls):
                self.send_frames([wire.header(wire.CANCEL, call_id)], block=False)
            self.send_frames([wire.header(wire.BYE)], block=False)
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

    def check_usable(self) -> None:
        if self._closed:
            raise DaemonError("the client is closed")
        if self._broken is not None:
            raise self._broken

    def send_frames(self, parts, *, block: bool) -> bool:
        """Send one message; raises :class:`UsageError` for one the daemon would not take
        (it would cut the connection instead of answering)."""
        size = sum(len(part) for part in parts)
        if size > wire.MAX_MESSAGE_SIZE:
            raise UsageError(f"this request is {size:,} bytes, more than the {format_size(wire.MAX_MESSAGE_SIZE)} the "
                             "daemon takes in one message (a command's arguments and environment, or one submission, "
                             "must fit in it); nothing was sent")
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
        watching = bool(self._calls.calls or self._sessions)
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
            self.link.tick()
        return n

    def _drain(self) -> int:
        sock = self._sock
        handle = self.link.receive
        n = 0
        while n < DRAIN_BATCH:
            try:
                # Part by part, with a plain int flag: recv_multipart's enum arithmetic and
                # RCVMORE look-ups cost more than the receive.
                frame = sock.recv(_NOBLOCK, copy=False)
                frames = [frame]
                while frame.more:
                    frame = sock.recv(_NOBLOCK, copy=False)
                    frames.append(frame)
            except zmq.Again:
                break
            n += 1
            handle(frames)
        return n

    def _send_now(self, parts: list[bytes]) -> bool:
        return self.send_frames(parts, block=False)

    def _on_session_news(self, h: wire.Header, frames: list[zmq.Frame]) -> None:
        sessions = self._sessions
        if sessions is None:
            return
        body = frames[1].buffer if len(frames) >= 2 else None
        kind = h.kind
        if kind == wire.ATTACHED:
            sessions.on_attached(h, body)
        elif kind == wire.LAGGED:
            sessions.on_lagged(h)
        elif body is None:
            return
        elif kind == wire.EVENTS:
            sessions.on_events(h, body)
        elif kind == wire.EVENT:
            sessions.on_event(h, body)
        else:
            sessions.on_sessions(h, body)

    def _on_status(self, h: wire.Header, frames: list[zmq.Frame]) -> None:
        if h.corr in self._asked and len(frames) >= 2:
            self._asked[h.corr] = frames[1].bytes

    def _on_error(self, h: wire.Header, frames: list[zmq.Frame]) -> None:
        """An error about one request of ours (one about none is the link's)."""
        if self._calls.receive(h, frames):
            return
        message = error_message(frames)
        if h.corr in self._asked:
            self._asked[h.corr] = message
        elif self._sessions is not None:
            # A session request of ours, e.g. refused by a daemon too old to know it.
            self._sessions.refuse(h.corr, message)

    def _on_monitor(self) -> None:
        from zmq.utils.monitor import recv_monitor_message

        while True:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError:
                return
            self.link.monitor_event(event["event"], self.remote.endpoint if self.remote else self.runtime.endpoint)

    def _say_waiting(self, line: str) -> None:
        # Its calls' callers hear it (``sluice run`` prints notices): a stall of the
        # daemon is waited out, and said, not taken for its death.
        for call in list(self._calls.calls.values()):
            if call.on_notice is not None:
                call.on_notice(call, line)

    def _break(self, error: DaemonError) -> None:
        if self._broken is None:
            self._broken = error
        self._fail_all(error)
        if self._sessions is not None:
            self._sessions.broken(error)

    def _fail_all(self, error: DaemonError) -> None:
        calls, self._calls.calls = self._calls.calls, {}
        for call in calls.values():
            call.failure = error


