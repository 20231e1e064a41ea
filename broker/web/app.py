"""The web application: the page, its assets, and the API the page calls.

==========================================  ==================================================
route                                       what
==========================================  ==================================================
``GET /``                                   the page (``/?token=...`` lets in: :mod:`.guard`)
``GET /static/...``                         its scripts, styles and vendored xterm.js
``GET /api/sessions/stream``                server-sent events: the session list, on change
``POST /api/sessions``                      start a session (as ``sluice exec --detach``)
``GET /api/sessions/{id}/events``           server-sent events: a session's events, the tail
                                            first (or from ``?since=N``, or ``Last-Event-ID``),
                                            through the session's one hub (:mod:`.hub`)
``GET /api/sessions/{id}/range``            events ``?first=A&last=B`` (scrolling up)
``POST /api/sessions/{id}/input``           a follow-up message
``POST /api/sessions/{id}/interrupt``       interrupt the running turn
``POST /api/sessions/{id}/approval``        answer an approval request (first answer wins)
``POST /api/sessions/{id}/stdin``           type into a running interactive command
                                            (``exec_command_stdin``; every frontend sees it)
``POST /api/sessions/{id}/shutdown``        shut the session down
``POST /api/run``                           one sandboxed command, its output streamed back
                                            as JSON lines (``sluice run``)
==========================================  ==================================================

Events go to the page as the Codex JSON the bridge writes (``seq`` set, output chunks in
base64); the page renders them itself, as text (see ``static/render.js``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import sys
import time
from importlib import resources

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from broker.net.runtime import RuntimeDir, with_source_root
from broker.web.guard import csrf_value
from broker.web.hub import follow
from broker.web.link import CommandRun, Control, Refused, Unavailable, event_range
from broker.wire.protocol import (
    STDIN_TYPED_MAX,
    ExecApproval,
    ExecCommandStdin,
    Interrupt,
    PatchApproval,
    ReviewDecision,
    Shutdown,
    TextInput,
    UserInput,
)

# Events a page gets first; earlier ones come as it scrolls up (at most RANGE_MAX a time).
TAIL_EVENTS = 2000
RANGE_MAX = 5000
# How often the session list is asked for while a page shows it, and how long an answer
# serves every page (so twenty tabs cost the daemon what one does).
LIST_EVERY_S = 1.0
KEEPALIVE_S = 15.0
START_TIMEOUT_S = 60.0
SANDBOX_MODES = ("read-only", "workspace-write", "danger-full-access")
APPROVAL_POLICIES = ("untrusted", "on-failure", "on-request", "never")
STATIC = resources.files("broker.web") / "static"


class BadRequest(Exception):
    pass


class Web:
    """The app's state: the daemon link and the token-derived page secret."""

    def __init__(self, runtime: RuntimeDir, token: str) -> None:
        self.runtime = runtime
        self.csrf = csrf_value(token)
        self.control = Control(runtime)
        # session id -> its one attachment, shared by the tabs (broker.web.hub).
        self.hubs: dict = {}
        self._listing: tuple[float, bytes] | None = None
        self._listing_lock = asyncio.Lock()
        self.index = (STATIC / "index.html").read_text()

    # -- the page ---------------------------------------------------------------------

    async def page(self, request: Request) -> Response:
        return Response(self.index.replace("{{csrf}}", self.csrf), media_type="text/html; charset=utf-8")

    # -- the session list -------------------------------------------------------------

    async def listing(self) -> bytes:
        """The session list as JSON, asked of the daemon at most once a :data:`LIST_EVERY_S`."""
        async with self._listing_lock:
            now = time.monotonic()
            if self._listing is None or now - self._listing[0] >= LIST_EVERY_S * 0.9:
                found = await self.control.sessions()
                self._listing = (now, msgspec.json.encode(found))
            return self._listing[1]

    async def sessions_stream(self, request: Request) -> Response:
        async def stream():
            last = None
            while True:
                try:
                    data, kind = await self.listing(), b"sessions"
                except Unavailable as e:
                    data, kind = json.dumps({"message": str(e)}).encode(), b"unavailable"
                if data != last:
                    # The daemon's clock for the sessions' ages: the browser's may differ.
                    yield b"event: " + kind + b"\ndata: " + b'{"now":%.3f,"list":' % time.time() + data + b"}\n\n"
                    last = data
                await asyncio.sleep(LIST_EVERY_S)

        return _sse(stream())

    async def start_session(self, request: Request) -> Response:
        body = await _json(request)
        cwd = _text(body, "cwd")
        prompt = _text(body, "prompt")
        if not cwd or not os.path.isabs(cwd) or not os.path.isdir(cwd):
            raise BadRequest("the directory must be an absolute path to an existing directory")
        if not prompt.strip():
            raise BadRequest("the task is empty")
        # Every value joined to its option (--model=VALUE): a value starting with "-"
        # stays a value, never an option of its own.
        argv = [sys.executable, "-m", "broker", "exec", "--detach", f"--cd={cwd}"]
        for key, flag, allowed in (("model", "--model", None), ("approval", "--approval-policy", APPROVAL_POLICIES),
                                   ("sandbox", "--sandbox", SANDBOX_MODES)):
            value = _text(body, key)
            if value:
                if allowed is not None and value not in allowed:
                    raise BadRequest(f"{key} must be one of {', '.join(allowed)}")
                argv.append(f"{flag}={value}")
        argv.append("-")
        # `sluice exec --detach` itself: the configuration, the provider's key and the
        # commands' environment resolved exactly as on the command line, in this process's
        # environment (the user's), never in the daemon's.
        env = with_source_root(dict(os.environ, SLUICE_RUNTIME_DIR=self.runtime.path))
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env)
        try:
            out, err = await asyncio.wait_for(proc.communicate(prompt.encode()), START_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return _error(504, "starting the session took too long")
        if proc.returncode != 0:
            lines = err.decode(errors="replace").strip().splitlines()
            return _error(400, lines[-1] if lines else f"sluice exec exited {proc.returncode}")
        return JSONResponse({"session": out.decode().strip()})

    # -- one session ------------------------------------------------------------------

    async def events(self, request: Request) -> Response:
        session_id = request.path_params["id"]
        since = await self._since(request, session_id)

        async def stream():
            items = follow(self.runtime, self.hubs, session_id, since, KEEPALIVE_S)
            try:
                async for item in items:
                    kind = item[0]
                    if kind == "events":
                        yield b"id: %d\nevent: events\ndata: " % item[2] + item[3] + b"\n\n"
                    elif kind == "idle":
                        yield b": keep-alive\n\n"
                    elif kind == "attached":
                        info = msgspec.to_builtins(item[1])
                        yield b"event: attached\ndata: " + json.dumps({"since": since, **info}).encode() + b"\n\n"
                    else:
                        yield b"event: " + kind.encode() + b"\ndata: " + json.dumps({"message": item[1]}).encode() + b"\n\n"
                        return
            finally:
                await items.aclose()

        return _sse(stream())

    async def _since(self, request: Request, session_id: str) -> int:
        """Where a stream starts: after ``Last-Event-ID`` (the browser reconnecting), at
        ``?since=N``, else the tail (and the current turn's start if an approval waits)."""
        resume = request.headers.get("last-event-id", "")
        if resume.isdigit():
            return int(resume) + 1
        since = request.query_params.get("since", "")
        if since.isdigit():
            return int(since)
        try:
            found = await self.control.sessions()
        except Unavailable:
            return 0
        info = next((s for s in found.sessions if s.id == session_id), None)
        if info is None:
            return 0  # the daemon says what is wrong when the stream attaches
        start = max(1, info.seq - TAIL_EVENTS + 1)
        if info.pending_approvals and info.turn_start:
            start = min(start, info.turn_start)
        return start

    async def range(self, request: Request) -> Response:
        try:
            first = int(request.query_params["first"])
            last = int(request.query_params["last"])
        except (KeyError, ValueError):
            raise BadRequest("first and last must be event numbers") from None
        if first < 1 or last < first or last - first >= RANGE_MAX:
            raise BadRequest(f"first..last must be a range of at most {RANGE_MAX} events from 1 on")
        data = await asyncio.to_thread(event_range, self.runtime, request.path_params["id"], first, last)
        return Response(data, media_type="application/json")

    async def input(self, request: Request) -> Response:
        text = _text(await _json(request), "text")
        if not text.strip():
            raise BadRequest("the message is empty")
        await self.control.submit(request.path_params["id"], UserInput([TextInput(text)]))
        return JSONResponse({})

    async def interrupt(self, request: Request) -> Response:
        await self.control.submit(request.path_params["id"], Interrupt())
        return JSONResponse({})

    async def shutdown(self, request: Request) -> Response:
        await self.control.submit(request.path_params["id"], Shutdown())
        return JSONResponse({})

    async def stdin(self, request: Request) -> Response:
        """What a person types into a running command of the session's terminal view."""
        body = await _json(request)
        call_id, text = _text(body, "call_id"), _text(body, "text")
        if not call_id:
            raise BadRequest("call_id names the command to type into")
        if not text:
            raise BadRequest("nothing to type")
        if len(text) > STDIN_TYPED_MAX:
            raise BadRequest(f"at most {STDIN_TYPED_MAX} characters are typed at once")
        sub_id = await self.control.type_into(request.path_params["id"], ExecCommandStdin(call_id, text))
        return JSONResponse({"id": sub_id})

    async def approval(self, request: Request) -> Response:
        body = await _json(request)
        try:
            decision = ReviewDecision(_text(body, "decision"))
        except ValueError:
            raise BadRequest("decision must be approved, approved_for_session, denied or abort") from None
        kind = _text(body, "kind")
        answer = {"exec": ExecApproval, "patch": PatchApproval}.get(kind)
        if answer is None:
            raise BadRequest("kind must be exec or patch")
        await self.control.submit(request.path_params["id"], answer(_text(body, "id"), decision))
        return JSONResponse({})

    # -- the command box --------------------------------------------------------------

    async def run(self, request: Request) -> Response:
        body = await _json(request)
        try:
            argv = shlex.split(_text(body, "command"))
        except ValueError as e:
            raise BadRequest(f"the command does not parse: {e}") from None
        if not argv:
            raise BadRequest("the command is empty")
        sandbox = _text(body, "sandbox") or "workspace-write"
        if sandbox not in SANDBOX_MODES:
            raise BadRequest(f"sandbox must be one of {', '.join(SANDBOX_MODES)}")
        writable = body.get("writable") or []
        if not isinstance(writable, list) or not all(isinstance(w, str) for w in writable):
            raise BadRequest("writable must be a list of directories")
        options = {"sandbox": sandbox, "writable": [w for w in writable if w.strip()],
                   "network": bool(body.get("network"))}
        cwd = _text(body, "cwd")
        if cwd:
            options["cwd"] = cwd
        run = CommandRun(self.runtime, argv, **options)
        run.start()

        async def stream():
            try:
                while True:
                    item = await run.next()
                    if item[0] == "output":
                        yield json.dumps({"stream": item[1], "text": item[2]}).encode() + b"\n"
                    elif item[0] == "exit":
                        yield json.dumps({"exit": _outcome(item[1])}).encode() + b"\n"
                        return
                    else:
                        yield json.dumps({"error": item[1]}).encode() + b"\n"
                        return
            finally:
                run.stop()

        return StreamingResponse(stream(), media_type="application/x-ndjson")


def _outcome(result) -> dict:
    """How a command of the command box ended (its output has been streamed already)."""
    fields = ("exit_code", "signal", "timed_out", "aborted", "duration_s", "error", "limit")
    return {"returncode": result.returncode, **{name: getattr(result, name) for name in fields}}


def _sse(stream) -> StreamingResponse:
    return StreamingResponse(stream, media_type="text/event-stream", headers={"x-accel-buffering": "no"})


async def _json(request: Request) -> dict:
    try:
        body = await request.json()
    except ValueError:
        raise BadRequest("the request body must be JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def _text(body: dict, key: str) -> str:
    value = body.get(key, "")
    if not isinstance(value, str):
        raise BadRequest(f"{key} must be a string")
    return value


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def make_app(runtime: RuntimeDir, token: str) -> Starlette:
    web = Web(runtime, token)

    async def bad_request(request, exc):
        return _error(400, str(exc))

    async def refused(request, exc):
        return _error(404, str(exc))

    async def unavailable(request, exc):
        return _error(503, str(exc))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        web.control.start()
        try:
            yield
        finally:
            web.control.close()

    app = Starlette(
        routes=[
            Route("/", web.page),
            Route("/api/sessions/stream", web.sessions_stream),
            Route("/api/sessions", web.start_session, methods=["POST"]),
            Route("/api/sessions/{id}/events", web.events),
            Route("/api/sessions/{id}/range", web.range),
            Route("/api/sessions/{id}/input", web.input, methods=["POST"]),
            Route("/api/sessions/{id}/interrupt", web.interrupt, methods=["POST"]),
            Route("/api/sessions/{id}/approval", web.approval, methods=["POST"]),
            Route("/api/sessions/{id}/stdin", web.stdin, methods=["POST"]),
            Route("/api/sessions/{id}/shutdown", web.shutdown, methods=["POST"]),
            Route("/api/run", web.run, methods=["POST"]),
            Mount("/static", app=StaticFiles(directory=str(STATIC)), name="static"),
        ],
        exception_handlers={BadRequest: bad_request, Refused: refused, Unavailable: unavailable},
        lifespan=lifespan,
    )
    app.state.web = web
    return app
