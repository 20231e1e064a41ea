"""chatty: 60,000 flushed one-byte writes through `sluice run`, against the same bare.

The command is ``python -c "...sys.stdout.write('x'); sys.stdout.flush()..."`` (this
interpreter, not a ``python3`` that may be a version manager's shim): each write is its own
``write(2)`` of one byte. ``chatty`` is ``sluice run -- <command>``
end to end as a subprocess whose stdout is a pipe, minus ``sluice run -- true`` (the CLI's
start-up, connecting and a sandboxed spawn: what every command pays, measured elsewhere);
the baseline is the same command bare, its stdout a pipe too (interpreter start-up in both).
Medians of alternating blocks against an already running daemon.
Target: ratio <= 1.3x.
"""

from __future__ import annotations

import subprocess
import sys

from bench_cli import sluice_argv
from common import WORK_DIR, Daemon, Row, Stats, alternate, bench_main, log, ratio

TARGET_RATIO = 1.3
WRITES = 60_000

CHATTY = f"""
import sys
w, f = sys.stdout.write, sys.stdout.flush
for _ in range({WRITES}):
    w('x'); f()
"""


def run_checked(argv: list[str], env: dict[str, str], expect: int) -> None:
    proc = subprocess.run(argv, env=env, cwd=WORK_DIR, stdin=subprocess.DEVNULL, capture_output=True)
    if proc.returncode != 0 or len(proc.stdout) != expect:
        raise RuntimeError(f"{argv[-3:]} exited {proc.returncode} with {len(proc.stdout)} bytes of stdout "
                           f"(expected {expect}): {proc.stderr.decode(errors='replace')[-300:]}")


def run(quick: bool) -> list[Row]:
    count = 6 if quick else 30
    command = [sys.executable, "-c", CHATTY]
    sluice = [*sluice_argv(), "run", "--"]
    cases = {
        "bare": (command, WRITES),
        "sluice-true": ([*sluice, "true"], 0),
        "sluice-chatty": ([*sluice, *command], WRITES),
    }
    with Daemon() as daemon:
        env = daemon.env()
        for argv, expect in cases.values():
            for _ in range(2):
                run_checked(argv, env, expect)
        log(f"chatty: {count} x (bare, sluice run -- true, sluice run -- {WRITES:,} one-byte writes)")
        samples = alternate({name: lambda a=argv, e=expect: run_checked(a, env, e)
                             for name, (argv, expect) in cases.items()}, count, block=5)
    bare = Stats.of(samples["bare"], 1e6)
    true = Stats.of(samples["sluice-true"], 1e6)
    chatty = Stats.of(samples["sluice-chatty"], 1e6)
    figure = chatty.median - true.median
    r = ratio(figure, bare.median)
    return [Row("chatty", figure, "ms", bare.median, r, f"<= {TARGET_RATIO:g}x", r is not None and r <= TARGET_RATIO,
                chatty,
                f"sluice run of {WRITES:,} flushed 1-byte writes {chatty.median:.0f} ms minus sluice run -- true "
                f"{true.median:.0f} ms; baseline the same bare {bare.median:.0f} ms (stdout a pipe in both)")]


if __name__ == "__main__":
    bench_main(run, __doc__)
