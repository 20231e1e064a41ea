"""spawn: round trip of a sandboxed `true` (workspace-write) through the daemon.

From the client: request sent -> final result received, one call at a time. Baseline:
``subprocess.run(["true"])`` in this process, in blocks alternating with the measured runs.
Target: median <= 4x the baseline.
"""

from __future__ import annotations

import subprocess

from common import WORK_DIR, Daemon, Row, Stats, alternate, bench_main, describe, log, ratio, warm_up

TARGET_RATIO = 4.0


def run(quick: bool) -> list[Row]:
    count = 60 if quick else 300
    failures: list[str] = []
    with Daemon() as daemon:
        client = daemon.client()
        warm_up(client, 20)

        def sandboxed() -> None:
            result = client.run(["true"], cwd=WORK_DIR, sandbox="workspace-write", wait_timeout=30)
            if not result.ok:
                failures.append(describe(result))

        log(f"spawn: {count} sandboxed `true` round trips, {count} subprocess.run baselines")
        samples = alternate({"baseline": lambda: subprocess.run(["true"]), "sandboxed": sandboxed}, count)
    stats = Stats.of(samples["sandboxed"], 1e6)
    base = Stats.of(samples["baseline"], 1e6)
    r = ratio(stats.median, base.median)
    note = f"baseline subprocess.run: {base.text()} ms"
    if failures:
        note += f"; {len(failures)} runs failed, first: {failures[0]}"
    return [Row("spawn", stats.median, "ms", base.median, r, f"median <= {TARGET_RATIO:g}x baseline",
                r <= TARGET_RATIO and not failures, stats, note)]


if __name__ == "__main__":
    bench_main(run, __doc__)
