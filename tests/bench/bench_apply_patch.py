"""apply_patch through the sandbox: a patch updating 10 files, end to end.

The agent reads and writes files for the model only through the session's sandbox
(``agent.sandbox_files``: batches of ``landlock_helper.fileops`` run by an executor as a
sandbox builtin). One apply is what the agent does for an auto-approved patch: one
sandboxed process (``SandboxFiles.conversation``) answers the read batch for
verification, then, after the in-memory verification, the write batch; it has ended
when the apply is counted done. Timed over 100 patches (after 20 of warm-up)
through the agent's runner (``BrokerRunner``) to a real daemon; each patch changes one
line in each of 10 files of a few KiB. Target: under 50 ms. Baseline: a sandboxed
`true` through the same runner, timed alternately with the patches (a patch is one such
run and the verification). The write batch alone (from its sending to its answer) is a
row of its own.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

from common import Daemon, Row, Stats, bench_main, log, ratio

from agent.apply_patch import change_ops, maybe_parse_apply_patch, outcome_of, paths_to_read, verify_patch
from agent.exec_runner import BrokerRunner
from agent.sandbox_files import SandboxFiles
from landlock_helper.policy import SandboxPolicy

FILES = 10
TARGET_MS = 50.0
POLICY = SandboxPolicy.from_mode("workspace-write")


def _patch(i: int) -> str:
    body = "".join(f"*** Update File: src/f{n}.py\n@@\n-value = {i}\n+value = {i + 1}\n" for n in range(FILES))
    return f"*** Begin Patch\n{body}*** End Patch"


async def _apply(files: SandboxFiles, cwd: str, i: int) -> tuple[float, float]:
    parsed = maybe_parse_apply_patch(["apply_patch", _patch(i)], cwd)
    started = time.perf_counter_ns()
    async with files.conversation() as conversation:
        action = verify_patch(parsed, await conversation.read(*paths_to_read(parsed)))
        writing = time.perf_counter_ns()
        outcome = outcome_of(action, (await conversation.run(change_ops(action))).get("failed"))
    done = time.perf_counter_ns()
    if not outcome.success:
        raise RuntimeError(f"patch {i} failed: {outcome.stderr.strip()}")
    return (done - started) / 1e6, (done - writing) / 1e6


async def _true(runner: BrokerRunner, cwd: str) -> float:
    started = time.perf_counter_ns()
    result = await runner.run(["true"], cwd, POLICY, None, sandbox_cwd=cwd)
    if result.returncode != 0:
        raise RuntimeError(f"true failed: {result.error or result.returncode}")
    return (time.perf_counter_ns() - started) / 1e6


async def _measure(daemon: Daemon, cwd: str, count: int) -> tuple[list[float], list[float], list[float]]:
    runner = await BrokerRunner.connect(daemon.runtime)
    try:
        files = SandboxFiles(runner, POLICY, cwd)
        whole, writes, trues = [], [], []
        for i in range(20 + count):
            total, write = await _apply(files, cwd, i)
            true = await _true(runner, cwd)
            if i >= 20:
                whole.append(total)
                writes.append(write)
                trues.append(true)
        return whole, writes, trues
    finally:
        await runner.aclose()


def run(quick: bool) -> list[Row]:
    count = 30 if quick else 100
    project = Path(tempfile.mkdtemp(prefix="sluice-bench-patch-"))
    try:
        (project / "src").mkdir()
        filler = "".join(f"# line {k}: {'x' * 60}\n" for k in range(60))
        for n in range(FILES):
            (project / "src" / f"f{n}.py").write_text(f"{filler}value = 0\n{filler}")
        with Daemon() as daemon:
            log(f"apply_patch: {count} patches of {FILES} files through the sandbox")
            whole, writes, trues = asyncio.run(_measure(daemon, str(project), count))
    finally:
        shutil.rmtree(project, ignore_errors=True)
    stats, write_stats, true_stats = Stats.of(whole), Stats.of(writes), Stats.of(trues)
    return [
        Row("patch-10-files", stats.median, "ms", baseline=true_stats.median,
            ratio=ratio(stats.median, true_stats.median), target=f"< {TARGET_MS:g} ms",
            holds=stats.median < TARGET_MS, stats=stats,
            note=f"read, verify, write: two batches in one sandboxed process; p99 {stats.p99:.1f} ms over {count}; "
                 f"baseline: a sandboxed `true` through the same runner"),
        Row("patch-10-files-write", write_stats.median, "ms", baseline=true_stats.median,
            ratio=ratio(write_stats.median, true_stats.median), stats=write_stats,
            note=f"the write batch alone; p99 {write_stats.p99:.1f} ms"),
    ]


if __name__ == "__main__":
    bench_main(run, __doc__)
