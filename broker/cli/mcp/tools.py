"""The tools of ``sluice mcp``: the policy every command gets, the tools' schemas, and
what a call in flight keeps (:class:`Run` for ``run``, :class:`Session` for the
interactive sessions). No protocol here: :mod:`broker.cli.mcp.server` speaks it."""

from __future__ import annotations

import codecs
import os
import time

import msgspec

import broker.client as C
from broker.wire.results import EXIT_NOT_FOUND

# Output a `run` returns: the first HEAD and the last TAIL bytes of each stream (twice: as text and
# as structuredContent, so both streams at their most stay near 16k tokens).
OUTPUT_HEAD = 4 * 1024
OUTPUT_TAIL = 12 * 1024
# Progress notifications: at most one per call per interval, each at most this much text.
PROGRESS_INTERVAL_S = 0.1
PROGRESS_MAX = 16 * 1024
# Interactive sessions: how many at once, and the output each keeps (the oldest goes).
MAX_SESSIONS = 16
SESSION_KEEP = 128 * 1024
# What a session tool returns at most per call (the rest stays for the next read).
SESSION_READ_MAX = 16 * 1024
DEFAULT_YIELD_MS = {"session_start": 500, "session_write": 1000, "session_read": 0}
MAX_YIELD_MS = 30_000
DEFAULT_TIMEOUT_S = 600
MAX_TIMEOUT_S = 24 * 3600
# structuredContent, outputSchema and tool titles came with this protocol version.
STRUCTURED_SINCE = "2025-06-18"


class ToolError(Exception):
    """A tool call that failed: answered as a result with isError, one line."""


# -- policy -----------------------------------------------------------------------------


class Policy:
    """What every command gets, fixed when the server starts: from flags and config.toml."""

    def __init__(self, args) -> None:
        from broker.cli.config import ConfigError, load_config

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
        self.request(["true"], root)  # every mistake in the flags (a refused root too), now rather than per call

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
            limits=self.limits, stdin=interactive, interactive=interactive, **self.limit_flags)
        # The workspace is the writable cwd wherever in it the command runs.
        return msgspec.structs.replace(request, sandbox_cwd=self.workspace)

    def describe(self) -> str:
        if self.mode == "danger-full-access":
            text = "Commands run WITHOUT a sandbox (danger-full-access)"
        elif self.mode == "read-only":
            text = "Commands run in a kernel sandbox: the filesystem is read-only"
        else:
            text = (f"Commands run in a kernel sandbox: only the workspace {self.workspace} (its .git and .sluice "
                    "excepted) and /tmp are writable")
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


def tools_for(version: str) -> list[dict]:
    if version >= STRUCTURED_SINCE:
        return TOOLS
    return [{k: v for k, v in t.items() if k not in ("outputSchema", "title")} for t in TOOLS]


def argv_of(arguments: dict) -> list[str]:
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


def number_arg(arguments: dict, name: str, default, maximum, *, integer: bool = False, minimum=0):
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


def status_line(result) -> str:
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


def not_run(result, argv: list[str]) -> str:
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
        self.cancelled = False  # by notifications/cancelled: it gets no response

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
            raise ToolError(not_run(result, self.argv))
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
        parts = [status_line(result)]
        for name, cap in (("stdout", self.out), ("stderr", self.err)):
            if cap.total:
                note = f" ({cap.total} bytes, the middle left out)" if cap.truncated else ""
                text = data[name][:-1] if data[name].endswith("\n") else data[name]
                parts.append(f"--- {name}{note} ---\n{text}")
        return tool_result("\n".join(parts), data, structured)


def tool_result(text: str, data: dict | None, structured: bool, error: bool = False) -> dict:
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
        if end < self.total:  # not inside a UTF-8 character: the next read gets all of it
            back = 0
            while back < 3 and end - back > frm and (self.buf[end - back - start] & 0xC0) == 0x80:
                back += 1
            if end - back > frm:
                end -= back
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
                head += f"ended: {not_run(result, self.argv)}"
            else:
                data["exit_code"] = result.exit_code
                data["signal"] = result.signal
                head += f"ended, {status_line(result)}"
        else:
            head += "running"
        if dropped:
            head += f"; {dropped} bytes of output were lost before they were read"
        if data["more"]:
            head += "; more output waiting (session_read)"
        return tool_result(f"{head}\n{text}" if text else head, data, structured)
