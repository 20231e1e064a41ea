"""agent.exec_runner's interactive runs against a real daemon: stdin written after start,
pipes and terminals, resize, cancel, flow control."""

from __future__ import annotations

import asyncio

import pytest

from agent.exec_runner import BrokerRunner
from broker.wire import frames as wire
from landlock_helper.policy import SandboxPolicy
from tests.support.harness import await_for, live_processes

pytestmark = pytest.mark.timeout(60)

WORKSPACE = SandboxPolicy.from_mode("workspace-write")


@pytest.mark.parametrize("tty", [None, wire.Winsize(24, 80)], ids=["pipes", "tty"])
def test_an_interactive_run_takes_stdin_after_it_started(module_daemon, tmp_path, tty) -> None:
    async def main() -> None:
        runner = await BrokerRunner.connect(module_daemon.runtime)
        try:
            out = bytearray()
            ended = []
            proc = await runner.start_interactive(
                ["/usr/bin/python3", "-u", "-c",
                 "import sys\nfor line in sys.stdin:\n    print('got', line.strip(), flush=True)\nprint('eof')"],
                str(tmp_path), WORKSPACE, lambda stream, chunk: out.extend(chunk), tty=tty, on_exit=ended.append)
            assert not proc.done and proc.pid
            assert await proc.write(b"one\n")
            await await_for(lambda: b"got one" in out, what="the first answer")
            assert await proc.write(b"two\n")
            await await_for(lambda: b"got two" in out, what="the second answer")
            if tty is None:
                proc.close_stdin()
            else:
                assert await proc.write(b"\x04")  # ^D at the start of a line: end of file
            result = await asyncio.wait_for(proc.wait(), 10)
            assert result.exit_code == 0, result
            assert b"eof" in result.aggregated and ended == [result]
            assert proc.call_id not in runner.running
            assert not await proc.write(b"late\n")
        finally:
            await runner.aclose()

    asyncio.run(main())


def test_a_terminal_run_is_a_tty_and_resizes(module_daemon, tmp_path) -> None:
    async def main() -> None:
        runner = await BrokerRunner.connect(module_daemon.runtime)
        try:
            out = bytearray()
            proc = await runner.start_interactive(["bash", "--norc", "-i"], str(tmp_path), WORKSPACE,
                                                  lambda s, c: out.extend(c), tty=wire.Winsize(30, 100))
            await proc.write(b"test -t 0 && echo IS-A-TTY; stty size\n")
            await await_for(lambda: b"IS-A-TTY" in out and b"30 100" in out, what="the terminal's size")
            proc.resize(40, 120)
            await proc.write(b"stty size\n")
            await await_for(lambda: b"40 120" in out, what="the new size")
            await proc.cancel()
            result = await asyncio.wait_for(proc.wait(), 10)
            assert result.aborted
        finally:
            await runner.aclose()

    asyncio.run(main())


def test_a_big_write_waits_for_the_window_and_arrives_whole(module_daemon, tmp_path) -> None:
    """8 MiB to a command that reads it slowly: the writer waits for acks, nothing is lost."""
    async def main() -> None:
        runner = await BrokerRunner.connect(module_daemon.runtime)
        try:
            out = bytearray()
            proc = await runner.start_interactive(["sh", "-c", "sleep 0.5; wc -c"], str(tmp_path), WORKSPACE,
                                                  lambda s, c: out.extend(c))
            assert await proc.write(b"x" * (8 << 20))
            proc.close_stdin()
            result = await asyncio.wait_for(proc.wait(), 20)
            assert result.exit_code == 0 and out.strip() == str(8 << 20).encode()
        finally:
            await runner.aclose()

    asyncio.run(main())


def test_held_output_stops_after_a_window_and_flows_again_when_released(module_daemon, tmp_path) -> None:
    async def main() -> None:
        runner = await BrokerRunner.connect(module_daemon.runtime)
        try:
            got = [0]
            proc = await runner.start_interactive(["yes"], str(tmp_path), WORKSPACE,
                                                  lambda s, c: got.__setitem__(0, got[0] + len(c)), stdin=False)
            loop = asyncio.get_running_loop()
            started = loop.time()
            await await_for(lambda: got[0] > 3 * wire.WINDOW_BYTES, what="yes to flood")  # it does, unheld
            rate = got[0] / (loop.time() - started)
            proc.hold_output(True)
            held_at = got[0]
            # What was not acknowledged yet still comes (at most a window), then nothing:
            # watched for three times as long as the flow, unheld, took to pass the bound.
            bound = held_at + wire.WINDOW_BYTES + wire.ACK_EVERY_BYTES
            deadline = loop.time() + max(1.0, 3 * (bound - held_at) / rate)
            while loop.time() < deadline:
                assert got[0] <= bound
                await asyncio.sleep(0.01)
            proc.hold_output(False)
            await await_for(lambda: got[0] > bound + 3 * wire.WINDOW_BYTES, what="the flow to start again")
            await proc.cancel()
            await asyncio.wait_for(proc.wait(), 10)
        finally:
            await runner.aclose()

    asyncio.run(main())


def test_cancel_and_closing_the_runner_kill_interactive_trees(module_daemon, tmp_path) -> None:
    marker = ["sleep", "4242.17"]

    async def main() -> None:
        runner = await BrokerRunner.connect(module_daemon.runtime)
        procs = []
        try:
            for _ in range(2):
                procs.append(await runner.start_interactive(["bash", "-c", f"{' '.join(marker)}; cat"],
                                                            str(tmp_path), WORKSPACE))
            await await_for(lambda: len(live_processes(marker)) == 2, what="both to run")
            await procs[0].cancel()
            assert (await asyncio.wait_for(procs[0].wait(), 10)).aborted
        finally:
            await runner.aclose()
        await await_for(lambda: not live_processes(marker), what="every tree to die")

    asyncio.run(main())
