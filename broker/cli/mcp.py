"""``sluice mcp``: sluice as an MCP server, over stdio.

Any MCP client (Claude Code, Cursor, Codex, ...) starts ``sluice mcp`` and gets tools
that run commands through the sluice daemon, each in the kernel sandbox: ``run`` (one
command, its exit status and output) and interactive sessions (``session_start``,
``session_write``, ``session_read``, ``session_close``). The policy (sandbox mode,
workspace, writable roots, network, resource limits) comes from our flags and the config
file when the server starts; no tool argument can change it.

The protocol is JSON-RPC 2.0, one message per line (the MCP stdio transport), spoken here
by hand: it is small, and the official SDK would bring pydantic, starlette and uvicorn
into the one process that must start fast and stay out of the sandbox's way.

One thread does everything but connecting: an event loop that waits, through the client
library's :meth:`~broker.client.Client.wait_io`, on the daemon's socket, our stdin and a
wake-up pipe at once, so a long ``run`` never blocks ``ping``, ``tools/list`` or another
``run``. Connecting (which may start a daemon, a second or so) runs on a thread of its own
and hands the client over; the client is used from the loop's thread only. Stdout carries
only protocol messages, written under a lock from one function; logs go to stderr.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import secrets
import select
import signal
import threading
import time

import msgspec

import broker.client as C
from broker.cli.base import print_error, write_all
from broker.wire.results import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE

SERVER_NAME = "sluice"
SERVER_VERSION = "0.1.0"
# Newest first: the answer to a client whose version we do not know.
PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
# structuredContent, outputSchema and tool titles came with this version.
STRUCTURED_SINCE = "2025-06-18"

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

# A line longer than this is answered with a parse error and skipped.
MAX_LINE = 16 * 1024 * 1024
# Output a `run` returns: the first HEAD and the last TAIL bytes of each stream.
OUTPUT_HEAD = 8 * 1024
OUTPUT_TAIL = 24 * 1024
# Progress notifications: at most one per call per interval, each at most this much text.
PROGRESS_INTERVAL_S = 0.1
PROGRESS_MAX = 16 * 1024
# Interactive sessions: how many at once, and the output each keeps (the oldest goes).
MAX_SESSIONS = 16
SESSION_KEEP = 128 * 1024
# What a session tool returns at most per call (the rest stays for the next read).
SESSION_READ_MAX = 64 * 1024
# session_write/read return early once output came and then none for this long.
QUIET_S = 0.2
DEFAULT_YIELD_MS = {"session_start": 500, "session_write": 1000, "session_read": 0}
MAX_YIELD_MS = 30_000
DEFAULT_TIMEOUT_S = 600
MAX_TIMEOUT_S = 24 * 3600
# At the end: how long cancelled commands get to die before we exit anyway.
SHUTDOWN_WAIT_S = 5.0


class ToolError(Exception):
    """A tool call that failed: answered as a result with isError, one line."""


class ProtocolError(Exception):
    """A request we answer with a JSON-RPC error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


# -- policy -----------------------------------------------------------------------------


