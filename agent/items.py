"""Conversation items: the Responses API ``input`` items the session keeps as plain dicts.

The conversation is a list of items in the shape the Responses API takes back as input
(and :mod:`agent.chat_completions` converts for Chat Completions)::

    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "..."}]}
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "..."}]}
    {"type": "function_call", "name": "shell", "arguments": "{...}", "call_id": "c1"}
    {"type": "local_shell_call", "call_id": "c2", "status": "completed", "action": {...}}
    {"type": "function_call_output", "call_id": "c1", "output": "..."}
    {"type": "custom_tool_call", "name": "apply_patch", "input": "*** Begin Patch...", "call_id": "c3"}
    {"type": "custom_tool_call_output", "call_id": "c3", "output": "..."}

:func:`normalize` keeps only the fields Codex keeps of what the model sent (no item
``id`` except on reasoning, no ``status`` on messages, no annotations), so the items can
be sent back even with response storage off.
"""

from __future__ import annotations

import base64
import mimetypes
from collections.abc import Iterable, Sequence
from typing import Any

import structlog

from broker.wire.protocol import ImageInput, InputItem, LocalImageInput, TextInput, UserMessageEvent

log = structlog.get_logger("agent.items")

Item = dict[str, Any]
CALL_TYPES = ("function_call", "local_shell_call", "custom_tool_call")
OUTPUT_TYPES = ("function_call_output", "custom_tool_call_output")
ABORTED_OUTPUT = "aborted"


def user_message(inputs: Sequence[InputItem]) -> Item | None:
    """The user message for ``inputs``; local images are read and sent inline. None if
    nothing is left (an image that cannot be read is skipped, as Codex does)."""
    content: list[dict[str, Any]] = []
    for part in inputs:
        if isinstance(part, TextInput):
            content.append({"type": "input_text", "text": part.text})
        elif isinstance(part, ImageInput):
            content.append({"type": "input_image", "image_url": part.image_url})
        elif isinstance(part, LocalImageInput):
            url = _data_url(part.path)
            if url is not None:
                content.append({"type": "input_image", "image_url": url})
    if not content:
        return None
    return {"type": "message", "role": "user", "content": content}


def user_message_event(inputs: Sequence[InputItem]) -> UserMessageEvent:
    """The ``user_message`` event that tells the frontends what was asked: the text parts
    joined by newlines; images as given (local ones by their path, not read here)."""
    images = [p.image_url if isinstance(p, ImageInput) else p.path
              for p in inputs if isinstance(p, ImageInput | LocalImageInput)]
    return UserMessageEvent("\n".join(input_texts(inputs)), images or None)


def _data_url(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        log.warning("image skipped: cannot read it", path=path, error=err.strerror)
        return None
    mime = mimetypes.guess_type(path)[0] or "application/octet-stream"
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def input_texts(inputs: Iterable[InputItem]) -> list[str]:
    return [part.text for part in inputs if isinstance(part, TextInput)]


def _content_part(part: Any) -> dict[str, Any] | None:
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if kind in ("input_text", "output_text", "summary_text", "reasoning_text", "text"):
        return {"type": kind, "text": str(part.get("text", ""))}
    if kind == "input_image":
        return {"type": kind, "image_url": str(part.get("image_url", ""))}
    return None


def normalize(item: Item) -> Item:
    """``item`` as the conversation keeps it (see the module docstring)."""
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        content = item.get("content")
        if isinstance(content, str):
            parts = [{"type": "output_text" if item.get("role") == "assistant" else "input_text", "text": content}]
        else:
            parts = [p for p in (_content_part(c) for c in content or []) if p is not None]
        return {"type": "message", "role": item.get("role", "assistant"), "content": parts}
    if kind == "function_call":
        return {"type": kind, "name": item.get("name", ""), "arguments": item.get("arguments", ""),
                "call_id": item.get("call_id") or item.get("id") or ""}
    if kind == "custom_tool_call":
        return {"type": kind, "call_id": item.get("call_id") or item.get("id") or "",
                "name": item.get("name", ""), "input": item.get("input", "")}
    if kind == "local_shell_call":
        return {"type": kind, "call_id": item.get("call_id") or item.get("id") or "",
                "status": item.get("status", "completed"), "action": item.get("action") or {}}
    if kind == "reasoning":
        out: Item = {"type": kind, "id": item.get("id", ""),
                     "summary": [p for p in (_content_part(s) for s in item.get("summary") or []) if p]}
        if item.get("content"):
            out["content"] = [p for p in (_content_part(c) for c in item["content"]) if p]
        if item.get("encrypted_content"):
            out["encrypted_content"] = item["encrypted_content"]
        return out
    return dict(item)


def output_texts(item: Item) -> list[str]:
    """The assistant text parts of a message item."""
    if item.get("type") != "message" or item.get("role") != "assistant":
        return []
    return [p["text"] for p in item.get("content") or [] if p.get("type") == "output_text"]


def last_assistant_message(items: Iterable[Item]) -> str | None:
    """Codex's ``get_last_assistant_message_from_turn``: the last output text of the last
    assistant message."""
    for item in reversed(list(items)):
        texts = output_texts(item)
        if texts:
            return texts[-1]
    return None


def with_aborted_outputs(items: Sequence[Item]) -> list[Item]:
    """``items`` with an ``aborted`` output right after every call that has none, so the
    model never sees a call left dangling (by an interrupt)."""
    answered = {i.get("call_id") for i in items if i.get("type") in OUTPUT_TYPES}
    out: list[Item] = []
    for item in items:
        out.append(item)
        if item.get("type") in CALL_TYPES and item.get("call_id") not in answered:
            kind = "custom_tool_call_output" if item.get("type") == "custom_tool_call" else "function_call_output"
            out.append({"type": kind, "call_id": item.get("call_id", ""), "output": ABORTED_OUTPUT})
    return out
