"""The model client against a scripted HTTP server on loopback: both wire APIs, retries.

``FakeModelServer`` runs ``http.server`` in a thread; every request takes the next
scripted step (a function writing the raw HTTP response), and the requests are kept
for the assertions. Backoff is scaled down through ``backoff_base`` so retries take
milliseconds.
"""

from __future__ import annotations

import asyncio
import re
import socket
import time
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

import agent.sse

from agent.chat_completions import ChatStreamAssembler, chat_messages, chat_tools
from agent.provider import ResolvedProvider
from agent.model_client import (
    Completed,
    Created,
    ModelClient,
    ModelError,
    OutputItemDone,
    OutputTextDelta,
    Prompt,
    ReasoningContentDelta,
    ReasoningSummaryDelta,
    backoff_delay,
    format_delay,
    retry_message,
)
from broker.wire.protocol import ModelProviderInfo, TokenCountEvent, WireApi
from tests.support.fake_model import FakeModelServer, chat_chunk, sse, sse_frame, status

pytestmark = pytest.mark.timeout(20)

API_KEY = "sk-test-0123456789abcdef"
FAST = 0.001  # backoff base in seconds: retries after 1, 2, 4 ms


def responses_stream(text: str = "Hi there.", *, response_id: str = "resp_1", complete: bool = True,
                     items: list[dict[str, Any]] | None = None) -> list[bytes]:
    message = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
    frames = [sse_frame({"type": "response.created", "response": {"id": response_id}}, "response.created")]
    half = len(text) // 2
    for piece in (text[:half], text[half:]):
        frames.append(sse_frame({"type": "response.output_text.delta", "delta": piece}, "response.output_text.delta"))
    for item in (items if items is not None else [message]):
        frames.append(sse_frame({"type": "response.output_item.done", "item": item}, "response.output_item.done"))
    if complete:
        usage = {"input_tokens": 12, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 7,
                 "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 19}
        frames.append(sse_frame({"type": "response.completed", "response": {"id": response_id, "usage": usage}},
                                "response.completed"))
    return frames


def provider(server: FakeModelServer, wire_api: WireApi = WireApi.RESPONSES, **settings: Any) -> ResolvedProvider:
    info = ModelProviderInfo(name="fake", base_url=server.base_url, env_key="FAKE_KEY", wire_api=wire_api, **settings)
    return ResolvedProvider.from_info(info, API_KEY, id="fake")


def collect(client: ModelClient, prompt: Prompt | None = None) -> list[Any]:
    async def run() -> list[Any]:
        async with client:
            return [event async for event in client.stream(prompt or Prompt(input=[user("hello")], model="m1"))]

    return asyncio.run(run())


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


# -- Responses API --------------------------------------------------------------------


def test_responses_stream_becomes_events_with_token_usage(server: FakeModelServer) -> None:
    call = {"type": "function_call", "name": "shell", "arguments": '{"command":["ls"]}', "call_id": "call_1"}
    message = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi there."}]}
    frames = responses_stream(items=[message, call])
    # Comments, reasoning deltas and an event type the client ignores, among the rest.
    frames[1:1] = [
        b": keep-alive\n\n",
        sse_frame({"type": "response.reasoning_summary_text.delta", "delta": "**Plan**"}),
        sse_frame({"type": "response.reasoning_text.delta", "delta": "think"}),
        sse_frame({"type": "response.in_progress", "response": {}}),
    ]
    server.script(sse(frames))
    tools = [{"type": "function", "name": "shell", "description": "run", "strict": False,
              "parameters": {"type": "object", "properties": {}}}]
    prompt = Prompt(input=[user("hello")], instructions="be brief", tools=tools, model="o4-mini")

    events = collect(ModelClient(provider(server), session_id="sess-1"), prompt)

    assert events == [
        Created(),
        ReasoningSummaryDelta("**Plan**"),
        ReasoningContentDelta("think"),
        OutputTextDelta("Hi t"),
        OutputTextDelta("here."),
        OutputItemDone(message),
        OutputItemDone(call),
        Completed("resp_1", TokenCountEvent(input_tokens=12, cached_input_tokens=4, output_tokens=7,
                                            reasoning_output_tokens=2, total_tokens=19)),
    ]
    (request,) = server.requests
    assert request["path"] == "/v1/responses"
    assert request["headers"]["authorization"] == f"Bearer {API_KEY}"
    assert request["headers"]["openai-beta"] == "responses=experimental"
    assert request["headers"]["accept"] == "text/event-stream"
    body = request["json"]
    assert body["model"] == "o4-mini" and body["stream"] is True and body["store"] is True
    assert body["instructions"] == "be brief"
    assert body["input"] == [user("hello")] and body["tools"] == tools
    assert body["prompt_cache_key"] == "sess-1"


def test_responses_request_without_storage_query_params_and_headers(server: FakeModelServer) -> None:
    server.script(sse(responses_stream()))
    resolved = provider(server, query_params={"api-version": "2025-04-01"}, http_headers={"X-Team": "tools"})
    prompt = Prompt(input=[user("hi")], model="o3", reasoning={"effort": "low", "summary": "auto"})

    collect(ModelClient(resolved, disable_response_storage=True), prompt)

    (request,) = server.requests
    assert request["path"] == "/v1/responses?api-version=2025-04-01"
    assert request["headers"]["x-team"] == "tools"
    body = request["json"]
    assert body["store"] is False
    assert body["reasoning"] == {"effort": "low", "summary": "auto"}
    assert body["include"] == ["reasoning.encrypted_content"]


def test_data_split_over_lines_and_crlf(server: FakeModelServer) -> None:
    created = b'event: response.created\r\ndata: {"type": "response.created",\r\ndata:  "response": {}}\r\n\r\n'
    rest = responses_stream()[1:]
    server.script(sse([created[:17], created[17:50], created[50:]] + rest))
    events = collect(ModelClient(provider(server)))
    assert events[0] == Created() and isinstance(events[-1], Completed)


def test_an_event_that_is_not_json_is_skipped_and_logged(server: FakeModelServer) -> None:
    frames = responses_stream()
    frames[2:2] = [b"event: response.output_text.delta\ndata: {not json\n\n", b"data: [1,\n\n"]
    server.script(sse(frames))
    with capture_logs() as logs:
        events = collect(ModelClient(provider(server)))
    assert isinstance(events[-1], Completed) and OutputTextDelta("here.") in events
    skipped = [entry for entry in logs if entry["event"] == "model stream: skipped an event that is not JSON"]
    assert [entry["sse_event"] for entry in skipped] == ["response.output_text.delta", "message"]


def test_a_chat_chunk_that_is_not_json_is_skipped(server: FakeModelServer) -> None:
    frames = [chat_chunk({"content": "4"}), b"data: {oops\n\n", chat_chunk({}, "stop"), b"data: [DONE]\n\n"]
    server.script(sse(frames))
    events = collect(ModelClient(provider(server, WireApi.CHAT)))
    assert OutputTextDelta("4") in events and isinstance(events[-1], Completed)


def test_an_event_over_the_size_limit_fails_the_request_once(server: FakeModelServer, monkeypatch) -> None:
    monkeypatch.setattr(agent.sse, "MAX_EVENT_CHARS", 1024 * 1024)
    frames = responses_stream()
    frames[1:1] = [b"data: " + b"x" * (1024 * 1024 + 1) + b"\n\n"]
    server.script(sse(frames), sse(responses_stream()))
    with pytest.raises(ModelError) as caught:
        collect(ModelClient(provider(server), backoff_base=FAST))
    assert str(caught.value) == "the model server sent an event over 1 MiB"
    assert len(server.requests) == 1  # the same server would send it again: not retried


def test_response_failed_is_retried_with_its_delay(server: FakeModelServer) -> None:
    failed = {"type": "response.failed", "response": {"id": "r", "error": {
        "code": "rate_limit_exceeded", "message": "Rate limit reached for o3. Please try again in 20ms."}}}
    server.script(sse([sse_frame({"type": "response.created", "response": {}}), sse_frame(failed)]),
                  sse(responses_stream()))
    notes: list[str] = []

    events = collect(ModelClient(provider(server), on_retry=notes.append, backoff_base=FAST))

    assert notes == ["stream error: stream disconnected before completion: Rate limit reached for o3. "
                     "Please try again in 20ms.; retrying 1/10 in 20ms…"]
    assert isinstance(events[-1], Completed)


def test_response_failed_for_context_length_is_not_retried(server: FakeModelServer) -> None:
    failed = {"type": "response.failed", "response": {"error": {
        "code": "context_length_exceeded", "message": "Your input exceeds the context window of this model."}}}
    server.script(sse([sse_frame(failed)]), sse(responses_stream()))
    notes: list[str] = []
    with pytest.raises(ModelError, match="^Your input exceeds the context window of this model.$") as caught:
        collect(ModelClient(provider(server), on_retry=notes.append, backoff_base=FAST))
    assert caught.value.code == "context_length_exceeded"
    assert notes == [] and len(server.requests) == 1


# -- Chat Completions -----------------------------------------------------------------


def test_chat_stream_assembles_tool_call_fragments(server: FakeModelServer) -> None:
    frames = [
        chat_chunk({"role": "assistant", "content": ""}),
        chat_chunk({"content": "Let me "}),
        chat_chunk({"content": "look."}),
        chat_chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                    "function": {"name": "shell", "arguments": ""}}]}),
        chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"comm'}}]}),
        chat_chunk({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                                    "function": {"name": "update_plan", "arguments": '{"plan":'}}]}),
        chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'and":["ls"]}'}}]}),
        chat_chunk({"tool_calls": [{"index": 1, "function": {"arguments": "[]}"}}]}),
        chat_chunk({}, "tool_calls"),
        sse_frame({"id": "chatcmpl-9", "choices": [], "usage": {
            "prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39,
            "prompt_tokens_details": {"cached_tokens": 10}}}),
        b"data: [DONE]\n\n",
    ]
    server.script(sse(frames))
    tools = [{"type": "function", "name": "shell", "parameters": {"type": "object"}},
             {"type": "local_shell"}]
    history = [
        user("list files"),
        {"type": "function_call", "name": "shell", "arguments": '{"command":["pwd"]}', "call_id": "c0"},
        {"type": "function_call_output", "call_id": "c0", "output": "/work"},
    ]

    events = collect(ModelClient(provider(server, WireApi.CHAT)),
                     Prompt(input=history, instructions="be brief", tools=tools, model="qwen"))

    assert events == [
        Created(),
        OutputTextDelta("Let me "),
        OutputTextDelta("look."),
        OutputItemDone({"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": "Let me look."}]}),
        OutputItemDone({"type": "function_call", "name": "shell", "arguments": '{"command":["ls"]}', "call_id": "call_a"}),
        OutputItemDone({"type": "function_call", "name": "update_plan", "arguments": '{"plan":[]}', "call_id": "call_b"}),
        Completed("chatcmpl-9", TokenCountEvent(input_tokens=30, cached_input_tokens=10, output_tokens=9,
                                                reasoning_output_tokens=None, total_tokens=39)),
    ]
    (request,) = server.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["authorization"] == f"Bearer {API_KEY}"
    body = request["json"]
    assert body["stream"] is True and body["model"] == "qwen"
    assert body["stream_options"] == {"include_usage": True}
    assert body["tools"] == [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "shell", "arguments": '{"command":["pwd"]}'}}]},
        {"role": "tool", "tool_call_id": "c0", "content": "/work"},
    ]


