"""How the agent runs a command: the :class:`CommandRunner` interface and its daemon implementation.

The session never spawns anything itself. It calls::

    result = await runner.run(argv, cwd, sandbox_policy, timeout_ms, on_output, call_id=...,
                              sandbox_cwd=session_cwd)

``cwd`` is where the command runs; ``sandbox_cwd`` (default: ``cwd``) is the directory
the policy's ``disk-write-cwd`` makes writable. The session passes its own cwd there,
so a ``workdir`` the model chose is a place to run, never a writable root.
``on_output(stream, chunk)`` gets each chunk of output as it arrives (``stream`` an
:class:`~broker.wire.protocol.ExecOutputStream`, ``chunk`` bytes), in order; ``run`` returns
an :class:`ExecResult` once the command has ended. ``await runner.cancel(call_id)``
kills the command's process tree; its ``run`` then returns with ``aborted`` set.
Cancelling the task awaiting ``run`` cancels the command as well (and re-raises at once,
without waiting for the executor to confirm).

:class:`BrokerRunner` sends each command to the daemon over a :class:`~agent.broker_link.BrokerLink`
(role ``agent``): the broker queues it for a free executor, which runs it in the sandbox
of ``sandbox_policy`` (a policy that allows everything runs it unsandboxed). Output is
acknowledged as ``on_output`` returns, so a slow consumer slows only its own command.

Long-lived interactive commands (a shell, a REPL, a dev server)::

    proc = await runner.start_interactive(argv, cwd, sandbox_policy, on_output,
                                          tty=Winsize(24, 80), sandbox_cwd=session_cwd)
    await proc.write(b"print(1)\n")   # waits while the stdin window is full
    proc.resize(40, 120)              # a terminal's new size (nothing for pipes)
    await proc.cancel()               # kill its tree; ``await proc.wait()`` then returns
    result = await proc.wait()        # how it ended, once it has

``start_interactive`` returns once the executor reports the command started (or, if it
never did, with ``proc.done`` set and the reason in ``proc.result.error``). Such a run
has no timeout and takes none of an executor's slots. With ``tty`` (a
:class:`~broker.wire.frames.Winsize`) the command's stdin, stdout and stderr are a
terminal, and all its output comes as stdout; with ``tty=None`` they are pipes.
``stdin=False`` gives it /dev/null (its output still streams until it exits). Its
stdin is written in ``in`` messages, at most :data:`~broker.wire.frames.STDIN_WINDOW_BYTES`
unacknowledged by the executor, so a command that stops reading holds up only its own
writer. ``on_exit(result)`` (optional) is called once, from the event loop, when it has
ended, whoever ended it.

Every result carries ``aggregated``: stdout and stderr interleaved as they came, of which
at most ``aggregate_limit`` bytes are kept, half from the start and half from the end
(``aggregated_omitted`` counts what was dropped in between). The model is only ever shown
head and tail of long output, so this copy holds all it can see.
"""

from __future__ import annotations

import abc
import asyncio
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import msgspec
import structlog
import zmq

from agent.broker_link import BrokerLink, LinkError
from broker.net.runtime import RuntimeDir
from broker.wire import frames as wire
from broker.wire.protocol import ExecOutputStream, SandboxPolicy
from broker.wire.results import new_call_id
from landlock_helper import fileops
from landlock_helper.env import filter_env
from landlock_helper.limits import Limits

log = structlog.get_logger("agent.exec_runner")

DEFAULT_AGGREGATE_LIMIT = 1024 * 1024
# What the executor keeps of an interactive run's output for its exit status: little,
# since the caller keeps its own copy as the output streams (``aggregated``).
INTERACTIVE_CAPTURE_LIMIT = 64 * 1024

# What an ``exec_command_end`` carries of each of stdout, stderr and the aggregated
# output, in characters (the seed's MAX_STREAM_OUTPUT): the deltas already carried every
# byte to the frontends, and formatted_output is what the model saw.
MAX_STREAM_OUTPUT = 5 * 1024


def cap_stream_output(text: str) -> str:
    return text[:MAX_STREAM_OUTPUT]


