"""memory: the daemon's whole tree, idle and while streaming 1 GiB.

The tree is the daemon and all its descendants: executors, their zygotes and warm
sandboxes, and running commands. Its total is summed over ``psutil``'s
``memory_full_info`` per process: PSS (shared pages divided among their sharers, so the
sum is what the tree really costs; the target is on PSS) and RSS (shared pages counted
in every process, so the sum overstates). Idle: the median of 10 samples, 100 ms apart,
after a warm-up and a second of rest. Growth: a sampler process reads the total every
50 ms while ``head -c 1073741824 /dev/zero`` streams to the client (every byte counted);
growth is the highest sample taken during the stream minus idle. No baseline.
Target: idle PSS <= 150 MiB; growth <= 32 MiB.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

from bench_throughput import stream
from common import Daemon, GiB, MiB, Row, Stats, bench_main, log, warm_up
from tree_memory import tree_memory

TARGET_IDLE_MIB = 150.0
TARGET_GROWTH_MIB = 32.0
SAMPLE_EVERY_S = 0.05


class Sampler:
    """``tree_memory.py`` sampling the daemon's tree every ``SAMPLE_EVERY_S`` in a process of its own."""

    def __init__(self, daemon: Daemon) -> None:
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tree_memory.py")
        self.proc = subprocess.Popen([sys.executable, script, str(daemon.pid), str(SAMPLE_EVERY_S)],
                                     stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        self.proc.stdout.readline()  # sampling has begun

    def stop(self, since_ns: int, until_ns: int) -> list[tuple[int, int]]:
        """(PSS, RSS) samples taken between the two ``time.monotonic_ns`` instants."""
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        samples = []
        for line in out.decode().splitlines():
            fields = line.split()
            if len(fields) == 3 and since_ns <= int(fields[0]) <= until_ns:  # a cut line is dropped
                samples.append((int(fields[1]), int(fields[2])))
        return samples


def idle_memory(daemon: Daemon) -> tuple[float, float, int]:
    """(PSS, RSS) medians of 10 samples and the process count, at rest."""
    samples = []
    for _ in range(10):
        samples.append(tree_memory(daemon.pid))
        time.sleep(0.1)
    return (statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples),
            len(daemon.processes()))


def run(quick: bool) -> list[Row]:
    size = 256 * MiB if quick else GiB
    with Daemon() as daemon:
        client = daemon.client()
        warm_up(client, 20)
        time.sleep(1.0)
        idle_pss, idle_rss, nprocs = idle_memory(daemon)
        log(f"memory: idle {idle_pss / MiB:.1f} MiB PSS over {nprocs} processes; streaming {size // MiB} MiB")
        sampler = Sampler(daemon)
        since = time.monotonic_ns()
        try:
            received, _ = stream(client, size)
        finally:
            samples = sampler.stop(since, time.monotonic_ns())
        time.sleep(1.0)
        after_pss, _, _ = idle_memory(daemon)
    if not samples:
        raise RuntimeError("no memory sample was taken during the stream")
    growth_pss = [(pss - idle_pss) / MiB for pss, _ in samples]
    growth_rss = max(rss for _, rss in samples) - idle_rss
    stats = Stats.of(growth_pss)
    growth = max(growth_pss)
    note = (f"{len(samples)} samples while streaming {size // MiB} MiB; RSS sum growth {growth_rss / MiB:.1f} MiB; "
            f"1 s after the stream: {(after_pss - idle_pss) / MiB:+.1f} MiB PSS from idle")
    if received != size:
        note += f"; WRONG BYTE COUNT: received {received} of {size}"
    return [
        Row("memory-idle", idle_pss / MiB, "MiB", None, None, f"PSS <= {TARGET_IDLE_MIB:g} MiB",
            idle_pss / MiB <= TARGET_IDLE_MIB, None,
            f"PSS sum over {nprocs} processes (daemon, executors, zygotes, warm sandboxes); "
            f"RSS sum {idle_rss / MiB:.1f} MiB"),
        Row("memory-growth", growth, "MiB", None, None, f"<= {TARGET_GROWTH_MIB:g} MiB",
            growth <= TARGET_GROWTH_MIB and received == size, stats, note),
    ]


if __name__ == "__main__":
    bench_main(run, __doc__)