def test_chat_text_reasoning_and_end_without_done(server: FakeModelServer) -> None:
    # Some servers stop after finish_reason without [DONE]; that is still a complete answer.
    frames = [chat_chunk({"reasoning_content": "hmm"}), chat_chunk({"content": "4"}), chat_chunk({}, "stop")]
    server.script(sse(frames))
    events = collect(ModelClient(provider(server, WireApi.CHAT)))
    assert events == [
        Created(),
        ReasoningContentDelta("hmm"),
        OutputTextDelta("4"),
        OutputItemDone({"type": "reasoning", "id": "", "summary": [],
                        "content": [{"type": "reasoning_text", "text": "hmm"}]}),
        OutputItemDone({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "4"}]}),
        Completed("chatcmpl-9", None),
    ]


def test_chat_stream_cut_before_finish_is_retried(server: FakeModelServer) -> None:
    server.script(sse([chat_chunk({"content": "partial"})]),
                  sse([chat_chunk({"content": "whole"}), chat_chunk({}, "stop"), b"data: [DONE]\n\n"]))
    notes: list[str] = []
    events = collect(ModelClient(provider(server, WireApi.CHAT), on_retry=notes.append, backoff_base=FAST))
    assert len(notes) == 1 and "stream closed before response.completed; retrying 1/10 in" in notes[0]
    items = [e.item for e in events if isinstance(e, OutputItemDone)]
    assert items == [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "whole"}]}]