class Policy:
    """What every command gets, fixed when the server starts: from flags and config.toml."""

    def __init__(self, args) -> None:
        from agent.config import ConfigError, load_config

        try:
            config = load_config()
        except ConfigError as e:
            raise C.UsageError(str(e)) from None
        # sluice run's default unless config.toml names a mode (the agent's default is read-only).
        self.mode = args.sandbox or (config.sandbox_mode if "sandbox_mode" in config.raw else "workspace-write")
        workspace_write = self.mode == "workspace-write"
        self.writable = list(config.writable_roots if workspace_write else ()) + list(args.writable)
        self.network = bool(args.network or (workspace_write and config.network_access))
        self.env_passthrough = list(args.env)
        self.limits = config.limits
        self.limit_flags = dict(memory=args.memory, pids_limit=args.pids_limit, file_size=args.file_size,
                                cpu_time=args.cpu_time)
        try:
            root = os.path.realpath(args.cwd or os.getcwd())
        except FileNotFoundError:
            raise C.UsageError("the current directory no longer exists; cd somewhere else or pass --cwd") from None
        if not os.path.isdir(root):
            what = "is not a directory" if os.path.exists(root) else "does not exist"
            raise C.UsageError(f"--cwd {root} {what}")
        self.workspace = root
        self.request(["true"], root)  # every mistake in the flags, now rather than per call

    def cwd(self, given) -> str:
        """The tool's ``cwd`` (relative to the workspace, or absolute), inside the workspace."""
        if given is None:
            return self.workspace
        if not isinstance(given, str) or not given:
            raise ToolError("cwd must be a non-empty string")
        path = os.path.realpath(os.path.join(self.workspace, given))
        if os.path.commonpath([path, self.workspace]) != self.workspace:
            raise ToolError(f"cwd {given} is outside the workspace {self.workspace}")
        if not os.path.isdir(path):
            raise ToolError(f"cwd {given} is not a directory in the workspace")
        return path

    def request(self, argv: list[str], cwd: str, *, timeout_ms: int | None = None, interactive: bool = False):
        request = C.make_request(
            argv, cwd=cwd, sandbox=self.mode, writable=self.writable, network=self.network,
            env_passthrough=self.env_passthrough, timeout_ms=timeout_ms, capture_limit=0,
            limits=self.limits, stdin=interactive, **self.limit_flags)
        # The workspace is the writable cwd wherever in it the command runs.
        request = msgspec.structs.replace(request, sandbox_cwd=self.workspace)
        if interactive:
            request = msgspec.structs.replace(request, interactive=True)
        return request

    def describe(self) -> str:
        if self.mode == "danger-full-access":
            text = "Commands run WITHOUT a sandbox (danger-full-access)"
        elif self.mode == "read-only":
            text = "Commands run in a kernel sandbox: the filesystem is read-only"
        else:
            text = f"Commands run in a kernel sandbox: only the workspace {self.workspace} and /tmp are writable"
        if self.writable:
            text += f", plus {', '.join(self.writable)}"
        if self.mode != "danger-full-access":
            text += "; network access is " + ("allowed" if self.network else "blocked")
        return (f"{text}. The workspace is {self.workspace}; a tool's cwd must be inside it. "
                "The sandbox is set by the user and cannot be changed from here.")


# -- tools ------------------------------------------------------------------------------

_COMMAND_PROPS = {
    "command": {"type": "string", "description": "A shell command line, run with `bash -lc`."},
    "argv": {"type": "array", "items": {"type": "string"}, "minItems": 1,
             "description": "The command as a list of arguments, run without a shell. Give this or `command`."},
    "cwd": {"type": "string", "description": "Where it runs: a directory inside the workspace (relative to it, "
                                             "or absolute). Default: the workspace."},
}
_YIELD = {"type": "integer", "minimum": 0, "maximum": MAX_YIELD_MS,
          "description": "How long to wait for output, in milliseconds (returns early once output came and "
                         "paused, or the session ended)."}
_SESSION_ID = {"type": "string", "description": "The id session_start returned."}

_RUN_OUTPUT = {
    "type": "object",
    "properties": {
        "exit_code": {"type": ["integer", "null"], "description": "null when killed by a signal or timed out"},
        "signal": {"type": ["integer", "null"]},
        "timed_out": {"type": "boolean"},
        "duration_s": {"type": "number"},
        "stdout": {"type": "string"},
        "stderr": {"type": "string"},
        "stdout_bytes": {"type": "integer", "description": "bytes the command wrote to stdout"},
        "stderr_bytes": {"type": "integer"},
        "stdout_truncated": {"type": "boolean", "description": "the middle of stdout was left out"},
        "stderr_truncated": {"type": "boolean"},
        "limit": {"type": ["string", "null"], "description": "a resource limit the command ran into"},
    },
    "required": ["exit_code", "signal", "timed_out", "stdout", "stderr", "stdout_truncated", "stderr_truncated"],
}
_SESSION_OUTPUT = {
    "type": "object",
    "properties": {
        "session_id": {"type": "string"},
        "output": {"type": "string", "description": "stdout and stderr as they came, since the last call"},
        "dropped_bytes": {"type": "integer", "description": "output lost before it was read (the oldest goes "
                                                           f"beyond {SESSION_KEEP // 1024} KiB)"},
        "more": {"type": "boolean", "description": "more output is waiting: call session_read"},
        "running": {"type": "boolean"},
        "exit_code": {"type": ["integer", "null"]},
        "signal": {"type": ["integer", "null"]},
    },
    "required": ["session_id", "output", "running"],
}

