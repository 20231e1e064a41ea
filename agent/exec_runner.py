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

:class:`BrokerRunner` sends each command to the daemon over a :class:`~broker.net.aiolink.PeerLink`
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
from typing import TypedDict, Unpack

import msgspec
import structlog

from broker.net.calls import CallTable, PeerCall
from broker.net.aiolink import PeerLink
from broker.net.link import LinkError
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


class SandboxOptions(TypedDict, total=False):
    """Options of every run (:class:`CommandRunner`): ``sandbox_cwd`` (default: ``cwd``),
    the directory the policy's ``disk-write-cwd`` makes writable; ``limits``, the run's
    resource limits (None: the executor's defaults; the result's ``limit`` says which it hit)."""

    sandbox_cwd: str | None
    limits: Limits | None


class CommandOptions(SandboxOptions, total=False):
    """Options of a command, besides :class:`SandboxOptions`: ``call_id`` (default: a new
    one) names it for :meth:`CommandRunner.cancel`; ``env`` (default: the runner's) loses
    its secrets before it goes anywhere, except the names in ``env_passthrough``."""

    call_id: str | None
    env: Mapping[str, str] | None
    env_passthrough: Iterable[str]


class CommandRunner(abc.ABC):
    """Runs commands for a session (see the module docstring)."""

    @abc.abstractmethod
    async def run(self, argv: Sequence[str], cwd: str, sandbox_policy: SandboxPolicy, timeout_ms: int | None,
                  on_output: OutputCallback | None = None, **options: Unpack[CommandOptions]) -> ExecResult:
        """Run ``argv`` in ``cwd`` under ``sandbox_policy`` (:class:`CommandOptions`) and
        return how it ended."""

    @abc.abstractmethod
    async def cancel(self, call_id: str) -> None:
        """Kill the command ``call_id`` (and its whole tree) if it is still running."""

    async def run_fileops(self, batch: bytes, cwd: str, sandbox_policy: SandboxPolicy, timeout_ms: int | None,
                          **options: Unpack[SandboxOptions]) -> ExecResult:
        """Carry out ``batch`` (:mod:`landlock_helper.fileops`) in the sandbox of
        ``sandbox_policy``, exactly as a command of that policy would be run; the result's
        ``stdout`` is the whole answer, its ``stderr`` what the sandbox said besides."""
        raise NotImplementedError(f"{type(self).__name__} cannot run file operations")

    async def start_interactive(self, argv: Sequence[str], cwd: str, sandbox_policy: SandboxPolicy,
                                on_output: OutputCallback | None = None, *, tty: wire.Winsize | None = None,
                                stdin: bool = True, on_exit: ExitCallback | None = None, fileops: bool = False,
                                **options: Unpack[CommandOptions]) -> InteractiveProcess:
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