def test_chat_messages_conversion() -> None:
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "what is this?"},
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "name": "shell", "arguments": "{}", "call_id": "a"},
        {"type": "local_shell_call", "call_id": "b", "status": "completed",
         "action": {"type": "exec", "command": ["ls"], "working_directory": "/w", "timeout_ms": 1000}},
        {"type": "reasoning", "id": "r", "summary": []},
        {"type": "function_call_output", "call_id": "a", "output": {"content": "ok", "success": True}},
        {"type": "function_call_output", "call_id": "b", "output": "files"},
    ]
    assert chat_messages(None, items) == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "shell", "arguments": "{}"}},
            {"id": "b", "type": "function", "function": {
                "name": "shell", "arguments": '{"command": ["ls"], "workdir": "/w", "timeout_ms": 1000}'}}]},
        {"role": "tool", "tool_call_id": "a", "content": "ok"},
        {"role": "tool", "tool_call_id": "b", "content": "files"},
    ]
    assert chat_tools([{"type": "web_search"}]) == []


def test_chat_assembler_gives_calls_without_id_one() -> None:
    assembler = ChatStreamAssembler()
    assembler.feed({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "{}"}}]},
                                 "finish_reason": "tool_calls"}]})
    (item,) = assembler.items()
    assert item["name"] == "f" and item["arguments"] == "{}" and item["call_id"].startswith("call_")


