"""stdin: `head -c 1073741824 /dev/zero | sluice run [--via-broker] -- wc -c`.

The whole command line as a person runs it: ``sluice run`` (a subprocess, start-up
included) with a piped stdin, whose count by the sandboxed ``wc -c`` must equal the size.
``stdin``: a direct run, where the pipe is the command's own stdin; ``stdin-via-broker``:
``sluice run`` reads the pipe and feeds it, with flow control, through the daemon.
Baseline: ``head -c N /dev/zero | wc -c`` run by ``sh`` from this process, timed in the
same run, alternating with the measured runs. Figures are MB/s (10^6 bytes per second),
the median of the repetitions. No target.
"""

from __future__ import annotations

import subprocess
import sys
import time

from common import ROOT, WORK_DIR, Daemon, GiB, MiB, Row, Stats, bench_main, log, pipe_baseline, ratio, warm_up


def through_sluice(env: dict[str, str], size: int, flags: str = "") -> tuple[int, int]:
    """(bytes the command counted, nanoseconds) for ``size`` bytes piped into ``sluice run``."""
    t0 = time.perf_counter_ns()
    proc = subprocess.run(["sh", "-c", f'head -c {size} /dev/zero | "$0" -m broker run {flags} -- wc -c', sys.executable],
                          env=env, cwd=WORK_DIR, capture_output=True, timeout=600)
    elapsed = time.perf_counter_ns() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"sluice run exited {proc.returncode}: {proc.stderr.decode(errors='replace')[-300:]}")
    return int(proc.stdout.split()[0]), elapsed


def run(quick: bool) -> list[Row]:
    size = 256 * MiB if quick else GiB
    reps = 3 if quick else 5
    kinds = {"stdin": "", "stdin-via-broker": "--via-broker"}
    rates: dict[str, list[float]] = {row: [] for row in kinds}
    base_rates: list[float] = []
    short: dict[str, list[str]] = {row: [] for row in kinds}
    with Daemon() as daemon:
        env = dict(daemon.env(), PYTHONPATH=ROOT)
        warm_up(daemon.client(), 5)
        for flags in kinds.values():
            through_sluice(env, 64 * MiB, flags)
        pipe_baseline(64 * MiB, "wc -c")
        log(f"stdin: {reps} x {size // MiB} MiB piped into sluice run (direct, and --via-broker), "
            f"{reps} x the same into wc -c directly")
        for _ in range(reps):
            base_rates.append(size / pipe_baseline(size, "wc -c") * 1e3)  # bytes/ns * 1e3 = MB/s
            for row, flags in kinds.items():
                counted, elapsed = through_sluice(env, size, flags)
                rates[row].append(size / elapsed * 1e3)
                if counted != size:
                    short[row].append(f"the command counted {counted} of {size} bytes")
    base = Stats.of(base_rates)
    rows = []
    for row in kinds:
        stats = Stats.of(rates[row])
        note = f"{size // MiB} MiB per run, {reps} runs, sluice run's start-up included; baseline MB/s: {base.text()}"
        if short[row]:
            note += "; WRONG BYTE COUNT: " + ", ".join(short[row])
        rows.append(Row(row, stats.median, "MB/s", base.median, ratio(stats.median, base.median), None,
                        None if not short[row] else False, stats, note))
    return rows


if __name__ == "__main__":
    bench_main(run, __doc__)
