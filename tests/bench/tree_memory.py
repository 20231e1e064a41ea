"""The memory of a process tree; run as a script, a sampler of it.

``python tree_memory.py PID INTERVAL_S`` prints ``<monotonic ns> <pss> <rss>`` (bytes, summed
over PID and all its descendants) every INTERVAL_S seconds until terminated. It runs as a process
of its own so that sampling does not take the measuring client's time.
"""

from __future__ import annotations

import signal
import sys
import time

import psutil


def tree_memory(pid: int) -> tuple[int, int]:
    """(PSS sum, RSS sum) in bytes over ``pid`` and its descendants; vanished ones skipped."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0, 0
    pss = rss = 0
    for p in procs:
        try:
            m = p.memory_full_info()
        except psutil.Error:
            continue
        pss += m.pss
        rss += m.rss
    return pss, rss


def sample_forever(pid: int, interval: float) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    next_at = time.monotonic()
    while True:
        pss, rss = tree_memory(pid)
        print(time.monotonic_ns(), pss, rss, flush=True)
        next_at += interval
        time.sleep(max(0.0, next_at - time.monotonic()))


if __name__ == "__main__":
    sample_forever(int(sys.argv[1]), float(sys.argv[2]))
