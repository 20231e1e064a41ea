"""Unified exec: long-lived commands (a shell, a REPL, a dev server) the model drives
over several tool calls.

One :class:`UnifiedExecManager` per agent session holds that session's commands, each
an :class:`ExecSession` keyed by an integer id, running through the session's
:class:`~agent.exec_runner.CommandRunner` (``start_interactive``: a terminal or pipes, in
the session's sandbox, no timeout). The tool handlers (:mod:`agent.tool_calls`) decide
approval and sandbox exactly as for ``shell``, then call :meth:`UnifiedExecManager.open`,
:meth:`~UnifiedExecManager.write` and :meth:`~UnifiedExecManager.collect`.

Behaviour (the seed's ``unified_exec/mod.rs``, and Codex's ``exec_command`` /
``write_stdin`` after it):

- Output is kept per session in an :class:`OutputBuffer` of at most
  :data:`OUTPUT_MAX_BYTES` (128 KiB): past that the oldest bytes are dropped, and only as
  many as needed. A call collects what the command prints until its deadline, or until
  the command has exited and all its output is in, and takes it out of the buffer.
- The seed's ``timeout_ms`` defaults to :data:`DEFAULT_TIMEOUT_MS` and is clamped to
  :data:`MAX_TIMEOUT_MS`, with the warning line :func:`clamp_timeout` gives.
- A command that exited is gone once a call has seen it exit (that call gets its last
  output and no session id); its id then raises :class:`UnknownSessionId`.
- At most ``max_sessions`` (default :data:`DEFAULT_MAX_SESSIONS`) per agent session: opening
  one more first closes the one idle longest (sessions a call is using are not
  candidates), and :meth:`UnifiedExecManager.open` returns a note saying so for the model.
- A session no call (and no person typing into it) has used for ``idle_timeout_s``
  (default :data:`DEFAULT_IDLE_TIMEOUT_S`; 0: never) is closed by a reaper task.
- A session's command runs with :data:`SESSION_ENV` added to the session's environment
  (:func:`session_env`): no colours, no pager, a plain terminal type, UTF-8.
- Interrupting a turn cancels the call waiting on a session, never the session.
  :meth:`UnifiedExecManager.close_all` (the agent session's shutdown) kills every one and
  waits, bounded, for their trees to be reported dead.

A person may type into a session too (the ``exec_command_stdin`` op, by the call id its
events carry; :meth:`UnifiedExecManager.typing_target` and :meth:`~UnifiedExecManager.type`):
the bytes go to its stdin exactly as a ``write_stdin`` call's do, under the same lock, so
one writer's input is never cut into by another's, and never wait in the agent session's
submission loop (a command that stopped reading holds up that input, not an interrupt).
Codex has no convention for telling the model of input it did not type, so the model is
told nothing apart: what the command prints in answer (with a terminal, the echo of what
was typed too) is output like any other, read by the model's next call on that session.

Events: ``exec_command_begin`` when a session's command starts, an
``exec_command_output_delta`` per chunk as it prints (between turns too), and
``exec_command_end`` when its process exits, however it ends, all under the call id of
the tool call that started it and the submission id of the last call that used it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import structlog

from agent.exec_runner import CommandRunner, ExecResult, InteractiveProcess, cap_stream_output
from broker.wire import frames as wire
from broker.wire.protocol import (
    Duration,
    EventMsg,
    ExecCommandBeginEvent,
    ExecCommandEndEvent,
    ExecCommandOutputDeltaEvent,
    ExecOutputStream,
    SandboxPolicy,
)
from landlock_helper.limits import Limits

log = structlog.get_logger("agent.unified_exec")

DEFAULT_TIMEOUT_MS = 1_000
MAX_TIMEOUT_MS = 60_000
OUTPUT_MAX_BYTES = 128 * 1024
DEFAULT_MAX_SESSIONS = 64
DEFAULT_IDLE_TIMEOUT_S = 30 * 60.0
# The terminal a session gets when the model does not say (Codex's PTY size).
DEFAULT_WINSIZE = wire.Winsize(24, 80)
# How long close_all waits for the executors to report the killed trees dead.
CLOSE_GRACE_S = 5.0
FIRST_SESSION_ID = 1000
# Set for every session's command, as Codex does for its interactive commands: output
# meant for a model, not a person (no colours, no pager waiting for a key).
SESSION_ENV = {
    "NO_COLOR": "1",
    "TERM": "dumb",
    "LANG": "C.UTF-8",
    "LC_CTYPE": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "COLORTERM": "",
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "GH_PAGER": "cat",
}

Send = Callable[[str, EventMsg], None]


class UnknownSessionId(LookupError):
    """No live session has this id (it exited, was closed, or never was)."""

    def __init__(self, session_id: int) -> None:
        super().__init__(f"Unknown session id {session_id}")
        self.session_id = session_id


class NotTypable(LookupError):
    """A person's input cannot go to this command; ``str(e)`` says why, in one line."""


