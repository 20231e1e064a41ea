"""throughput: `head -c 1073741824 /dev/zero` through the daemon to the client.

Every byte is counted by the client's ``on_output`` callback (summing ``len(chunk)``) and
the count must equal the size. Baseline: ``head -c N /dev/zero | cat > /dev/null`` run
by ``sh`` from this process, timed in the same run, alternating with the measured runs.
Figures are MB/s (10^6 bytes per second), the median of the repetitions for each.
Target: >= 0.5x the baseline.
"""

from __future__ import annotations

import time

from common import WORK_DIR, Daemon, GiB, MiB, Row, Stats, bench_main, describe, log, pipe_baseline, ratio, warm_up

TARGET_RATIO = 0.5


def stream(client, size: int) -> tuple[int, int]:
    """(bytes received, nanoseconds) for ``head -c size /dev/zero`` through the daemon."""
    received = 0

    def count(call, stream_no, chunk) -> None:
        nonlocal received
        received += len(chunk)

    t0 = time.perf_counter_ns()
    result = client.run(["head", "-c", str(size), "/dev/zero"], cwd=WORK_DIR, on_output=count, wait_timeout=300)
    elapsed = time.perf_counter_ns() - t0
    if not result.ok:
        raise RuntimeError(f"streaming {size} bytes failed: {describe(result)}")
    return received, elapsed


def run(quick: bool) -> list[Row]:
    size = 256 * MiB if quick else GiB
    reps = 3 if quick else 5
    rates: list[float] = []
    base_rates: list[float] = []
    short: list[str] = []
    with Daemon() as daemon:
        client = daemon.client()
        warm_up(client, 5)
        stream(client, 64 * MiB)
        pipe_baseline(64 * MiB, "cat")
        log(f"throughput: {reps} x {size // MiB} MiB through the daemon, {reps} x the same through a pipe")
        for _ in range(reps):
            base_rates.append(size / pipe_baseline(size, "cat") * 1e3)  # bytes/ns * 1e3 = MB/s
            received, elapsed = stream(client, size)
            rates.append(received / elapsed * 1e3)
            if received != size:
                short.append(f"received {received} of {size} bytes")
    stats, base = Stats.of(rates), Stats.of(base_rates)
    r = ratio(stats.median, base.median)
    note = f"{size // MiB} MiB per run, {reps} runs; pipe baseline MB/s: {base.text()}"
    if short:
        note += "; WRONG BYTE COUNT: " + ", ".join(short)
    return [Row("throughput", stats.median, "MB/s", base.median, r, f">= {TARGET_RATIO:g}x baseline",
                r >= TARGET_RATIO and not short, stats, note)]


if __name__ == "__main__":
    bench_main(run, __doc__)
