"""What one misbehaving MCP server costs the other sessions of its agent process: the
event loop's lag (how late a 1 ms timer fires) in a process that runs the server as the
agent does (``BrokerRunner`` to the daemon, ``McpManager``, the sandboxed launcher), in
the same run:

- ``idle``: no server, 3 s;
- ``junk``: a server printing junk from its first byte, from its start until it is
  stopped (after 100 bad lines) and 1 s more;
- ``mute``: a server flooding valid notifications from its first byte and never
  answering, until its start-up timeout (3 s) fires;
- ``flood``: a valid server flooding notifications, 5 s after its start; then one call,
  whose answer comes after what the server wrote before it.

Each row: the median lag, with p99 and max in the note, and the process's CPU share
(this process stands for the agent: the server's output is read here).
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time

from common import WORK_DIR, Daemon, Row, Stats, bench_main, log

from agent.exec_runner import BrokerRunner
from agent.mcp.launcher import sandboxed_launcher
from agent.mcp.manager import McpManager
from broker.net.logging import configure as configure_logging
from broker.wire.protocol import McpServerConfig
from landlock_helper.policy import SandboxPolicy
from tests.support.mcp_servers import CHATTY, JUNK, MUTE, NOTIFICATION_BYTES

POLICY = SandboxPolicy.from_mode("workspace-write")
TICK_S = 0.001


class Lag:
    """Samples how late a TICK_S timer fires, until stopped."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._task = asyncio.ensure_future(self._run())
        self._cpu = time.process_time()
        self._wall = time.monotonic()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(TICK_S)
            self.samples.append((loop.time() - before - TICK_S) * 1000)

    async def stop(self) -> tuple[Stats, float]:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        cpu = (time.process_time() - self._cpu) / (time.monotonic() - self._wall)
        return Stats.of(self.samples), cpu


def _server(name: str, source: str, **settings) -> McpServerConfig:
    return McpServerConfig(name=name, command=os.path.realpath(sys.executable), args=["-c", source], **settings)


def _row(scenario: str, stats: Stats, cpu: float, note: str) -> Row:
    return Row(f"mcp-flood-lag-{scenario}", stats.median, "ms", stats=stats,
               note=f"p99 {stats.p99:.2f} ms, max {stats.max:.1f} ms; CPU {cpu:.0%}; {note}")


async def _all(daemon: Daemon, flood_s: float) -> list[Row]:
    runner = await BrokerRunner.connect(daemon.runtime)
    launcher = sandboxed_launcher(runner, session_policy=POLICY, cwd=WORK_DIR, sandbox_cwd=WORK_DIR)
    rows = []
    try:
        lag = Lag()
        await asyncio.sleep(3.0)
        rows.append(_row("idle", *await lag.stop(), "no MCP server"))

        for name, source, timeout in (("junk", JUNK, 30.0), ("mute", MUTE, 3.0)):
            manager = McpManager([_server(name, source, startup_timeout_s=timeout)], launcher)
            lag = Lag()
            began = time.monotonic()
            errors = await manager.start()
            took = time.monotonic() - began
            await asyncio.sleep(1.0)
            stats, cpu = await lag.stop()
            await manager.aclose()
            rows.append(_row(name, stats, cpu, f"start failed after {took:.2f} s: {errors[0] if errors else 'no error'}"))

        manager = McpManager([_server("chatty", CHATTY, startup_timeout_s=60.0)], launcher)
        lag = Lag()
        errors = await manager.start()
        if errors:
            raise RuntimeError(errors[0])
        await asyncio.sleep(flood_s)
        began = time.monotonic()
        outcome = await manager.call("chatty__count", {})
        took = time.monotonic() - began
        stats, cpu = await lag.stop()
        await manager.aclose()
        sent = int(re.search(r'"text": ?"(\d+)"', outcome.output).group(1))
        rows.append(_row("flood", stats, cpu, f"a call answered in {took:.1f} s, behind "
                                               f"{sent * NOTIFICATION_BYTES / 2**20:.0f} MiB of notifications"))
    finally:
        await runner.aclose()
    return rows


def run(quick: bool) -> list[Row]:
    configure_logging(level="error")
    with Daemon() as daemon:
        log("MCP floods: the event loop's lag, idle and under three misbehaving servers")
        return asyncio.run(_all(daemon, 2.0 if quick else 5.0))


if __name__ == "__main__":
    bench_main(run, __doc__)
