"""chatty: 60,000 flushed one-byte writes through `sluice run`, against the same bare.

The command is ``python -c "...sys.stdout.write('x'); sys.stdout.flush()..."`` (this
interpreter, not a ``python3`` that may be a version manager's shim): each write is its
own ``write(2)`` of one byte. ``chatty`` is ``sluice run -- <command>`` (the console
script of a non-editable install, see ``installed.py``) end to end as a subprocess whose
stdout is a pipe, minus ``sluice run -- true`` (the CLI's start-up, connecting and a
sandboxed spawn: what every command pays, measured elsewhere);
the baseline is the same command bare, its stdout a pipe too (interpreter start-up in both).
Medians of alternating blocks against an already running daemon.
Target: ratio <= 1.3x.
"""

from __future__ import annotations

import sys

from common import Daemon, Row, Stats, alternate, bench_main, checked_run, log, ratio
from installed import sluice_cli

TARGET_RATIO = 1.3
WRITES = 60_000

CHATTY = f"""
import sys
w, f = sys.stdout.write, sys.stdout.flush
for _ in range({WRITES}):
    w('x'); f()
"""


def run(quick: bool) -> list[Row]:
    count = 6 if quick else 30
    command = [sys.executable, "-c", CHATTY]
    cli = sluice_cli()
    sluice = [*cli.argv, "run", "--"]
    with Daemon() as daemon:
        env = daemon.env()
        cases = {
            "bare": (command, env, WRITES),
            "sluice-true": ([*sluice, "true"], cli.env(env), 0),
            "sluice-chatty": ([*sluice, *command], cli.env(env), WRITES),
        }
        for argv, e, expect in cases.values():
            for _ in range(2):
                checked_run(argv, e, expect_stdout=expect)
        log(f"chatty: {count} x (bare, sluice run -- true, sluice run -- {WRITES:,} one-byte writes)")
        samples = alternate({name: lambda a=argv, e=e, n=expect: checked_run(a, e, expect_stdout=n)
                             for name, (argv, e, expect) in cases.items()}, count, block=5)
    bare = Stats.of(samples["bare"], 1e6)
    true = Stats.of(samples["sluice-true"], 1e6)
    chatty = Stats.of(samples["sluice-chatty"], 1e6)
    figure = chatty.median - true.median
    r = ratio(figure, bare.median)
    return [Row("chatty", figure, "ms", bare.median, r, f"<= {TARGET_RATIO:g}x", r is not None and r <= TARGET_RATIO,
                chatty,
                f"sluice run of {WRITES:,} flushed 1-byte writes {chatty.median:.0f} ms minus sluice run -- true "
                f"{true.median:.0f} ms; baseline the same bare {bare.median:.0f} ms (stdout a pipe in both); "
                f"{cli.kind}")]


if __name__ == "__main__":
    bench_main(run, __doc__)
