"""The MCP servers of one agent session: started together, their tools offered, calls routed.

:meth:`McpManager.start` starts every configured server at once through a
:data:`Launcher` (the session's: a long-lived sandboxed process in an executor, speaking
over its stdin and stdout), runs the MCP handshake and lists the tools, each server within
its ``startup_timeout_sec`` counted from its process's start, as Codex counts it from the
spawn: reaching an executor and setting up the sandbox (slow under load) are the launch's,
bounded apart by :data:`LAUNCH_TIMEOUT_S`. A server that fails is reported (one line
each, returned for the session to send as ``error`` events) and the session goes on
without it.

:meth:`McpManager.call` runs one tool call with the server's ``tool_timeout_sec``; a server
that crashed or stopped answering fails that call with a clear error, and is started again
for the next call (its tools keep the names they were offered under). Cancelling the
awaiting task cancels the call (the server is told ``notifications/cancelled``).
:meth:`McpManager.aclose` stops every server. A server's stderr goes to the log, at most
:data:`STDERR_LOG_BYTES` of it per start.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from agent.mcp.client import McpClient, McpError
from agent.mcp.tools import McpTool, declaration, error_for_model, offered_tools, result_for_model
from broker.wire.protocol import McpServerConfig

log = structlog.get_logger("agent.mcp")

STDERR_LOG_BYTES = 64 * 1024
# Launching a server (an executor taking it, its sandbox set up, its process started) may
# take this long, apart from its start-up budget: only a launch that is stuck ends here.
LAUNCH_TIMEOUT_S = 60.0
# Closing a session: how long a server has, its stdin closed, to exit by itself (what it
# was sent last, a cancellation, read) before it is killed.
CLOSE_GRACE_S = 1.0


class Process(Protocol):
    """A running server as the launcher gives it."""

    async def write(self, data: bytes) -> None:
        """To its stdin; raises McpError once it is gone."""

    async def stop(self, grace_s: float = 0.0) -> None:
        """End it (its whole process tree); returns once it is gone. With ``grace_s``, as
        the MCP spec has a client shut a stdio server down: its stdin closed first, so it
        reads what it was sent (a cancellation) and may exit by itself, and killed only if
        it is still there ``grace_s`` later."""

    def hold_output(self, held: bool) -> None:
        """Stop (``True``) or restart (``False``) the flow of its output."""


@dataclass
class Streams:
    """Where a launched server's output goes."""

    stdout: Callable[[bytes], None]
    stderr: Callable[[bytes], None]
    exited: Callable[[str], None]


# (server, where its output goes) -> the running process, returned once it has started;
# raises McpError (one line).
Launcher = Callable[[McpServerConfig, Streams], Awaitable[Process]]


@dataclass
class CallOutcome:
    """A tool call's end: what the model is told (text, or function output items), and the
    event's ``success`` and ``result`` (None: the call got none, ``why`` says why)."""

    output: str | list[dict[str, Any]]
    success: bool
    result: dict[str, Any] | None
    duration_s: float
    why: str | None = None


class _Server:
    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self.client: McpClient | None = None
        self.process: Process | None = None
        self.stderr_left = STDERR_LOG_BYTES
        self.starting: asyncio.Task | None = None


