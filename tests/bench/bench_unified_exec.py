"""unified exec: write round trip to an echoing REPL, and memory per idle session.

Round trip: through the agent's runner (``BrokerRunner.start_interactive``, the path
``write_stdin`` and the seed's ``unified_exec`` take), the time from a write of one
short line to the moment its answer has come back, over 200 writes (after 20 of
warm-up), for a Python REPL in a terminal (``python3 -i``: the line ``N`` answered by
``N`` and a prompt) and for a Python echo loop on pipes. No baseline.

Memory: the daemon's tree (daemon, executors, zygotes, warm sandboxes, commands) summed
by ``psutil`` (PSS and RSS), idle, then with 20 ``bash -i`` sessions in terminals
waiting at their prompt; per session = (with - without) / 20.
"""

from __future__ import annotations

import asyncio
import statistics
import time

from common import WORK_DIR, Daemon, MiB, Row, Stats, bench_main, log
from tree_memory import tree_memory

from agent.exec_runner import BrokerRunner
from broker.wire import frames as wire
from landlock_helper.policy import SandboxPolicy

POLICY = SandboxPolicy.from_mode("workspace-write")
ECHO = ["/usr/bin/python3", "-u", "-c", "import sys\nfor line in sys.stdin:\n    sys.stdout.write(line)\n"]
REPL = ["/usr/bin/python3", "-q", "-i"]
SESSIONS = 20


async def _round_trips(runner: BrokerRunner, argv: list[str], tty: wire.Winsize | None, count: int,
                       answer) -> list[float]:
    out = bytearray()
    arrived = asyncio.Event()

    def on_output(stream, chunk: bytes) -> None:
        out.extend(chunk)
        arrived.set()

    proc = await runner.start_interactive(argv, WORK_DIR, POLICY, on_output, tty=tty)
    try:
        if tty is not None:  # wait for the first prompt
            while b">>> " not in out:
                arrived.clear()
                await asyncio.wait_for(arrived.wait(), 10)
        samples = []
        for i in range(count):
            out.clear()
            expect = answer(i)
            started = time.perf_counter_ns()
            await proc.write(f"{i}\n".encode())
            while expect not in out:
                arrived.clear()
                await asyncio.wait_for(arrived.wait(), 10)
            samples.append((time.perf_counter_ns() - started) / 1e6)
        return samples
    finally:
        await proc.cancel()
        await proc.wait()


async def _latency(daemon: Daemon, count: int) -> dict[str, list[float]]:
    runner = await BrokerRunner.connect(daemon.runtime)
    try:
        results = {}
        for name, argv, tty, answer in (
            ("repl-tty", REPL, wire.Winsize(24, 80), lambda i: f"\r\n{i}\r\n>>> ".encode()),
            ("echo-pipes", ECHO, None, lambda i: f"{i}\n".encode()),
        ):
            await _round_trips(runner, argv, tty, 20, answer)  # warm-up
            results[name] = await _round_trips(runner, argv, tty, count, answer)
        return results
    finally:
        await runner.aclose()


async def _memory(daemon: Daemon) -> tuple[float, float]:
    runner = await BrokerRunner.connect(daemon.runtime)
    procs = []
    try:
        await asyncio.sleep(1.0)
        before = _settled(daemon)
        outs = []
        for _ in range(SESSIONS):
            out = bytearray()
            outs.append(out)
            procs.append(await runner.start_interactive(["bash", "--norc", "-i"], WORK_DIR, POLICY,
                                                        lambda s, c, out=out: out.extend(c),
                                                        tty=wire.Winsize(24, 80)))
        for proc in procs:
            await proc.write(b"echo READY\n")
        deadline = time.monotonic() + 20
        while not all(b"READY\r\n" in o for o in outs):
            if time.monotonic() > deadline:
                raise RuntimeError("the sessions did not all answer")
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        after = _settled(daemon)
        return ((after[0] - before[0]) / SESSIONS, (after[1] - before[1]) / SESSIONS)
    finally:
        for proc in procs:
            await proc.cancel()
        for proc in procs:
            await proc.wait()
        await runner.aclose()


def _settled(daemon: Daemon) -> tuple[float, float]:
    samples = []
    for _ in range(5):
        samples.append(tree_memory(daemon.pid))
        time.sleep(0.1)
    return statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)


def run(quick: bool) -> list[Row]:
    count = 50 if quick else 200
    with Daemon() as daemon:
        log(f"unified exec: {count} round trips each way")
        latency = asyncio.run(_latency(daemon, count))
        log(f"unified exec: memory of {SESSIONS} idle bash sessions")
        pss, rss = asyncio.run(_memory(daemon))
    rows = []
    for name, samples in latency.items():
        stats = Stats.of(samples)
        rows.append(Row(f"uexec-roundtrip-{name}", stats.median, "ms", stats=stats,
                        note=f"p99 {stats.p99:.2f} ms over {len(samples)} writes"))
    rows.append(Row("uexec-memory-per-session", pss / MiB, "MiB", note=f"PSS; RSS sum {rss / MiB:.1f} MiB per session, "
                    f"over {SESSIONS} idle `bash -i` in terminals"))
    return rows


if __name__ == "__main__":
    bench_main(run, __doc__)
