"""mcp-true: what a `run` of `true` costs through `sluice mcp`, against the other ways in.

``mcp-true``: the official MCP SDK's client (``mcp`` on PyPI) calls the ``run`` tool with
``argv: ["true"]`` on one ``sluice mcp`` it started, round trip. ``mcp-raw``: the same
``tools/call`` line written to ``sluice mcp``'s stdin by hand and its response line read
(no SDK: what the server itself adds). ``lib-true``: ``Client.run(["true"])`` of the
Python client library in this process (what ``sluice mcp`` does per call, minus MCP).
``cli-true-vs-lib``: ``sluice run -- true`` as a whole process (``bench_cli.py``'s
``cli-true`` compares it with Codex). Per-call overhead of MCP: mcp-true and mcp-raw
less lib-true. ``mcp-start``: spawning ``sluice mcp`` to the answer of its
first ``run`` (initialize, connect to the running daemon, the run). All against one
running daemon, medians, in alternating blocks. No targets.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time

from common import WORK_DIR, Daemon, Row, Stats, bench_main, log, ratio
from installed import sluice_cli


def sluice_argv() -> list[str]:
    """The ``sluice`` a user runs: a non-editable install of this checkout (installed.py)."""
    return sluice_cli().argv


class RawServer:
    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([*sluice_argv(), "mcp", "--cwd", WORK_DIR], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, cwd=WORK_DIR)
        self.buf = b""
        self.n = 0

    def call(self, method: str, params: dict) -> dict:
        self.n += 1
        line = json.dumps({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params}).encode() + b"\n"
        self.proc.stdin.write(line)
        self.proc.stdin.flush()
        while b"\n" not in self.buf:
            select.select([self.proc.stdout], [], [], 30)
            data = os.read(self.proc.stdout.fileno(), 65536)
            if not data:
                raise RuntimeError("sluice mcp exited")
            self.buf += data
        out, self.buf = self.buf.split(b"\n", 1)
        message = json.loads(out)
        if "error" in message or message["result"].get("isError"):
            raise RuntimeError(f"{method} failed: {message}")
        return message

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(15)


RUN_TRUE = {"name": "run", "arguments": {"argv": ["true"]}}
INIT = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}


def run(quick: bool) -> list[Row]:
    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    count = 20 if quick else 50
    block = 10
    samples: dict[str, list[int]] = {"mcp-true": [], "mcp-raw": [], "lib-true": [], "cli-true": [], "mcp-start": []}

    def timed(name, fn):
        t0 = time.perf_counter_ns()
        fn()
        samples[name].append(time.perf_counter_ns() - t0)

    with Daemon() as daemon:
        env = sluice_cli().env(daemon.env())  # for sluice's processes only
        client = daemon.client()
        raw = RawServer(env)
        raw.call("initialize", INIT)
        cli = [*sluice_argv(), "run", "--", "true"]

        def cli_true():
            subprocess.run(cli, env=env, cwd=WORK_DIR, stdin=subprocess.DEVNULL, capture_output=True, check=True)

        def lib_true():
            assert client.run(["true"], cwd=WORK_DIR).returncode == 0

        def start():
            r = RawServer(env)
            r.call("initialize", INIT)
            r.call("tools/call", RUN_TRUE)
            r.close()

        async def main():
            params = StdioServerParameters(command=sluice_argv()[0], args=[*sluice_argv()[1:], "mcp", "--cwd", WORK_DIR],
                                           env=env, cwd=WORK_DIR)
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                for _ in range(5):  # warm-up: connect, warm sandboxes
                    await session.call_tool("run", {"argv": ["true"]})
                    raw.call("tools/call", RUN_TRUE)
                    lib_true()
                    cli_true()
                log(f"mcp: {count} x (SDK client run, raw JSON-RPC run, library run, sluice run -- true)")
                for done in range(0, count, block):
                    n = min(block, count - done)
                    for _ in range(n):
                        t0 = time.perf_counter_ns()
                        r = await session.call_tool("run", {"argv": ["true"]})
                        samples["mcp-true"].append(time.perf_counter_ns() - t0)
                        assert r.structured_content["exit_code"] == 0
                    time.sleep(0.02)
                    for _ in range(n):
                        timed("mcp-raw", lambda: raw.call("tools/call", RUN_TRUE))
                    time.sleep(0.02)
                    for _ in range(n):
                        timed("lib-true", lib_true)
                    time.sleep(0.02)
                    for _ in range(n):
                        timed("cli-true", cli_true)
                for _ in range(5 if quick else 10):
                    timed("mcp-start", start)

        anyio.run(main)
        raw.close()

    st = {name: Stats.of(v, 1e6) for name, v in samples.items()}
    lib = st["lib-true"].median
    return [
        Row("mcp-true", st["mcp-true"].median, "ms", lib, ratio(st["mcp-true"].median, lib), None, None, st["mcp-true"],
            f"run of `true` through sluice mcp from the MCP SDK's client; baseline Client.run; "
            f"overhead {st['mcp-true'].median - lib:.2f} ms per call"),
        Row("mcp-raw", st["mcp-raw"].median, "ms", lib, ratio(st["mcp-raw"].median, lib), None, None, st["mcp-raw"],
            f"the same tools/call written by hand (no SDK); overhead {st['mcp-raw'].median - lib:.2f} ms per call"),
        Row("lib-true", lib, "ms", None, None, None, None, st["lib-true"], "Client.run([\"true\"]) in this process"),
        Row("cli-true-vs-lib", st["cli-true"].median, "ms", lib, ratio(st["cli-true"].median, lib), None, None,
            st["cli-true"], f"sluice run -- true, whole process ({' '.join(sluice_argv())}); baseline lib-true"),
        Row("mcp-start", st["mcp-start"].median, "ms", None, None, None, None, st["mcp-start"],
            "spawn sluice mcp, initialize, first run of `true` answered (daemon already running)"),
    ]


if __name__ == "__main__":
    bench_main(run, __doc__)
