"""MCP tools as offered to the model: Codex's qualified names, schemas made acceptable,
results as text; and the ``[mcp_servers]`` configuration."""

from __future__ import annotations

import hashlib
import json

import pytest

from agent.mcp.config import McpConfigError, grants, parse_servers
from agent.mcp.tools import SchemaError, offered_tools, qualified_name, result_for_model, sanitize_schema


def test_qualified_names_follow_codex():
    assert qualified_name("files", "read") == "files__read"
    assert qualified_name("my.server", "do it") == "my_server__do_it"
    long = qualified_name("s" * 30, "t" * 40)
    raw = "s" * 30 + "__" + "t" * 40
    assert len(long) == 64 and long == raw[:24] + hashlib.sha1(raw.encode()).hexdigest()


def test_schemas_are_made_acceptable():
    assert sanitize_schema(True) == {"type": "string"}
    assert sanitize_schema({"properties": {"a": {}}}) == {"type": "object", "properties": {"a": {"type": "string"}}}
    assert sanitize_schema({"type": "array"}) == {"type": "array", "items": {"type": "string"}}
    assert sanitize_schema({"type": "object", "required": "a"}) == {"type": "object", "properties": {}}
    assert sanitize_schema({"anyOf": [{"type": "string"}, {}]}) == {"anyOf": [{"type": "string"}, {"type": "string"}]}
    assert sanitize_schema({"type": ["string", "bogus"]}) == {"type": ["string"]}
    with pytest.raises(SchemaError):
        sanitize_schema([1, 2])
    deep: dict = {}
    node = deep
    for _ in range(100):
        node["items"] = {}
        node = node["items"]
    with pytest.raises(SchemaError):
        sanitize_schema(deep)


def test_tools_with_unusable_schemas_or_taken_names_are_skipped_with_a_note():
    taken = {"s__a"}
    offered, notes = offered_tools("s", [
        {"name": "a", "inputSchema": {}},
        {"name": "b", "inputSchema": "nope"},
        {"name": "c", "inputSchema": {"type": "string"}, "description": "C"},
        {"description": "no name"},
    ], taken)
    assert [t.qualified for t in offered] == ["s__c"]
    assert offered[0].parameters == {"type": "object", "properties": {}} and offered[0].description == "C"
    assert len(notes) == 3 and "taken" in notes[0] and "not str" in notes[1]


def test_results_for_the_model():
    text, ok = result_for_model({"content": [{"type": "text", "text": "hi"}], "structuredContent": {"x": 1}})
    assert ok and json.loads(text) == {"content": [{"type": "text", "text": "hi"}], "structuredContent": {"x": 1}}
    text, ok = result_for_model({"content": [], "isError": True})
    assert not ok and json.loads(text)["isError"] is True


def test_server_configuration():
    servers = parse_servers({
        "git": {"command": "uvx", "args": ["mcp-server-git"], "tool_timeout_sec": 5},
        "web": {"command": "npx", "network": True, "writable_roots": ["/tmp/cache"]},
        "off": {"command": "x", "enabled": False},
    })
    assert [s.name for s in servers] == ["git", "web"]
    assert servers[0].argv == ["uvx", "mcp-server-git"] and servers[0].tool_timeout_s == 5.0
    assert grants(servers[0]) == []
    assert grants(servers[1]) == ["network access", "write access to /tmp/cache"]
    for table, message in [
        ({"a b": {"command": "x"}}, "letters, digits"),
        ({"s": {"args": []}}, "mcp_servers.s.command"),
        ({"s": {"command": "x", "args": "y"}}, "mcp_servers.s.args"),
        ({"s": {"command": "x", "writable_roots": ["rel"]}}, "absolute"),
        ({"s": {"command": "x", "startup_timeout_sec": 0}}, "startup_timeout_sec"),
        ({"s": {"command": "x", "sandbox": "none"}}, "mcp_servers.s.sandbox"),
        ({"s": {"command": "x", "colour": 1}}, "unknown key 'colour'"),
    ]:
        with pytest.raises(McpConfigError, match=message):
            parse_servers(table)
