"""MCP servers for the tests and benchmarks: third-party ones installed on first use into
a cache outside the repository (the reference ``@modelcontextprotocol/server-everything``
from npm, and ``mcp-server-time`` from PyPI), each as a
``[mcp_servers.NAME]`` table; and :func:`local_launcher`, which starts servers as plain
children of this process (no daemon, no sandbox) for the manager's own tests and as the
baseline of the benchmark; and small servers that misbehave (:data:`JUNK`, :data:`ENDLESS`,
:data:`CHATTY`, :data:`MUTE`) for the fault tests and their benchmark."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from agent.mcp.client import McpError
from agent.mcp.manager import Streams
from broker.wire.protocol import McpServerConfig
from tests.support.harness import sluice_argv

CACHE = Path(os.environ.get("SLUICE_TEST_CACHE", Path.home() / ".cache" / "sluice-tests"))
EVERYTHING = "@modelcontextprotocol/server-everything"


def everything_entry() -> tuple[str | None, str]:
    """(the path of server-everything's entry script, "") or (None, why it is not there)."""
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        return None, "node and npm are not installed (.ci/run installs them)"
    prefix = CACHE / "npm"
    entry = prefix / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
    with _installing():
        if not entry.exists():
            prefix.mkdir(parents=True, exist_ok=True)
            try:
                r = subprocess.run([npm, "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(prefix),
                                    EVERYTHING], capture_output=True, text=True, timeout=300)
            except subprocess.TimeoutExpired:
                return None, f"npm install {EVERYTHING} took over 300 s (registry unreachable?)"
            if r.returncode != 0 or not entry.exists():
                return None, f"npm install {EVERYTHING} failed (registry unreachable?): {r.stderr.strip()[-300:]}"
    return str(entry), ""


@contextlib.contextmanager
def _installing():
    """Held while a server is looked for and installed into the cache, which the workers of
    a parallel run (``-n``) share: one installs, the others wait and then find it there."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        yield


def unseen_in_sandbox(paths: list[str]) -> str:
    """"" if a command in the sandbox (workspace-write, as a session runs its MCP servers)
    can read every one of ``paths``; else why not. The host's /tmp is not there inside:
    a cache under a ``HOME`` in /tmp is installed but out of the servers' sight."""
    with tempfile.TemporaryDirectory(prefix="sl-probe-") as cwd:
        r = subprocess.run([*sluice_argv(), "sandbox", "--cwd", cwd, "--", "sh", "-c",
                            'for p; do test -r "$p" || echo "$p"; done', "sh", *paths],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"sluice sandbox failed: {r.stderr.strip()[-500:]}"
    unseen = r.stdout.split("\n")[:-1]
    if not unseen:
        return ""
    return (f"the sandbox cannot see {', '.join(unseen)} (/tmp inside it is sluice's own): "
            "set SLUICE_TEST_CACHE to a directory outside /tmp")


def everything_table(name: str = "everything", **extra: str) -> str:
    entry, why = everything_entry()
    assert entry is not None, why
    return _table(name, shutil.which("node"), [entry, "stdio"], extra)


def time_server() -> tuple[tuple[str, list[str], dict[str, str]] | None, str]:
    """((command, args, env) of mcp-server-time, "") or (None, why it is not there).

    Installed with pip into the cache on first use, and run by the interpreter this
    virtual environment is made from: a command in the sandbox may not see the test's own
    environment (a checkout under /tmp is not visible under workspace-write)."""
    target = CACHE / "python" / f"py{sys.version_info[0]}{sys.version_info[1]}"
    with _installing():
        if not (target / "mcp_server_time").is_dir():
            target.mkdir(parents=True, exist_ok=True)
            try:
                r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                                    "--target", str(target), "mcp-server-time"],
                                   capture_output=True, text=True, timeout=300)
            except subprocess.TimeoutExpired:
                return None, "pip install mcp-server-time took over 300 s (registry unreachable?)"
            if r.returncode != 0 or not (target / "mcp_server_time").is_dir():
                return None, f"pip install mcp-server-time failed (registry unreachable?): {r.stderr.strip()[-300:]}"
    python = os.path.realpath(sys.executable)
    return (python, ["-m", "mcp_server_time", "--local-timezone", "Etc/UTC"], {"PYTHONPATH": str(target)}), ""


def time_table(name: str = "time", **extra: str) -> str:
    server, why = time_server()
    assert server is not None, why
    command, args, env = server
    pairs = ", ".join(f'{k} = "{v}"' for k, v in env.items())
    return _table(name, command, args, {"env": "{ " + pairs + " }", **extra})