# -- retries --------------------------------------------------------------------------


def test_429_honours_retry_after_and_announces_it(server: FakeModelServer) -> None:
    error = {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}
    server.script(status(429, error, {"Retry-After": "0.3"}), sse(responses_stream()))
    notes: list[str] = []
    started = time.monotonic()

    events = collect(ModelClient(provider(server), on_retry=notes.append, backoff_base=FAST))

    elapsed = time.monotonic() - started
    assert notes == ["stream error: unexpected status 429 Too Many Requests: Rate limit reached; retrying 1/4 in 300ms…"]
    assert 0.3 <= elapsed < 3
    assert isinstance(events[-1], Completed) and len(server.requests) == 2


def test_429_try_again_in_body(server: FakeModelServer) -> None:
    error = {"error": {"message": "Slow down. Please try again in 0.05s.", "code": "rate_limit_exceeded"}}
    server.script(status(429, error), sse(responses_stream()))
    notes: list[str] = []
    collect(ModelClient(provider(server), on_retry=notes.append, backoff_base=FAST))
    assert notes == ["stream error: unexpected status 429 Too Many Requests: Slow down. Please try again in 0.05s.; "
                     "retrying 1/4 in 50ms…"]


def test_429_insufficient_quota_is_not_retried(server: FakeModelServer) -> None:
    error = {"error": {"message": "You exceeded your current quota.", "type": "insufficient_quota",
                       "code": "insufficient_quota"}}
    server.script(status(429, error))
    with pytest.raises(ModelError, match="^unexpected status 429 Too Many Requests: You exceeded your current quota.$"):
        collect(ModelClient(provider(server), backoff_base=FAST))
    assert len(server.requests) == 1


