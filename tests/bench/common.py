"""What every benchmark shares: a daemon for the run, statistics, result rows, output.

A benchmark module defines ``run(quick: bool) -> list[Row]`` and ends with
``if __name__ == "__main__": bench_main(run, __doc__)``. ``run_all.py`` imports the
modules and calls ``run`` in turn.

Durations are taken with ``time.perf_counter_ns``. Baselines are measured in the same
run, in blocks alternating with the measured runs (:func:`alternate`), because the
machine is shared and noisy: a ratio against a baseline of the same minute means more
than an absolute figure.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

# The checkout this file lives in, so the scripts run the code next to them.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import psutil  # noqa: E402

from broker.client import Client  # noqa: E402
from broker.net.runtime import RuntimeDir  # noqa: E402
from tests.support.harness import DaemonFactory  # noqa: E402

MiB = 1024 * 1024
GiB = 1024 * MiB

# Commands run in the checkout: a git work tree, like an agent's (its .git is bound read-only).
WORK_DIR = ROOT


def log(message: str) -> None:
    """Progress, on stderr (the table goes to stdout)."""
    print(f"  {message}", file=sys.stderr, flush=True)


# -- statistics --------------------------------------------------------------------------


@dataclass(frozen=True)
class Stats:
    median: float
    p99: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, samples: Iterable[float], scale: float = 1.0) -> Stats:
        """Summary of ``samples``, each divided by ``scale`` (e.g. ns -> ms with 1e6)."""
        values = sorted(v / scale for v in samples)
        if not values:
            raise ValueError("no samples")
        return cls(statistics.median(values), percentile(values, 99), values[0], values[-1], len(values))

    def text(self) -> str:
        return f"{fmt(self.median)} / {fmt(self.p99)} / {fmt(self.min)} / {fmt(self.max)} (n={self.n})"

    def to_json(self) -> dict:
        return {"median": _round(self.median), "p99": _round(self.p99), "min": _round(self.min),
                "max": _round(self.max), "n": self.n}


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (p99 of 100 samples is the 99th)."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def alternate(ways: dict[str, Callable[[], object]], count: int, *, block: int = 20,
              settle_s: float = 0.02) -> dict[str, list[int]]:
    """Time each of ``ways`` ``count`` times (ns), in alternating blocks of ``block`` runs.

    Blocks, not strict alternation: the work a sandboxed run leaves behind (its zygote
    making the next warm sandbox) would land in the baseline run that follows and flatter
    the ratio; a short settle before each block lets it finish. Alternating blocks still
    spread the slow phases of a noisy machine over every way.
    """
    samples: dict[str, list[int]] = {name: [] for name in ways}
    for start in range(0, count, block):
        for name, fn in ways.items():
            time.sleep(settle_s)
            for _ in range(min(block, count - start)):
                t0 = time.perf_counter_ns()
                fn()
                samples[name].append(time.perf_counter_ns() - t0)
    return samples


def fmt(x: float | None) -> str:
    """Three significant digits, no exponent for the usual ranges."""
    if x is None:
        return "-"
    if x == 0:
        return "0"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    digits = max(0, 2 - int(math.floor(math.log10(abs(x)))))
    return f"{x:.{digits}f}"


def _round(x: float | None) -> float | None:
    return None if x is None else float(f"{x:.6g}")


# -- result rows -------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the results table (and one object of the JSON list)."""

    id: str
    figure: float | None
    unit: str
    baseline: float | None = None
    ratio: float | None = None
    target: str | None = None
    holds: bool | None = None
    stats: Stats | None = None
    note: str = ""

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "figure": _round(self.figure),
            "unit": self.unit,
            "baseline": _round(self.baseline),
            "ratio": _round(self.ratio),
            "target": self.target,
            "holds": self.holds,
            # Beyond the required keys: the distribution and what the figure means.
            "stats": self.stats.to_json() if self.stats else None,
            "note": self.note,
        }


def ratio(figure: float | None, baseline: float | None) -> float | None:
    if figure is None or not baseline:
        return None
    return figure / baseline


def peer_row(row_id: str, unit: str, ours: Stats | None, theirs: Stats | None, *, peer: str,
             max_ratio: float | None, failures: Sequence[str] = (), skipped: str = "", note: str = "") -> Row:
    """A row comparing sluice (``ours``) with a peer or baseline (``theirs``) measured in the
    same run: the ratio is ours / theirs, the target (if any) ``ratio <= max_ratio``.

    A peer that is unavailable (``skipped`` says why) leaves the row unjudged; a failed
    run of either (``failures``) makes it not hold, whatever the figures say.
    """
    target = None if max_ratio is None else f"<= {max_ratio:g}x {peer}"
    figure = ours.median if ours else None
    baseline = None if skipped or not theirs else theirs.median
    r = ratio(figure, baseline)
    holds = None if max_ratio is None or skipped else (r is not None and r <= max_ratio)
    if skipped:
        note = f"{peer} skipped: {skipped}; {note}"
    if failures:
        holds = False if max_ratio is not None else None
        note = f"FAILED: {len(failures)} runs, first: {failures[0]}; {note}"
    return Row(row_id, figure, unit, baseline, r, target, holds, ours, note)


