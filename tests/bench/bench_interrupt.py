"""interrupt: cancel sent -> result received, with the whole process tree verified gone.

Two commands: ``sleep 100`` and ``sh -c 'sleep 100 & setsid sleep 100 & wait'`` (one
sleep escaping into a session of its own). Each run's sleeps get a unique duration
(``100.<nonce>``) as a marker. Before cancelling we wait until every expected process
runs (psutil, untimed). The figure is from ``client.cancel`` to ``client.wait`` returning
the aborted result; then, untimed, no process anywhere on the machine may still carry the
marker (zombies count as gone). No baseline. Target: median <= 10 ms and p99 <= 50 ms.
"""

from __future__ import annotations

import itertools
import os
import time

import psutil
from common import WORK_DIR, Daemon, Row, Stats, bench_main, describe, log, warm_up

TARGET_MEDIAN_MS = 10.0
TARGET_P99_MS = 50.0
RUNNING_TIMEOUT_S = 10.0

CASES = {
    # id suffix -> (argv for a marker, how many `sleep` processes must run before cancelling)
    "sleep": (lambda m: ["sleep", m], 1),
    "setsid": (lambda m: ["sh", "-c", f"sleep {m} & setsid sleep {m} & wait"], 2),
}

_nonces = itertools.count(1)


def new_marker() -> str:
    return f"100.{os.getpid()}{next(_nonces):06d}"


def marked(marker: str) -> list[psutil.Process]:
    """Live (non-zombie) processes anywhere whose command line carries ``marker``."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        info = p.info
        if info["status"] != psutil.STATUS_ZOMBIE and any(marker in a for a in info["cmdline"] or ()):
            found.append(p)
    return found


def wait_running(client, call, marker: str, sleeps: int) -> None:
    """Pump until the call has started and ``sleeps`` sleep processes with ``marker`` run."""
    deadline = time.monotonic() + RUNNING_TIMEOUT_S
    while time.monotonic() < deadline:
        client.poll(0.002)
        if call.done:
            raise RuntimeError(f"the command ended before it was cancelled: {call.result or call.failure}")
        if not call.started:
            continue
        try:
            tree = psutil.Process(call.pid).children(recursive=True)
            running = sum(1 for p in tree if p.name() == "sleep" and marker in " ".join(p.cmdline()))
        except psutil.Error:
            continue
        if running >= sleeps:
            return
    raise RuntimeError(f"the command was not running after {RUNNING_TIMEOUT_S:g} s")


def interrupt_once(client, case: str) -> tuple[int, list[str]]:
    """(ns from cancel to result, survivors' descriptions) for one run of ``case``."""
    make_argv, sleeps = CASES[case]
    marker = new_marker()
    call = client.submit(make_argv(marker), cwd=WORK_DIR)
    wait_running(client, call, marker, sleeps)
    # The check below must be able to see the tree, or its "none left" would prove nothing.
    if len(marked(marker)) < sleeps:
        raise RuntimeError(f"the process scan does not see the running sleeps of {marker}")
    t0 = time.perf_counter_ns()
    client.cancel(call)
    result = client.wait(call, timeout=30)
    elapsed = time.perf_counter_ns() - t0
    if not result.aborted:
        raise RuntimeError(f"the cancelled call did not end as aborted: {describe(result)}")
    survivors = [f"pid {p.pid} {' '.join(p.info['cmdline'])}" for p in marked(marker)]
    return elapsed, survivors


def run(quick: bool) -> list[Row]:
    count = 20 if quick else 100
    rows = []
    with Daemon() as daemon:
        client = daemon.client()
        warm_up(client, 5)
        for case in CASES:
            for _ in range(5):
                interrupt_once(client, case)
            log(f"interrupt-{case}: {count} cancels")
            samples: list[int] = []
            survivors: list[str] = []
            for _ in range(count):
                elapsed, left = interrupt_once(client, case)
                samples.append(elapsed)
                survivors += left
            stats = Stats.of(samples, 1e6)
            holds = stats.median <= TARGET_MEDIAN_MS and stats.p99 <= TARGET_P99_MS and not survivors
            note = f"no process of the {count} cancelled trees was left when the result arrived"
            if survivors:
                note = f"SURVIVORS after the result: {len(survivors)}, e.g. {survivors[0]}"
            rows.append(Row(f"interrupt-{case}", stats.median, "ms", None, None,
                            f"median <= {TARGET_MEDIAN_MS:g} ms, p99 <= {TARGET_P99_MS:g} ms", holds, stats, note))
    return rows


if __name__ == "__main__":
    bench_main(run, __doc__)
