"""A client of one MCP server: JSON-RPC 2.0 over a byte stream, newline-delimited.

The server is an untrusted program (it runs in the sandbox, see :mod:`agent.mcp.manager`),
so everything it sends is checked: a line that is not JSON, is not an object, answers no
request of ours, or is over :data:`~broker.wire.mcp.MAX_LINE_BYTES` is dropped with a
throttled log line, never an exception in the caller. After :data:`MAX_BAD_LINES` such
lines in a row, or a line that runs on past :data:`ENDLESS_LINE_BYTES`, the server is
taken for one that makes no sense: the client closes (every request fails with one line
naming the server and why) and :attr:`McpClient.on_fault` is told, so that the server is
stopped. What the client needs from the stream is a :class:`Transport`; the bytes the
server writes are given to :meth:`McpClient.feed` and its end to :meth:`McpClient.closed`.

What a server's output may cost: the agent's one event loop serves every session, so a
server's lines are not read where they arrive (:meth:`McpClient.feed` only keeps them)
but by a reader that takes at most :data:`SLICE_S` of the loop at a time and
:data:`BUDGET_S` in any second, then yields. While more than :data:`BACKLOG_BYTES` of
whole lines wait, the server's output is held (:meth:`Transport.hold_output`: the
executor stops reading its pipe after at most a window more, and the server waits to
write), so what one server holds in the agent stays under about 25 MiB whatever it
sends, and the request timeouts fire whatever it does.

The protocol as the client speaks it (MCP, https://modelcontextprotocol.io):

- :meth:`McpClient.initialize`: ``initialize`` with our latest protocol version, our
  capabilities (``roots``) and name; the server answers with the version it speaks, which
  must be one of :data:`PROTOCOL_VERSIONS`; then the ``notifications/initialized``
  notification.
- :meth:`McpClient.list_tools`: ``tools/list``, following ``nextCursor`` pages.
- :meth:`McpClient.call_tool`: ``tools/call``; on a timeout or when the caller is
  cancelled the server is told ``notifications/cancelled`` for that request.
- Requests from the server: ``ping`` is answered, ``roots/list`` gives the roots the
  manager set; anything else gets "method not found". Its notifications are logged.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import structlog

from broker.net.logging import Throttle
from broker.wire.mcp import MAX_LINE_BYTES, METHOD_NOT_FOUND, PROTOCOL_VERSIONS

log = structlog.get_logger("agent.mcp")

# tools/list pages followed, at most (a server that pages forever is cut off).
MAX_PAGES = 100
# Bad lines in a row (no good message between them) after which the server is stopped.
MAX_BAD_LINES = 100
# A line over the limit is dropped up to its end; one that runs on past this is no
# line but a stream of junk, and the server is stopped.
ENDLESS_LINE_BYTES = 4 * MAX_LINE_BYTES
# A server's lines are read for at most this long at a time (seconds), and at most
# BUDGET_S in any second, so other sessions wait for it at most that long.
SLICE_S = 0.002
BUDGET_S = 0.25
# Whole lines waiting to be read past which the server's output is held.
BACKLOG_BYTES = 1024 * 1024
CLIENT_INFO = {"name": "sluice", "version": "0.1.0"}


class McpError(Exception):
    """A request that failed: the server's error, a timeout, or the server gone; one line."""


class Transport(Protocol):
    """How bytes reach the server's stdin, and how its output is held back."""

    async def write(self, data: bytes) -> None:
        """Send ``data`` (in order); raises :class:`McpError` when the server is gone."""

    def hold_output(self, held: bool) -> None:
        """Stop (``True``) or restart (``False``) the flow of the server's output."""


