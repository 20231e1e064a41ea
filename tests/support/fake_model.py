"""A scripted model server for agent tests, a fake command runner, a session harness.

The server (:class:`FakeModelServer`) is ``http.server`` on 127.0.0.1 in a thread; each
request takes the next scripted step (:func:`status`, :func:`sse` of :func:`sse_frame`
frames, Chat Completions chunks from :func:`chat_chunk`) and is kept in ``requests``.
This module also has the Responses API answers a session needs: a turn of text, of
function calls, of reasoning, and steps that wait for a signal before they answer.

:class:`FakeRunner` stands in for the daemon in fast tests: every command is answered by
``respond(argv, sandboxed)`` (a :class:`FakeExec`), with its output streamed in chunks;
a command marked ``hang`` runs until it is cancelled.

:class:`Harness` drives one :class:`~agent.session.Session` over them and waits for the
events it emits (``until``, ``done``); ``tag(event)`` is the event's Codex ``type``.
"""

from __future__ import annotations

import asyncio
import collections
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from agent.exec_runner import CommandRunner, ExecResult, HeadTailBuffer, InteractiveProcess, OutputCallback
from agent.instructions import is_environment_context
from agent.session import Session
from broker.wire.protocol import (
    AskForApproval,
    ConfigureSession,
    Event,
    ExecOutputStream,
    ModelProviderInfo,
    Submission,
    TextInput,
    UserInput,
    WireApi,
)
from landlock_helper import fileops
from landlock_helper.policy import SandboxPolicy

# -- the scripted server --------------------------------------------------------------

Step = Callable[[BaseHTTPRequestHandler], None]


class FakeModelServer:
    def __init__(self) -> None:
        self.steps: collections.deque[Step] = collections.deque()
        self.requests: list[dict[str, Any]] = []
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                server.requests.append({
                    "path": self.path,
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "json": json.loads(body) if body else None,
                })
                self.close_connection = True
                step = server.steps.popleft() if server.steps else status(500, {"error": {"message": "no scripted response"}})
                try:
                    step(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def script(self, *steps: Step) -> None:
        self.steps.extend(steps)

    def __enter__(self) -> FakeModelServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def _head(handler: BaseHTTPRequestHandler, code: int, reason: str, headers: dict[str, str]) -> None:
    lines = [f"HTTP/1.1 {code} {reason}"] + [f"{k}: {v}" for k, v in headers.items()] + ["Connection: close", "", ""]
    handler.wfile.write("\r\n".join(lines).encode())
    handler.wfile.flush()


def status(code: int, body: Any, headers: dict[str, str] | None = None) -> Step:
    reasons = {401: "Unauthorized", 400: "Bad Request", 429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}

    def step(handler: BaseHTTPRequestHandler) -> None:
        data = (json.dumps(body) if not isinstance(body, str) else body).encode()
        _head(handler, code, reasons.get(code, "Error"),
              {"Content-Type": "application/json", "Content-Length": str(len(data)), **(headers or {})})
        handler.wfile.write(data)

    return step


def sse_frame(data: Any, event: str | None = None) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return (head + "".join(f"data: {line}\n" for line in text.split("\n")) + "\n").encode()


def sse(frames: list[bytes], *, chunked: bool = False, hang: bool = False, server: FakeModelServer | None = None) -> Step:
    """200 with these SSE frames, one write each; then close (or, with ``hang``, wait)."""

    def step(handler: BaseHTTPRequestHandler) -> None:
        headers = {"Content-Type": "text/event-stream"}
        if chunked:
            headers["Transfer-Encoding"] = "chunked"
        _head(handler, 200, "OK", headers)
        for frame in frames:
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame) if chunked else frame)
            handler.wfile.flush()
        if hang:
            assert server is not None
            server.release.wait(10)

    return step


