"""sandbox-cost: a sandboxed `true` through landlock_helper directly, no daemon.

Both ways the executor can start a command: ``Spawner.spawn`` (a warm sandbox from the
zygote's pool) and ``landlock_helper.spawn.spawn`` (a sandbox made on the spot), each
timed from the call to the whole tree being dead and reaped, with the workspace-write
policy and one hidden path (the executor hides its runtime dir). Baseline: an
unsandboxed fork+exec of `true` (``subprocess.run``), in alternating blocks. Measured by
``sandbox_timer.py`` in a small process of its own, which makes its Spawner first thing,
as the executor does. The row's figure is the warm pool; target: median overhead over
the baseline <= 1 ms. ``sandbox-cost-cold`` reports ``spawn()`` alongside, untargeted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

from common import WORK_DIR, Row, Stats, bench_main, log, ratio

TARGET_OVERHEAD_MS = 1.0
TIMER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_timer.py")


def run(quick: bool) -> list[Row]:
    count = 60 if quick else 300
    hidden = tempfile.mkdtemp(prefix="slb-hide-", dir="/tmp")
    log(f"sandbox-cost: {count} x (warm pool, cold spawn, subprocess.run) of `true`")
    try:
        proc = subprocess.run([sys.executable, TIMER, str(count), WORK_DIR, hidden], capture_output=True,
                              text=True, timeout=600)
    finally:
        shutil.rmtree(hidden, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(f"sandbox_timer.py exited {proc.returncode}: {proc.stderr[-400:]}")
    samples = json.loads(proc.stdout)
    base = Stats.of(samples["baseline"], 1e6)
    rows = []
    for row_id, way, what in (("sandbox-cost", "pool", "Spawner.spawn (warm pool)"),
                              ("sandbox-cost-cold", "cold", "spawn() (sandbox made per call)")):
        stats = Stats.of(samples[way], 1e6)
        overhead = stats.median - base.median
        judged = way == "pool"
        rows.append(Row(
            row_id, stats.median, "ms", base.median, ratio(stats.median, base.median),
            f"overhead <= {TARGET_OVERHEAD_MS:g} ms" if judged else None,
            overhead <= TARGET_OVERHEAD_MS if judged else None, stats,
            f"{what}: median overhead {overhead:.2f} ms over subprocess.run ({base.text()} ms)",
        ))
    return rows


if __name__ == "__main__":
    bench_main(run, __doc__)
