"""The model client: one streamed model request, with Codex's retry policy.

``ModelClient(provider).stream(prompt)`` sends ``prompt`` (Responses API ``input``
items as plain dicts, instructions, tools in the Responses shape, model) and yields
:data:`ResponseEvent` values as the answer streams in::

    Created()                          the model started answering
    OutputTextDelta(delta)             assistant text, as it comes
    ReasoningSummaryDelta(delta)       reasoning summary text, as it comes
    ReasoningContentDelta(delta)       raw reasoning text, as it comes
    OutputItemDone(item)               a finished output item (message, function_call,
                                       local_shell_call, reasoning, ...) as a dict
    Completed(response_id, token_usage)   always the last event; usage may be None

Deltas are live. Output items of one attempt are held back until that attempt has
completed and then delivered, just before ``Completed``: if the stream breaks and the
request is retried, the caller never sees (or acts on, e.g. runs a command for) an item
of the broken attempt. Deltas seen before a break may be seen again after the retry;
the retry announcement (below) tells the caller it happened.

Wire APIs
---------

``wire_api = "responses"`` (OpenAI): ``POST {base_url}/responses`` with ``stream:
true`` and ``store`` (false when ``disable_response_storage``; reasoning models then
get ``include: ["reasoning.encrypted_content"]``), headers ``Authorization: Bearer``,
``OpenAI-Beta: responses=experimental`` and ``Accept: text/event-stream``. The SSE
stream's events carry a ``type``: ``response.created``, ``response.output_text.delta``,
``response.reasoning_summary_text.delta``, ``response.reasoning_text.delta``,
``response.output_item.done``, and the end: ``response.completed`` (its ``usage``
becomes a :class:`~broker.wire.protocol.TokenCountEvent`), ``response.failed`` (its
``error.message``), ``response.incomplete`` or an ``error`` event. Others are ignored.

``wire_api = "chat"``: ``POST {base_url}/chat/completions``; see
:mod:`agent.chat_completions` for the conversion both ways.

Retry policy
------------

Two budgets per call of ``stream``, from the provider (Codex's defaults):

- ``request_max_retries`` (4): the request failed before a stream began: connection
  error or timeout, HTTP 429, HTTP 5xx;
- ``stream_max_retries`` (10): the stream began but broke before completing: the
  connection dropped or the body ended without ``response.completed`` / ``[DONE]``,
  no byte for ``stream_idle_timeout_ms``, or a ``response.failed`` that is worth
  retrying (not ``context_length_exceeded``, ``insufficient_quota`` and the like).

Retry *n* waits ``backoff_base * 2**(n-1)`` (200 ms, 400 ms, 800 ms, ...) times a
jitter in [0.9, 1.1), unless the server said how long: a ``Retry-After`` header
(seconds or an HTTP date), ``retry-after-ms``, or "try again in 1.5s" in the error
message. Before waiting, ``on_retry`` gets the announcement, worded as Codex words it
(the agent forwards it as a ``background_event``)::

    stream error: unexpected status 429 Too Many Requests: Rate limit reached; retrying 1/4 in 1.5s…

with the delay printed as Rust prints a ``Duration`` (``203ms``, ``1.5s``). When a
budget runs out, :class:`ModelError` with a one-line message. Any other 4xx (401, 400,
404, ...) is not retried: :class:`ModelError` with the status and the server's own
error message. The API key is only ever in the ``Authorization`` header; it is scrubbed
from every message this module produces and never logged.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import importlib.metadata
import inspect
import json
import random
import re
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import structlog

from agent.chat_completions import ChatStreamAssembler, chat_messages, chat_tools
from agent.provider import ResolvedProvider
from agent.sse import ServerSentEvent, SSEDecoder, SSEError
from broker.net.logging import Throttle
from broker.wire.frames import one_line
from broker.wire.protocol import TokenCountEvent, WireApi

log = structlog.get_logger("agent.model_client")
_throttled = Throttle(log)

TokenUsage = TokenCountEvent
"""Token counts of one response; Codex's ``TokenUsage`` is its ``token_count`` event."""

try:
    USER_AGENT = f"sluice/{importlib.metadata.version('sluice')}"
except importlib.metadata.PackageNotFoundError:
    USER_AGENT = "sluice"

DEFAULT_BACKOFF_BASE = 0.2
DEFAULT_CONNECT_TIMEOUT = 30.0

