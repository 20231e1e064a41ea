"""sandbox-cli: `sluice sandbox -- true` against bubblewrap with the same isolation.

Both whole processes, as a person runs them: ``sluice sandbox -- true`` (the console
script next to this interpreter, else ``python -m broker``: interpreter start-up,
imports, the sandbox made on the spot, the command, exit; no daemon) and
``bwrap --ro-bind / / --dev /dev --proc /proc --unshare-all --die-with-parent
--new-session true``, strictly alternating, median of 20 (8 with ``--quick``) after
warm-up. Baseline: ``python -c pass`` (a bare interpreter start-up, the floor of any
Python command), alternating too. Besides wall time, the CPU time of each whole process
tree (user + system of the reaped children) is noted: it is steadier on a shared machine.

Target (issue 15): sluice sandbox <= 5x bubblewrap. Without bwrap on PATH (Debian's
``bubblewrap`` package) the row says so and holds nothing.
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys

from bench_cli import sluice_argv
from common import WORK_DIR, Row, Stats, alternate, bench_main, log, ratio

TARGET = 5.0
BWRAP = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all", "--die-with-parent",
         "--new-session", "true"]


def _runner(argv: list[str], env: dict[str, str], cpu: list[float]):
    """A function that runs ``argv`` once (it must exit 0) and notes its tree's CPU ms."""

    def run_once() -> None:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run(argv, env=env, cwd=WORK_DIR, stdin=subprocess.DEVNULL, capture_output=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise RuntimeError(f"{argv} exited {proc.returncode}: {proc.stderr.decode(errors='replace')[-300:]}")
        cpu.append((after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000)

    return run_once


def run(quick: bool) -> list[Row]:
    count = 8 if quick else 20
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return [Row("sandbox-cli", None, "ms", target=f"<= {TARGET:g}x bwrap",
                    note="bwrap not found on PATH (install Debian's bubblewrap): no peer to compare with")]
    cases = {
        "baseline": [sys.executable, "-c", "pass"],
        "bwrap": [bwrap, *BWRAP],
        "sluice": [*sluice_argv(), "sandbox", "--", "true"],
    }
    env = dict(os.environ)
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    ways = {name: _runner(argv, env, cpu[name]) for name, argv in cases.items()}
    for way in ways.values():
        for _ in range(3):
            way()
    for samples in cpu.values():
        samples.clear()
    log(f"sandbox-cli: {count} x (python -c pass, bwrap ... true, sluice sandbox -- true), alternating")
    samples = alternate(ways, count, block=1, settle_s=0.005)
    wall = {name: Stats.of(samples[name], 1e6) for name in cases}
    cpu_ms = {name: statistics.median(values) for name, values in cpu.items()}
    figure, peer = wall["sluice"].median, wall["bwrap"].median
    rel = ratio(figure, peer)
    return [Row("sandbox-cli", figure, "ms", peer, rel, f"<= {TARGET:g}x bwrap", rel is not None and rel <= TARGET,
                wall["sluice"],
                f"`{' '.join(os.path.basename(a) for a in cases['sluice'])}` vs `bwrap {' '.join(BWRAP)}`, "
                f"whole processes, median of {count} alternating; python -c pass {wall['baseline'].median:.1f} ms; "
                f"CPU of the tree (median): sluice {cpu_ms['sluice']:.1f} ms, bwrap {cpu_ms['bwrap']:.1f} ms, "
                f"python -c pass {cpu_ms['baseline']:.1f} ms")]


if __name__ == "__main__":
    bench_main(run, __doc__)