# Call ids of sessions that ended, remembered (at most this many) to tell a person typing
# into one that it has ended rather than that it never was.
ENDED_KEPT = 256


class OutputBuffer:
    """A session's output not yet collected: chunks in order, at most ``limit`` bytes;
    past that, the oldest bytes go (and only as many as needed)."""

    __slots__ = ("limit", "chunks", "total_bytes")

    def __init__(self, limit: int = OUTPUT_MAX_BYTES) -> None:
        self.limit = limit
        self.chunks: collections.deque[bytes] = collections.deque()
        self.total_bytes = 0

    def push_chunk(self, chunk: bytes) -> None:
        if not chunk:
            return
        self.chunks.append(bytes(chunk))
        self.total_bytes += len(chunk)
        excess = self.total_bytes - self.limit
        while excess > 0:
            first = self.chunks[0]
            if len(first) <= excess:
                self.chunks.popleft()
                self.total_bytes -= len(first)
                excess -= len(first)
            else:
                self.chunks[0] = first[excess:]
                self.total_bytes -= excess
                excess = 0

    def snapshot(self) -> list[bytes]:
        return list(self.chunks)

    def drain(self) -> bytes:
        """All of it, leaving it empty."""
        data = b"".join(self.chunks)
        self.chunks.clear()
        self.total_bytes = 0
        return data


def clamp_timeout(requested_ms: int | None) -> tuple[int, str | None]:
    """The seed's rule: the timeout to use, and the warning line for the model when the
    request was above :data:`MAX_TIMEOUT_MS`."""
    if requested_ms is None:
        return DEFAULT_TIMEOUT_MS, None
    if requested_ms > MAX_TIMEOUT_MS:
        warning = (f"Warning: requested timeout {requested_ms}ms exceeds maximum of {MAX_TIMEOUT_MS}ms; "
                   f"clamping to {MAX_TIMEOUT_MS}ms.\n")
        return MAX_TIMEOUT_MS, warning
    return max(0, requested_ms), None


@dataclass(eq=False)
class ExecSession:
    """One long-lived command of an agent session."""

    id: int
    argv: list[str]
    cwd: str
    call_id: str
    """The model's call id of the call that started it: its events carry it."""
    sub_id: str
    """The submission its events go out under: the last call's that used it."""
    sandboxed: bool
    process: InteractiveProcess | None = None
    buffer: OutputBuffer = field(default_factory=OutputBuffer)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    started: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    busy: int = 0
    """Calls using it right now (it is not idle while any does)."""
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    input_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held for each write to its stdin: one writer's input goes in whole."""

    @property
    def exited(self) -> bool:
        return self.process is not None and self.process.done

    @property
    def result(self) -> ExecResult | None:
        return self.process.result if self.process is not None else None

    def touch(self, sub_id: str | None = None) -> None:
        self.last_used = time.monotonic()
        if sub_id:
            self.sub_id = sub_id


@dataclass
class Collected:
    """What one call gathered: the output, and whether (and how) the command ended."""

    output: bytes
    wall_time_s: float
    result: ExecResult | None
    """Set when the command has exited (the session is then gone)."""


