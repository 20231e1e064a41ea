"""chunk-latency: from a line written by a sandboxed command to the client receiving it.

The command (Python, in the sandbox) writes ``time.monotonic_ns()`` and a newline every
10 ms for 2 s, unbuffered. The client's ``on_output`` takes ``time.monotonic_ns()`` on
arrival; each complete line gives one sample, arrival minus write time (CLOCK_MONOTONIC is
the same clock inside the sandbox: it has no time namespace). No baseline.
Target: median <= 1 ms and p99 <= 5 ms.
"""

from __future__ import annotations

import sys
import time

from common import WORK_DIR, Daemon, Row, Stats, bench_main, describe, log, warm_up

TARGET_MEDIAN_MS = 1.0
TARGET_P99_MS = 5.0
PERIOD_S = 0.01

# Paced on absolute deadlines so that a late wake-up does not shift every later line.
TICKER = """
import os, sys, time
count, period = int(sys.argv[1]), float(sys.argv[2])
start = time.monotonic()
for i in range(count):
    delay = start + i * period - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    os.write(1, b"%d\\n" % time.monotonic_ns())
"""


def ticks(client, count: int) -> list[int]:
    """Latencies (ns) of ``count`` lines written ``PERIOD_S`` apart."""
    latencies: list[int] = []
    pending = bytearray()

    def on_output(call, stream, chunk) -> None:
        now = time.monotonic_ns()
        if stream != 1:
            return
        pending.extend(chunk)
        *lines, rest = bytes(pending).split(b"\n")
        pending[:] = rest
        latencies.extend(now - int(line) for line in lines if line)

    argv = [sys.executable, "-c", TICKER, str(count), str(PERIOD_S)]
    result = client.run(argv, cwd=WORK_DIR, on_output=on_output, wait_timeout=60)
    if not result.ok or len(latencies) != count:
        raise RuntimeError(f"ticker run: {describe(result)}, {len(latencies)} of {count} lines received; "
                           f"stderr {result.stderr[-300:]!r}")
    return latencies


def run(quick: bool) -> list[Row]:
    per_run = int(2.0 / PERIOD_S)
    runs = 1 if quick else 3
    samples: list[int] = []
    with Daemon() as daemon:
        client = daemon.client()
        warm_up(client, 5)
        ticks(client, 20)
        log(f"chunk-latency: {runs} x 2 s of a line every {PERIOD_S * 1000:g} ms")
        for _ in range(runs):
            samples += ticks(client, per_run)
    stats = Stats.of(samples, 1e6)
    holds = stats.median <= TARGET_MEDIAN_MS and stats.p99 <= TARGET_P99_MS
    return [Row("chunk-latency", stats.median, "ms", None, None,
                f"median <= {TARGET_MEDIAN_MS:g} ms, p99 <= {TARGET_P99_MS:g} ms", holds, stats,
                f"{runs} run(s) of {per_run} lines, {PERIOD_S * 1000:g} ms apart")]


if __name__ == "__main__":
    bench_main(run, __doc__)
