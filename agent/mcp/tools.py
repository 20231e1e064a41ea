"""MCP tools as the model sees them: qualified names, sanitised schemas, results as Codex gives them.

Names: a server's tool ``t`` of server ``s`` is offered as ``s__t`` (Codex's delimiter:
model APIs allow only ``[a-zA-Z0-9_-]`` in tool names, and every other character is
replaced by ``_``). A name over 64 characters keeps its first 24 and ends with the SHA-1
of the unsanitised ``s__t`` (40 hex digits), so it stays unique and stable; a name that
collides with one already offered is skipped with a warning.

Schemas come from untrusted servers and go into the model's request, where one invalid
schema would fail the whole request. :func:`sanitize_schema` makes each one a schema the
model APIs take: every schema has a ``type`` (inferred from ``properties``, ``items`` or
``enum``, else ``string``), objects have ``properties``, arrays ``items``, and boolean
schemas become permissive ones; the input schema is an object. A tool whose schema is not
a JSON object at all, or is nested beyond :data:`MAX_SCHEMA_DEPTH`, is skipped with a
note (:class:`SchemaError`), never a failed request.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

DELIMITER = "__"
MAX_TOOL_NAME = 64
MAX_SCHEMA_DEPTH = 32
_DISALLOWED = re.compile(r"[^a-zA-Z0-9_-]")
_TYPES = {"string", "number", "integer", "boolean", "object", "array", "null"}


class SchemaError(ValueError):
    """A tool's schema that cannot be offered; ``str()`` says why."""


@dataclass(frozen=True)
class McpTool:
    """One tool of one server, as offered to the model under ``qualified``."""

    qualified: str
    server: str
    name: str
    description: str
    parameters: dict[str, Any]


def qualified_name(server: str, tool: str) -> str:
    raw = f"{server}{DELIMITER}{tool}"
    name = _DISALLOWED.sub("_", raw) or "_"
    if len(name) > MAX_TOOL_NAME:
        digest = hashlib.sha1(raw.encode()).hexdigest()
        name = name[:MAX_TOOL_NAME - len(digest)] + digest
    return name


def sanitize_schema(schema: Any, depth: int = 0) -> dict[str, Any]:
    """A copy of ``schema`` the model APIs accept (see the module docstring)."""
    if depth > MAX_SCHEMA_DEPTH:
        raise SchemaError(f"schema nested deeper than {MAX_SCHEMA_DEPTH} levels")
    if isinstance(schema, bool) or schema is None:
        return {"type": "string"}
    if not isinstance(schema, dict):
        raise SchemaError(f"a schema is a JSON object, not {type(schema).__name__}")
    out = dict(schema)
    kind = out.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k in _TYPES]
        kind = out["type"] = kinds if kinds else "string"
    elif kind not in _TYPES:
        if "properties" in out:
            kind = "object"
        elif "items" in out:
            kind = "array"
        else:
            kind = "string"
        if not any(key in out for key in ("anyOf", "oneOf", "allOf")) or "type" in schema:
            out["type"] = kind
    kinds = kind if isinstance(kind, list) else [kind]
    if "object" in kinds:
        properties = out.get("properties")
        out["properties"] = {str(k): sanitize_schema(v, depth + 1) for k, v in properties.items()} \
            if isinstance(properties, dict) else {}
        if "required" in out and not (isinstance(out["required"], list)
                                      and all(isinstance(r, str) for r in out["required"])):
            del out["required"]
        extra = out.get("additionalProperties")
        if extra is not None and not isinstance(extra, bool):
            out["additionalProperties"] = sanitize_schema(extra, depth + 1)
    if "array" in kinds:
        out["items"] = sanitize_schema(out.get("items", True), depth + 1) \
            if not isinstance(out.get("items"), list) else {"type": "string"}
    for combiner in ("anyOf", "oneOf", "allOf"):
        if combiner in out:
            options = out[combiner]
            if isinstance(options, list) and options:
                out[combiner] = [sanitize_schema(o, depth + 1) for o in options]
            else:
                del out[combiner]
    return out


def offered_tools(server: str, tools: list[dict], taken: set[str]) -> tuple[list[McpTool], list[str]]:
    """The tools of ``server`` to offer (their names added to ``taken``), and a note for
    each one skipped."""
    offered: list[McpTool] = []
    notes: list[str] = []
    for tool in tools:
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            notes.append(f"MCP server {server}: a tool without a name was skipped")
            continue
        qualified = qualified_name(server, name)
        if qualified in taken:
            notes.append(f"MCP server {server}: tool {name} skipped: its name {qualified} is taken")
            continue
        try:
            parameters = sanitize_schema(tool.get("inputSchema", {"type": "object"}))
            if parameters.get("type") != "object":
                parameters = {"type": "object", "properties": {}}
        except (SchemaError, RecursionError) as err:
            notes.append(f"MCP server {server}: tool {name} skipped: {err}")
            continue
        description = tool.get("description")
        taken.add(qualified)
        offered.append(McpTool(qualified, server, name, description if isinstance(description, str) else "",
                               parameters))
    return offered, notes


def declaration(tool: McpTool) -> dict[str, Any]:
    """The tool in the Responses API shape the model client takes (see :mod:`agent.tools`)."""
    return {"type": "function", "name": tool.qualified, "description": tool.description,
            "strict": False, "parameters": tool.parameters}


def result_for_model(result: dict[str, Any]) -> tuple[str | list[dict[str, Any]], bool]:
    """What the model is told of a ``tools/call`` result, and whether the call succeeded,
    as Codex 0.169 gives it (the seed gives the JSON of ``content`` alone):

    - the JSON of ``structuredContent``, when the result has one (not null);
    - else the JSON of the ``content`` array, the seed's shape
      (``[{"type":"text","text":"Echo: hi"}]``); or, when it holds an image, its items
      as the Responses API's function output items (:func:`content_items`);
    - success unless ``isError`` is true. The model is not told which (the function output
      has no such field); the ``mcp_tool_call_end`` event says it.

    JSON is compact, keys in the server's order, as Codex's ``serde_json::to_string``.
    """
    success = result.get("isError") is not True
    structured = result.get("structuredContent")
    if structured is not None:
        return _json(structured), success
    content = result.get("content") if isinstance(result.get("content"), list) else []
    items = content_items(content)
    return (items if items is not None else _json(content)), success


def content_items(content: list[Any]) -> list[dict[str, Any]] | None:
    """MCP content with an image in it as function output items: text as ``input_text``,
    an image as ``input_image`` (its data as a ``data:`` URL), anything else as the
    ``input_text`` of its JSON; None without an image, whose text goes as JSON instead."""
    if not any(isinstance(block, dict) and block.get("type") == "image" for block in content):
        return None
    items = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            items.append({"type": "input_text", "text": block["text"]})
        elif kind == "image" and isinstance(block.get("data"), str):
            data = block["data"]
            if not data.startswith("data:"):
                mime = block.get("mimeType", block.get("mime_type"))
                data = f"data:{mime if isinstance(mime, str) else 'application/octet-stream'};base64,{data}"
            items.append({"type": "input_image", "image_url": data})
        else:
            items.append({"type": "input_text", "text": _json(block)})
    return items


def error_for_model(why: str) -> str:
    """What the model is told of a call that got no result (the server failed, timed out,
    went away): Codex's ``err: "tool call error: <why>"``, the quoted form being Rust's
    ``Debug`` of the text, which JSON's quoting matches for printable text."""
    return "err: " + json.dumps(f"tool call error: {why}", ensure_ascii=False)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