def checked_run(argv: Sequence[str], env: dict[str, str], cwd: str | None = None, *,
                expect_stdout: int | None = None) -> None:
    """Run ``argv`` to the end (stdin /dev/null, output captured); an exit code other than 0,
    or a stdout not of ``expect_stdout`` bytes, raises with what went wrong."""
    proc = subprocess.run(list(argv), env=env, cwd=cwd or WORK_DIR, stdin=subprocess.DEVNULL, capture_output=True)
    if proc.returncode != 0 or (expect_stdout is not None and len(proc.stdout) != expect_stdout):
        got = "" if expect_stdout is None else f" with {len(proc.stdout)} bytes of stdout (expected {expect_stdout})"
        raise RuntimeError(f"`{' '.join(os.path.basename(a) for a in argv[:4])} ...` exited {proc.returncode}{got}: "
                           f"{' '.join(proc.stderr.decode(errors='replace').split())[-200:]}")


def recording(failures: list[str], fn: Callable[[], object]) -> Callable[[], None]:
    """``fn``, its exceptions appended to ``failures`` instead of raised (a timed run that
    failed must show as a failure of its row, not end the benchmark)."""
    def run() -> None:
        try:
            fn()
        except Exception as e:
            failures.append(str(e))
    return run


def warmed_runs(cases: dict[str, tuple[Sequence[str], dict[str, str]]], failures: dict[str, list[str]],
                warm: int = 3) -> dict[str, Callable[[], None]]:
    """For each ``name: (argv, env)``, a timed run for :func:`alternate` (its failures go to
    ``failures[name]``), after ``warm`` runs: a way that fails while warming up is not timed."""
    timed = {}
    for name, (argv, env) in cases.items():
        try:
            for _ in range(warm):
                checked_run(argv, env)
        except RuntimeError as err:
            failures[name].append(str(err))
            continue
        timed[name] = recording(failures[name], lambda a=argv, e=env: checked_run(a, e))
    return timed


def error_row(row_id: str, error: BaseException | str) -> Row:
    """A benchmark that could not produce its figure: it counts as not holding."""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return Row(row_id, None, "", target="(benchmark failed)", holds=False, note=" ".join(text.split())[:300])


COLUMNS = ("id", "figure", "unit", "baseline", "ratio", "target", "holds", "median / p99 / min / max")


def table(rows: Sequence[Row]) -> str:
    """The results as an aligned text table, notes listed below it."""
    cells = [COLUMNS]
    for r in rows:
        holds = "-" if r.holds is None else ("yes" if r.holds else "NO")
        cells.append((r.id, fmt(r.figure), r.unit, fmt(r.baseline),
                      "-" if r.ratio is None else f"{fmt(r.ratio)}x",
                      r.target or "-", holds, r.stats.text() if r.stats else "-"))
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    lines = []
    for i, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    notes = [f"  {r.id}: {r.note}" for r in rows if r.note]
    if notes:
        lines += ["", "notes:", *notes]
    return "\n".join(lines)


def markdown_table(rows: Sequence[Row]) -> str:
    """The results as a Markdown table, the form docs/benchmarks.md shows them in."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|---|---:|---|---:|---:|---|---|---|"]
    for r in rows:
        holds = "-" if r.holds is None else ("yes" if r.holds else "**no**")
        cells = (r.id, fmt(r.figure), r.unit, fmt(r.baseline), "-" if r.ratio is None else f"{fmt(r.ratio)}x",
                 r.target or "-", holds, r.stats.text() if r.stats else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_heading(installed: Sequence[str], quick: bool) -> str:
    """The line above a pasted table: when, on what, which sluice and which peers."""
    now = datetime.datetime.now(datetime.UTC)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"Results on this machine, {now:%Y-%m-%d}, `nproc` {os.cpu_count()} (Linux "
            f"{os.uname().release.split('-')[0]}, Python {sys.version.split()[0]}, load average at the end {load}"
            f"{'; a --quick run' if quick else ''}; {'; '.join(installed)}). Times in ms; the last column shows "
            "median / p99 / min / max of the samples:")


def markdown_notes(rows: Sequence[Row]) -> str:
    """The rows' notes as a Markdown list."""
    return "\n".join(f"- `{r.id}`: {r.note}" for r in rows if r.note)


def machine_line() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, nproc {os.cpu_count()}, "
            f"load average {load}, Linux {os.uname().release}, Python {sys.version.split()[0]}")


