"""The protocol of ``sluice mcp``: JSON-RPC 2.0 over stdio, one message per line, and the
loop that serves it (see :mod:`broker.cli.mcp`)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import threading
import time

import broker.client as C
from broker.cli.base import print_error, write_all
from broker.cli.mcp.tools import (
    DEFAULT_TIMEOUT_S,
    DEFAULT_YIELD_MS,
    MAX_SESSIONS,
    MAX_TIMEOUT_S,
    MAX_YIELD_MS,
    STRUCTURED_SINCE,
    TOOL_NAMES,
    Policy,
    Run,
    Session,
    ToolError,
    argv_of,
    not_run,
    number_arg,
    tool_result,
    tools_for,
)
from broker.net.signals import caught_signals
from broker.wire.mcp import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    MAX_LINE_BYTES,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    PROTOCOL_VERSIONS,
)
from broker.wire.results import EXIT_OK

SERVER_NAME = "sluice"
SERVER_VERSION = "0.1.0"
# session_write/read return early once output came and then none for this long.
QUIET_S = 0.2
# At the end: how long cancelled commands get to die before we exit anyway.
SHUTDOWN_WAIT_S = 5.0


class Batch:
    """A JSON-RPC batch (an array of messages on one line): its responses go out together,
    as one array, once every request in it that gets a response has one."""

    def __init__(self) -> None:
        self.responses: list[dict] = []
        self.pending: set = set()  # keys of its requests still unanswered
        self.open = True  # still being dispatched


class ProtocolError(Exception):
    """A request we answer with a JSON-RPC error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


# -- the server -------------------------------------------------------------------------