def test_500_twice_then_success(server: FakeModelServer) -> None:
    server.script(status(500, {"error": {"message": "boom"}}), status(503, "overloaded\n"), sse(responses_stream()))
    notes: list[str] = []

    async def note(message: str) -> None:  # an async callback is awaited
        notes.append(message)

    events = collect(ModelClient(provider(server), on_retry=note, backoff_base=FAST))

    assert isinstance(events[-1], Completed) and len(server.requests) == 3
    assert len(notes) == 2
    assert re.fullmatch(r"stream error: unexpected status 500 Internal Server Error: boom; "
                        r"retrying 1/4 in \d+(\.\d+)?(ms|µs|ns)…", notes[0])
    assert re.fullmatch(r"stream error: unexpected status 503 Service Unavailable: overloaded; "
                        r"retrying 2/4 in \d+(\.\d+)?(ms|µs|ns)…", notes[1])


def test_stream_cut_before_completed_is_retried_and_broken_items_dropped(server: FakeModelServer) -> None:
    stale = {"type": "function_call", "name": "shell", "arguments": "{}", "call_id": "stale"}
    server.script(sse(responses_stream("first", complete=False, items=[stale])),
                  sse(responses_stream("second", response_id="resp_2")))
    notes: list[str] = []

    events = collect(ModelClient(provider(server), on_retry=notes.append, backoff_base=FAST))

    assert len(notes) == 1
    assert re.fullmatch(r"stream error: stream disconnected before completion: stream closed before "
                        r"response\.completed; retrying 1/10 in \d+(\.\d+)?(ms|µs|ns)…", notes[0])
    items = [e.item for e in events if isinstance(e, OutputItemDone)]
    assert stale not in items and len(items) == 1
    assert events[-1].response_id == "resp_2"


def test_chunked_stream_dropped_mid_body_is_retried(server: FakeModelServer) -> None:
    server.script(sse(responses_stream(complete=False), chunked=True), sse(responses_stream()))
    notes: list[str] = []
    events = collect(ModelClient(provider(server), on_retry=notes.append, backoff_base=FAST))
    assert len(notes) == 1 and notes[0].startswith("stream error: stream disconnected before completion: ")
    assert isinstance(events[-1], Completed)


def test_idle_stream_is_retried(server: FakeModelServer) -> None:
    server.script(sse(responses_stream(complete=False), hang=True, server=server), sse(responses_stream()))
    notes: list[str] = []
    started = time.monotonic()
    events = collect(ModelClient(provider(server, stream_idle_timeout_ms=200), on_retry=notes.append, backoff_base=FAST))
    assert len(notes) == 1
    assert notes[0].startswith("stream error: stream disconnected before completion: idle timeout waiting for SSE; "
                               "retrying 1/10 in ")
    assert isinstance(events[-1], Completed) and time.monotonic() - started < 5


def test_request_budget_exhausted(server: FakeModelServer) -> None:
    server.script(*(status(500, {"error": {"message": "boom"}}) for _ in range(3)))
    notes: list[str] = []
    with pytest.raises(ModelError) as caught:
        collect(ModelClient(provider(server, request_max_retries=2), on_retry=notes.append, backoff_base=FAST))
    assert str(caught.value) == "exceeded retry limit, last status: 500 Internal Server Error: boom"
    assert caught.value.status == 500
    assert len(server.requests) == 3
    assert [n.split(" in ")[0] for n in notes] == [
        "stream error: unexpected status 500 Internal Server Error: boom; retrying 1/2",
        "stream error: unexpected status 500 Internal Server Error: boom; retrying 2/2",
    ]


def test_stream_budget_exhausted(server: FakeModelServer) -> None:
    server.script(*(sse(responses_stream(complete=False)) for _ in range(2)))
    notes: list[str] = []
    with pytest.raises(ModelError) as caught:
        collect(ModelClient(provider(server, stream_max_retries=1), on_retry=notes.append, backoff_base=FAST))
    assert str(caught.value) == ("stream disconnected before completion: stream closed before response.completed "
                                 "(gave up after 1 retries)")
    assert len(notes) == 1 and "retrying 1/1 in" in notes[0]


