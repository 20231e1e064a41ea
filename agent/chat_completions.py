"""Chat Completions on the wire: Responses-style input in, Responses-style items out.

The agent keeps its conversation as Responses API ``input`` items (plain dicts). For a
provider with ``wire_api = "chat"`` (Ollama, llama.cpp, vLLM, most OpenAI-compatible
servers) they become Chat Completions ``messages``:

- the instructions become the first ``system`` message;
- a ``message`` item becomes a message of its role (``developer`` is sent as
  ``system``); its text parts are joined, and a message with images is sent as a list
  of ``text`` / ``image_url`` parts;
- a ``function_call`` (and a ``custom_tool_call``, and a ``local_shell_call``, which
  is sent as a call of the ``shell`` function) becomes an entry of ``tool_calls`` on an
  assistant message; consecutive calls, and a call right after the assistant's text,
  share one assistant message, as the API requires of parallel calls;
- a ``function_call_output`` (or ``custom_tool_call_output``) becomes a ``tool``
  message with its ``tool_call_id``;
- ``reasoning`` items and anything else are not sent.

Tools are declared in the Responses shape (``{"type": "function", "name", "description",
"parameters"}``) and sent as ``{"type": "function", "function": {...}}``; tools only the
Responses API knows (``local_shell``, ``web_search``) are left out.

The answer streams as ``chat.completion.chunk`` objects, ended by ``data: [DONE]``.
:class:`ChatStreamAssembler` folds the chunks into what the Responses API would have
said: text deltas, reasoning deltas (``delta.reasoning_content`` / ``delta.reasoning``
as local servers send them), tool-call fragments joined by their ``index`` (``id`` and
``function.name`` arrive once, ``function.arguments`` in pieces) into ``function_call``
items, the text into one assistant ``message`` item, and ``usage`` (requested with
``stream_options.include_usage``) into token counts.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from broker.wire.protocol import TokenCountEvent


def chat_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Chat Completions ``messages`` for Responses-style input ``items``."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    for item in items:
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role", "user")
            messages.append({"role": "system" if role == "developer" else role, "content": _content(item.get("content"))})
        elif kind in ("function_call", "custom_tool_call", "local_shell_call"):
            _add_tool_call(messages, _tool_call(kind, item))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            messages.append({"role": "tool", "tool_call_id": item.get("call_id", ""), "content": _output_text(item.get("output"))})
    return messages


def chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses-shaped function tools in the Chat Completions shape."""
    converted = []
    for tool in tools:
        if "function" in tool:
            converted.append(tool)
        elif tool.get("type") == "function":
            function = {k: v for k, v in tool.items() if k != "type"}
            converted.append({"type": "function", "function": function})
    return converted


def _content(content: Any) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    if not any(isinstance(p, dict) and p.get("type") == "input_image" for p in parts):
        return "".join(p.get("text", "") for p in parts if isinstance(p, dict))
    converted: list[dict[str, Any]] = []
    for part in parts:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "input_image":
            converted.append({"type": "image_url", "image_url": {"url": part.get("image_url", "")}})
        elif "text" in part:
            converted.append({"type": "text", "text": part["text"]})
    return converted


def _tool_call(kind: str, item: dict[str, Any]) -> dict[str, Any]:
    if kind == "local_shell_call":
        action = item.get("action") or {}
        arguments = {"command": action.get("command", [])}
        for source, target in (("working_directory", "workdir"), ("timeout_ms", "timeout_ms")):
            if action.get(source) is not None:
                arguments[target] = action[source]
        name, text = "shell", json.dumps(arguments)
        call_id = item.get("call_id") or item.get("id") or ""
    elif kind == "custom_tool_call":
        name, text, call_id = item.get("name", ""), item.get("input", ""), item.get("call_id", "")
    else:
        name, text, call_id = item.get("name", ""), item.get("arguments", ""), item.get("call_id", "")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def _add_tool_call(messages: list[dict[str, Any]], call: dict[str, Any]) -> None:
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and isinstance(last.get("content"), (str, type(None))):
        last.setdefault("tool_calls", []).append(call)
        return
    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, dict) and isinstance(output.get("content"), str):
        return output["content"]
    return json.dumps(output)


def chat_usage(usage: dict[str, Any]) -> TokenCountEvent:
    prompt = usage.get("prompt_tokens") or 0
    completion = usage.get("completion_tokens") or 0
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
    return TokenCountEvent(
        input_tokens=prompt,
        cached_input_tokens=cached,
        output_tokens=completion,
        reasoning_output_tokens=reasoning,
        total_tokens=usage.get("total_tokens") or prompt + completion,
    )


@dataclass
class _PendingCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class ChatChunk:
    """What one chunk contributed: its text and reasoning deltas."""

    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)


class ChatStreamAssembler:
    """Fold ``chat.completion.chunk`` objects into deltas, items and usage."""

    def __init__(self) -> None:
        self.response_id = ""
        self.usage: TokenCountEvent | None = None
        self.finished = False
        """A choice has said its ``finish_reason``."""
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, _PendingCall] = {}

    def feed(self, chunk: dict[str, Any]) -> ChatChunk:
        out = ChatChunk()
        if isinstance(chunk.get("id"), str) and chunk["id"]:
            self.response_id = chunk["id"]
        if isinstance(chunk.get("usage"), dict):
            self.usage = chat_usage(chunk["usage"])
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta") or choice.get("message") or {}
            text = delta.get("content")
            if isinstance(text, str) and text:
                self._text.append(text)
                out.text.append(text)
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                self._reasoning.append(reasoning)
                out.reasoning.append(reasoning)
            for position, fragment in enumerate(delta.get("tool_calls") or []):
                self._add_fragment(position, fragment)
            if choice.get("finish_reason"):
                self.finished = True
        return out

    def _add_fragment(self, position: int, fragment: Any) -> None:
        if not isinstance(fragment, dict):
            return
        index = fragment.get("index")
        index = index if isinstance(index, int) else position
        call = self._calls.setdefault(index, _PendingCall())
        if fragment.get("id"):
            call.id = fragment["id"]
        function = fragment.get("function") or {}
        if function.get("name"):
            # Some servers repeat the name in every fragment; it does not accumulate.
            call.name = function["name"]
        if isinstance(function.get("arguments"), str):
            call.arguments.append(function["arguments"])

    def items(self) -> list[dict[str, Any]]:
        """The finished output: reasoning, the assistant message, then the calls."""
        items: list[dict[str, Any]] = []
        if self._reasoning:
            items.append({
                "type": "reasoning",
                "id": "",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "".join(self._reasoning)}],
            })
        if self._text:
            items.append({
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "".join(self._text)}],
            })
        for index in sorted(self._calls):
            call = self._calls[index]
            items.append({
                "type": "function_call",
                "name": call.name,
                "arguments": "".join(call.arguments),
                # A few local servers send no id; the agent still needs one to pair the output.
                "call_id": call.id or f"call_{uuid.uuid4().hex[:24]}",
            })
        return items