TOOLS = [
    {
        "name": "run",
        "title": "Run a command in the sandbox",
        "description": (
            "Run one command in sluice's kernel sandbox and return its exit code, stdout and stderr. "
            "Stdin is empty. Give `command` (a shell line) or `argv`. Output longer than "
            f"{(OUTPUT_HEAD + OUTPUT_TAIL) // 1024} KiB per stream keeps its start and end; the result says "
            f"when. Default timeout {DEFAULT_TIMEOUT_S} s. Progress notifications carry output as it comes."),
        "inputSchema": {"type": "object", "properties": {
            **_COMMAND_PROPS,
            "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_TIMEOUT_S,
                          "description": f"Kill the command's whole tree after this many seconds "
                                         f"(default {DEFAULT_TIMEOUT_S})."},
        }},
        "outputSchema": _RUN_OUTPUT,
    },
    {
        "name": "session_start",
        "title": "Start an interactive session",
        "description": (
            "Start a long-lived command in the sandbox with stdin open (a REPL, a shell, a server); returns its "
            "session_id and first output. Not a terminal: use e.g. `python3 -i -u` or `bash --norc -i`. "
            f"At most {MAX_SESSIONS} sessions; each keeps the last {SESSION_KEEP // 1024} KiB of unread output."),
        "inputSchema": {"type": "object", "properties": {**_COMMAND_PROPS, "yield_ms": _YIELD}},
        "outputSchema": _SESSION_OUTPUT,
    },
    {
        "name": "session_write",
        "title": "Write to a session",
        "description": ("Send text to a session's stdin exactly as given (end a line with \\n), then wait up to "
                        "yield_ms for output and return it. close_stdin: then end its input."),
        "inputSchema": {"type": "object", "properties": {
            "session_id": _SESSION_ID, "text": {"type": "string"}, "yield_ms": _YIELD,
            "close_stdin": {"type": "boolean", "description": "end of file after the text"},
        }, "required": ["session_id", "text"]},
        "outputSchema": _SESSION_OUTPUT,
    },
    {
        "name": "session_read",
        "title": "Read a session's output",
        "description": "Return a session's output since the last call, waiting up to yield_ms (default 0) for some.",
        "inputSchema": {"type": "object", "properties": {"session_id": _SESSION_ID, "yield_ms": _YIELD},
                        "required": ["session_id"]},
        "outputSchema": _SESSION_OUTPUT,
    },
    {
        "name": "session_close",
        "title": "Close a session",
        "description": "Kill a session's whole process tree and return its last output and exit status.",
        "inputSchema": {"type": "object", "properties": {"session_id": _SESSION_ID}, "required": ["session_id"]},
        "outputSchema": _SESSION_OUTPUT,
    },
]
TOOL_NAMES = {t["name"] for t in TOOLS}


def _tools_for(version: str) -> list[dict]:
    if version >= STRUCTURED_SINCE:
        return TOOLS
    return [{k: v for k, v in t.items() if k not in ("outputSchema", "title")} for t in TOOLS]


def _argv_of(arguments: dict) -> list[str]:
    command, argv = arguments.get("command"), arguments.get("argv")
    if (command is None) == (argv is None):
        raise ToolError("give exactly one of `command` (a shell line) and `argv` (a list of strings)")
    if command is not None:
        if not isinstance(command, str) or not command.strip():
            raise ToolError("`command` must be a non-empty string")
        return ["bash", "-lc", command]
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv) or not argv[0]:
        raise ToolError("`argv` must be a non-empty list of strings")
    return argv


def _number(arguments: dict, name: str, default, maximum, *, integer: bool = False, minimum=0):
    value = arguments.get(name, default)
    if value is None:
        return default
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not minimum <= value <= maximum:
        raise ToolError(f"`{name}` must be a number from {minimum} to {maximum}, got {value!r}")
    return value


def _decode(data) -> str:
    return bytes(data).decode("utf-8", "replace")


