"""The Model Context Protocol as both sides of sluice speak it: the agent's client of its
servers (:mod:`agent.mcp.client`) and ``sluice mcp``'s server (:mod:`broker.cli.mcp`).
JSON-RPC 2.0, one message per line (https://modelcontextprotocol.io)."""

from __future__ import annotations

# The protocol versions sluice speaks, newest first: the client offers the first and
# accepts any; the server answers a client's version when it is one of them, else the first.
PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
# One message, at most (a tool's result included).
MAX_LINE_BYTES = 16 * 1024 * 1024

# JSON-RPC error codes.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