class UnifiedExecManager:
    """The long-lived commands of one agent session (see the module docstring)."""

    def __init__(
        self,
        runner: CommandRunner,
        send: Send,
        *,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    ) -> None:
        self.runner = runner
        self.send = send
        self.max_sessions = max_sessions
        self.idle_timeout_s = idle_timeout_s
        self.sessions: dict[int, ExecSession] = {}
        self._next_id = FIRST_SESSION_ID
        self._reaper: asyncio.Task[None] | None = None
        self._closing: set[ExecSession] = set()
        self._ended_calls: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._typing: set[asyncio.Task[None]] = set()
        self.closed = False

    def configure(self, *, max_sessions: int, idle_timeout_s: float) -> None:
        self.max_sessions = max(1, max_sessions)
        self.idle_timeout_s = max(0.0, idle_timeout_s)

    # -- opening ----------------------------------------------------------------------

    async def open(
        self,
        argv: Sequence[str],
        cwd: str,
        sandbox_policy: SandboxPolicy,
        *,
        call_id: str,
        sub_id: str,
        sandboxed: bool,
        tty: wire.Winsize | None = DEFAULT_WINSIZE,
        stdin: bool = True,
        env: Mapping[str, str] | None = None,
        sandbox_cwd: str | None = None,
        env_passthrough: Iterable[str] = (),
        limits: Limits | None = None,
    ) -> tuple[ExecSession, list[str]]:
        """Start ``argv`` as a new session (``exec_command_begin`` first); returns it and
        the notes for the model (a session closed to make room). A command that could not
        start comes back already exited, with the reason in its result's ``error``."""
        if self.closed:
            raise RuntimeError("the session is shut down")
        notes = await self._make_room()
        session = ExecSession(self._allocate_id(), list(argv), cwd, call_id, sub_id, sandboxed)
        session.busy += 1
        self.sessions[session.id] = session
        self.send(sub_id, ExecCommandBeginEvent(call_id, list(argv), cwd))

        def on_output(stream: ExecOutputStream, chunk: bytes) -> None:
            session.buffer.push_chunk(chunk)
            session.changed.set()
            self.send(session.sub_id, ExecCommandOutputDeltaEvent(session.call_id, stream, chunk))

        try:
            session.process = await self.runner.start_interactive(
                argv, cwd, sandbox_policy, on_output, tty=tty, stdin=stdin,
                on_exit=lambda result: self._on_exit(session, result), env=env, sandbox_cwd=sandbox_cwd,
                env_passthrough=env_passthrough, limits=limits,
            )
        except BaseException:
            # Cancelled (an interrupt) before it started: the runner cancelled it.
            self.sessions.pop(session.id, None)
            self._end_event(session, ExecResult(aborted=True))
            raise
        finally:
            session.busy -= 1
        session.touch()
        self._ensure_reaper()
        return session, notes

    def _allocate_id(self) -> int:
        session_id = self._next_id
        self._next_id += 1
        return session_id

    async def _make_room(self) -> list[str]:
        notes = []
        # Exited ones the model has not polled since are gone first, without a note.
        while len(self.sessions) >= self.max_sessions:
            exited = [s for s in self.sessions.values() if s.exited and not s.busy]
            if exited:
                for s in exited:
                    self.sessions.pop(s.id, None)
                continue
            idle = [s for s in self.sessions.values() if not s.busy]
            if not idle:
                break  # every one is in use by a call right now: over the cap for a moment
            oldest = min(idle, key=lambda s: s.last_used)
            notes.append(f"Note: closed session {oldest.id} ({_command_text(oldest.argv)}), the one idle longest: "
                         f"at most {self.max_sessions} sessions run at once.")
            await self.close(oldest.id, wait=False)
        return notes

    # -- using ------------------------------------------------------------------------

    def get(self, session_id: int) -> ExecSession:
        """The live session ``session_id``; :class:`UnknownSessionId` if there is none."""
        session = self.sessions.get(session_id)
        if session is None:
            raise UnknownSessionId(session_id)
        return session

    async def write(self, session: ExecSession, data: bytes, sub_id: str | None = None) -> bool:
        """Write ``data`` to the session's stdin; False if it has ended."""
        session.touch(sub_id)
        if not data:
            return not session.exited
        assert session.process is not None
        session.busy += 1
        try:
            async with session.input_lock:
                return await session.process.write(data)
        finally:
            session.busy -= 1
            session.touch()

    def typing_target(self, call_id: str) -> ExecSession:
        """The live session whose events carry ``call_id``, for a person to type into;
        :class:`NotTypable` saying why when there is none or it takes no input."""
        session = next((s for s in self.sessions.values() if s.call_id == call_id), None)
        if session is None or session.exited:
            if session is not None or call_id in self._ended_calls:
                raise NotTypable(f"command {call_id} has ended; nothing was typed")
            raise NotTypable(f"no interactive command of this session has call id {call_id!r}; "
                             "only running exec_command / unified_exec sessions take input")
        if session.process is None:
            raise NotTypable(f"command {call_id} is still starting; nothing was typed")
        if not session.process.tty:
            raise NotTypable(f"command {call_id} has no stdin to type into (it runs without a terminal)")
        return session

    def type(self, session: ExecSession, data: bytes, on_lost: Callable[[], None]) -> None:
        """Write a person's ``data`` to the session's stdin, after the input typed before it,
        without waiting; ``on_lost()`` if the command ends before all of it is written."""
        async def write() -> None:
            if not await self.write(session, data):
                on_lost()

        # Tasks start in the order made and the lock queues them in that order: input
        # typed in two ops goes in in the order typed.
        task = asyncio.get_running_loop().create_task(write(), name=f"type-{session.call_id}")
        self._typing.add(task)
        task.add_done_callback(self._typing.discard)

    async def collect(self, session: ExecSession, timeout_s: float, sub_id: str | None = None) -> Collected:
        """The output the session prints within ``timeout_s`` (less if it exits), taken out
        of its buffer. A session seen to have exited is forgotten here."""
        session.touch(sub_id)
        session.busy += 1
        started = time.monotonic()
        deadline = started + max(0.0, timeout_s)
        collected = bytearray()
        try:
            while True:
                session.changed.clear()
                collected += session.buffer.drain()
                if session.exited:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(session.changed.wait(), remaining)
        finally:
            session.busy -= 1
            session.touch()
        result = session.result if session.exited else None
        if result is not None and self.sessions.get(session.id) is session:
            del self.sessions[session.id]
        return Collected(bytes(collected), time.monotonic() - started, result)

    def resize(self, session: ExecSession, rows: int, cols: int) -> None:
        if session.process is not None:
            session.process.resize(rows, cols)

    # -- ending -----------------------------------------------------------------------

    def _on_exit(self, session: ExecSession, result: ExecResult) -> None:
        session.changed.set()
        session.ended.set()
        self._ended_calls[session.call_id] = None
        while len(self._ended_calls) > ENDED_KEPT:
            self._ended_calls.popitem(last=False)
        self._closing.discard(session)
        self._end_event(session, result)

    def _end_event(self, session: ExecSession, result: ExecResult) -> None:
        aggregated = result.aggregated.decode("utf-8", errors="replace")
        stdout = result.stdout.decode("utf-8", errors="replace")
        stderr = result.stderr.decode("utf-8", errors="replace")
        if result.error and result.error not in stderr:
            stderr = f"{stderr}{result.error}\n"
            aggregated = f"{aggregated}{result.error}\n"
        aggregated = cap_stream_output(aggregated)  # the deltas carried every byte
        self.send(session.sub_id, ExecCommandEndEvent(
            call_id=session.call_id, stdout=cap_stream_output(stdout), stderr=cap_stream_output(stderr),
            aggregated_output=aggregated,
            exit_code=result.returncode, duration=Duration.from_seconds(time.monotonic() - session.started),
            formatted_output=aggregated,
        ))

    async def close(self, session_id: int, *, wait: bool = True) -> None:
        """Kill the session's tree and forget it (waiting, bounded, for the kill if ``wait``)."""
        session = self.sessions.pop(session_id, None)
        if session is None or session.process is None:
            return
        if not session.exited:
            # Kept until its exit comes, so close_all can still wait for it.
            self._closing.add(session)
            await session.process.cancel()
            if wait:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(session.ended.wait(), CLOSE_GRACE_S)

    async def close_all(self) -> None:
        """Kill every session (the agent session is going away) and wait, bounded, until
        each one's tree is reported dead. Nothing can be opened afterwards."""
        self.closed = True
        for task in list(self._typing):
            task.cancel()
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        sessions = list(self.sessions.values()) + list(self._closing)
        self.sessions.clear()
        for session in sessions:
            if session.process is not None and not session.exited:
                await session.process.cancel()
        waits = [asyncio.ensure_future(s.ended.wait()) for s in sessions if s.process is not None and not s.exited]
        if waits:
            _, pending = await asyncio.wait(waits, timeout=CLOSE_GRACE_S)
            for w in pending:
                w.cancel()
            if pending:
                log.warning("sessions not reported dead in time", count=len(pending))
        self._closing.clear()

    # -- idle reaping -----------------------------------------------------------------

    def _ensure_reaper(self) -> None:
        if self.idle_timeout_s <= 0 or self.closed:
            return
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._reap(), name="unified-exec-reaper")

    async def _reap(self) -> None:
        while self.sessions and self.idle_timeout_s > 0:
            interval = min(max(self.idle_timeout_s / 4, 0.05), 30.0)
            await asyncio.sleep(interval)
            now = time.monotonic()
            for session in list(self.sessions.values()):
                if not session.busy and now - session.last_used >= self.idle_timeout_s:
                    log.info("idle session reaped", id=session.id, idle_s=round(now - session.last_used, 1))
                    await self.close(session.id, wait=False)


def session_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """A session command's environment: ``env`` (None: the agent's own) with :data:`SESSION_ENV`."""
    return {**(os.environ if env is None else env), **SESSION_ENV}


def _command_text(argv: Sequence[str], limit: int = 60) -> str:
    text = " ".join(argv)
    return text if len(text) <= limit else text[: limit - 1] + "…"