class Server:
    def __init__(self, policy: Policy, rfd: int = 0, wfd: int = 1) -> None:
        self.policy = policy
        self.rfd = rfd
        self.wfd = wfd
        self.write_lock = threading.Lock()
        self.version = PROTOCOL_VERSIONS[0]
        self.client = None
        self.connector: threading.Thread | None = None
        self.connected = None  # (client, error) from the connector thread
        self.waiting: list = []  # Runs and Sessions to submit once connected
        self.runs: dict = {}  # request key -> Run
        self.sessions: dict[str, Session] = {}
        self.batch_of: dict = {}  # request key -> the Batch it came in
        self.current_batch: Batch | None = None  # the one being dispatched
        self.inbuf = bytearray()
        self.skipping = False  # inside an over-long line
        self.eof = False
        self.stop_signal = None
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    # -- output -------------------------------------------------------------------------

    def send(self, message: dict | list) -> None:
        """The one writer of stdout."""
        line = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace") + b"\n"
        with self.write_lock:
            try:
                write_all(self.wfd, line)
            except OSError:
                self.eof = True  # nobody reads us any more: wind down

    def reply(self, req_id, result: dict) -> None:
        self.respond({"jsonrpc": "2.0", "id": req_id, "result": result})

    def error(self, req_id, code: int, message: str) -> None:
        self.respond({"jsonrpc": "2.0", "id": req_id, "error": {"code": code, "message": message}})

    def respond(self, message: dict) -> None:
        """A response goes out now, or with the rest of its batch."""
        req_id = message["id"]
        batch = self.batch_of.pop(_key(req_id), None) if req_id is not None else self.current_batch
        if batch is None:
            self.send(message)
            return
        batch.responses.append(message)
        batch.pending.discard(_key(req_id))
        self.flush(batch)

    def forget(self, req_id) -> None:
        """``req_id`` gets no response (it was cancelled): its batch waits for it no more."""
        batch = self.batch_of.pop(_key(req_id), None)
        if batch is not None:
            batch.pending.discard(_key(req_id))
            self.flush(batch)

    def flush(self, batch: Batch) -> None:
        if batch.open or batch.pending:
            return
        responses, batch.responses = batch.responses, []
        if responses:  # a batch of notifications only gets nothing
            self.send(responses)

    def log(self, message: str) -> None:
        print_error(f"mcp: {message}")

    @property
    def structured(self) -> bool:
        return self.version >= STRUCTURED_SINCE

    # -- the loop -----------------------------------------------------------------------

    def serve(self) -> int:
        def on_signal(signum, frame):
            self.stop_signal = signum

        with caught_signals(on_signal, wake_w=self.wake_w):
            while not self.eof and self.stop_signal is None:
                self.step(self.timeout())
            self.shutdown()
        return EXIT_OK

    def step(self, timeout: float | None) -> None:
        fds = (self.rfd, self.wake_r)
        ready: set[int] = set()
        if self.client is not None:
            try:
                ready.update(self.client.wait_io(fds, timeout))
            except C.DaemonError as e:
                self.lost_daemon(str(e))
        else:
            with contextlib.suppress(InterruptedError):
                ready.update(select.select(fds, [], [], timeout)[0])
        # The client returns early when the daemon had something: look at stdin anyway.
        with contextlib.suppress(InterruptedError):
            ready.update(select.select(fds, [], [], 0)[0])
        if self.wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(self.wake_r, 512):
                    pass
            self.adopt_client()
        if self.rfd in ready:
            self.read_input()
        self.tick()

    def timeout(self) -> float | None:
        now = time.monotonic()
        due = []
        for run in self.runs.values():
            t = run.progress_due(now)
            if t is not None:
                due.append(t)
        for s in self.sessions.values():
            if s.waiter is not None:
                due.append(s.waiter[2])
                if s.total > s.waiter[4]:
                    due.append(s.last_output + QUIET_S)
        if not due:
            return None
        return max(0.0, min(due) - now)

    def tick(self) -> None:
        now = time.monotonic()
        for key, run in list(self.runs.items()):
            if run.call is not None and run.call.done:
                del self.runs[key]
                self.finish_run(run)
            elif run.progress_due(now) is not None and run.progress_due(now) <= now:
                self.send({"jsonrpc": "2.0", "method": "notifications/progress", "params": run.take_progress(now)})
        for s in list(self.sessions.values()):
            if s.stdin and self.client is not None and s.call is not None and not s.ended:
                try:
                    n = self.client.write_stdin(s.call, s.stdin)
                except (C.DaemonError, C.UsageError):
                    n = len(s.stdin)
                del s.stdin[:n]
            if (s.eof_wanted and not s.stdin and self.client is not None and s.call is not None and s.call.started
                    and not s.ended):
                with contextlib.suppress(C.DaemonError):
                    self.client.close_stdin(s.call)
                s.eof_wanted = False
            if s.waiter is None and s.closing and s.ended:
                self.sessions.pop(s.sid, None)
            if s.waiter is not None:
                req_id, tool, deadline, _, total_then = s.waiter
                quiet = s.total > total_then and now >= s.last_output + QUIET_S and tool != "session_close"
                if s.ended or now >= deadline or quiet:
                    s.waiter = None
                    self.answer_session(req_id, s)

    def answer_session(self, req_id, s: Session) -> None:
        if s.ended and s.call is None and s.failure is not None and s.total == 0:
            self.sessions.pop(s.sid, None)
            self.reply(req_id, tool_result(f"session {s.sid}: {s.failure}", None, False, error=True))
            return
        if s.ended and s.call is not None and s.total == 0:
            r = s.call.result
            if r is not None and r.error is not None:
                self.sessions.pop(s.sid, None)
                self.reply(req_id, tool_result(not_run(r, s.argv), None, False, error=True))
                return
        result = s.take(self.structured)
        if s.ended and (s.closing or not s.unread()):
            self.sessions.pop(s.sid, None)
        self.reply(req_id, result)

    def finish_run(self, run: Run) -> None:
        call = run.call
        if call.failure is not None:
            self.reply(run.req_id, tool_result(f"lost the sluice daemon: {call.failure}", None, False, error=True))
            return
        if run.cancelled:
            self.forget(run.req_id)  # cancelled by the client: no response (the spec's rule)
            return
        if run.token is not None and run.pending:
            self.send({"jsonrpc": "2.0", "method": "notifications/progress",
                       "params": run.take_progress(time.monotonic())})
        try:
            self.reply(run.req_id, run.outcome(self.structured))
        except ToolError as e:
            self.reply(run.req_id, tool_result(str(e), None, False, error=True))

    # -- the daemon ---------------------------------------------------------------------

    def with_client(self, item) -> None:
        """Submit ``item`` (a Run or a Session) now, or once connected."""
        if self.client is not None:
            self.submit(item)
            return
        self.waiting.append(item)
        if self.connector is None:
            self.connector = threading.Thread(target=self.connect, name="sluice-mcp-connect", daemon=True)
            self.connector.start()

    def connect(self) -> None:
        try:
            self.connected = (C.Client.connect(name="sluice mcp"), None)
        except C.SluiceError as e:
            self.connected = (None, str(e))
        except Exception as e:  # noqa: BLE001 (reported to the tool call, never a traceback)
            self.connected = (None, f"{type(e).__name__}: {e}")
        with contextlib.suppress(OSError):
            os.write(self.wake_w, b"c")

    def adopt_client(self) -> None:
        if self.connector is None or self.connected is None:
            return
        self.connector.join()
        client, error = self.connected
        self.connector = None
        self.connected = None
        waiting, self.waiting = self.waiting, []
        if client is None:
            self.log(f"cannot reach the daemon: {error}")
            for item in waiting:
                self.fail_item(item, f"cannot reach the sluice daemon: {error}")
            return
        self.client = client
        for item in waiting:
            self.submit(item)

    def submit(self, item) -> None:
        if isinstance(item, Session) and item.failure is not None:
            return  # closed while we were connecting
        try:
            item.call = self.client.submit_request(item.request, on_output=item.on_output)
        except C.SluiceError as e:
            self.fail_item(item, f"cannot submit the command: {e}")
            if isinstance(e, C.DaemonError):
                self.lost_daemon(str(e))

    def fail_item(self, item, message: str) -> None:
        if isinstance(item, Run):
            self.runs.pop(_key(item.req_id), None)
            self.reply(item.req_id, tool_result(message, None, False, error=True))
        else:
            item.failure = message

    def lost_daemon(self, message: str) -> None:
        """The client broke: its calls failed with it; the next tool call reconnects."""
        self.log(message)
        client, self.client = self.client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
        for s in self.sessions.values():
            if s.call is not None and not s.call.done:
                s.failure = f"lost the sluice daemon: {message}"

    # -- input --------------------------------------------------------------------------

    def read_input(self) -> None:
        try:
            data = os.read(self.rfd, 1 << 16)
        except BlockingIOError:
            return
        except OSError as e:
            self.log(f"reading stdin failed: {e.strerror}")
            data = b""
        if not data:
            self.eof = True
            if self.inbuf.strip() and not self.skipping:
                self.handle_line(bytes(self.inbuf))
            self.inbuf.clear()
            return
        self.inbuf += data
        while True:
            nl = self.inbuf.find(b"\n")
            if nl < 0:
                if len(self.inbuf) > MAX_LINE_BYTES:
                    if not self.skipping:
                        self.error(None, PARSE_ERROR, f"message longer than {MAX_LINE_BYTES} bytes; skipped")
                    self.skipping = True
                    self.inbuf.clear()
                return
            line = bytes(self.inbuf[:nl])
            del self.inbuf[: nl + 1]
            if self.skipping:
                self.skipping = False
                continue
            if line.strip():
                self.handle_line(line)

    def handle_line(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except (ValueError, RecursionError) as e:
            self.error(None, PARSE_ERROR, f"parse error: {str(e)[:200]}")
            return
        if isinstance(message, list) and message:
            self.handle_batch(message)
        else:
            self.handle_guarded(message)

    def handle_batch(self, messages: list) -> None:
        batch = Batch()
        for m in messages:
            if isinstance(m, dict) and isinstance(m.get("method"), str) and _valid_id(m.get("id")):
                key = _key(m["id"])
                if key not in self.batch_of:
                    self.batch_of[key] = batch
                    batch.pending.add(key)
        self.current_batch = batch
        try:
            for m in messages:
                if isinstance(m, list):
                    self.error(None, INVALID_REQUEST, "a batch inside a batch")
                else:
                    self.handle_guarded(m)
        finally:
            self.current_batch = None
            batch.open = False
        self.flush(batch)

    def handle_guarded(self, message) -> None:
        try:
            self.handle(message)
        except Exception as e:  # noqa: BLE001 (a bug must not end the server)
            self.log(f"internal error: {type(e).__name__}: {e}")
            req_id = message.get("id") if isinstance(message, dict) else None
            if isinstance(message, dict) and "method" in message and _valid_id(req_id):
                self.error(req_id, INTERNAL_ERROR, f"internal error: {type(e).__name__}: {e}")

    def handle(self, message) -> None:
        if isinstance(message, list):
            self.error(None, INVALID_REQUEST, "an empty batch")
            return
        if not isinstance(message, dict):
            self.error(None, INVALID_REQUEST, "a message must be a JSON object")
            return
        has_id = "id" in message
        req_id = message.get("id")
        method = message.get("method")
        if method is None and ("result" in message or "error" in message):
            return  # a response; we send no requests, so nothing waits for it
        if has_id and not _valid_id(req_id):
            self.error(None, INVALID_REQUEST, "the id must be a string or an integer")
            return
        if message.get("jsonrpc") != "2.0" or not isinstance(method, str):
            # Not a request, nor a notification (which needs both too): JSON-RPC answers
            # it with Invalid Request, under its id if it has a usable one, else null.
            self.error(req_id if has_id else None, INVALID_REQUEST,
                       'not a JSON-RPC 2.0 request: needs "jsonrpc": "2.0" and a method')
            return
        params = message.get("params")
        if params is None:
            params = {}
        if not has_id:
            if isinstance(params, dict):
                self.notification(method, params)
            return
        if not isinstance(params, dict):
            self.error(req_id, INVALID_PARAMS, "params must be an object")
            return
        try:
            result = self.request(req_id, method, params)
        except ProtocolError as e:
            self.error(req_id, e.code, str(e))
            return
        if result is not None:
            self.reply(req_id, result)

    def notification(self, method: str, params: dict) -> None:
        if method == "notifications/cancelled":
            self.cancel(params.get("requestId"))
        # notifications/initialized and anything else: nothing to do

    def request(self, req_id, method: str, params: dict):
        if method == "initialize":
            asked = params.get("protocolVersion")
            self.version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
            return {
                "protocolVersion": self.version,
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": SERVER_NAME, "version": SERVER_VERSION},
                "instructions": self.policy.describe(),
            }
        if method == "ping":
            return {}
        if method == "tools/list":
            return {"tools": tools_for(self.version)}
        if method == "tools/call":
            return self.call_tool(req_id, params)
        raise ProtocolError(METHOD_NOT_FOUND, f"method not found: {method}")

    def call_tool(self, req_id, params: dict):
        name = params.get("name")
        if not isinstance(name, str):
            raise ProtocolError(INVALID_PARAMS, "tools/call needs the tool's name")
        if name not in TOOL_NAMES:
            raise ProtocolError(INVALID_PARAMS, f"unknown tool: {name}")
        arguments = params.get("arguments") or {}
        if not isinstance(arguments, dict):
            raise ProtocolError(INVALID_PARAMS, "arguments must be an object")
        key = _key(req_id)
        if key in self.runs or any(s.waiter and _key(s.waiter[0]) == key for s in self.sessions.values()):
            raise ProtocolError(INVALID_REQUEST, f"request id {req_id!r} is already in use")
        meta = params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        if not isinstance(token, (str, int)) or isinstance(token, bool):
            token = None
        try:
            return getattr(self, f"tool_{name}")(req_id, arguments, token)
        except ToolError as e:
            return tool_result(str(e), None, False, error=True)
        except C.UsageError as e:
            return tool_result(f"invalid command: {e}", None, False, error=True)

    # -- tools --------------------------------------------------------------------------

    def tool_run(self, req_id, arguments: dict, token):
        argv = argv_of(arguments)
        cwd = self.policy.cwd(arguments.get("cwd"))
        timeout_s = number_arg(arguments, "timeout_s", DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S)
        if timeout_s <= 0:
            raise ToolError("`timeout_s` must be more than 0")
        request = self.policy.request(argv, cwd, timeout_ms=max(1, int(timeout_s * 1000)))
        run = Run(req_id, token, argv, request)
        self.runs[_key(req_id)] = run
        self.with_client(run)
        return None  # answered when it ends

    def tool_session_start(self, req_id, arguments: dict, token):
        argv = argv_of(arguments)
        cwd = self.policy.cwd(arguments.get("cwd"))
        yield_ms = number_arg(arguments, "yield_ms", DEFAULT_YIELD_MS["session_start"], MAX_YIELD_MS, integer=True)
        if len(self.sessions) >= MAX_SESSIONS:
            raise ToolError(f"too many sessions ({MAX_SESSIONS}); close one with session_close")
        request = self.policy.request(argv, cwd, interactive=True)
        sid = secrets.token_hex(4)
        while sid in self.sessions:
            sid = secrets.token_hex(4)
        s = Session(sid, argv, request)
        self.sessions[sid] = s
        self.wait_on(s, req_id, "session_start", yield_ms)
        self.with_client(s)
        return None

    def session(self, arguments: dict) -> Session:
        sid = arguments.get("session_id")
        if not isinstance(sid, str):
            raise ToolError("`session_id` must be the string session_start returned")
        s = self.sessions.get(sid)
        if s is None:
            raise ToolError(f"no session {sid} (it was closed, or ended and was read to its end)")
        return s

    def wait_on(self, s: Session, req_id, tool: str, yield_ms: int) -> None:
        if s.waiter is not None:  # a call still waiting gets what there is now
            previous, s.waiter = s.waiter, None
            self.answer_session(previous[0], s)
            self.sessions[s.sid] = s
        now = time.monotonic()
        s.waiter = (req_id, tool, now + yield_ms / 1000, now, s.total)

    def tool_session_write(self, req_id, arguments: dict, token):
        s = self.session(arguments)
        text = arguments.get("text")
        if not isinstance(text, str):
            raise ToolError("`text` must be a string")
        close = arguments.get("close_stdin", False)
        if not isinstance(close, bool):
            raise ToolError("`close_stdin` must be true or false")
        yield_ms = number_arg(arguments, "yield_ms", DEFAULT_YIELD_MS["session_write"], MAX_YIELD_MS, integer=True)
        if s.ended:
            raise ToolError(f"session {s.sid} has ended; session_read returns its last output")
        if s.eof_wanted or s.closing:
            raise ToolError(f"the stdin of session {s.sid} is closed")
        s.stdin += text.encode("utf-8", "replace")  # a lone surrogate from JSON becomes "?"
        s.eof_wanted = close
        self.wait_on(s, req_id, "session_write", yield_ms)
        return None

    def tool_session_read(self, req_id, arguments: dict, token):
        s = self.session(arguments)
        yield_ms = number_arg(arguments, "yield_ms", DEFAULT_YIELD_MS["session_read"], MAX_YIELD_MS, integer=True)
        if s.unread() or s.ended or yield_ms == 0:
            if s.waiter is not None:
                previous, s.waiter = s.waiter, None
                self.answer_session(previous[0], s)
            self.answer_session(req_id, s)
            return None
        self.wait_on(s, req_id, "session_read", yield_ms)
        return None

    def tool_session_close(self, req_id, arguments: dict, token):
        s = self.session(arguments)
        self.close_session(s)
        self.wait_on(s, req_id, "session_close", int(SHUTDOWN_WAIT_S * 1000))
        return None

    def close_session(self, s: Session) -> None:
        """Kill its tree; it leaves the table once ended and answered (see tick)."""
        s.closing = True
        if s.call is not None and self.client is not None and not s.ended:
            with contextlib.suppress(C.DaemonError):
                self.client.cancel(s.call)
        elif s.call is None and not s.ended:
            s.failure = "closed before it started"

    def cancel(self, req_id) -> None:
        if not _valid_id(req_id):
            return
        run = self.runs.get(_key(req_id))
        if run is None:
            for s in list(self.sessions.values()):  # a waiting session call: answered no more
                if s.waiter is not None and _key(s.waiter[0]) == _key(req_id):
                    tool, s.waiter = s.waiter[1], None
                    self.forget(req_id)
                    if tool == "session_start":  # nobody learnt its id: it goes
                        self.close_session(s)
            return
        if run.call is None:  # still waiting for the daemon: never submitted
            self.runs.pop(_key(req_id), None)
            self.forget(req_id)
            with contextlib.suppress(ValueError):
                self.waiting.remove(run)
            return
        run.token = None
        run.cancelled = True
        if self.client is not None:
            with contextlib.suppress(C.DaemonError):
                self.client.cancel(run.call)

    # -- the end ------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stdin ended (or a signal came): every command and session dies, then we exit."""
        if self.stop_signal is not None:
            self.log(f"stopping on signal {self.stop_signal}")
        if self.connector is not None:
            self.connector.join(timeout=SHUTDOWN_WAIT_S)
            self.adopt_client_quietly()
        client = self.client
        if client is None:
            return
        calls = [r.call for r in self.runs.values() if r.call is not None]
        calls += [s.call for s in self.sessions.values() if s.call is not None]
        calls = [c for c in calls if not c.done]
        for call in calls:
            with contextlib.suppress(C.DaemonError):
                client.cancel(call)
        deadline = time.monotonic() + SHUTDOWN_WAIT_S
        try:
            while any(not c.done for c in calls) and time.monotonic() < deadline:
                client.poll(min(0.2, max(0.0, deadline - time.monotonic())))
        except C.DaemonError:
            pass
        left = [c for c in calls if not c.done]
        if left:
            self.log(f"{len(left)} command(s) did not end within {SHUTDOWN_WAIT_S:g} s of being cancelled")
        client.close()
        self.client = None

    def adopt_client_quietly(self) -> None:
        if self.connected is None:
            return
        client, _ = self.connected
        self.connected = None
        self.connector = None
        self.waiting = []
        if client is not None:
            client.close()


def _valid_id(req_id) -> bool:
    return isinstance(req_id, str) or (isinstance(req_id, int) and not isinstance(req_id, bool))


def _key(req_id):
    """Request ids 1 and "1" are different requests."""
    return (type(req_id).__name__, req_id)