class StreamedOutput:
    """The beginning of a command's output as it streams, enough for an
    ``exec_command_end`` when the command is cut short (an interrupt) and the result with
    its own copy never comes."""

    _KEEP = MAX_STREAM_OUTPUT * 4  # bytes: room for as many characters of UTF-8

    def __init__(self) -> None:
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.aggregated = bytearray()

    def add(self, stream: ExecOutputStream, chunk: bytes) -> None:
        for buf in (self.stdout if stream == ExecOutputStream.STDOUT else self.stderr, self.aggregated):
            if len(buf) < self._KEEP:
                buf += chunk[: self._KEEP - len(buf)]

    def texts(self) -> tuple[str, str, str]:
        """stdout, stderr and the aggregated output, decoded and capped."""
        return tuple(cap_stream_output(bytes(b).decode("utf-8", errors="replace"))  # type: ignore[return-value]
                     for b in (self.stdout, self.stderr, self.aggregated))


OutputCallback = Callable[[ExecOutputStream, bytes], None]
ExitCallback = Callable[["ExecResult"], None]

_STREAMS = {wire.STDOUT: ExecOutputStream.STDOUT, wire.STDERR: ExecOutputStream.STDERR}


class HeadTailBuffer:
    """Keeps the first and the last ``limit // 2`` bytes of what is written."""

    __slots__ = ("limit", "_head", "_tail", "omitted")

    def __init__(self, limit: int = DEFAULT_AGGREGATE_LIMIT) -> None:
        self.limit = limit
        self._head = bytearray()
        self._tail = bytearray()
        self.omitted = 0

    def write(self, data: bytes) -> None:
        half = self.limit // 2
        room = half - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if not data:
            return
        self._tail += data
        excess = len(self._tail) - (self.limit - half)
        if excess > 0:
            del self._tail[:excess]
            self.omitted += excess

    def getvalue(self) -> bytes:
        return bytes(self._head + self._tail)


class ExecResult(wire.ExitStatus, frozen=True, kw_only=True):
    """How a command ended (:class:`broker.wire.frames.ExitStatus`; ``error`` is set when
    it never ran or its executor failed), with the output as the model sees it."""

    aggregated: bytes = b""
    aggregated_omitted: int = 0


class CommandRunner(abc.ABC):
    """Runs commands for a session (see the module docstring)."""

    @abc.abstractmethod
    async def run(
        self,
        argv: Sequence[str],
        cwd: str,
        sandbox_policy: SandboxPolicy,
        timeout_ms: int | None,
        on_output: OutputCallback | None = None,
        *,
        call_id: str | None = None,
        env: Mapping[str, str] | None = None,
        sandbox_cwd: str | None = None,
        env_passthrough: Iterable[str] = (),
        limits: Limits | None = None,
    ) -> ExecResult:
        """Run ``argv`` in ``cwd`` under ``sandbox_policy`` (its ``disk-write-cwd`` being
        ``sandbox_cwd``, default ``cwd``) and return how it ended.

        ``env`` (default: the runner's) loses its secrets before it goes anywhere, except
        the names in ``env_passthrough``. ``limits``: the command's resource limits
        (None: the executor's defaults); the result's ``limit`` says which it hit."""

    @abc.abstractmethod
    async def cancel(self, call_id: str) -> None:
        """Kill the command ``call_id`` (and its whole tree) if it is still running."""

    async def run_fileops(
        self,
        batch: bytes,
        cwd: str,
        sandbox_policy: SandboxPolicy,
        timeout_ms: int | None,
        *,
        sandbox_cwd: str | None = None,
        limits: Limits | None = None,
    ) -> ExecResult:
        """Carry out ``batch`` (:mod:`landlock_helper.fileops`) in the sandbox of
        ``sandbox_policy``, exactly as a command of that policy would be run; the result's
        ``stdout`` is the whole answer, its ``stderr`` what the sandbox said besides."""
        raise NotImplementedError(f"{type(self).__name__} cannot run file operations")

    async def start_interactive(
        self,
        argv: Sequence[str],
        cwd: str,
        sandbox_policy: SandboxPolicy,
        on_output: OutputCallback | None = None,
        *,
        tty: wire.Winsize | None = None,
        stdin: bool = True,
        on_exit: ExitCallback | None = None,
        call_id: str | None = None,
        env: Mapping[str, str] | None = None,
        sandbox_cwd: str | None = None,
        env_passthrough: Iterable[str] = (),
        limits: Limits | None = None,
        fileops: bool = False,
    ) -> InteractiveProcess:
        """Start a long-lived command whose stdin stays open (see the module docstring);
        ``fileops``: the sandbox's file-operation builtin instead of ``argv``, which takes
        one batch after another on its stdin (:mod:`landlock_helper.fileops`)."""
        raise NotImplementedError(f"{type(self).__name__} cannot run interactive commands")

    async def aclose(self) -> None:
        """Release what the runner holds; commands still running are cancelled."""


