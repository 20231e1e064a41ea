"""concurrency: sandboxed `true` runs from one client, N kept in flight, commands per second.

For N = 1, 8, 64, 256 the client submits N calls, then a new one each time one ends,
until the case's total has been submitted, and waits for the last; commands/s is the total
over the wall time from the first submit to the last result. Every call must succeed.
The per-command figures (submit -> result, ms) go in the stats column. Baseline: the
serial throughput (N = 1) of the same run. Target: >= 400 commands/s at N = 64, and no
failures at any N.
"""

from __future__ import annotations

import time

from common import WORK_DIR, Daemon, Row, Stats, bench_main, describe, log, ratio, warm_up

IN_FLIGHT = (1, 8, 64, 256)
TARGET_AT_64 = 400.0
CASE_TIMEOUT_S = 120.0


def keep_in_flight(client, n: int, total: int) -> tuple[float, list[int], list[str]]:
    """(commands/s, per-command ns, failure descriptions) for ``total`` calls, ``n`` at a time."""
    submitted_at: dict[str, int] = {}
    latencies: list[int] = []
    failures: list[str] = []
    inflight: list = []
    submitted = 0
    t0 = time.perf_counter_ns()
    deadline = time.monotonic() + CASE_TIMEOUT_S
    while submitted < total or inflight:
        while submitted < total and len(inflight) < n:
            call = client.submit(["true"], cwd=WORK_DIR)
            submitted_at[call.call_id] = time.perf_counter_ns()
            inflight.append(call)
            submitted += 1
        client.poll(1.0)
        now = time.perf_counter_ns()
        still = []
        for call in inflight:
            if not call.done:
                still.append(call)
                continue
            latencies.append(now - submitted_at.pop(call.call_id))
            if call.failure is not None:
                failures.append(str(call.failure))
            elif not call.result.ok:
                failures.append(describe(call.result))
        inflight = still
        if time.monotonic() > deadline:
            failures += [f"still running after {CASE_TIMEOUT_S:g} s: {c!r}" for c in inflight]
            for call in inflight:
                client.cancel(call)
            break
    elapsed = time.perf_counter_ns() - t0
    return len(latencies) / elapsed * 1e9, latencies, failures


def run(quick: bool) -> list[Row]:
    totals = {1: 50, 8: 100, 64: 256, 256: 512} if quick else {1: 200, 8: 400, 64: 1024, 256: 1536}
    results = {}
    with Daemon() as daemon:
        client = daemon.client()
        warm_up(client, 10)
        keep_in_flight(client, 8, 50)
        for n in IN_FLIGHT:
            log(f"concurrency-{n}: {totals[n]} commands, {n} in flight")
            results[n] = keep_in_flight(client, n, totals[n])
    serial = results[1][0]
    rows = []
    for n, (rate, latencies, failures) in results.items():
        holds = not failures and (rate >= TARGET_AT_64 if n == 64 else True)
        target = f">= {TARGET_AT_64:g}/s, no failures" if n == 64 else "no failures"
        note = f"{totals[n]} commands, {len(failures)} failed"
        if failures:
            note += f", first: {failures[0]}"
        rows.append(Row(f"concurrency-{n}", rate, "cmd/s", serial, ratio(rate, serial), target, holds,
                        Stats.of(latencies, 1e6) if latencies else None, note))
    return rows


if __name__ == "__main__":
    bench_main(run, __doc__)