# response.failed / 429 error codes that the same request cannot cure.
_FATAL_CODES = frozenset({
    "context_length_exceeded",
    "insufficient_quota",
    "invalid_prompt",
    "usage_limit_reached",
    "usage_not_included",
})
_TRY_AGAIN = re.compile(r"try again in\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|secs|seconds?)\b", re.IGNORECASE)


# -- what goes in, what comes out -----------------------------------------------------


def reasoning_param(model: str, effort: str | None, summary: str | None) -> dict[str, Any] | None:
    """The Responses API ``reasoning`` for ``model``, as Codex sends it: only to models
    that reason (names starting with ``o``, ``codex`` or ``gpt-5``), never with effort
    ``none``; effort defaults to ``medium`` and the summary to ``auto`` (``none``: no
    summary asked for)."""
    effort = effort or "medium"
    if effort == "none" or not model.startswith(("o", "codex", "gpt-5")):
        return None
    reasoning: dict[str, Any] = {"effort": effort}
    summary = summary or "auto"
    if summary != "none":
        reasoning["summary"] = summary
    return reasoning


@dataclass
class Prompt:
    """One model request."""

    input: list[dict[str, Any]]
    """Responses API input items: messages, function_call, function_call_output, ..."""
    instructions: str | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    """Tool declarations in the Responses shape (``{"type": "function", "name", ...}``)."""
    model: str | None = None
    """None: the client's model."""
    reasoning: dict[str, Any] | None = None
    """Responses API ``reasoning`` (``{"effort": ..., "summary": ...}``), for reasoning models."""
    parallel_tool_calls: bool = False
    prompt_cache_key: str | None = None
    """None: the client's session id, if it has one."""


@dataclass(frozen=True, slots=True)
class Created:
    pass


@dataclass(frozen=True, slots=True)
class OutputItemDone:
    item: dict[str, Any]


@dataclass(frozen=True, slots=True)
class OutputTextDelta:
    delta: str


@dataclass(frozen=True, slots=True)
class ReasoningSummaryDelta:
    delta: str


@dataclass(frozen=True, slots=True)
class ReasoningContentDelta:
    delta: str


@dataclass(frozen=True, slots=True)
class Completed:
    response_id: str
    token_usage: TokenUsage | None = None


ResponseEvent = Created | OutputItemDone | OutputTextDelta | ReasoningSummaryDelta | ReasoningContentDelta | Completed

RetryCallback = Callable[[str], Awaitable[None] | None]


class ModelError(Exception):
    """The model request failed for good; ``str()`` is one line for a person.

    ``status`` is the HTTP status when there was one; ``code`` the server's error code.
    """

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


# -- retry arithmetic and wording -----------------------------------------------------


def backoff_delay(attempt: int, *, base: float = DEFAULT_BACKOFF_BASE, rng: random.Random | None = None) -> float:
    """Seconds to wait before retry ``attempt`` (1-based): Codex's 200 ms * 2^(n-1), ±10 %,
    in whole milliseconds."""
    jitter = (rng or random).uniform(0.9, 1.1)
    return int(base * 1000 * 2 ** max(attempt - 1, 0) * jitter) / 1000


def format_delay(seconds: float) -> str:
    """``seconds`` as Rust's ``{:?}`` prints a ``Duration``: ``0ns``, ``250µs``, ``203ms``, ``1.5s``."""
    total = max(0, round(seconds * 1_000_000_000))
    secs, nanos = divmod(total, 1_000_000_000)
    if secs:
        whole, fraction, width, unit = secs, nanos, 9, "s"
    elif nanos >= 1_000_000:
        whole, fraction = divmod(nanos, 1_000_000)
        width, unit = 6, "ms"
    elif nanos >= 1_000:
        whole, fraction = divmod(nanos, 1_000)
        width, unit = 3, "µs"
    else:
        return f"{nanos}ns"
    digits = str(fraction).rjust(width, "0").rstrip("0")
    return f"{whole}.{digits}{unit}" if digits else f"{whole}{unit}"


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # Loading the CA bundle takes ~15 ms; one context serves every client of the process
    # (the agent makes one per session), instead of one load per session configured.
    return httpx.create_ssl_context()


def retry_message(reason: str, attempt: int, max_retries: int, delay: float) -> str:
    """The retry announcement, as Codex words it."""
    return f"stream error: {reason}; retrying {attempt}/{max_retries} in {format_delay(delay)}…"


