"""``[mcp_servers.NAME]`` in the configuration: the MCP servers a session starts.

Codex's keys: ``command`` (required), ``args``, ``env``, ``startup_timeout_sec`` (default
10), ``tool_timeout_sec`` (default 60). sluice's own, because every server runs in the
sandbox: by default a server gets the session's sandbox policy *without network*; one
that needs more says so with ``network = true`` and ``writable_roots = ["/abs/path"]``,
and ``sandbox = "read-only" | "workspace-write" | "danger-full-access"`` replaces the
session's mode for it. What a server is granted beyond the default is shown to the user
when the session starts (:func:`grants`). A server is a
:class:`broker.wire.protocol.McpServerConfig`: the frontend reads the table and sends the
servers in ``configure_session``.
"""

from __future__ import annotations

import os
import re
from typing import Any

from broker.wire.protocol import McpServerConfig

DEFAULT_STARTUP_TIMEOUT_S = 10.0
DEFAULT_TOOL_TIMEOUT_S = 60.0
SANDBOX_MODES = ("read-only", "workspace-write", "danger-full-access")
_NAME = re.compile(r"^[a-zA-Z0-9_-]+$")
_KEYS = {"command", "args", "env", "startup_timeout_sec", "tool_timeout_sec", "network", "writable_roots", "sandbox",
         "enabled", "cwd"}


class McpConfigError(ValueError):
    """A server's table that cannot be used; ``str()`` is one line naming the key."""


def parse_servers(table: Any) -> list[McpServerConfig]:
    """The enabled servers of ``mcp_servers`` (a TOML table), by name; raises McpConfigError."""
    if table is None:
        return []
    if not isinstance(table, dict):
        raise McpConfigError("mcp_servers must be a table of [mcp_servers.NAME] tables")
    servers = []
    for name, section in table.items():
        where = f"mcp_servers.{name}"
        if not _NAME.match(name):
            raise McpConfigError(f"{where}: a server name may hold only letters, digits, '_' and '-'")
        if not isinstance(section, dict):
            raise McpConfigError(f"{where} must be a table")
        unknown = sorted(set(section) - _KEYS)
        if unknown:
            raise McpConfigError(f"{where}: unknown key {unknown[0]!r}")
        if section.get("enabled", True) is False:
            continue
        servers.append(_server(name, section, where))
    return servers


def _server(name: str, section: dict, where: str) -> McpServerConfig:
    command = section.get("command")
    if not isinstance(command, str) or not command:
        raise McpConfigError(f"{where}.command must be a non-empty string")
    args = section.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise McpConfigError(f"{where}.args must be a list of strings")
    env = section.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise McpConfigError(f"{where}.env must be a table of strings")
    timeouts = {}
    for key, default in (("startup_timeout_sec", DEFAULT_STARTUP_TIMEOUT_S), ("tool_timeout_sec", DEFAULT_TOOL_TIMEOUT_S)):
        value = section.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 86400:
            raise McpConfigError(f"{where}.{key} must be a number of seconds between 0 and 86400")
        timeouts[key] = float(value)
    network = section.get("network", False)
    if not isinstance(network, bool):
        raise McpConfigError(f"{where}.network must be true or false")
    roots = section.get("writable_roots", [])
    if not isinstance(roots, list) or not all(isinstance(r, str) and os.path.isabs(r) for r in roots):
        raise McpConfigError(f"{where}.writable_roots must be a list of absolute paths")
    sandbox = section.get("sandbox")
    if sandbox is not None and sandbox not in SANDBOX_MODES:
        raise McpConfigError(f"{where}.sandbox must be one of {', '.join(SANDBOX_MODES)}")
    cwd = section.get("cwd")
    if cwd is not None and not (isinstance(cwd, str) and os.path.isabs(cwd)):
        raise McpConfigError(f"{where}.cwd must be an absolute path")
    return McpServerConfig(name=name, command=command, args=list(args), env=dict(env),
                           startup_timeout_s=timeouts["startup_timeout_sec"], tool_timeout_s=timeouts["tool_timeout_sec"],
                           network=network, writable_roots=list(roots), sandbox=sandbox, cwd=cwd)


def grants(server: McpServerConfig) -> list[str]:
    """What ``server`` is allowed beyond a session's sandbox without network, one phrase each."""
    out = []
    if server.sandbox == "danger-full-access":
        out.append("no sandbox at all")
    elif server.sandbox is not None:
        out.append(f"the {server.sandbox} sandbox")
    if server.network and server.sandbox != "danger-full-access":
        out.append("network access")
    if server.writable_roots and server.sandbox != "danger-full-access":
        out.append("write access to " + ", ".join(server.writable_roots))
    return out