class InteractiveProcess(abc.ABC):
    """A long-lived command started by :meth:`CommandRunner.start_interactive`."""

    call_id: str
    pid: int | None
    tty: bool

    @property
    @abc.abstractmethod
    def done(self) -> bool:
        """True once it has ended (or never started)."""

    @property
    @abc.abstractmethod
    def result(self) -> ExecResult | None:
        """How it ended; None while it runs."""

    @abc.abstractmethod
    async def write(self, data: bytes) -> bool:
        """Write ``data`` to its stdin, waiting while the window is full; False if it
        ended (or its stdin was closed) before all of it was sent."""

    @abc.abstractmethod
    def close_stdin(self) -> None:
        """End of file on its stdin, after what was written."""

    @abc.abstractmethod
    def resize(self, rows: int, cols: int) -> None:
        """Its terminal's new size (nothing for a command without one)."""

    @abc.abstractmethod
    def hold_output(self, held: bool) -> None:
        """Stop (``True``) or restart (``False``) acknowledging its output: held, at most a
        window more of it comes, then the executor stops reading its pipes and the command
        waits to write. For a reader that cannot keep up (a flooding MCP server)."""

    @abc.abstractmethod
    async def cancel(self) -> None:
        """Kill its whole tree; :meth:`wait` then returns with ``aborted`` set."""

    @abc.abstractmethod
    async def wait(self) -> ExecResult:
        """How it ended, once it has."""


@dataclass(slots=True, eq=False)
class _Running:
    call_id: str
    on_output: OutputCallback | None
    future: asyncio.Future[ExecResult]
    aggregated: HeadTailBuffer
    pid: int | None = None
    unacked_bytes: int = 0
    unacked_chunks: int = 0
    # Interactive runs only.
    interactive: bool = False
    started: asyncio.Future[None] | None = None
    on_exit: ExitCallback | None = None
    stdin_unacked: int = 0
    stdin_closed: bool = False
    stdin_room: asyncio.Event | None = None
    output_held: bool = False


def _ack(running: _Running) -> bytes:
    """The acknowledgement of the output of ``running`` not acknowledged yet."""
    return wire.header(wire.ACK, running.call_id, n=running.unacked_bytes, seq=running.unacked_chunks)


class _BrokerProcess(InteractiveProcess):
    """An interactive run of a :class:`BrokerRunner`."""

    def __init__(self, runner: BrokerRunner, running: _Running, tty: bool) -> None:
        self._runner = runner
        self._running = running
        self.call_id = running.call_id
        self.tty = tty

    @property
    def pid(self) -> int | None:  # type: ignore[override]
        return self._running.pid

    @property
    def done(self) -> bool:
        return self._running.future.done()

    @property
    def result(self) -> ExecResult | None:
        future = self._running.future
        return future.result() if future.done() else None

    async def write(self, data: bytes) -> bool:
        return await self._runner._write_stdin(self._running, data)

    def close_stdin(self) -> None:
        running = self._running
        if running.stdin_closed or running.future.done():
            return
        running.stdin_closed = True
        self._runner._send_soon([wire.header(wire.IN, running.call_id), b""])

    def resize(self, rows: int, cols: int) -> None:
        if self.tty and not self.done:
            body = wire.encode(wire.Winsize(rows, cols))
            self._runner._send_soon([wire.header(wire.RESIZE, self.call_id), body])

    def hold_output(self, held: bool) -> None:
        running = self._running
        running.output_held = held
        if not held and running.unacked_bytes and not self.done:
            self._runner._send_soon([_ack(running)])
            running.unacked_bytes = running.unacked_chunks = 0

    async def cancel(self) -> None:
        if not self.done:
            self._runner._send_cancel(self.call_id)

    async def wait(self) -> ExecResult:
        return await asyncio.shield(self._running.future)

    def __repr__(self) -> str:
        state = "done" if self.done else "running"
        return f"<InteractiveProcess {self.call_id} pid={self.pid} {state}>"


