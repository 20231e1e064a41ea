"""A Session over a real daemon: real executors, the real sandbox, a scripted model."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from agent.exec_runner import BrokerRunner
from broker.wire.protocol import (
    AskForApproval,
    ExecApproval,
    Interrupt,
    ReviewDecision,
)
from landlock_helper.policy import SandboxPolicy
from tests.support.fake_model import (
    FakeModelServer,
    Harness,
    assistant,
    call,
    outputs_of,
    response,
    tag,
)
from tests.support.harness import await_for, live_processes

pytestmark = pytest.mark.timeout(90)


def test_session_over_the_daemon(daemon_factory, tmp_path) -> None:
    handle = daemon_factory.start(executors=1)
    sleeper = ["sleep", f"{random.randint(1000, 9999)}.{random.randint(100, 999)}"]
    script = "printf 'one\\ntwo\\n'; echo oops >&2; ls"
    with FakeModelServer() as server:
        server.script(
            # 1: a command in the workspace sandbox, its output streamed.
            response(call("shell", {"command": ["bash", "-c", script]}, "c1")),
            response(assistant("Listed.")),
            # 2: read-only sandbox, on-failure: the write is denied, the retry approved.
            response(call("shell", {"command": ["bash", "-c", "echo hi > out.txt"]}, "c2")),
            response(assistant("Wrote it.")),
            # 3: interrupted mid-command.
            response(call("shell", {"command": ["bash", "-c", f"echo go; {' '.join(sleeper)}"]}, "c3")),
            # 4: 100 KB of output: every byte in the deltas, the end event capped.
            response(call("shell", {"command": ["bash", "-c", "head -c 102400 /dev/zero | tr '\\0' x"]}, "c4")),
            response(assistant("Big.")),
        )

        async def main():
            runner = await BrokerRunner.connect(handle.runtime)
            try:
                h = Harness(server, runner, tmp_path)
                (h.cwd / "a.txt").write_text("a")
                (h.cwd / "b.txt").write_text("b")
                await h.configure(sandbox_policy=SandboxPolicy.from_mode("workspace-write"))
                sub_id = await h.say("list the files here")
                assert (await h.done(sub_id, timeout=30)).msg.last_agent_message == "Listed."
                streamed = b"".join(d.chunk for d in h.of("exec_command_output_delta", sub_id))
                assert b"one\ntwo\n" in streamed and b"a.txt\nb.txt\n" in streamed and b"oops\n" in streamed
                end = h.of("exec_command_end", sub_id)[0]
                assert end.exit_code == 0 and end.stdout == "one\ntwo\na.txt\nb.txt\n" and end.stderr == "oops\n"
                assert sorted(end.aggregated_output.splitlines()) == ["a.txt", "b.txt", "one", "oops", "two"]

                await h.configure(sandbox_policy=SandboxPolicy.from_mode("read-only"),
                                  approval_policy=AskForApproval.ON_FAILURE)
                sub_id = await h.say("write a file")
                request = await h.until(lambda e: e.id == sub_id and tag(e) == "exec_approval_request", timeout=30)
                assert request.msg.reason == "command failed; retry without sandbox?"
                assert not (h.cwd / "out.txt").exists()
                await h.submit(ExecApproval(sub_id, ReviewDecision.APPROVED))
                assert tag(await h.done(sub_id, timeout=30)) == "task_complete"
                assert (h.cwd / "out.txt").read_text() == "hi\n"
                failed, retried = h.of("exec_command_end", sub_id)
                assert failed.exit_code != 0 and retried.exit_code == 0

                sub_id = await h.say("wait a while")
                await h.until(lambda e: e.id == sub_id and tag(e) == "exec_command_output_delta", timeout=30)
                # "go" is out before bash has exec'd the sleep: wait for it to be there.
                await await_for(lambda: live_processes(sleeper), what="the command's sleep to start")
                await h.submit(Interrupt())
                assert h.tags(sub_id, deltas=False)[-3:] == ["exec_command_end", "error", "turn_aborted"]
                # What it printed before the interrupt, not empty strings.
                end = h.of("exec_command_end", sub_id)[-1]
                assert (end.exit_code, end.stdout, end.aggregated_output) == (130, "go\n", "go\n")
                await await_for(lambda: not live_processes(sleeper), what="the interrupted command's tree to die")

                sub_id = await h.say("print a lot")
                assert (await h.done(sub_id, timeout=30)).msg.last_agent_message == "Big."
                streamed = b"".join(d.chunk for d in h.of("exec_command_output_delta", sub_id))
                assert streamed == b"x" * 102400
                end = h.of("exec_command_end", sub_id)[0]
                assert end.stdout == end.aggregated_output == "x" * 5120 and end.stderr == ""
            finally:
                await runner.aclose()

        asyncio.run(main())

    first = json.loads(outputs_of(server.requests[1]["json"])["c1"])
    assert first["metadata"]["exit_code"] == 0 and "a.txt" in first["output"]
    assert json.loads(outputs_of(server.requests[3]["json"])["c2"])["metadata"]["exit_code"] == 0