class McpClient:
    """One connection to one server (see the module docstring)."""

    def __init__(self, name: str, transport: Transport, *, roots: list[str] = ()) -> None:
        self.name = name
        self.transport = transport
        self.roots = list(roots)
        self.server_info: dict[str, Any] = {}
        self.protocol_version: str | None = None
        self.instructions: str | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        # What the server wrote and was not read yet: whole lines (the first
        # ``_lines_end`` bytes), then the start of the next one.
        self._buffer = bytearray()
        self._lines_end = 0
        # Inside a line over the limit: what comes is dropped up to its end.
        self._skipping = False
        self._skipped = 0
        self._bad_in_a_row = 0
        self._reading: asyncio.Handle | asyncio.TimerHandle | None = None
        self._second_start = 0.0
        self._second_spent = 0.0
        self._held = False
        self._gone: str | None = None
        self._throttle = Throttle(log)
        # Called with (method, params) for each notification from the server.
        self.on_notification: Callable[[str, Any], None] | None = None
        # Called with why (the rest of "MCP server NAME ...") when the client gives up on
        # a server that makes no sense; it is closed by then, and should be stopped.
        self.on_fault: Callable[[str], None] | None = None
        self._writes: asyncio.Lock | None = None
        # Our answers to the server's own requests (ping, roots/list) while they are sent.
        self._answering: set[asyncio.Future] = set()

    def attach(self, transport: Transport) -> None:
        """Speak to the server through ``transport`` from now on (its output held if it must be)."""
        self.transport = transport
        if self._held:
            self._hold(True)

    # -- what the server sends -----------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Bytes the server wrote to its stdout: kept, and read soon (see the module docstring)."""
        if self._gone is not None:
            return
        if self._skipping:
            end = data.find(b"\n")
            if end < 0:
                self._skipped += len(data)
                if self._skipped > ENDLESS_LINE_BYTES:
                    self._fault(f"sent a line that does not end (over {ENDLESS_LINE_BYTES >> 20} MiB)")
                return
            self._skipping = False
            data = data[end + 1:]
        start = len(self._buffer)
        self._buffer += data
        last = data.rfind(b"\n")
        if last >= 0:
            self._lines_end = start + last + 1
        if len(self._buffer) - self._lines_end > MAX_LINE_BYTES:
            self._skipped = len(self._buffer) - self._lines_end
            del self._buffer[self._lines_end:]
            self._skipping = True
            self._bad_line(f"a line over {MAX_LINE_BYTES >> 20} MiB", b"")
            if self._gone is not None:
                return
        if self._lines_end:
            if self._reading is None:
                self._reading = asyncio.get_running_loop().call_soon(self._read)
            if self._lines_end > BACKLOG_BYTES and not self._held:
                self._hold(True)

    def _read(self) -> None:
        """Read waiting lines within the budget; called again (soon, or in the next second)
        while lines wait."""
        self._reading = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now - self._second_start >= 1.0:
            self._second_start, self._second_spent = now, 0.0
        if self._second_spent >= BUDGET_S:
            self._reading = loop.call_at(self._second_start + 1.0, self._read)
            return
        started = time.perf_counter()
        buffer, pos = self._buffer, 0
        while pos < self._lines_end and self._gone is None:
            end = buffer.index(b"\n", pos, self._lines_end)
            line = bytes(buffer[pos:end])
            pos = end + 1
            if line.strip():
                self._on_line(line)
            if time.perf_counter() - started >= SLICE_S:
                break
        self._second_spent += time.perf_counter() - started
        if self._gone is not None:
            return
        del buffer[:pos]
        self._lines_end -= pos
        if self._lines_end:
            self._reading = loop.call_soon(self._read)
        if self._held and self._lines_end <= BACKLOG_BYTES // 2:
            self._hold(False)

    def _hold(self, held: bool) -> None:
        self._held = held
        try:
            self.transport.hold_output(held)
        except McpError:
            pass

    def closed(self, why: str) -> None:
        """The server is gone (it exited, or makes no sense): every request fails with ``why``."""
        if self._gone is not None:
            return
        self._gone = why
        self._buffer = bytearray()
        self._lines_end = 0
        if self._reading is not None:
            self._reading.cancel()
            self._reading = None
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(McpError(f"MCP server {self.name} {why}"))

    def _bad_line(self, what: str, line: bytes) -> None:
        """A line that is no MCP message: logged (throttled) and counted."""
        self._bad_in_a_row += 1
        self._throttle("warning", f"MCP server sent {what}", server=self.name,
                       line=line[:200].decode(errors="replace"))
        if self._bad_in_a_row >= MAX_BAD_LINES:
            self._fault(f"sent {MAX_BAD_LINES} lines in a row that are not MCP messages (the last: {what})")

    def _fault(self, what: str) -> None:
        """Give up on the server: closed, with one line saying why, and :attr:`on_fault` told."""
        why = f"{what}; it was stopped"
        log.error("MCP server makes no sense: stopped", server=self.name, why=why)
        self.closed(why)
        if self.on_fault is not None:
            self.on_fault(why)

    @property
    def gone(self) -> str | None:
        """Why the server is gone (None while it is there)."""
        return self._gone

    def _on_line(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            self._bad_line("a line that is not JSON", line)
            return
        if isinstance(message, list):  # a batch (2025-03-26 allows them)
            for item in message[:1000]:
                self._on_message(item, line)
        else:
            self._on_message(message, line)

    def _on_message(self, message: Any, line: bytes) -> None:
        if not isinstance(message, dict):
            self._bad_line("a message that is not an object", line)
            return
        method = message.get("method")
        if isinstance(method, str):
            self._bad_in_a_row = 0
            if "id" in message:
                self._spawn(self._answer(message["id"], method, message.get("params")))
            elif self.on_notification is not None:
                self.on_notification(method, message.get("params"))
            return
        future = self._pending.pop(message.get("id"), None) if _is_id(message.get("id")) else None
        if future is None:
            self._bad_line("an answer to no request of ours", line)
            return
        self._bad_in_a_row = 0
        if future.done():
            return
        error = message.get("error")
        if error is not None:
            future.set_exception(McpError(_error_text(error)))
        else:
            future.set_result(message.get("result"))

    async def _answer(self, request_id: Any, method: str, params: Any) -> None:
        if method == "ping":
            reply: dict[str, Any] = {"result": {}}
        elif method == "roots/list":
            reply = {"result": {"roots": [{"uri": "file://" + root, "name": root} for root in self.roots]}}
        else:
            reply = {"error": {"code": METHOD_NOT_FOUND, "message": f"method not found: {method}"}}
        try:
            await self._send({"jsonrpc": "2.0", "id": request_id, **reply})
        except McpError:
            pass

    def _spawn(self, coro: Awaitable) -> None:
        # Held until done: the loop keeps only a weak reference to a task.
        task = asyncio.ensure_future(coro)
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    # -- what we send --------------------------------------------------------------------

    async def _send(self, message: dict) -> None:
        if self._gone is not None:
            raise McpError(f"MCP server {self.name} {self._gone}")
        if self._writes is None:
            self._writes = asyncio.Lock()
        data = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        async with self._writes:
            await self.transport.write(data)

    async def notify(self, method: str, params: dict | None = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        await self._send(message)

    async def request(self, method: str, params: dict | None = None, *, timeout: float | None = None) -> Any:
        """The result of ``method``; raises :class:`McpError` (an error answer, the server
        gone, or ``timeout`` seconds passed: the server is then told the request is cancelled,
        as it is when the caller is cancelled)."""
        request_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        try:
            await self._send(message)
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except asyncio.TimeoutError:
            await self._cancel(request_id, "timed out")
            raise McpError(f"MCP server {self.name} did not answer {method} within {timeout:g} s") from None
        except asyncio.CancelledError:
            await asyncio.shield(self._cancel(request_id, "cancelled by the user"))
            raise
        finally:
            self._pending.pop(request_id, None)

    async def _cancel(self, request_id: int, reason: str) -> None:
        if self._pending.pop(request_id, None) is None or self._gone is not None:
            return
        try:
            await self.notify("notifications/cancelled", {"requestId": request_id, "reason": reason})
        except McpError:
            pass

    # -- the protocol --------------------------------------------------------------------

    async def initialize(self, timeout: float) -> None:
        """The handshake; raises :class:`McpError` (one line) when it fails."""
        capabilities: dict[str, Any] = {"roots": {"listChanged": False}} if self.roots else {}
        result = await self.request("initialize", {
            "protocolVersion": PROTOCOL_VERSIONS[0],
            "capabilities": capabilities,
            "clientInfo": CLIENT_INFO,
        }, timeout=timeout)
        if not isinstance(result, dict):
            raise McpError(f"MCP server {self.name} answered initialize with {type(result).__name__}, not an object")
        version = result.get("protocolVersion")
        if version not in PROTOCOL_VERSIONS:
            raise McpError(f"MCP server {self.name} speaks protocol version {version!r}; sluice speaks "
                           f"{', '.join(PROTOCOL_VERSIONS)}")
        self.protocol_version = version
        info = result.get("serverInfo")
        self.server_info = info if isinstance(info, dict) else {}
        instructions = result.get("instructions")
        self.instructions = instructions if isinstance(instructions, str) else None
        await self.notify("notifications/initialized")

    async def list_tools(self, timeout: float) -> list[dict]:
        """Every tool the server offers (following its pages), as it describes them."""
        tools: list[dict] = []
        cursor = None
        for _ in range(MAX_PAGES):
            result = await self.request("tools/list", {"cursor": cursor} if cursor else {}, timeout=timeout)
            if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
                raise McpError(f"MCP server {self.name} answered tools/list without a list of tools")
            tools += [tool for tool in result["tools"] if isinstance(tool, dict)]
            cursor = result.get("nextCursor")
            if not cursor or not isinstance(cursor, str):
                return tools
        log.warning("MCP server pages its tools without end; the first pages are used", server=self.name,
                    pages=MAX_PAGES)
        return tools

    async def call_tool(self, tool: str, arguments: Any, timeout: float | None) -> dict:
        """The result of ``tools/call`` (``content``, ``structuredContent``, ``isError``)."""
        result = await self.request("tools/call", {"name": tool, "arguments": arguments if arguments is not None else {}},
                                    timeout=timeout)
        if not isinstance(result, dict):
            raise McpError(f"MCP server {self.name} answered tools/call with {type(result).__name__}, not an object")
        return result


def _is_id(value: Any) -> bool:
    return isinstance(value, (int, str)) and not isinstance(value, bool)


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        message = error.get("message")
        code = error.get("code")
        text = message if isinstance(message, str) and message else "unknown error"
        return f"{text} (code {code})" if isinstance(code, int) else text
    return str(error)[:500]
