"""apply_patch through the sandbox: a patch updating 10 files, end to end.

The agent reads and writes files for the model only through the session's sandbox
(``agent.sandbox_files``: batches of ``landlock_helper.fileops`` run by an executor as a
sandbox builtin). One apply is what the agent does for an auto-approved patch: the
read batch for verification (one sandboxed process), the in-memory verification, the
write batch (a second one), the outcome. Timed over 100 patches (after 20 of warm-up)
through the agent's runner (``BrokerRunner``) to a real daemon; each patch changes one
line in each of 10 files of a few KiB. Target: under 50 ms. The write batch alone is a
row of its own.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

from common import Daemon, Row, Stats, bench_main, log

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
    action = verify_patch(parsed, await files.read(*paths_to_read(parsed)))
    writing = time.perf_counter_ns()
    outcome = outcome_of(action, (await files.run(change_ops(action))).get("failed"))
    done = time.perf_counter_ns()
    if not outcome.success:
        raise RuntimeError(f"patch {i} failed: {outcome.stderr.strip()}")
    return (done - started) / 1e6, (done - writing) / 1e6


async def _measure(daemon: Daemon, cwd: str, count: int) -> tuple[list[float], list[float]]:
    runner = await BrokerRunner.connect(daemon.runtime)
    try:
        files = SandboxFiles(runner, POLICY, cwd)
        whole, writes = [], []
        for i in range(20 + count):
            total, write = await _apply(files, cwd, i)
            if i >= 20:
                whole.append(total)
                writes.append(write)
        return whole, writes
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
            whole, writes = asyncio.run(_measure(daemon, str(project), count))
    finally:
        shutil.rmtree(project, ignore_errors=True)
    stats, write_stats = Stats.of(whole), Stats.of(writes)
    return [
        Row("patch-10-files", stats.median, "ms", target=f"< {TARGET_MS:g} ms", holds=stats.median < TARGET_MS,
            stats=stats, note=f"read, verify, write: two sandboxed batches; p99 {stats.p99:.1f} ms over {count}"),
        Row("patch-10-files-write", write_stats.median, "ms", stats=write_stats,
            note=f"the write batch alone; p99 {write_stats.p99:.1f} ms"),
    ]


if __name__ == "__main__":
    bench_main(run, __doc__)
