"""Run every benchmark (the execution path, session fan-out), print one table, optionally write JSON.

    python tests/bench/run_all.py [--json PATH] [--quick] [--markdown]

First the set-up (``peers.py``, ``installed.py``): the peers (Codex, srt, bubblewrap)
are installed if missing and checked, and this checkout is installed (not editable) in
a throw-away venv whose ``sluice`` the CLI rows run; a peer that cannot be had is
skipped with one line saying why, and the rows compared with it are left unjudged.
Each benchmark starts its own daemon (in a fresh runtime dir under /tmp) and stops it
when done, also on error or Ctrl-C. A benchmark that fails outright gives a row that
does not hold, and the others still run. ``--quick`` is a smoke run: fewer iterations,
256 MiB streamed instead of 1 GiB. ``--markdown`` prints a table to paste into
docs/benchmarks.md, under a heading line with the date and ``nproc``.
"""

from __future__ import annotations

import importlib
import sys
import time

from common import (
    Row,
    error_row,
    install_signal_handlers,
    machine_line,
    markdown_heading,
    markdown_notes,
    markdown_table,
    parse_args,
    summary,
    table,
    write_json,
)
from peers import set_up

# Module name -> the row id it reports under if it fails before producing rows.
BENCHMARKS = {
    "bench_spawn": "spawn",
    "bench_sandbox_cost": "sandbox-cost",
    "bench_throughput": "throughput",
    "bench_chunk_latency": "chunk-latency",
    "bench_interrupt": "interrupt",
    "bench_concurrency": "concurrency",
    "bench_memory": "memory",
    "bench_cli": "cli-true",
    "bench_sandbox_true": "sandbox-true",
    "bench_bulk": "bulk-1g",  # and bulk-1g-null, bulk-1g-file
    "bench_chatty": "chatty",
    "bench_fanout": "fanout-50",
    "bench_mcp": "mcp-true",
    "bench_mcp_agent": "mcp-start",
    "bench_unified_exec": "uexec-roundtrip",
    "bench_apply_patch": "patch-10-files",
}


def main() -> int:
    args = parse_args(__doc__)
    install_signal_handlers()
    at_start = machine_line()
    print(f"sluice benchmarks{' (quick)' if args.quick else ''}: {at_start}", file=sys.stderr, flush=True)
    rows: list[Row] = []
    started = time.monotonic()
    try:
        t0 = time.monotonic()
        try:
            installed = set_up()
        except Exception as e:  # the rows say what they could not compare with
            installed = [f"set-up failed: {type(e).__name__}: {e}"]
        for line in installed:
            print(f"  {line}", file=sys.stderr, flush=True)
        print(f"  set-up: {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
        for module_name, row_id in BENCHMARKS.items():
            t0 = time.monotonic()
            try:
                rows += importlib.import_module(module_name).run(args.quick)
            except Exception as e:  # one broken benchmark must not hide the others' figures
                print(f"  {module_name} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                rows.append(error_row(row_id, e))
            print(f"  {module_name}: {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("interrupted; figures so far:", file=sys.stderr)
        print(table(rows), file=sys.stderr)
        return 130
    if args.markdown:
        print(markdown_heading(installed, args.quick))
        print()
        print(markdown_table(rows))
        print()
        print(summary(rows))
        print()
        print(markdown_notes(rows))
    else:
        print(f"started {at_start}")
        print(f"ended   {machine_line()}")
        for line in installed:
            print(f"measured: {line}")
        print(table(rows))
        print()
        print(summary(rows))
    print(f"total time {time.monotonic() - started:.0f} s")
    if args.json:
        write_json(rows, args.json)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