class McpManager:
    def __init__(self, servers: list[McpServerConfig], launcher: Launcher, *, roots: list[str] = ()) -> None:
        self._servers = {s.name: _Server(s) for s in servers}
        self._launcher = launcher
        self._roots = list(roots)
        self.tools: dict[str, McpTool] = {}
        # Tools left out at start (a schema that cannot be offered, a name taken), one line each.
        self.notes: list[str] = []
        self._closed = False
        self._stopping: set[asyncio.Task] = set()

    @property
    def servers(self) -> list[McpServerConfig]:
        return [s.config for s in self._servers.values()]

    async def start(self) -> list[str]:
        """Start every server at once; the errors, one line each (the servers that failed
        are left out, and their tools are not offered)."""
        names = list(self._servers)
        outcomes = await asyncio.gather(*(self._start(self._servers[n]) for n in names), return_exceptions=True)
        errors = []
        taken: set[str] = set()
        for name, outcome in zip(names, outcomes):
            if isinstance(outcome, BaseException):
                if isinstance(outcome, asyncio.CancelledError):
                    raise outcome
                why = str(outcome) if isinstance(outcome, McpError) else f"MCP server {name}: {outcome!r}"
                errors.append(f"MCP client for `{name}` failed to start: {why}")
                await self._stop(self._servers[name])
                continue
            offered, notes = offered_tools(name, outcome, taken)
            for note in notes:
                log.warning(note)
            self.notes += notes
            for tool in offered:
                self.tools[tool.qualified] = tool
        return errors

    def declarations(self) -> list[dict[str, Any]]:
        return [declaration(tool) for tool in self.tools.values()]

    async def call(self, qualified: str, arguments: Any) -> CallOutcome:
        """Call the tool offered as ``qualified`` (one of :attr:`tools`)."""
        tool = self.tools[qualified]
        server = self._servers[tool.server]
        started = time.monotonic()
        try:
            try:
                client = await self._ready(server)
            except McpError:
                raise
            except Exception as err:  # a launcher's own failure: this call fails, not the turn
                raise McpError(f"MCP server {tool.server} could not be started again: {err}") from None
            result = await client.call_tool(tool.name, arguments, server.config.tool_timeout_s)
        except McpError as err:
            # A timeout leaves the server running (told the call is cancelled), as Codex does.
            return CallOutcome(error_for_model(str(err)), False, None, time.monotonic() - started, why=str(err))
        output, success = result_for_model(result)
        return CallOutcome(output, success, result, time.monotonic() - started)

    async def aclose(self) -> None:
        self._closed = True
        await asyncio.gather(*(self._stop(s, grace_s=CLOSE_GRACE_S) for s in self._servers.values()),
                             return_exceptions=True)

    # -- one server ----------------------------------------------------------------------

    async def _ready(self, server: _Server) -> McpClient:
        """The server's client, starting it again if it is gone."""
        if server.client is not None and server.client.gone is None:
            return server.client
        if self._closed:
            raise McpError(f"MCP server {server.config.name} is stopped: the session is shutting down")
        log.info("restarting MCP server", server=server.config.name,
                 why=server.client.gone if server.client is not None else None)
        await self._stop(server)
        await self._start(server)
        return server.client

    async def _start(self, server: _Server) -> list[dict]:
        config = server.config
        server.stderr_left = STDERR_LOG_BYTES
        client = McpClient(config.name, _Unstarted(), roots=self._roots)
        client.on_notification = lambda method, params: log.debug("MCP notification", server=config.name,
                                                                  method=method)
        client.on_fault = lambda why: self._fault(server, client)
        streams = Streams(client.feed, lambda data: self._stderr(server, data),
                          lambda why: client.closed(why))
        server.client = client
        try:
            process = await asyncio.wait_for(self._launcher(config, streams), LAUNCH_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise McpError(f"MCP server {config.name} could not be launched within {LAUNCH_TIMEOUT_S:g} s") from None
        # The budget is the server's own: from its process's start.
        timeout = config.startup_timeout_s
        deadline = time.monotonic() + timeout
        server.process = process
        client.attach(process)
        if client.gone is not None:  # it made no sense before it was even started
            await self._stop(server)
            raise McpError(f"MCP server {config.name} {client.gone}")
        left = max(0.0, deadline - time.monotonic())
        try:
            await client.initialize(left)
            return await client.list_tools(max(0.001, deadline - time.monotonic()))
        except McpError as err:
            if "did not answer" in str(err):
                raise McpError(f"MCP server {config.name} did not finish starting within {timeout:g} s") from None
            raise

    def _fault(self, server: _Server, client: McpClient) -> None:
        """``client`` gave up on its server: stop the server now, not at the next call."""
        if server.client is not client or server.process is None:
            return  # not started yet (_start stops it) or stopped already
        task = asyncio.get_running_loop().create_task(self._stop(server))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def _stderr(self, server: _Server, data: bytes) -> None:
        if server.stderr_left <= 0:
            return
        text = data[:server.stderr_left].decode(errors="replace")
        server.stderr_left -= len(data)
        for line in text.splitlines():
            if line.strip():
                log.info("MCP server stderr", server=server.config.name, line=line[:1000])
        if server.stderr_left <= 0:
            log.info("MCP server stderr: the rest of it is not logged", server=server.config.name,
                     limit=STDERR_LOG_BYTES)

    async def _stop(self, server: _Server, grace_s: float = 0.0) -> None:
        """Stop ``server``: at once (it misbehaved), or, closing the session, with
        ``grace_s`` to read its stdin to the end and exit."""
        process, server.process = server.process, None
        if server.client is not None:
            server.client.closed("was stopped")
        if process is not None:
            try:
                await process.stop(grace_s)
            except Exception as err:  # noqa: BLE001 - stopping must never fail the caller
                log.warning("stopping an MCP server failed", server=server.config.name, error=str(err))


class _Unstarted:
    async def write(self, data: bytes) -> None:
        raise McpError("not started yet")

    def hold_output(self, held: bool) -> None:
        pass  # McpClient.attach applies it once there is a process
