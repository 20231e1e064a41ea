"""MCP tools as offered to the model: Codex's qualified names, schemas made acceptable,
results as text; and the ``[mcp_servers]`` configuration."""

from __future__ import annotations

import hashlib

import pytest

from agent.mcp.config import McpConfigError, grants, parse_servers
from agent.mcp.tools import (
    SchemaError,
    content_items,
    error_for_model,
    offered_tools,
    qualified_name,
    result_for_model,
    sanitize_schema,
)


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


def test_results_for_the_model_are_codexs():
    # The seed's shape: the content array's JSON, compact, keys in the server's order.
    assert result_for_model({"content": [{"type": "text", "text": "Echo: hi"}]}) == (
        '[{"type":"text","text":"Echo: hi"}]', True)
    # Structured content, when there is one, is what the model gets instead.
    assert result_for_model({"content": [{"type": "text", "text": "hi"}], "structuredContent": {"x": "é"}}) == (
        '{"x":"é"}', True)
    assert result_for_model({"content": [], "structuredContent": None, "isError": False}) == ("[]", True)
    # isError fails the call; the model sees the same shape.
    assert result_for_model({"content": [{"type": "text", "text": "no"}], "isError": True}) == (
        '[{"type":"text","text":"no"}]', False)
    assert result_for_model({"isError": True, "structuredContent": {"error": 1}}) == ('{"error":1}', False)
    assert result_for_model({}) == ("[]", True)


def test_content_with_an_image_goes_as_input_items():
    output, ok = result_for_model({"content": [
        {"type": "text", "text": "look"},
        {"type": "image", "data": "Zm9v", "mimeType": "image/png"},
        {"type": "image", "data": "data:image/gif;base64,R0lG"},
        {"type": "image", "data": "YmFy"},
        {"type": "resource", "resource": {"uri": "file:///x"}},
    ]})
    assert ok and output == [
        {"type": "input_text", "text": "look"},
        {"type": "input_image", "image_url": "data:image/png;base64,Zm9v"},
        {"type": "input_image", "image_url": "data:image/gif;base64,R0lG"},
        {"type": "input_image", "image_url": "data:application/octet-stream;base64,YmFy"},
        {"type": "input_text", "text": '{"type":"resource","resource":{"uri":"file:///x"}}'},
    ]
    assert content_items([{"type": "text", "text": "no image"}]) is None


def test_a_call_without_a_result_is_codexs_err_text():
    assert error_for_model('MCP server s did not answer "tools/call"') == (
        'err: "tool call error: MCP server s did not answer \\"tools/call\\""')


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