def write_json(rows: Sequence[Row], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump([r.to_json() for r in rows], f, indent=2)
        f.write("\n")


def summary(rows: Sequence[Row]) -> str:
    """How many targets hold; which do not, and which could not be judged (a peer missing,
    or a --quick run too small for the target)."""
    judged = [r for r in rows if r.holds is not None]
    failing = [r.id for r in judged if not r.holds]
    unjudged = [r.id for r in rows if r.holds is None and r.target]
    text = f"targets holding: {len(judged) - len(failing)} of {len(judged)}"
    text += f" (not holding: {', '.join(failing)})" if failing else ""
    return text + (f"; not judged (a peer unavailable, or --quick: see the notes): {', '.join(unjudged)}"
                   if unjudged else "")


# -- running -----------------------------------------------------------------------------


def _terminate_as_interrupt(signum, frame) -> None:
    # SIGTERM/SIGHUP unwind like Ctrl-C, so every daemon context is stopped on the way out.
    raise KeyboardInterrupt(f"signal {signum}")


def install_signal_handlers() -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _terminate_as_interrupt)


def parse_args(description: str | None, argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(description or "").strip().splitlines()[0] if description else None)
    p.add_argument("--quick", action="store_true",
                   help="smoke run: fewer iterations, 256 MiB instead of 1 GiB streamed")
    p.add_argument("--json", metavar="PATH", help="also write the rows as a JSON list to PATH")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown (as in docs/benchmarks.md)")
    return p.parse_args(argv)


def bench_main(run: Callable[[bool], list[Row]], description: str | None) -> None:
    """Entry point of one benchmark script: run it, print the table, write JSON if asked."""
    args = parse_args(description)
    install_signal_handlers()
    try:
        rows = run(args.quick)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    print(machine_line())
    print(markdown_table(rows) if args.markdown else table(rows))
    if args.json:
        write_json(rows, args.json)


# -- the daemon --------------------------------------------------------------------------


class Daemon:
    """A real ``python -m broker daemon`` in a runtime dir of its own, for one benchmark:
    the tests' harness (tests/support/harness.py) as a context manager. The daemon, and
    anything of its tree still alive after it exits, is stopped on the way out, exceptions
    and Ctrl-C included; its warnings and errors are printed then."""

    def __init__(self, executors: int | None = None) -> None:
        self.executors = executors
        self._factory = DaemonFactory()
        self.handle = None
        self.home = ""

    def __enter__(self) -> Daemon:
        try:
            # A sluice home of its own (config, sessions' journals), not the user's.
            self.home = tempfile.mkdtemp(prefix="slb-home-", dir="/tmp")
            self.handle = self._factory.start(self.executors, env={"SLUICE_HOME": self.home})
        except BaseException:
            self._factory.stop_all()
            shutil.rmtree(self.home, ignore_errors=True)
            raise
        return self

    def __exit__(self, *exc) -> None:
        complaints = self.complaints()
        for problem in self._factory.stop_all():
            log(problem)
        shutil.rmtree(self.home, ignore_errors=True)
        for line in complaints:
            log(f"daemon log: {line[:300]}")

    @property
    def runtime(self) -> RuntimeDir:
        return self.handle.runtime

    @property
    def pid(self) -> int:
        return self.handle.pid

    def env(self) -> dict[str, str]:
        """The environment for the CLI and other clients of this daemon."""
        return {**self.handle.env_for_children(), "SLUICE_HOME": self.home}

    def client(self) -> Client:
        """A connected client, closed when the daemon is stopped."""
        return self.handle.client()

    def processes(self) -> list[psutil.Process]:
        """The daemon and all its descendants (executors, zygotes, warm sandboxes, commands)."""
        try:
            return [psutil.Process(self.pid), *self.handle.descendants()]
        except psutil.Error:
            return []

    def complaints(self) -> list[str]:
        """The warnings and errors of the daemon's log (it goes away with the runtime dir)."""
        return [line.strip() for line in self.handle.log().splitlines()
                if any(f'"level": "{level}"' in line for level in ("warning", "error", "critical"))
                or "Traceback" in line] if self.handle else []


def pipe_baseline(size: int, reader: str) -> int:
    """Nanoseconds for ``size`` zero bytes through a plain pipe into ``reader`` (a shell
    command, its output discarded): the baseline of the streaming benchmarks."""
    t0 = time.perf_counter_ns()
    subprocess.run(["sh", "-c", f"head -c {size} /dev/zero | {reader} > /dev/null"], check=True)
    return time.perf_counter_ns() - t0


def warm_up(client: Client, count: int, argv: Sequence[str] = ("true",)) -> None:
    """Run ``argv`` ``count`` times (executors connected, warm sandboxes made, caches hot)."""
    for _ in range(count):
        result = client.run(list(argv), cwd=WORK_DIR, wait_timeout=30)
        if not result.ok:
            raise RuntimeError(f"warm-up run of {list(argv)} failed: {describe(result)}")


def describe(result) -> str:
    """A one-line account of a client Result that was not ok."""
    if result.error:
        return f"error {result.error!r} (returncode {result.returncode})"
    if result.aborted:
        return "aborted"
    if result.timed_out:
        return "timed out"
    if result.signal is not None:
        return f"killed by signal {result.signal}"
    return f"exit code {result.exit_code}"
