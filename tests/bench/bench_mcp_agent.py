"""MCP servers as the agent's tools: start-up time and per-call overhead of a server run
in the sandbox through the daemon (the session's launcher) against the same server run
as a plain child process (no daemon, no sandbox), measured in the same run.

Start-up: ``McpManager.start()`` (process start, ``initialize``, ``tools/list``), median
of 5, for server-everything (node) and mcp-server-time (Python). Per call: ``echo``
(server-everything) and ``get_current_time`` (mcp-server-time), median and p99 of 100
after 10 of warm-up.
"""

from __future__ import annotations

import asyncio
import time

from common import WORK_DIR, Daemon, Row, Stats, bench_main, log, ratio

from agent.exec_runner import BrokerRunner
from agent.mcp.launcher import sandboxed_launcher
from agent.mcp.manager import McpManager
from broker.net.logging import configure as configure_logging
from broker.wire.protocol import McpServerConfig
from landlock_helper.policy import SandboxPolicy
from tests.support.mcp_servers import everything_entry, local_launcher, time_server

POLICY = SandboxPolicy.from_mode("workspace-write")


def _servers() -> list[tuple[McpServerConfig, str, dict]]:
    import shutil

    out = []
    entry, why = everything_entry()
    if entry is not None:
        out.append((McpServerConfig(name="everything", command=shutil.which("node"), args=[entry, "stdio"]),
                    "everything__echo", {"message": "hi"}))
    else:
        log(f"server-everything left out: {why}")
    found, why = time_server()
    if found is not None:
        command, args, env = found
        out.append((McpServerConfig(name="time", command=command, args=args, env=env),
                    "time__get_current_time", {"timezone": "Etc/UTC"}))
    else:
        log(f"mcp-server-time left out: {why}")
    return out


async def _measure(launcher, server: McpServerConfig, tool: str, args: dict, starts: int, calls: int):
    start_samples, call_samples = [], []
    for _ in range(starts):
        manager = McpManager([server], launcher)
        began = time.perf_counter()
        errors = await manager.start()
        start_samples.append((time.perf_counter() - began) * 1000)
        if errors:
            raise RuntimeError(errors[0])
        await manager.aclose()
    manager = McpManager([server], launcher)
    await manager.start()
    try:
        for i in range(10 + calls):
            began = time.perf_counter()
            outcome = await manager.call(tool, args)
            if not outcome.success:
                raise RuntimeError(outcome.why or str(outcome.output))
            if i >= 10:
                call_samples.append((time.perf_counter() - began) * 1000)
    finally:
        await manager.aclose()
    return Stats.of(start_samples), Stats.of(call_samples)


async def _all(daemon: Daemon, starts: int, calls: int) -> list[Row]:
    runner = await BrokerRunner.connect(daemon.runtime)
    sandboxed = sandboxed_launcher(runner, session_policy=POLICY, cwd=WORK_DIR, sandbox_cwd=WORK_DIR)
    rows = []
    try:
        for server, tool, args in _servers():
            local_start, local_call = await _measure(local_launcher([]), server, tool, args, starts, calls)
            box_start, box_call = await _measure(sandboxed, server, tool, args, starts, calls)
            name = server.name
            rows.append(Row(f"mcp-start-{name}", box_start.median, "ms", baseline=local_start.median,
                            ratio=ratio(box_start.median, local_start.median), stats=box_start,
                            note=f"sandboxed through the daemon vs a plain child process "
                                 f"(+{box_start.median - local_start.median:.1f} ms)"))
            rows.append(Row(f"mcp-call-{name}", box_call.median, "ms", baseline=local_call.median,
                            ratio=ratio(box_call.median, local_call.median), stats=box_call,
                            note=f"p99 {box_call.p99:.2f} ms; +{box_call.median - local_call.median:.2f} ms per call "
                                 "over a plain child process"))
    finally:
        await runner.aclose()
    return rows


def run(quick: bool) -> list[Row]:
    starts, calls = (3, 30) if quick else (5, 100)
    # The MCP manager's log lines go to stderr, warnings only: stdout is the results table.
    configure_logging(level="warning")
    with Daemon() as daemon:
        log(f"MCP: {starts} starts and {calls} calls per server, sandboxed and plain")
        return asyncio.run(_all(daemon, starts, calls))


if __name__ == "__main__":
    bench_main(run, __doc__)