def parse_retry_after(headers: httpx.Headers, body_message: str = "", *, now: float | None = None) -> float | None:
    """Seconds the server asked us to wait, if it said: ``retry-after-ms``, ``Retry-After``
    (seconds or an HTTP date), or "try again in Xs" in its message."""
    value = headers.get("retry-after-ms")
    if value:
        try:
            return max(float(value) / 1000, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value:
        try:
            return max(float(value), 0.0)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value).timestamp()
            except (TypeError, ValueError, IndexError):
                when = None
            if when is not None:
                return max(when - (time.time() if now is None else now), 0.0)
    return try_again_in(body_message)


def try_again_in(message: str) -> float | None:
    found = _TRY_AGAIN.search(message or "")
    if not found:
        return None
    amount = float(found.group(1))
    return amount / 1000 if found.group(2).lower() == "ms" else amount


class _Retryable(Exception):
    """One attempt failed in a way worth retrying."""

    budget = "request"

    def __init__(self, reason: str, delay: float | None = None, *, status: int | None = None,
                 hint: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.delay = delay
        self.status = status
        # What to check, added to the error once the retries are used up.
        self.hint = hint


class _StreamBroke(_Retryable):
    budget = "stream"

    def __init__(self, reason: str, delay: float | None = None) -> None:
        # Codex's wording for a stream error.
        super().__init__(f"stream disconnected before completion: {reason}", delay)


# -- the client -----------------------------------------------------------------------


class ModelClient:
    """Streams model responses from one provider. Use as ``async with`` or call ``aclose``.

    ``on_retry`` receives each retry announcement (a plain or an async function);
    ``backoff_base`` scales the waits (tests make it small); ``http_client`` lets a
    caller share or instrument an ``httpx.AsyncClient`` (not closed by ``aclose``).
    """

    def __init__(
        self,
        provider: ResolvedProvider,
        *,
        model: str | None = None,
        disable_response_storage: bool = False,
        session_id: str | None = None,
        on_retry: RetryCallback | None = None,
        backoff_base: float = DEFAULT_BACKOFF_BASE,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        http_client: httpx.AsyncClient | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.provider = provider
        self.model = model
        self.disable_response_storage = disable_response_storage
        self.session_id = session_id
        self.on_retry = on_retry
        self.backoff_base = backoff_base
        self._rng = rng or random.Random()
        idle = provider.stream_idle_timeout
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient(
            timeout=httpx.Timeout(idle, connect=connect_timeout), follow_redirects=False, verify=_ssl_context()
        )

    def __repr__(self) -> str:
        return f"ModelClient(provider={self.provider!r}, model={self.model!r})"

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> ModelClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def stream(self, prompt: Prompt, *, on_retry: RetryCallback | None = None) -> AsyncIterator[ResponseEvent]:
        """The response to ``prompt`` as events, retrying as the module docstring says.

        Raises :class:`ModelError` when the request cannot succeed.
        """
        announce = on_retry or self.on_retry
        budgets = {"request": self.provider.request_max_retries, "stream": self.provider.stream_max_retries}
        used = {"request": 0, "stream": 0}
        attempt = self._responses_attempt if self.provider.wire_api == WireApi.RESPONSES else self._chat_attempt
        while True:
            try:
                async with aclosing(attempt(prompt)) as events:
                    async for event in events:
                        yield event
                return
            except _Retryable as failure:
                kind, reason = failure.budget, self._scrub(failure.reason)
                if used[kind] >= budgets[kind]:
                    if failure.status is not None:
                        message = f"exceeded retry limit, last status: {reason.removeprefix('unexpected status ')}"
                    else:
                        message = f"{reason} (gave up after {used[kind]} retries){failure.hint}"
                    raise ModelError(message, status=failure.status) from None
                used[kind] += 1
                delay = failure.delay
                if delay is None:
                    delay = backoff_delay(used[kind], base=self.backoff_base, rng=self._rng)
                log.warning("model request retry", provider=self.provider.id, reason=reason,
                            retry=used[kind], max_retries=budgets[kind], delay_s=delay)
                if announce is not None:
                    result = announce(retry_message(reason, used[kind], budgets[kind], delay))
                    if inspect.isawaitable(result):
                        await result
                await asyncio.sleep(delay)

    # -- one attempt per wire API -----------------------------------------------------

    def _model(self, prompt: Prompt) -> str:
        model = prompt.model or self.model
        if not model:
            raise ModelError("no model given: set `model` in config.toml or pass --model")
        return model

    async def _responses_attempt(self, prompt: Prompt) -> AsyncIterator[ResponseEvent]:
        payload: dict[str, Any] = {
            "model": self._model(prompt),
            "instructions": prompt.instructions or "",
            "input": prompt.input,
            "tools": prompt.tools,
            "tool_choice": "auto",
            "parallel_tool_calls": prompt.parallel_tool_calls,
            "store": not self.disable_response_storage,
            "stream": True,
        }
        if prompt.reasoning is not None:
            payload["reasoning"] = prompt.reasoning
            if self.disable_response_storage:
                payload["include"] = ["reasoning.encrypted_content"]
        cache_key = prompt.prompt_cache_key or self.session_id
        if cache_key:
            payload["prompt_cache_key"] = cache_key
        headers = {"OpenAI-Beta": "responses=experimental"}

        items: list[dict[str, Any]] = []
        completed: Completed | None = None
        async with self._post("responses", payload, headers) as response, aclosing(self._events(response)) as stream:
            async for sse in stream:
                data = _json_object(sse)
                if data is None:
                    continue
                kind = data.get("type") or sse.event
                if kind == "response.created":
                    yield Created()
                elif kind == "response.output_text.delta":
                    if isinstance(data.get("delta"), str):
                        yield OutputTextDelta(data["delta"])
                elif kind == "response.reasoning_summary_text.delta":
                    if isinstance(data.get("delta"), str):
                        yield ReasoningSummaryDelta(data["delta"])
                elif kind == "response.reasoning_text.delta":
                    if isinstance(data.get("delta"), str):
                        yield ReasoningContentDelta(data["delta"])
                elif kind == "response.output_item.done":
                    if isinstance(data.get("item"), dict):
                        items.append(data["item"])
                elif kind == "response.completed":
                    body = data.get("response") or {}
                    usage = body.get("usage")
                    completed = Completed(
                        str(body.get("id") or ""),
                        _responses_usage(usage) if isinstance(usage, dict) else None,
                    )
                    break
                elif kind == "response.failed":
                    error = (data.get("response") or {}).get("error") or {}
                    raise self._stream_error(error, "response.failed event received")
                elif kind == "error":
                    raise self._stream_error(data.get("error") if isinstance(data.get("error"), dict) else data,
                                             "error event received")
                elif kind == "response.incomplete":
                    details = (data.get("response") or {}).get("incomplete_details") or {}
                    reason = details.get("reason") or "unknown"
                    raise ModelError(f"incomplete response returned, reason: {reason}", code=str(reason))
        if completed is None:
            raise _StreamBroke("stream closed before response.completed")
        for item in items:
            yield OutputItemDone(item)
        yield completed

    async def _chat_attempt(self, prompt: Prompt) -> AsyncIterator[ResponseEvent]:
        payload: dict[str, Any] = {
            "model": self._model(prompt),
            "messages": chat_messages(prompt.instructions, prompt.input),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        tools = chat_tools(prompt.tools)
        if tools:
            payload["tools"] = tools
        assembler = ChatStreamAssembler()
        created = done = False
        async with self._post("chat/completions", payload, {}) as response, aclosing(self._events(response)) as stream:
            try:
                async for sse in stream:
                    if sse.data.strip() == "[DONE]":
                        done = True
                        break
                    data = _json_object(sse)
                    if data is None:
                        continue
                    if data.get("error"):
                        error = data["error"] if isinstance(data["error"], dict) else {"message": str(data["error"])}
                        raise self._stream_error(error, "error chunk received")
                    if not created:
                        created = True
                        yield Created()
                    chunk = assembler.feed(data)
                    for text in chunk.reasoning:
                        yield ReasoningContentDelta(text)
                    for text in chunk.text:
                        yield OutputTextDelta(text)
            except _StreamBroke:
                # A server that said finish_reason and then went quiet or hung up without
                # [DONE] has still finished; only the usage chunk may be missing.
                if not assembler.finished:
                    raise
        if not (done or assembler.finished):
            raise _StreamBroke("stream closed before response.completed")
        for item in assembler.items():
            yield OutputItemDone(item)
        yield Completed(assembler.response_id, assembler.usage)

    # -- HTTP -------------------------------------------------------------------------

    @asynccontextmanager
    async def _post(self, path: str, payload: dict[str, Any], extra_headers: dict[str, str]) -> AsyncIterator[httpx.Response]:
        url = self.provider.url(path)
        headers = {"Accept": "text/event-stream", "User-Agent": USER_AGENT, **extra_headers, **self.provider.headers()}
        if self.session_id:
            headers["session_id"] = self.session_id
        request = self._http.build_request("POST", url, json=payload, headers=headers)
        try:
            response = await self._http.send(request, stream=True)
        except httpx.TimeoutException as err:
            raise _Retryable(f"timeout sending request for url ({url}): {type(err).__name__}",
                             hint=self._unreachable_hint(err)) from None
        except httpx.TransportError as err:
            raise _Retryable(f"error sending request for url ({url}): {_describe(err)}",
                             hint=self._unreachable_hint(err)) from None
        try:
            if not response.is_success:
                raise await self._status_error(response)
            yield response
        finally:
            await response.aclose()

    def _unreachable_hint(self, err: httpx.TransportError) -> str:
        """What to check when nothing answered at all: most often a wrong base_url, or a
        local server not started."""
        if not isinstance(err, (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol)):
            return ""
        return (f"; check base_url of model provider '{self.provider.name}' ({self.provider.base_url}) "
                "and that its server is running")

    async def _status_error(self, response: httpx.Response) -> Exception:
        try:
            body = (await response.aread()).decode("utf-8", "replace")
        except httpx.HTTPError:
            body = ""
        message, code = _error_message(body)
        status = response.status_code
        text = f"unexpected status {status} {response.reason_phrase or ''}".rstrip()
        if message:
            text += f": {message}"
        text = self._scrub(text)
        if status == 429 and code not in _FATAL_CODES or status >= 500:
            return _Retryable(text, parse_retry_after(response.headers, message), status=status)
        return ModelError(text, status=status, code=code)

    async def _events(self, response: httpx.Response) -> AsyncIterator[ServerSentEvent]:
        """SSE events of ``response``; a drop or a silence is :class:`_StreamBroke`."""
        idle = self.provider.stream_idle_timeout
        decoder = SSEDecoder()
        chunks = response.aiter_bytes()
        try:
            while True:
                try:
                    async with asyncio.timeout(idle):
                        chunk = await anext(chunks)
                except StopAsyncIteration:
                    return
                except (TimeoutError, httpx.TimeoutException):
                    raise _StreamBroke("idle timeout waiting for SSE") from None
                except httpx.TransportError as err:
                    raise _StreamBroke(_describe(err)) from None
                try:
                    events = decoder.feed(chunk)
                except SSEError as err:
                    # The same server would send it again: not worth a retry.
                    raise ModelError(f"the model server sent {err}") from None
                for event in events:
                    yield event
        finally:
            await chunks.aclose()

    def _stream_error(self, error: dict[str, Any], fallback: str) -> Exception:
        message = one_line(str(error.get("message") or "")) or fallback
        code = error.get("code") or error.get("type")
        code = str(code) if code else None
        message = self._scrub(message)
        if code in _FATAL_CODES:
            return ModelError(message, code=code)
        return _StreamBroke(message, try_again_in(message))

    def _scrub(self, text: str) -> str:
        key = self.provider.api_key
        if key is not None and key.reveal():
            text = text.replace(key.reveal(), "[redacted]")
        return text


def _json_object(sse: ServerSentEvent) -> dict[str, Any] | None:
    try:
        data = json.loads(sse.data)
    except (ValueError, RecursionError):
        # structlog keeps ``event`` for the message itself: the SSE event's name goes as sse_event.
        _throttled("warning", "model stream: skipped an event that is not JSON", sse_event=sse.event,
                   chars=len(sse.data))
        return None
    return data if isinstance(data, dict) else None


def _responses_usage(usage: dict[str, Any]) -> TokenUsage:
    input_tokens = usage.get("input_tokens") or 0
    output_tokens = usage.get("output_tokens") or 0
    return TokenCountEvent(
        input_tokens=input_tokens,
        cached_input_tokens=(usage.get("input_tokens_details") or {}).get("cached_tokens"),
        output_tokens=output_tokens,
        reasoning_output_tokens=(usage.get("output_tokens_details") or {}).get("reasoning_tokens"),
        total_tokens=usage.get("total_tokens") or input_tokens + output_tokens,
    )


def _error_message(body: str) -> tuple[str, str | None]:
    """The server's error message and code from an error body (OpenAI's JSON shape, or text)."""
    try:
        data = json.loads(body)
    except ValueError:
        return one_line(body), None
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, str):
            return one_line(error), None
        if isinstance(error, dict):
            code = error.get("code") or error.get("type")
            message = error.get("message") or error.get("detail") or ""
            return one_line(str(message)), (str(code) if code else None)
    return one_line(body), None


def _describe(err: httpx.HTTPError) -> str:
    return one_line(str(err)) or type(err).__name__
