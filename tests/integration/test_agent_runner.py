"""agent.exec_runner: the BrokerRunner against a real daemon, real executors, the real sandbox."""

from __future__ import annotations

import asyncio
import os
import random

import pytest

from agent.exec_runner import BrokerRunner, ExecResult, HeadTailBuffer
from broker.net.aiolink import PeerLink
from broker.net.link import LinkError
from broker.wire.protocol import ExecOutputStream
from landlock_helper.policy import SandboxPolicy
from tests.support.harness import live_processes

pytestmark = pytest.mark.timeout(60)

READ_ONLY = SandboxPolicy.from_mode("read-only")
FULL = SandboxPolicy.from_mode("danger-full-access")


def test_head_tail_buffer_keeps_both_ends() -> None:
    buf = HeadTailBuffer(10)
    for piece in (b"abc", b"defgh", b"ijklmnop", b"qrstuvwxyz"):
        buf.write(piece)
    assert buf.getvalue() == b"abcdevwxyz"
    assert buf.omitted == 26 - 10
    small = HeadTailBuffer(10)
    small.write(b"hello")
    assert small.getvalue() == b"hello" and small.omitted == 0


def test_result_returncode() -> None:
    assert ExecResult(exit_code=3).returncode == 3
    assert ExecResult(timed_out=True).returncode == 124
    assert ExecResult(aborted=True).returncode == 130
    assert ExecResult(signal=9).returncode == 137
    assert ExecResult(error="executable not found").returncode == 127


def test_run_streams_output_and_sandbox_applies(module_daemon, tmp_path) -> None:
    cwd = str(tmp_path)

    async def main() -> None:
        runner = await BrokerRunner.connect(module_daemon.runtime)
        try:
            chunks: list[tuple[ExecOutputStream, bytes]] = []
            script = "echo out; echo err >&2; exit 3"
            result = await runner.run(["bash", "-c", script], cwd, READ_ONLY, 10_000,
                                      lambda s, c: chunks.append((s, c)))
            assert result.exit_code == 3 and result.returncode == 3
            assert result.stdout == b"out\n" and result.stderr == b"err\n"
            assert sorted(result.aggregated.splitlines()) == [b"err", b"out"]
            assert b"".join(c for s, c in chunks if s == ExecOutputStream.STDOUT) == b"out\n"
            assert b"".join(c for s, c in chunks if s == ExecOutputStream.STDERR) == b"err\n"

            # Read-only: the write is refused; unrestricted: it lands.
            denied = await runner.run(["bash", "-c", "echo x > f"], cwd, READ_ONLY, 10_000)
            assert denied.exit_code != 0 and not os.path.exists(tmp_path / "f")
            allowed = await runner.run(["bash", "-c", "echo x > f"], cwd, FULL, 10_000)
            assert allowed.exit_code == 0 and (tmp_path / "f").read_text() == "x\n"

            timed = await runner.run(["sleep", "30"], cwd, READ_ONLY, 200)
            assert timed.timed_out and timed.returncode == 124

            missing = await runner.run(["no-such-program-xyz"], cwd, READ_ONLY, 10_000)
            assert missing.returncode == 127 and missing.error
        finally:
            await runner.aclose()

    asyncio.run(main())


def test_cancel_kills_the_tree_both_ways(module_daemon, tmp_path) -> None:
    cwd = str(tmp_path)

    async def main() -> None:
        runner = await BrokerRunner.connect(module_daemon.runtime)
        try:
            marker = ["sleep", f"{random.randint(1000, 9999)}.{random.randint(100, 999)}"]
            started = asyncio.Event()
            task = asyncio.create_task(runner.run(
                ["bash", "-c", f"echo go; {' '.join(marker)}"], cwd, READ_ONLY, None,
                lambda s, c: started.set(), call_id="cancel-me"))
            await asyncio.wait_for(started.wait(), 10)
            assert runner.running == ["cancel-me"]
            await runner.cancel("cancel-me")
            result = await asyncio.wait_for(task, 10)
            assert result.aborted and result.returncode == 130

            # Cancelling the awaiting task cancels the command too.
            marker2 = ["sleep", f"{random.randint(1000, 9999)}.{random.randint(100, 999)}"]
            started.clear()
            task = asyncio.create_task(runner.run(
                ["bash", "-c", f"echo go; {' '.join(marker2)}"], cwd, READ_ONLY, None,
                lambda s, c: started.set()))
            await asyncio.wait_for(started.wait(), 10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(500):
                if not live_processes(marker) and not live_processes(marker2):
                    break
                await asyncio.sleep(0.01)
            assert not live_processes(marker) and not live_processes(marker2)
        finally:
            await runner.aclose()

    asyncio.run(main())


def test_link_refuses_without_daemon(tmp_path) -> None:
    from broker.net.runtime import RuntimeDir

    async def main() -> None:
        with pytest.raises(LinkError, match="no daemon is running"):
            await PeerLink.connect(RuntimeDir(str(tmp_path)))

    asyncio.run(main())


def test_daemon_going_away_fails_running_commands(daemon_factory, tmp_path) -> None:
    handle = daemon_factory.start(executors=1)

    async def main() -> None:
        runner = await BrokerRunner.connect(handle.runtime)
        try:
            started = asyncio.Event()
            task = asyncio.create_task(runner.run(["bash", "-c", "echo go; sleep 30"], str(tmp_path),
                                                  READ_ONLY, None, lambda s, c: started.set()))
            await asyncio.wait_for(started.wait(), 10)
            await asyncio.to_thread(handle.stop)
            result = await asyncio.wait_for(task, 15)
            assert result.error and result.returncode != 0
        finally:
            await runner.aclose()

    asyncio.run(main())