class BrokerRunner(CommandRunner):
    """Runs commands on the daemon's executors over ``link``."""

    def __init__(
        self,
        link: BrokerLink,
        *,
        env: Mapping[str, str] | None = None,
        capture_limit: int = wire.DEFAULT_CAPTURE_LIMIT,
        aggregate_limit: int = DEFAULT_AGGREGATE_LIMIT,
        owns_link: bool = False,
    ) -> None:
        self.link = link
        self.env = dict(os.environ if env is None else env)
        self.capture_limit = capture_limit
        self.aggregate_limit = aggregate_limit
        self._owns_link = owns_link
        self._running: dict[str, _Running] = {}
        self._senders: set[asyncio.Task[None]] = set()
        link.on(wire.OUT, self._on_out)
        link.on(wire.STARTED, self._on_started)
        link.on(wire.EXIT, self._on_exit)
        link.on(wire.ERROR, self._on_error)
        link.on(wire.ACK, self._on_stdin_ack)
        link.on_broken.append(self._on_broken)

    @classmethod
    async def connect(cls, runtime: RuntimeDir | None = None, *, timeout: float = 10.0, **kwargs) -> BrokerRunner:
        """A runner with its own link to the daemon of ``runtime`` (closed by :meth:`aclose`)."""
        link = await BrokerLink.connect(runtime, timeout=timeout)
        return cls(link, owns_link=True, **kwargs)

    @property
    def running(self) -> list[str]:
        return list(self._running)

    async def run(
        self,
        argv: Sequence[str],
        cwd: str,
        sandbox_policy: SandboxPolicy,
        timeout_ms: int | None,
        on_output: OutputCallback | None = None,
        *,
        call_id: str | None = None,
        env: Mapping[str, str] | None = None,
        sandbox_cwd: str | None = None,
        env_passthrough: Iterable[str] = (),
        limits: Limits | None = None,
    ) -> ExecResult:
        call_id = call_id or new_call_id()
        if call_id in self._running:
            raise ValueError(f"call id {call_id} is already running")
        if self.link.broken is not None:
            return ExecResult(error=str(self.link.broken))
        passthrough = list(env_passthrough)
        request = wire.RunRequest(
            argv=list(argv),
            cwd=cwd,
            sandbox=sandbox_policy,
            # Filtered before it is sent: the executor may be on another host.
            env=filter_env(self.env if env is None else env, passthrough),
            env_passthrough=passthrough,
            timeout_ms=timeout_ms,
            capture_limit=self.capture_limit,
            sandbox_cwd=sandbox_cwd or cwd,
            limits=limits,
        )
        return await self._run(call_id, request, on_output)

    async def run_fileops(
        self,
        batch: bytes,
        cwd: str,
        sandbox_policy: SandboxPolicy,
        timeout_ms: int | None,
        *,
        sandbox_cwd: str | None = None,
        limits: Limits | None = None,
    ) -> ExecResult:
        if self.link.broken is not None:
            return ExecResult(error=str(self.link.broken))
        request = wire.RunRequest(
            argv=[fileops.PROGRAM], cwd=cwd, sandbox=sandbox_policy, env={}, timeout_ms=timeout_ms,
            # All of the answer is gathered here as it streams; the executor keeps no copy.
            capture_limit=0, sandbox_cwd=sandbox_cwd or cwd, limits=limits, fileops=batch,
        )
        out, err = bytearray(), bytearray()

        def gather(stream: ExecOutputStream, chunk: bytes) -> None:
            (out if stream == ExecOutputStream.STDOUT else err).extend(chunk)

        result = await self._run(new_call_id(), request, gather)
        return msgspec.structs.replace(result, stdout=bytes(out), stderr=bytes(err))

    async def _run(self, call_id: str, request: wire.RunRequest, on_output: OutputCallback | None) -> ExecResult:
        future: asyncio.Future[ExecResult] = asyncio.get_running_loop().create_future()
        running = _Running(call_id, on_output, future, HeadTailBuffer(self.aggregate_limit))
        self._running[call_id] = running
        try:
            await self.link.send_wait([wire.header(wire.RUN, call_id), wire.encode(request)])
            # Shielded: a cancelled caller must not cancel the future the handlers resolve.
            return await asyncio.shield(future)
        except LinkError as err:
            return ExecResult(error=str(err))
        except asyncio.CancelledError:
            self._send_cancel(call_id)
            raise
        finally:
            self._running.pop(call_id, None)

    async def start_interactive(
        self,
        argv: Sequence[str],
        cwd: str,
        sandbox_policy: SandboxPolicy,
        on_output: OutputCallback | None = None,
        *,
        tty: wire.Winsize | None = None,
        stdin: bool = True,
        on_exit: ExitCallback | None = None,
        call_id: str | None = None,
        env: Mapping[str, str] | None = None,
        sandbox_cwd: str | None = None,
        env_passthrough: Iterable[str] = (),
        limits: Limits | None = None,
        fileops: bool = False,
    ) -> InteractiveProcess:
        call_id = call_id or new_call_id()
        if call_id in self._running:
            raise ValueError(f"call id {call_id} is already running")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ExecResult] = loop.create_future()
        running = _Running(call_id, on_output, future, HeadTailBuffer(self.aggregate_limit), interactive=True,
                           started=loop.create_future(), on_exit=on_exit, stdin_room=asyncio.Event())
        running.stdin_closed = not stdin
        process = _BrokerProcess(self, running, tty is not None)
        if self.link.broken is not None:
            self._finish(running, ExecResult(error=str(self.link.broken)))
            return process
        passthrough = list(env_passthrough)
        request = wire.RunRequest(
            argv=list(argv),
            cwd=cwd,
            sandbox=sandbox_policy,
            env=filter_env(self.env if env is None else env, passthrough),
            env_passthrough=passthrough,
            timeout_ms=None,
            # The caller keeps what it needs of the output as it streams.
            capture_limit=min(self.capture_limit, INTERACTIVE_CAPTURE_LIMIT),
            sandbox_cwd=sandbox_cwd or cwd,
            limits=limits,
            stdin=stdin,
            tty=tty,
            interactive=True,
            fileops=b"" if fileops else None,
        )
        self._running[call_id] = running
        try:
            await self.link.send_wait([wire.header(wire.RUN, call_id), wire.encode(request)])
            assert running.started is not None
            await asyncio.wait([running.started, future], return_when=asyncio.FIRST_COMPLETED)
        except LinkError as err:
            self._finish(running, ExecResult(error=str(err)))
        except asyncio.CancelledError:
            # Nobody will ever know its id: it must not outlive the cancelled caller.
            self._send_cancel(call_id)
            self._running.pop(call_id, None)
            raise
        return process

    async def _write_stdin(self, running: _Running, data: bytes) -> bool:
        view = memoryview(data)
        room_event = running.stdin_room
        assert room_event is not None
        while view:
            if running.future.done() or running.stdin_closed:
                return False
            room = wire.STDIN_WINDOW_BYTES - running.stdin_unacked
            if room <= 0:
                room_event.clear()
                waiter = asyncio.ensure_future(room_event.wait())
                try:
                    await asyncio.wait([waiter, running.future], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
                continue
            n = min(room, len(view))
            try:
                await self.link.send_wait([wire.header(wire.IN, running.call_id), bytes(view[:n])])
            except LinkError:
                return False
            running.stdin_unacked += n
            view = view[n:]
        return True

    async def cancel(self, call_id: str) -> None:
        if call_id in self._running:
            self._send_cancel(call_id)

    def _send_soon(self, parts: list[bytes]) -> None:
        """Send now, or (the queue being full) as soon as the link takes it."""
        if self.link.send(parts) or self.link.broken is not None:
            return
        task = asyncio.get_running_loop().create_task(self._send_later(parts))
        self._senders.add(task)
        task.add_done_callback(self._senders.discard)

    async def _send_later(self, parts: list[bytes]) -> None:
        try:
            await self.link.send_wait(parts)
        except LinkError as err:
            log.warning("could not send", kind=wire.decode_header(parts[0]).kind, error=str(err))

    def _send_cancel(self, call_id: str) -> None:
        if not self.link.send([wire.header(wire.CANCEL, call_id)]):
            log.warning("could not send cancel", call_id=call_id)

    async def aclose(self) -> None:
        for call_id in list(self._running):
            self._send_cancel(call_id)
        if self._owns_link:
            await self.link.aclose()

    # -- messages from the broker -----------------------------------------------------

    def _on_out(self, head: wire.Header, frames: list[zmq.Frame]) -> None:
        running = self._running.get(head.corr)
        if running is None or len(frames) < 2:
            return
        chunk = frames[1].bytes
        running.unacked_bytes += len(chunk)
        running.unacked_chunks += 1
        try:
            if chunk:
                running.aggregated.write(chunk)
                if running.on_output is not None:
                    running.on_output(_STREAMS.get(head.stream, ExecOutputStream.STDOUT), chunk)
        finally:
            if not running.output_held and (running.unacked_bytes >= wire.ACK_EVERY_BYTES
                                            or running.unacked_chunks >= wire.ACK_EVERY_CHUNKS):
                if self.link.send([_ack(running)]):
                    running.unacked_bytes = running.unacked_chunks = 0

    def _on_started(self, head: wire.Header, frames: list[zmq.Frame]) -> None:
        running = self._running.get(head.corr)
        if running is None or len(frames) < 2:
            return
        try:
            running.pid = wire.decode(wire.STARTED, frames[1].buffer).pid
        except wire.WireError:
            pass
        if running.started is not None and not running.started.done():
            running.started.set_result(None)

    def _on_stdin_ack(self, head: wire.Header, frames: list[zmq.Frame]) -> None:
        # The executor has written ``n`` more bytes of the call's stdin to the command.
        running = self._running.get(head.corr)
        if running is None or running.stdin_room is None:
            return
        running.stdin_unacked = max(0, running.stdin_unacked - head.n)
        running.stdin_room.set()

    def _on_exit(self, head: wire.Header, frames: list[zmq.Frame]) -> None:
        running = self._running.get(head.corr)
        if running is None or running.future.done() or len(frames) < 2:
            return
        try:
            status = wire.decode(wire.EXIT, frames[1].buffer)
        except wire.WireError as err:
            self._finish(running, ExecResult(error=f"unreadable exit status: {err}"))
            return
        result = ExecResult(**msgspec.structs.asdict(status))
        self._finish(running, result)

    def _on_error(self, head: wire.Header, frames: list[zmq.Frame]) -> None:
        running = self._running.get(head.corr)
        if running is None or running.future.done():
            return
        message = "the daemon reported an error"
        if len(frames) > 1:
            try:
                message = wire.decode(wire.ERROR, frames[1].buffer).message
            except wire.WireError:
                pass
        self._finish(running, ExecResult(error=message))

    def _on_broken(self, error: LinkError) -> None:
        for running in list(self._running.values()):
            if not running.future.done():
                self._finish(running, ExecResult(error=str(error)))

    def _finish(self, running: _Running, result: ExecResult) -> None:
        result = msgspec.structs.replace(result, aggregated=running.aggregated.getvalue(),
                                         aggregated_omitted=running.aggregated.omitted)
        running.future.set_result(result)
        if not running.interactive:
            return
        # Nobody awaits run() for it: it leaves the table here.
        if self._running.get(running.call_id) is running:
            del self._running[running.call_id]
        if running.stdin_room is not None:
            running.stdin_room.set()
        if running.on_exit is not None:
            try:
                running.on_exit(result)
            except Exception:
                log.exception("on_exit callback failed", call_id=running.call_id)