def chat_chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    return sse_frame({"id": "chatcmpl-9", "object": "chat.completion.chunk",
                      "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra})

__all__ = [
    "SESSION_API_KEY",
    "FakeExec",
    "FakeModelServer",
    "FakeRunner",
    "Harness",
    "Step",
    "assistant",
    "call",
    "gated",
    "local_shell_call",
    "outputs_of",
    "reasoning",
    "response",
    "sse",
    "sse_frame",
    "status",
    "tag",
    "usage",
    "user_item",
]

USAGE = {"input_tokens": 12, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 7,
         "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 19}


def assistant(text: str) -> dict[str, Any]:
    return {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def call(name: str, arguments: Any, call_id: str) -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"type": "function_call", "id": f"fc_{call_id}", "name": name, "arguments": text, "call_id": call_id}


def local_shell_call(command: list[str], call_id: str, **action: Any) -> dict[str, Any]:
    return {"type": "local_shell_call", "id": f"ls_{call_id}", "call_id": call_id, "status": "completed",
            "action": {"type": "exec", "command": command, **action}}


def reasoning(*summary: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": s} for s in summary]}


def usage(total: int = 19) -> dict[str, Any]:
    return {**USAGE, "total_tokens": total}


def response(*items: dict[str, Any], deltas: Sequence[str] | None = None, reasoning_deltas: Sequence[str] = (),
             response_id: str = "resp_1", token_usage: dict[str, Any] | None = USAGE, complete: bool = True,
             hang: bool = False, server: FakeModelServer | None = None) -> Step:
    """A 200 Responses API stream: created, deltas (default: the text of the assistant
    messages among ``items``), the items, completed."""
    frames = [sse_frame({"type": "response.created", "response": {"id": response_id}})]
    if deltas is None:
        deltas = [p["text"] for i in items if i.get("type") == "message" for p in i["content"]]
    for delta in reasoning_deltas:
        frames.append(sse_frame({"type": "response.reasoning_summary_text.delta", "delta": delta}))
    for delta in deltas:
        frames.append(sse_frame({"type": "response.output_text.delta", "delta": delta}))
    for item in items:
        frames.append(sse_frame({"type": "response.output_item.done", "item": item}))
    if complete:
        body: dict[str, Any] = {"id": response_id}
        if token_usage is not None:
            body["usage"] = token_usage
        frames.append(sse_frame({"type": "response.completed", "response": body}))
    return sse(frames, hang=hang, server=server)


def gated(step: Step, gate: threading.Event, timeout: float = 10.0) -> Step:
    """``step``, once ``gate`` is set (the request stays open until then)."""

    def run(handler: BaseHTTPRequestHandler) -> None:
        gate.wait(timeout)
        step(handler)

    return run


# -- the fake runner ------------------------------------------------------------------


@dataclass
class FakeExec:
    stdout: bytes | str = b""
    stderr: bytes | str = b""
    exit_code: int | None = 0
    timed_out: bool = False
    hang: bool = False
    """Run until cancelled."""
    error: str | None = None
    duration_s: float = 0.25
    limit: str | None = None


@dataclass
class RunRecord:
    argv: list[str]
    cwd: str
    policy: SandboxPolicy
    timeout_ms: int | None
    call_id: str
    env: Mapping[str, str] | None
    sandbox_cwd: str | None = None
    env_passthrough: list[str] = field(default_factory=list)
    limits: object = None

    @property
    def sandboxed(self) -> bool:
        return not self.policy.is_unrestricted()


def _b(data: bytes | str) -> bytes:
    return data.encode() if isinstance(data, str) else data


class FakeRunner(CommandRunner):
    """Answers every command with ``respond(argv, sandboxed)``; records what it ran.

    File operations (patches, AGENTS.md) are carried out here, in this process, without
    a sandbox: the session's logic is what these tests are about; the sandbox's part is
    tested with real daemons (tests/integration/test_containment_agent.py). The policy of
    each batch (or conversation of batches) is recorded in ``fileops``."""

    def __init__(self, respond: Callable[[list[str], bool], FakeExec] | None = None) -> None:
        self.respond = respond or (lambda argv, sandboxed: FakeExec(stdout=f"ran {' '.join(argv)}\n"))
        self.runs: list[RunRecord] = []
        self.fileops: list[SandboxPolicy] = []
        self.cancelled: list[str] = []
        self.started = asyncio.Event()
        self._cancel: dict[str, asyncio.Event] = {}

    async def run(self, argv, cwd, sandbox_policy, timeout_ms, on_output: OutputCallback | None = None, *,
                  call_id=None, env=None, sandbox_cwd=None, env_passthrough=(), limits=None) -> ExecResult:
        record = RunRecord(list(argv), cwd, sandbox_policy, timeout_ms, call_id or f"run-{len(self.runs)}", env,
                           sandbox_cwd, list(env_passthrough), limits)
        self.runs.append(record)
        spec = self.respond(list(argv), record.sandboxed)
        aggregated = HeadTailBuffer()
        for stream, data in ((ExecOutputStream.STDOUT, _b(spec.stdout)), (ExecOutputStream.STDERR, _b(spec.stderr))):
            for start in range(0, len(data), 4096):
                chunk = data[start:start + 4096]
                aggregated.write(chunk)
                if on_output is not None:
                    on_output(stream, chunk)
        self.started.set()
        if spec.hang:
            cancelled = self._cancel.setdefault(record.call_id, asyncio.Event())
            try:
                await cancelled.wait()
            except asyncio.CancelledError:
                self.cancelled.append(record.call_id)
                raise
            return ExecResult(aborted=True, stdout=_b(spec.stdout), aggregated=aggregated.getvalue())
        return ExecResult(exit_code=spec.exit_code, timed_out=spec.timed_out, duration_s=spec.duration_s,
                          stdout=_b(spec.stdout), stderr=_b(spec.stderr), aggregated=aggregated.getvalue(),
                          error=spec.error, limit=spec.limit)

    async def run_fileops(self, batch, cwd, sandbox_policy, timeout_ms, *, sandbox_cwd=None, limits=None) -> ExecResult:
        self.fileops.append(sandbox_policy)
        return ExecResult(exit_code=0, stdout=fileops.encode(fileops.run(fileops.decode(batch))))

    async def start_interactive(self, argv, cwd, sandbox_policy, on_output: OutputCallback | None = None, *,
                                tty=None, stdin=True, on_exit=None, call_id=None, env=None, sandbox_cwd=None,
                                env_passthrough=(), limits=None, fileops=False) -> InteractiveProcess:
        if not fileops:
            return await super().start_interactive(argv, cwd, sandbox_policy, on_output)
        self.fileops.append(sandbox_policy)
        return _Fileops(on_output)

    async def cancel(self, call_id: str) -> None:
        self.cancelled.append(call_id)
        self._cancel.setdefault(call_id, asyncio.Event()).set()


class _Fileops(InteractiveProcess):
    """The fileops builtin's conversation, here in this process: each line written is a
    batch, answered at once (see :class:`FakeRunner`)."""

    call_id, pid, tty = "fileops", None, False

    def __init__(self, on_output: OutputCallback) -> None:
        self.on_output = on_output
        self._result: ExecResult | None = None

    @property
    def done(self) -> bool:
        return self._result is not None

    @property
    def result(self) -> ExecResult | None:
        return self._result

    async def write(self, data: bytes) -> bool:
        for line in data.splitlines():
            self.on_output(ExecOutputStream.STDOUT, fileops.encode(fileops.run(fileops.decode(line))) + b"\n")
        return not self.done

    def close_stdin(self) -> None:
        self._result = ExecResult(exit_code=0)

    def resize(self, rows: int, cols: int) -> None:
        pass

    def hold_output(self, held: bool) -> None:
        pass

    async def cancel(self) -> None:
        self._result = ExecResult(aborted=True)

    async def wait(self) -> ExecResult:
        assert self._result is not None, "the conversation waited on before its end"
        return self._result


# -- a session under test -----------------------------------------------------------

SESSION_API_KEY = "sk-session-test-5f2c9e1d"


def tag(event: Event) -> str:
    return type(event.msg).__struct_config__.tag


class Harness:
    """One Session over ``server`` and ``runner``, with its events collected."""

    def __init__(self, server: FakeModelServer, runner: FakeRunner, tmp_path: Path, **kwargs: Any) -> None:
        self.server = server
        self.runner = runner
        self.home = tmp_path / "home"
        self.cwd = tmp_path / "work"
        self.cwd.mkdir(exist_ok=True)
        self.events: list[Event] = []
        self.session = Session(self.events.append, runner, home=self.home, env={}, backoff_base=0.001, **kwargs)
        self._next = 0

    def configure_op(self, **overrides: Any) -> ConfigureSession:
        fields: dict[str, Any] = {
            "provider": ModelProviderInfo(name="fake", base_url=self.server.base_url, env_key="FAKE_KEY",
                                          wire_api=WireApi.RESPONSES),
            "model": "test-model",
            "approval_policy": AskForApproval.ON_REQUEST,
            "sandbox_policy": SandboxPolicy.from_mode("workspace-write"),
            "cwd": str(self.cwd),
            "api_key": SESSION_API_KEY,
        }
        fields.update(overrides)
        return ConfigureSession(**fields)

    async def submit(self, op: Any, sub_id: str | None = None) -> str:
        if sub_id is None:
            self._next += 1
            sub_id = f"s{self._next}"
        await self.session.submit(Submission(sub_id, op))
        return sub_id

    async def configure(self, **overrides: Any) -> Event:
        sub_id = await self.submit(self.configure_op(**overrides))
        return self.last(sub_id)

    async def say(self, text: str) -> str:
        return await self.submit(UserInput([TextInput(text)]))

    async def until(self, predicate: str | Callable[[Event], bool], timeout: float = 10.0, after: int = 0) -> Event:
        """The first event (from index ``after``) with that tag / matching, waiting for it."""
        check = (lambda e: tag(e) == predicate) if isinstance(predicate, str) else predicate
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            for event in self.events[after:]:
                if check(event):
                    return event
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"no {predicate} event; got {self.tags()}")
            await asyncio.sleep(0.002)

    async def done(self, sub_id: str, timeout: float = 10.0) -> Event:
        """The task's final event: task_complete, turn_aborted or an error."""
        return await self.until(
            lambda e: e.id == sub_id and tag(e) in ("task_complete", "turn_aborted", "error"), timeout)

    async def settled(self, timeout: float = 10.0) -> None:
        """Wait until every task the session started (it names them ``task-<id>``) has
        ended, an interrupted one included, and any one started as they ended: after
        that, nothing of theirs can still start a command or send an event."""
        deadline = asyncio.get_running_loop().time() + timeout
        while running := [t for t in asyncio.all_tasks() if t.get_name().startswith("task-") and not t.done()]:
            left = deadline - asyncio.get_running_loop().time()
            assert left > 0, f"tasks still running after {timeout:g} s: {[t.get_name() for t in running]}"
            await asyncio.wait(running, timeout=left)

    def last(self, sub_id: str) -> Event:
        return [e for e in self.events if e.id == sub_id][-1]

    def tags(self, sub_id: str | None = None, *, deltas: bool = True) -> list[str]:
        out = [tag(e) for e in self.events if sub_id is None or e.id == sub_id]
        if not deltas:
            out = [t for t in out if not t.endswith("_delta")]
        return out

    def of(self, kind: str, sub_id: str | None = None) -> list[Any]:
        return [e.msg for e in self.events if tag(e) == kind and (sub_id is None or e.id == sub_id)]


def user_item(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def conversation(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items`` (a request's input, a session's history) without the environment context
    messages: what was said."""
    return [i for i in items if not is_environment_context(i)]


def outputs_of(request: dict[str, Any]) -> dict[str, str]:
    return {i["call_id"]: i["output"] for i in request["input"] if i["type"] == "function_call_output"}
