"""Third-party MCP servers for the tests, installed on first use: the reference
``@modelcontextprotocol/server-everything`` (npm) into a cache outside the repository,
and ``mcp-server-time`` (PyPI, a test extra). Each is a ``[mcp_servers.NAME]`` table."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

CACHE = Path(os.environ.get("SLUICE_TEST_CACHE", Path.home() / ".cache" / "sluice-tests"))
EVERYTHING = "@modelcontextprotocol/server-everything"


def everything_entry() -> tuple[str | None, str]:
    """(the path of server-everything's entry script, "") or (None, why it is not there)."""
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        return None, "node and npm are not installed (.ci/run installs them)"
    prefix = CACHE / "npm"
    entry = prefix / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
    if not entry.exists():
        prefix.mkdir(parents=True, exist_ok=True)
        try:
            r = subprocess.run([npm, "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(prefix), EVERYTHING],
                               capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            return None, f"npm install {EVERYTHING} took over 300 s (registry unreachable?)"
        if r.returncode != 0 or not entry.exists():
            return None, f"npm install {EVERYTHING} failed (registry unreachable?): {r.stderr.strip()[-300:]}"
    return str(entry), ""


def everything_table(name: str = "everything", **extra: str) -> str:
    entry, why = everything_entry()
    assert entry is not None, why
    return _table(name, shutil.which("node"), [entry, "stdio"], extra)


def time_available() -> tuple[bool, str]:
    if importlib.util.find_spec("mcp_server_time") is None:
        return False, "mcp-server-time is not installed (pip install '.[test]')"
    return True, ""


def time_table(name: str = "time", **extra: str) -> str:
    return _table(name, sys.executable, ["-m", "mcp_server_time", "--local-timezone", "Etc/UTC"], extra)


def _table(name: str, command: str, args: list[str], extra: dict[str, str]) -> str:
    lines = [f"[mcp_servers.{name}]", f'command = "{command}"', "args = [" + ", ".join(f'"{a}"' for a in args) + "]"]
    lines += [f"{key} = {value}" for key, value in extra.items()]
    return "\n".join(lines) + "\n"