def test_connection_refused_is_retried_then_fails() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    info = ModelProviderInfo(name="gone", base_url=f"http://127.0.0.1:{port}/v1", request_max_retries=2)
    notes: list[str] = []
    with pytest.raises(ModelError, match=r"^error sending request for url \(http://127\.0\.0\.1:\d+/v1/chat/completions\): "
                                         r".+ \(gave up after 2 retries\); check base_url of model provider 'gone' "
                                         r"\(http://127\.0\.0\.1:\d+/v1\) and that its server is running$"):
        collect(ModelClient(ResolvedProvider.from_info(info), on_retry=notes.append, backoff_base=FAST))
    assert len(notes) == 2 and notes[1].startswith("stream error: error sending request for url")


def test_401_is_not_retried_and_the_key_never_shows(server: FakeModelServer) -> None:
    # A server that echoes the key back in full: it still does not reach the message.
    error = {"error": {"message": f"Incorrect API key provided: {API_KEY}.", "type": "invalid_request_error",
                       "code": "invalid_api_key"}}
    server.script(status(401, error), sse(responses_stream()))
    notes: list[str] = []
    client = ModelClient(provider(server), on_retry=notes.append, backoff_base=FAST)
    with pytest.raises(ModelError) as caught:
        collect(client)
    assert str(caught.value) == "unexpected status 401 Unauthorized: Incorrect API key provided: [redacted]."
    assert caught.value.status == 401 and caught.value.code == "invalid_api_key"
    assert notes == [] and len(server.requests) == 1
    for text in (str(caught.value), repr(caught.value), repr(client), str(client), repr(client.provider)):
        assert API_KEY not in text


def test_400_carries_the_server_message(server: FakeModelServer) -> None:
    server.script(status(400, {"error": {"message": "Unknown parameter: 'input[0].metadata'."}}))
    with pytest.raises(ModelError, match=r"^unexpected status 400 Bad Request: Unknown parameter: 'input\[0\]\.metadata'\.$"):
        collect(ModelClient(provider(server), backoff_base=FAST))


def test_ollama_style_provider_sends_no_authorization(server: FakeModelServer) -> None:
    server.script(sse([chat_chunk({"content": "ok"}), chat_chunk({}, "stop"), b"data: [DONE]\n\n"]))
    info = ModelProviderInfo(name="Ollama", base_url=server.base_url + "/", wire_api=WireApi.CHAT)
    collect(ModelClient(ResolvedProvider.from_info(info), model="llama3"), Prompt(input=[user("hi")]))
    (request,) = server.requests
    assert "authorization" not in request["headers"]
    assert request["path"] == "/v1/chat/completions" and request["json"]["model"] == "llama3"


def test_abandoning_the_stream_closes_the_connection(server: FakeModelServer) -> None:
    server.script(sse(responses_stream(complete=False), hang=True, server=server))

    async def run() -> Any:
        async with ModelClient(provider(server)) as client:
            events = client.stream(Prompt(input=[user("hi")], model="m"))
            first = await anext(events)
            await events.aclose()
            return first

    assert asyncio.run(run()) == Created()


# -- the pieces -----------------------------------------------------------------------


def test_format_delay_prints_like_rust_duration_debug() -> None:
    assert [format_delay(s) for s in (0, 0.0000005, 0.00025, 0.2, 0.203, 0.2035, 1, 1.5, 1.6, 12.25)] == [
        "0ns", "500ns", "250µs", "200ms", "203ms", "203.5ms", "1s", "1.5s", "1.6s", "12.25s"]
    assert retry_message("boom", 2, 10, 0.4) == "stream error: boom; retrying 2/10 in 400ms…"


def test_backoff_doubles_with_ten_percent_jitter() -> None:
    import random

    rng = random.Random(7)
    for attempt, nominal in ((1, 0.2), (2, 0.4), (3, 0.8), (4, 1.6)):
        for _ in range(50):
            assert nominal * 0.9 - 0.001 <= backoff_delay(attempt, rng=rng) <= nominal * 1.1


def test_provider_info_carries_no_key() -> None:
    resolved = ResolvedProvider.from_info(ModelProviderInfo(name="x", base_url="http://h/v1"), API_KEY)
    assert API_KEY not in msgspec.json.encode(resolved.info).decode()
    assert resolved.headers()["Authorization"] == f"Bearer {API_KEY}"