class _Running(PeerCall):
    """A run of a :class:`BrokerRunner`: the news of it goes to futures."""

    __slots__ = ("runner", "on_output", "future", "aggregated", "interactive", "started", "on_exit", "room")

    def __init__(self, runner: BrokerRunner, call_id: str, request: wire.RunRequest,
                 on_output: OutputCallback | None, *, on_exit: ExitCallback | None = None) -> None:
        super().__init__(call_id, request)
        loop = asyncio.get_running_loop()
        self.runner = runner
        self.on_output = on_output
        self.future: asyncio.Future[ExecResult] = loop.create_future()
        self.aggregated = HeadTailBuffer(runner.aggregate_limit)
        # Interactive runs only.
        self.interactive = request.interactive
        self.started: asyncio.Future[None] | None = loop.create_future() if self.interactive else None
        self.on_exit = on_exit
        self.room = asyncio.Event() if self.interactive else None

    def output(self, stream: int, chunk: memoryview) -> None:
        data = bytes(chunk)
        self.aggregated.write(data)
        if self.on_output is not None:
            self.on_output(_STREAMS.get(stream, ExecOutputStream.STDOUT), data)

    def began(self) -> None:
        if self.started is not None and not self.started.done():
            self.started.set_result(None)

    def stdin_taken(self) -> None:
        if self.room is not None:
            self.room.set()

    def ended(self, status: wire.ExitStatus) -> None:
        self.runner._finish(self, ExecResult(**msgspec.structs.asdict(status)))


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
        self._runner._put(self._runner.calls.close_stdin(self._running))

    def resize(self, rows: int, cols: int) -> None:
        if self.tty:
            self._runner._put(self._runner.calls.resize(self._running, wire.Winsize(rows, cols)))

    def hold_output(self, held: bool) -> None:
        if held:
            self._running.output_held = True
        else:
            self._runner._put(self._runner.calls.release(self._running))

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
        link: PeerLink,
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
        self.calls = CallTable(link.send)
        for kind in (wire.OUT, wire.STARTED, wire.EXIT, wire.ERROR, wire.ACK, wire.NOTICE):
            link.on(kind, self.calls.receive)
        link.on_broken.append(self._on_broken)

    @classmethod
    async def connect(cls, runtime: RuntimeDir | None = None, *, timeout: float = 10.0, **kwargs) -> BrokerRunner:
        """A runner with its own link to the daemon of ``runtime`` (closed by :meth:`aclose`)."""
        link = await PeerLink.connect(runtime, timeout=timeout)
        return cls(link, owns_link=True, **kwargs)

    @property
    def running(self) -> list[str]:
        return list(self.calls.calls)

    async def run(self, argv: Sequence[str], cwd: str, sandbox_policy: SandboxPolicy, timeout_ms: int | None,
                  on_output: OutputCallback | None = None, **options: Unpack[CommandOptions]) -> ExecResult:
        call_id = self._new_call_id(options.pop("call_id", None))
        if self.link.broken is not None:
            return ExecResult(error=str(self.link.broken))
        request = self._request(argv, cwd, sandbox_policy, timeout_ms=timeout_ms, capture_limit=self.capture_limit,
                                **options)
        return await self._run(call_id, request, on_output)

    def _new_call_id(self, call_id: str | None) -> str:
        call_id = call_id or new_call_id()
        if call_id in self.calls.calls:
            raise ValueError(f"call id {call_id} is already running")
        return call_id

    def _request(self, argv, cwd, policy, *, env=None, env_passthrough=(), sandbox_cwd=None,
                 **fields) -> wire.RunRequest:
        passthrough = list(env_passthrough)
        # The environment is filtered before it is sent: the executor may be on another host.
        return wire.RunRequest(argv=list(argv), cwd=cwd, sandbox=policy, env_passthrough=passthrough,
                               env=filter_env(self.env if env is None else env, passthrough),
                               sandbox_cwd=sandbox_cwd or cwd, **fields)

    async def run_fileops(self, batch: bytes, cwd: str, sandbox_policy: SandboxPolicy, timeout_ms: int | None,
                          **options: Unpack[SandboxOptions]) -> ExecResult:
        if self.link.broken is not None:
            return ExecResult(error=str(self.link.broken))
        # All of the answer is gathered here as it streams; the executor keeps no copy.
        request = self._request([fileops.PROGRAM], cwd, sandbox_policy, env={}, timeout_ms=timeout_ms,
                                capture_limit=0, fileops=batch, **options)
        out, err = bytearray(), bytearray()

        def gather(stream: ExecOutputStream, chunk: bytes) -> None:
            (out if stream == ExecOutputStream.STDOUT else err).extend(chunk)

        result = await self._run(new_call_id(), request, gather)
        return msgspec.structs.replace(result, stdout=bytes(out), stderr=bytes(err))

    async def _run(self, call_id: str, request: wire.RunRequest, on_output: OutputCallback | None) -> ExecResult:
        running = _Running(self, call_id, request, on_output)
        try:
            await self.link.send_wait(self.calls.run(running))
            # Shielded: a cancelled caller must not cancel the future the handlers resolve.
            return await asyncio.shield(running.future)
        except LinkError as err:
            return ExecResult(error=str(err))
        except asyncio.CancelledError:
            self._send_cancel(call_id)
            raise
        finally:
            self.calls.calls.pop(call_id, None)

    async def start_interactive(self, argv: Sequence[str], cwd: str, sandbox_policy: SandboxPolicy,
                                on_output: OutputCallback | None = None, *, tty: wire.Winsize | None = None,
                                stdin: bool = True, on_exit: ExitCallback | None = None, fileops: bool = False,
                                **options: Unpack[CommandOptions]) -> InteractiveProcess:
        call_id = self._new_call_id(options.pop("call_id", None))
        request = self._request(
            argv, cwd, sandbox_policy, timeout_ms=None,
            # The caller keeps what it needs of the output as it streams.
            capture_limit=min(self.capture_limit, INTERACTIVE_CAPTURE_LIMIT),
            stdin=stdin, tty=tty, interactive=True, fileops=b"" if fileops else None, **options)
        running = _Running(self, call_id, request, on_output, on_exit=on_exit)
        process = _BrokerProcess(self, running, tty is not None)
        if self.link.broken is not None:
            self._finish(running, ExecResult(error=str(self.link.broken)))
            return process
        try:
            await self.link.send_wait(self.calls.run(running))
            assert running.started is not None
            await asyncio.wait([running.started, running.future], return_when=asyncio.FIRST_COMPLETED)
        except LinkError as err:
            self._finish(running, ExecResult(error=str(err)))
        except asyncio.CancelledError:
            # Nobody will ever know its id: it must not outlive the cancelled caller.
            self._send_cancel(call_id)
            self.calls.calls.pop(call_id, None)
            raise
        return process

    async def _write_stdin(self, running: _Running, data: bytes) -> bool:
        view = memoryview(data)
        room_event = running.room
        assert room_event is not None
        while view:
            if running.future.done() or running.stdin_closed:
                return False
            room = self.calls.stdin_room(running)
            if room <= 0:
                room_event.clear()
                waiter = asyncio.ensure_future(room_event.wait())
                try:
                    await asyncio.wait([waiter, running.future], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
                continue
            try:
                await self.link.send_wait(self.calls.stdin(running, view[:room]))
            except LinkError:
                return False
            view = view[room:]
        return True

    async def cancel(self, call_id: str) -> None:
        if call_id in self.calls.calls:
            self._send_cancel(call_id)

    def _put(self, parts: list[bytes] | None) -> None:
        """Send now, or in order once the link takes it."""
        if parts is not None:
            self.link.put(parts)

    def _send_cancel(self, call_id: str) -> None:
        self.link.put([wire.header(wire.CANCEL, call_id)])

    async def aclose(self) -> None:
        for call_id in list(self.calls.calls):
            self._send_cancel(call_id)
        if self._owns_link:
            await self.link.aclose()

    def _on_broken(self, error: LinkError) -> None:
        for running in list(self.calls.calls.values()):
            self._finish(running, ExecResult(error=str(error)))

    def _finish(self, running: _Running, result: ExecResult) -> None:
        if running.future.done():
            return
        result = msgspec.structs.replace(result, aggregated=running.aggregated.getvalue(),
                                         aggregated_omitted=running.aggregated.omitted)
        running.future.set_result(result)
        if not running.interactive:
            return
        # Nobody awaits run() for it: it leaves the table here.
        if self.calls.calls.get(running.call_id) is running:
            del self.calls.calls[running.call_id]
        if running.room is not None:
            running.room.set()
        if running.on_exit is not None:
            try:
                running.on_exit(result)
            except Exception:
                log.exception("on_exit callback failed", call_id=running.call_id)