class Capture:
    """One stream of a `run`: its first and last bytes, and how many there were."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk) -> None:
        self.total += len(chunk)
        room = OUTPUT_HEAD - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > OUTPUT_TAIL:
                del self.tail[: len(self.tail) - OUTPUT_TAIL]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def text(self) -> str:
        if not self.truncated:
            return _decode(self.head + self.tail)
        left_out = self.total - len(self.head) - len(self.tail)
        return f"{_decode(self.head)}\n[... {left_out} bytes left out ...]\n{_decode(self.tail)}"


def _status_line(result) -> str:
    if result.timed_out:
        line = "timed out (its process tree was killed)"
    elif result.signal is not None:
        line = f"killed by signal {result.signal}"
    elif result.aborted:
        line = "cancelled"
    else:
        line = f"exit code {result.exit_code}"
    if result.limit:
        line += f"; {result.limit}"
    return line


def _not_run(result, argv: list[str]) -> str:
    """Why a command never ran, one line."""
    if result.returncode == EXIT_NOT_FOUND:
        return f"command not found: {argv[0]}"
    return " ".join(str(result.error).split())


class Run:
    """A `run` tool call in flight."""

    def __init__(self, req_id, token, argv: list[str], request) -> None:
        self.req_id = req_id
        self.token = token
        self.argv = argv
        self.request = request
        self.call = None
        self.out = Capture()
        self.err = Capture()
        self.pending = []  # decoded output not yet sent as progress
        self.pending_len = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.seen = 0
        self.last_progress = 0.0

    def on_output(self, call, stream, chunk) -> None:
        (self.err if stream == 2 else self.out).add(chunk)
        if self.token is not None:
            self.seen += len(chunk)
            text = self.decoder.decode(bytes(chunk))
            self.pending.append(text)
            self.pending_len += len(text)
            while self.pending_len > PROGRESS_MAX and len(self.pending) > 1:
                self.pending_len -= len(self.pending.pop(0))

    def progress_due(self, now: float) -> float | None:
        if not self.pending:
            return None
        return self.last_progress + PROGRESS_INTERVAL_S

    def take_progress(self, now: float) -> dict:
        text = "".join(self.pending)[-PROGRESS_MAX:]
        self.pending.clear()
        self.pending_len = 0
        self.last_progress = now
        return {"progressToken": self.token, "progress": self.seen, "message": text}

    def outcome(self, structured: bool) -> dict:
        result = self.call.result
        if result.error is not None:  # it never ran, or its executor failed
            raise ToolError(_not_run(result, self.argv))
        data = {
            "exit_code": result.exit_code if result.signal is None and not result.timed_out else None,
            "signal": result.signal,
            "timed_out": result.timed_out,
            "duration_s": round(result.duration_s, 3),
            "stdout": self.out.text(),
            "stderr": self.err.text(),
            "stdout_bytes": self.out.total,
            "stderr_bytes": self.err.total,
            "stdout_truncated": self.out.truncated,
            "stderr_truncated": self.err.truncated,
            "limit": result.limit,
        }
        parts = [_status_line(result)]
        for name, cap in (("stdout", self.out), ("stderr", self.err)):
            if cap.total:
                note = f" ({cap.total} bytes, the middle left out)" if cap.truncated else ""
                parts.append(f"--- {name}{note} ---\n{data[name]}")
        return _result("\n".join(parts), data, structured)


def _result(text: str, data: dict | None, structured: bool, error: bool = False) -> dict:
    out = {"content": [{"type": "text", "text": text}], "isError": error}
    if structured and data is not None:
        out["structuredContent"] = data
    return out


class Session:
    """An interactive command, its stdin open, its output kept (the last SESSION_KEEP bytes)."""

    def __init__(self, sid: str, argv: list[str], request) -> None:
        self.sid = sid
        self.argv = argv
        self.request = request
        self.call = None
        self.buf = bytearray()
        self.total = 0  # bytes of output ever
        self.read_to = 0  # the first byte not yet returned (absolute)
        self.last_output = 0.0
        self.stdin = bytearray()  # written by the model, not yet taken by the window
        self.eof_wanted = False
        self.closing = False
        self.failure: str | None = None  # never ran, or lost with the daemon
        # The one tool call waiting on this session: (req_id, tool, deadline, started_at, total_then).
        self.waiter = None

    def on_output(self, call, stream, chunk) -> None:
        self.buf += chunk
        self.total += len(chunk)
        if len(self.buf) > SESSION_KEEP:
            del self.buf[: len(self.buf) - SESSION_KEEP]
        self.last_output = time.monotonic()

    @property
    def ended(self) -> bool:
        return self.failure is not None or (self.call is not None and self.call.done)

    def unread(self) -> bool:
        return self.read_to < self.total

    def take(self, structured: bool) -> dict:
        start = self.total - len(self.buf)
        dropped = max(0, start - self.read_to)
        frm = max(self.read_to, start)
        end = min(self.total, frm + SESSION_READ_MAX)
        text = _decode(self.buf[frm - start: end - start])
        self.read_to = end
        data = {"session_id": self.sid, "output": text, "dropped_bytes": dropped, "more": end < self.total,
                "running": not self.ended, "exit_code": None, "signal": None}
        head = f"session {self.sid}: "
        if self.ended:
            result = self.call.result if self.call is not None else None
            if self.failure is not None or result is None:
                head += f"ended: {self.failure}"
            elif result.error is not None:
                head += f"ended: {_not_run(result, self.argv)}"
            else:
                data["exit_code"] = result.exit_code
                data["signal"] = result.signal
                head += f"ended, {_status_line(result)}"
        else:
            head += "running"
        if dropped:
            head += f"; {dropped} bytes of output were lost before they were read"
        if data["more"]:
            head += "; more output waiting (session_read)"
        return _result(f"{head}\n{text}" if text else head, data, structured)


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
        self.inbuf = bytearray()
        self.skipping = False  # inside an over-long line
        self.eof = False
        self.stop_signal = None
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    # -- output -------------------------------------------------------------------------

    def send(self, message: dict) -> None:
        """The one writer of stdout."""
        line = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace") + b"\n"
        with self.write_lock:
            try:
                write_all(self.wfd, line)
            except OSError:
                self.eof = True  # nobody reads us any more: wind down

    def reply(self, req_id, result: dict) -> None:
        self.send({"jsonrpc": "2.0", "id": req_id, "result": result})

    def error(self, req_id, code: int, message: str) -> None:
        self.send({"jsonrpc": "2.0", "id": req_id, "error": {"code": code, "message": message}})

    def log(self, message: str) -> None:
        print_error(f"mcp: {message}")

    @property
    def structured(self) -> bool:
        return self.version >= STRUCTURED_SINCE

    # -- the loop -----------------------------------------------------------------------

    def serve(self) -> int:
        def on_signal(signum, frame):
            self.stop_signal = signum

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        old_wakeup = signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        try:
            while not self.eof and self.stop_signal is None:
                self.step(self.timeout())
            self.shutdown()
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for s, h in old.items():
                signal.signal(s, h)
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
            if s.eof_wanted and not s.stdin and self.client is not None and s.call is not None and not s.ended:
                with contextlib.suppress(C.DaemonError):
                    self.client.close_stdin(s.call)
                s.eof_wanted = False
            if s.waiter is not None:
                req_id, tool, deadline, _, total_then = s.waiter
                quiet = s.total > total_then and now >= s.last_output + QUIET_S and tool != "session_close"
                if s.ended or now >= deadline or quiet:
                    s.waiter = None
                    self.answer_session(req_id, s)

    def answer_session(self, req_id, s: Session) -> None:
        if s.ended and s.call is None and s.failure is not None and s.total == 0:
            self.sessions.pop(s.sid, None)
            self.reply(req_id, _result(f"session {s.sid}: {s.failure}", None, False, error=True))
            return
        if s.ended and s.call is not None and s.total == 0:
            r = s.call.result
            if r is not None and r.error is not None:
                self.sessions.pop(s.sid, None)
                self.reply(req_id, _result(_not_run(r, s.argv), None, False, error=True))
                return
        result = s.take(self.structured)
        if s.ended and (s.closing or not s.unread()):
            self.sessions.pop(s.sid, None)
        self.reply(req_id, result)

    def finish_run(self, run: Run) -> None:
        call = run.call
        if call.failure is not None:
            self.reply(run.req_id, _result(f"lost the sluice daemon: {call.failure}", None, False, error=True))
            return
        if call.result.aborted and not call.result.timed_out:
            return  # cancelled by the client: no response (the spec's rule)
        if run.token is not None and run.pending:
            self.send({"jsonrpc": "2.0", "method": "notifications/progress",
                       "params": run.take_progress(time.monotonic())})
        try:
            self.reply(run.req_id, run.outcome(self.structured))
        except ToolError as e:
            self.reply(run.req_id, _result(str(e), None, False, error=True))

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
            self.reply(item.req_id, _result(message, None, False, error=True))
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
                if len(self.inbuf) > MAX_LINE:
                    if not self.skipping:
                        self.error(None, PARSE_ERROR, f"message longer than {MAX_LINE} bytes; skipped")
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
        try:
            self.handle(message)
        except Exception as e:  # noqa: BLE001 (a bug must not end the server)
            self.log(f"internal error: {type(e).__name__}: {e}")
            req_id = message.get("id") if isinstance(message, dict) else None
            if isinstance(message, dict) and "method" in message and _valid_id(req_id):
                self.error(req_id, INTERNAL_ERROR, f"internal error: {type(e).__name__}: {e}")

    def handle(self, message) -> None:
        if isinstance(message, list):
            self.error(None, INVALID_REQUEST, "JSON-RPC batches are not supported; send one message per line")
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
            if has_id:
                self.error(req_id, INVALID_REQUEST, 'not a JSON-RPC 2.0 request: needs "jsonrpc": "2.0" and a method')
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
            return {"tools": _tools_for(self.version)}
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
            return _result(str(e), None, False, error=True)
        except C.UsageError as e:
            return _result(f"invalid command: {e}", None, False, error=True)

    # -- tools --------------------------------------------------------------------------

    def tool_run(self, req_id, arguments: dict, token):
        argv = _argv_of(arguments)
        cwd = self.policy.cwd(arguments.get("cwd"))
        timeout_s = _number(arguments, "timeout_s", DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S)
        if timeout_s <= 0:
            raise ToolError("`timeout_s` must be more than 0")
        request = self.policy.request(argv, cwd, timeout_ms=max(1, int(timeout_s * 1000)))
        run = Run(req_id, token, argv, request)
        self.runs[_key(req_id)] = run
        self.with_client(run)
        return None  # answered when it ends

    def tool_session_start(self, req_id, arguments: dict, token):
        argv = _argv_of(arguments)
        cwd = self.policy.cwd(arguments.get("cwd"))
        yield_ms = _number(arguments, "yield_ms", DEFAULT_YIELD_MS["session_start"], MAX_YIELD_MS, integer=True)
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
        yield_ms = _number(arguments, "yield_ms", DEFAULT_YIELD_MS["session_write"], MAX_YIELD_MS, integer=True)
        if s.ended:
            raise ToolError(f"session {s.sid} has ended; session_read returns its last output")
        if s.eof_wanted or s.closing:
            raise ToolError(f"the stdin of session {s.sid} is closed")
        s.stdin += text.encode("utf-8")
        s.eof_wanted = close
        self.wait_on(s, req_id, "session_write", yield_ms)
        return None

    def tool_session_read(self, req_id, arguments: dict, token):
        s = self.session(arguments)
        yield_ms = _number(arguments, "yield_ms", DEFAULT_YIELD_MS["session_read"], MAX_YIELD_MS, integer=True)
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
        s.closing = True
        if s.call is not None and self.client is not None and not s.ended:
            self.client.cancel(s.call)
        elif s.call is None and not s.ended:
            s.failure = "closed before it started"
        self.wait_on(s, req_id, "session_close", int(SHUTDOWN_WAIT_S * 1000))
        return None

    def cancel(self, req_id) -> None:
        if not _valid_id(req_id):
            return
        run = self.runs.get(_key(req_id))
        if run is None:
            for s in self.sessions.values():  # a waiting session call: answered no more
                if s.waiter is not None and _key(s.waiter[0]) == _key(req_id):
                    s.waiter = None
            return
        if run.call is None:  # still waiting for the daemon: never submitted
            self.runs.pop(_key(req_id), None)
            with contextlib.suppress(ValueError):
                self.waiting.remove(run)
            return
        run.token = None
        if self.client is not None:
            with contextlib.suppress(C.DaemonError):
                self.client.cancel(run.call)
        # finish_run sends nothing for a cancelled call (one that ended first is answered)

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


def mcp_main(args) -> int:
    try:
        policy = Policy(args)
    except C.UsageError as e:
        print_error(f"error: {e}")
        return EXIT_USAGE
    if args.env_report:
        from broker.cli.base import env_report

        env_report(args.env)
    return Server(policy).serve()