def _table(name: str, command: str, args: list[str], extra: dict[str, str]) -> str:
    lines = [f"[mcp_servers.{name}]", f'command = "{command}"', "args = [" + ", ".join(f'"{a}"' for a in args) + "]"]
    lines += [f"{key} = {value}" for key, value in extra.items()]
    return "\n".join(lines) + "\n"


class LocalProcess:
    """A server as a plain child process (no sandbox): what a launcher gives the manager."""

    def __init__(self, proc: asyncio.subprocess.Process, streams: Streams) -> None:
        self.proc = proc
        self.stderr = bytearray()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._tasks = [asyncio.ensure_future(self._pump(proc.stdout, streams.stdout)),
                       asyncio.ensure_future(self._pump(proc.stderr, self._stderr(streams.stderr)))]
        self._exit = asyncio.ensure_future(self._wait(streams))

    def _stderr(self, forward):
        def on(data: bytes) -> None:
            self.stderr.extend(data)
            forward(data)
        return on

    async def _pump(self, stream, to) -> None:
        while chunk := await stream.read(65536):
            to(chunk)
            await self._flowing.wait()

    def hold_output(self, held: bool) -> None:
        if held:
            self._flowing.clear()
        else:
            self._flowing.set()

    async def _wait(self, streams: Streams) -> None:
        code = await self.proc.wait()
        await asyncio.gather(*self._tasks)
        streams.exited(f"exited with status {code}")

    async def write(self, data: bytes) -> None:
        if self.proc.returncode is not None:
            raise McpError("gone")
        self.proc.stdin.write(data)
        try:
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            raise McpError("gone") from None

    async def stop(self, grace_s: float = 0.0) -> None:
        if grace_s > 0 and self.proc.returncode is None:
            self.proc.stdin.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._exit), grace_s)
        if self.proc.returncode is None:
            self.proc.kill()
        await self._exit


def local_launcher(started: list[LocalProcess]):
    """A launcher that starts servers as plain children of this process, recorded in ``started``."""
    async def launch(config: McpServerConfig, streams: Streams) -> LocalProcess:
        proc = await asyncio.create_subprocess_exec(
            *config.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env={**os.environ, **config.env})
        process = LocalProcess(proc, streams)
        started.append(process)
        return process
    return launch


# -- servers that misbehave (Python source, run with ``python -c``) -----------------------

# Junk from its first byte, as fast as it can.
JUNK = """
import sys
w = sys.stdout.buffer.write
lines = b"this is not json, and it never stops\\n" * 2000
while True:
    w(lines)
"""

# A line that never ends.
ENDLESS = """
import sys
w = sys.stdout.buffer.write
chunk = b"x" * 65536
while True:
    w(chunk)
"""

# A valid server that floods valid notifications from its initialize on, as fast as it
# can; its one tool, count, says how many it has written.
CHATTY = """
import json, sys, threading
lock = threading.Lock()
sent = [0]
out = sys.stdout.buffer
def send(message):
    with lock:
        out.write(json.dumps(message).encode() + b"\\n")
        out.flush()
def flood():
    note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x" * 100}}
    batch = (json.dumps(note).encode() + b"\\n") * 100
    while True:
        with lock:
            out.write(batch)
            out.flush()
            sent[0] += 100
for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue
    reply = {"jsonrpc": "2.0", "id": message["id"]}
    method = message["method"]
    if method == "initialize":
        reply["result"] = {"protocolVersion": message["params"]["protocolVersion"], "capabilities": {"tools": {}},
                           "serverInfo": {"name": "chatty", "version": "1"}}
        threading.Thread(target=flood, daemon=True).start()
    elif method == "tools/list":
        reply["result"] = {"tools": [{"name": "count", "description": "Notifications sent.",
                                      "inputSchema": {"type": "object"}}]}
    elif method == "tools/call":
        with lock:
            reply["result"] = {"content": [{"type": "text", "text": str(sent[0])}]}
    else:
        reply["error"] = {"code": -32601, "message": "no"}
    send(reply)
"""
# One line of CHATTY's flood.
NOTIFICATION_BYTES = len(json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                                     "params": {"level": "info", "data": "x" * 100}})) + 1

# CHATTY's flood from its first byte, and never an answer.
MUTE = CHATTY.replace("for line in sys.stdin:", "flood()\nfor line in sys.stdin:")
