"""Unified exec end to end: a Session over a real daemon (real executors, the real
sandbox, terminals), driven by a scripted model through the seed's ``unified_exec`` tool
and Codex's ``exec_command`` / ``write_stdin``.

Session ids are the manager's, counted from 1000 per agent session, so a script can
name them before they exist.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
import time

import pytest

from agent.exec_runner import BrokerRunner
from agent.instructions import base_instructions
from agent.unified_exec import OUTPUT_MAX_BYTES
from broker.wire.protocol import (
    AskForApproval,
    ExecApproval,
    Interrupt,
    ReviewDecision,
    Shutdown,
    TextInput,
    UnifiedExecSettings,
    UserInput,
)
from landlock_helper.policy import SandboxPolicy
from tests.support.fake_model import FakeModelServer, Harness, assistant, call, gated, outputs_of, response, tag
from tests.support.harness import await_for, live_processes
from tests.support.sessions import collect, configure_op

pytestmark = pytest.mark.timeout(90)

SEED = UnifiedExecSettings(tools="seed")
CODEX = UnifiedExecSettings(tools="codex")
WORKSPACE = SandboxPolicy.from_mode("workspace-write")


def seed(call_id: str, *chunks: str, session: int | None = None, timeout_ms: int | None = 600):
    args: dict = {"input": list(chunks)}
    if session is not None:
        args["session_id"] = str(session)
    if timeout_ms is not None:
        args["timeout_ms"] = timeout_ms
    return response(call("unified_exec", args, call_id))


def answers(server: FakeModelServer) -> dict[str, str]:
    """Every call's output the model was sent, by call id."""
    found: dict[str, str] = {}
    for request in server.requests:
        found.update(outputs_of(request["json"]))
    return found


def seed_answer(server: FakeModelServer, call_id: str) -> dict:
    return json.loads(answers(server)[call_id])


def run(server: FakeModelServer, handle, tmp_path, body, **configure) -> None:
    async def main() -> None:
        runner = await BrokerRunner.connect(handle.runtime)
        h = Harness(server, runner, tmp_path)
        try:
            await h.configure(**{"sandbox_policy": WORKSPACE, "unified_exec": SEED, **configure})
            await body(h)
        finally:
            await h.session.aclose()
            await runner.aclose()

    asyncio.run(main())


# -- the seed's own cases -------------------------------------------------------------


def test_a_bash_session_keeps_an_exported_variable_and_sessions_are_independent(module_daemon, tmp_path) -> None:
    with FakeModelServer() as server:
        server.script(
            seed("c1", "bash", "-i"),
            seed("c2", "export", "CODEX_INTERACTIVE_SHELL_VAR=codex\n", session=1000),
            # Calls whose answers are checked wait longer, for a loaded machine.
            seed("c3", "echo [$CODEX_INTERACTIVE_SHELL_VAR]\n", session=1000, timeout_ms=1500),
            seed("c4", "bash", "-i"),
            seed("c5", "echo [$CODEX_INTERACTIVE_SHELL_VAR]\n", session=1001, timeout_ms=1500),
            seed("c6", "echo [$CODEX_INTERACTIVE_SHELL_VAR]\n", session=1000, timeout_ms=1500),
            response(assistant("Done.")),
        )

        async def body(h: Harness) -> None:
            sub = await h.say("drive two shells")
            assert tag(await h.done(sub, timeout=60)) == "task_complete"
            # The frontends saw each session start, and its output as it came.
            begins = h.of("exec_command_begin", sub)
            assert [b.command for b in begins] == [["bash", "-i"], ["bash", "-i"]]
            streamed = b"".join(d.chunk for d in h.of("exec_command_output_delta", sub) if d.call_id == "c1")
            assert b"[codex]" in streamed

        run(server, module_daemon, tmp_path, body)
    first = seed_answer(server, "c1")
    assert first["session_id"] == "1000"
    assert "[codex]" in seed_answer(server, "c3")["output"]
    assert seed_answer(server, "c4")["session_id"] == "1001"
    other = seed_answer(server, "c5")["output"]
    assert "[]" in other and "[codex]" not in other
    assert "[codex]" in seed_answer(server, "c6")["output"]


def test_output_beyond_128_kib_keeps_the_newest_bytes(module_daemon, tmp_path) -> None:
    script = ("import sys, time\n"
              "time.sleep(0.3)\n"
              "sys.stdout.write(''.join(f'{i:07d}\\n' for i in range(25000)) + 'END\\n')\n"
              "sys.stdout.flush()\n"
              "time.sleep(60)\n")
    with FakeModelServer() as server:
        printed = threading.Event()
        server.script(
            seed("c1", "/usr/bin/python3", "-c", script, timeout_ms=50),
            # The poll comes once all of it has been printed, none of it collected.
            gated(seed("c2", session=1000, timeout_ms=100), printed, timeout=30),
            response(assistant("Done.")),
        )

        streamed = bytearray()

        async def body(h: Harness) -> None:
            sub = await h.say("print a lot")

            def everything() -> bytes:
                return b"".join(d.chunk for d in h.of("exec_command_output_delta", sub))

            await await_for(lambda: b"END" in everything(), timeout=15.0, what="all the output")
            printed.set()
            assert tag(await h.done(sub, timeout=30)) == "task_complete"
            streamed.extend(everything())

        run(server, module_daemon, tmp_path, body)
    stream = bytes(streamed)
    assert len(stream) > OUTPUT_MAX_BYTES + 50_000
    first = seed_answer(server, "c1")
    assert first == {"session_id": "1000", "output": ""}
    second = seed_answer(server, "c2")
    assert second["session_id"] == "1000"
    assert second["output"].encode() == stream[-OUTPUT_MAX_BYTES:]


def test_an_exited_session_is_gone_and_its_id_unknown(module_daemon, tmp_path) -> None:
    with FakeModelServer() as server:
        server.script(
            seed("c1", "bash", "-i"),
            seed("c2", "exit\n", session=1000, timeout_ms=5000),
            seed("c3", session=1000, timeout_ms=100),
            seed("c4", "/bin/echo", "codex", timeout_ms=5000),
            seed("c5", "/no/such/program", timeout_ms=5000),
            response(assistant("Done.")),
        )

        async def body(h: Harness) -> None:
            sub = await h.say("exit the shell")
            assert tag(await h.done(sub, timeout=30)) == "task_complete"
            ends = h.of("exec_command_end", sub)
            assert [e.call_id for e in ends] == ["c1", "c4", "c5"] and ends[0].exit_code == 0
            assert ends[2].exit_code == 127
            assert not h.session.unified_exec.sessions

        run(server, module_daemon, tmp_path, body)
    assert seed_answer(server, "c2")["session_id"] is None
    assert answers(server)["c3"] == "unified exec failed: Unknown session id 1000"
    # A command that exits within its timeout never holds a session.
    assert seed_answer(server, "c4")["session_id"] is None and "codex" in seed_answer(server, "c4")["output"]
    missing = seed_answer(server, "c5")
    assert missing["session_id"] is None and "/no/such/program" in missing["output"], missing


def test_a_timeout_above_the_maximum_is_clamped_with_a_warning(module_daemon, tmp_path) -> None:
    with FakeModelServer() as server:
        server.script(seed("c1", "/bin/echo", "codex", timeout_ms=120_000), response(assistant("Done.")))

        async def body(h: Harness) -> None:
            assert tag(await h.done(await h.say("echo"), timeout=30)) == "task_complete"

        run(server, module_daemon, tmp_path, body)
    output = seed_answer(server, "c1")["output"]
    assert output.startswith(
        "Warning: requested timeout 120000ms exceeds maximum of 60000ms; clamping to 60000ms.\n")
    assert "codex" in output


# -- Codex's exec_command / write_stdin -----------------------------------------------


def exec_command(call_id: str, **args):
    return response(call("exec_command", args, call_id))


def write_stdin(call_id: str, session: int, chars: str = "", yield_time_ms: int = 600, **more):
    return response(call("write_stdin", {"session_id": session, "chars": chars, "yield_time_ms": yield_time_ms,
                                         **more}, call_id))


def test_a_python_repl_driven_over_several_calls(module_daemon, tmp_path) -> None:
    with FakeModelServer() as server:
        server.script(
            exec_command("c1", cmd="/usr/bin/python3 -i -q", tty=True, yield_time_ms=1500),
            write_stdin("c2", 1000, "x = 6 * 7\n"),
            write_stdin("c3", 1000, "def f(n):\n    return n * x\n\n"),
            write_stdin("c4", 1000, "print('answer', f(10))\n", yield_time_ms=1500),
            write_stdin("c5", 1000, "import sys; sys.exit(3)\n", yield_time_ms=5000),
            write_stdin("c6", 1000, "1\n"),
            response(assistant("Done.")),
        )

        async def body(h: Harness) -> None:
            sub = await h.say("use python")
            assert tag(await h.done(sub, timeout=60)) == "task_complete"
            end = h.of("exec_command_end", sub)[-1]
            assert end.call_id == "c1" and end.exit_code == 3 and "answer 420" in end.aggregated_output

        run(server, module_daemon, tmp_path, body, unified_exec=CODEX)
    got = answers(server)
    assert "Process running with session ID 1000" in got["c1"] and ">>>" in got["c1"]
    assert got["c1"].startswith("Chunk ID: ") and "\nWall time: " in got["c1"] and "\nOutput:\n" in got["c1"]
    assert "answer 420" in got["c4"]
    assert "Process exited with code 3" in got["c5"] and "session ID" not in got["c5"]
    assert got["c6"] == "write_stdin failed: Unknown session id 1000"


def test_exec_command_without_a_terminal(module_daemon, tmp_path) -> None:
    with FakeModelServer() as server:
        server.script(
            exec_command("c1", cmd="echo one; echo two >&2", yield_time_ms=5000),
            exec_command("c2", cmd="echo started; sleep 30", yield_time_ms=1500),
            write_stdin("c3", 1001, "more\n"),
            exec_command("c4", cmd="seq 1 20000", yield_time_ms=5000, max_output_tokens=50),
            response(assistant("Done.")),
        )

        async def body(h: Harness) -> None:
            sub = await h.say("run things")
            assert tag(await h.done(sub, timeout=60)) == "task_complete"
            assert [t["name"] for t in server.requests[0]["json"]["tools"]][:2] == ["exec_command", "write_stdin"]
            assert "shell" not in [t["name"] for t in server.requests[0]["json"]["tools"]]

        run(server, module_daemon, tmp_path, body, unified_exec=CODEX)
    got = answers(server)
    assert "Process exited with code 0" in got["c1"] and "one\n" in got["c1"] and "two\n" in got["c1"]
    # Ids are never reused: the first command's (it exited) was 1000.
    assert "Process running with session ID 1001" in got["c2"] and "started" in got["c2"]
    assert got["c3"] == ("write_stdin failed: stdin is closed for this session; "
                         "rerun exec_command with tty=true to keep stdin open")
    long = got["c4"]
    assert "tokens truncated" in long and long.rstrip().endswith("20000") and "\n1\n2\n" in long
    assert len(long.split("Output:\n", 1)[1]) < 400


# -- the sandbox and approvals --------------------------------------------------------


def test_a_session_that_writes_outside_the_writable_roots_is_denied(module_daemon, tmp_path, outside) -> None:
    victim = os.path.join(outside, "victim")
    planted = os.path.join(outside, "planted")
    with FakeModelServer() as server:
        server.script(
            seed("c1", "bash", "-i"),
            seed("c2", f"echo pwned > {victim}; touch {planted}; echo rc=$?\n", session=1000, timeout_ms=1500),
            # A session whose command fails the way denials do, under on-failure: asked to retry.
            seed("c3", "bash", "-c", f"echo x > {planted}", timeout_ms=5000),
            response(assistant("Done.")),
        )

        async def body(h: Harness) -> None:
            await h.configure(sandbox_policy=WORKSPACE, unified_exec=SEED,
                              approval_policy=AskForApproval.ON_FAILURE)
            sub = await h.say("write outside")
            request = await h.until(lambda e: e.id == sub and tag(e) == "exec_approval_request", timeout=30)
            assert request.msg.call_id == "c3" and request.msg.reason == "command failed; retry without sandbox?"
            await h.submit(ExecApproval(sub, ReviewDecision.DENIED))
            assert tag(await h.done(sub, timeout=30)) == "task_complete"

        run(server, module_daemon, tmp_path, body)
    assert open(victim).read() == "original\n" and not os.path.exists(planted)
    output = seed_answer(server, "c2")["output"]
    assert "rc=1" in output and ("Read-only file system" in output or "Permission denied" in output)
    assert seed_answer(server, "c3")["session_id"] is None


def test_a_session_command_needs_approval_like_any_command(module_daemon, tmp_path) -> None:
    with FakeModelServer() as server:
        server.script(seed("c1", "bash", "-i"), response(assistant("Done.")))

        async def body(h: Harness) -> None:
            await h.configure(sandbox_policy=WORKSPACE, unified_exec=SEED, approval_policy=AskForApproval.UNTRUSTED)
            sub = await h.say("open a shell")
            request = await h.until(lambda e: e.id == sub and tag(e) == "exec_approval_request", timeout=30)
            assert request.msg.command == ["bash", "-i"]
            await h.submit(ExecApproval(sub, ReviewDecision.DENIED))
            assert tag(await h.done(sub, timeout=30)) == "task_complete"
            assert not h.of("exec_command_begin", sub) and not h.session.unified_exec.sessions

        run(server, module_daemon, tmp_path, body)
    assert answers(server)["c1"] == "exec command rejected by user"


# -- lifetimes ------------------------------------------------------------------------


def test_interrupt_keeps_sessions_and_shutdown_kills_them(module_daemon, tmp_path) -> None:
    sleeper = ["sleep", f"{random.randint(1000, 9999)}.{random.randint(100, 999)}"]
    with FakeModelServer() as server:
        server.script(
            seed("c1", *sleeper, timeout_ms=300),
            seed("c2", "bash", "-i", timeout_ms=300),
            seed("c3", session=1000, timeout_ms=60_000),  # interrupted while it waits
            seed("c4", session=1000, timeout_ms=100),
            response(assistant("Still there.")),
        )

        async def body(h: Harness) -> None:
            sub = await h.say("start things")
            await h.until(lambda e: e.id == sub and tag(e) == "exec_command_begin" and e.msg.call_id == "c2",
                          timeout=30)
            sessions = h.session.unified_exec.sessions
            await await_for(lambda: 1000 in sessions and sessions[1000].busy, timeout=15.0, what="the long poll")
            await h.submit(Interrupt())
            assert h.tags(sub, deltas=False)[-2:] == ["error", "turn_aborted"]
            assert live_processes(sleeper) and sorted(h.session.unified_exec.sessions) == [1000, 1001]
            assert not h.of("exec_command_end", sub)

            sub2 = await h.say("are they still there?")
            assert tag(await h.done(sub2, timeout=30)) == "task_complete"
            bash = [p for p in live_processes(["bash", "-i"])]
            assert bash

            done = await h.submit(Shutdown())
            await h.until(lambda e: e.id == done and tag(e) == "shutdown_complete", timeout=30)
            # Each session's end was reported, and nothing of their trees is left.
            assert sorted(e.call_id for e in h.of("exec_command_end")) == ["c1", "c2"]
            await await_for(lambda: not live_processes(sleeper) and not any(p.is_running() for p in bash),
                            timeout=15.0, what="the sessions' processes to be gone")

        run(server, module_daemon, tmp_path, body)
    assert seed_answer(server, "c4")["session_id"] == "1000"


def test_the_session_cap_closes_the_one_idle_longest(module_daemon, tmp_path) -> None:
    with FakeModelServer() as server:
        server.script(
            seed("c1", "bash", "-i", timeout_ms=200),
            seed("c2", "bash", "-i", timeout_ms=200),
            seed("c3", "echo used\n", session=1000, timeout_ms=200),  # 1001 is now the idle one
            seed("c4", "bash", "-i", timeout_ms=200),
            seed("c5", session=1001, timeout_ms=100),
            seed("c6", "echo [still]\n", session=1000, timeout_ms=1500),
            response(assistant("Done.")),
        )

        async def body(h: Harness) -> None:
            sub = await h.say("three shells")
            assert tag(await h.done(sub, timeout=60)) == "task_complete"
            assert sorted(h.session.unified_exec.sessions) == [1000, 1002]
            assert [e.call_id for e in h.of("exec_command_end", sub)] == ["c2"]

        run(server, module_daemon, tmp_path, body,
            unified_exec=UnifiedExecSettings(tools="seed", max_sessions=2))
    third = seed_answer(server, "c4")
    assert third["session_id"] == "1002"
    assert third["output"].startswith("Note: closed session 1001 (bash -i), the one idle longest: "
                                      "at most 2 sessions run at once.\n")
    assert answers(server)["c5"] == "unified exec failed: Unknown session id 1001"
    assert "[still]" in seed_answer(server, "c6")["output"]


def test_an_idle_session_is_reaped(module_daemon, tmp_path) -> None:
    with FakeModelServer() as server:
        reaped = threading.Event()
        server.script(
            seed("c1", "bash", "-i", timeout_ms=100),
            gated(seed("c2", "echo hi\n", session=1000, timeout_ms=100), reaped, timeout=30),
            response(assistant("Done.")),
        )

        async def body(h: Harness) -> None:
            sub = await h.say("leave a shell")
            await h.until(lambda e: tag(e) == "exec_command_end", timeout=30)
            reaped.set()
            assert tag(await h.done(sub, timeout=30)) == "task_complete"
            assert not h.session.unified_exec.sessions

        run(server, module_daemon, tmp_path, body,
            unified_exec=UnifiedExecSettings(tools="seed", idle_timeout_ms=400))
    assert answers(server)["c2"] == "unified exec failed: Unknown session id 1000"


def test_the_tools_follow_the_setting(module_daemon, tmp_path) -> None:
    with FakeModelServer() as server:
        server.script(
            response(call("unified_exec", {"input": ["true"]}, "c1")), response(assistant("a")),
            response(call("shell", {"command": ["true"]}, "c2")), response(assistant("b")),
        )

        async def body(h: Harness) -> None:
            await h.configure(sandbox_policy=WORKSPACE, unified_exec=UnifiedExecSettings(tools="off"))
            assert tag(await h.done(await h.say("one"), timeout=30)) == "task_complete"
            await h.configure(sandbox_policy=WORKSPACE, unified_exec=CODEX)
            assert tag(await h.done(await h.say("two"), timeout=30)) == "task_complete"

        run(server, module_daemon, tmp_path, body)
    names = [[t["name"] for t in r["json"]["tools"]] for r in server.requests]
    assert names[0] == ["shell", "apply_patch", "update_plan"]
    assert names[2] == ["exec_command", "write_stdin", "apply_patch", "update_plan"]
    # The instructions describe the tools offered, and only those.
    assert server.requests[0]["json"]["instructions"] == base_instructions("off")
    assert server.requests[2]["json"]["instructions"] == base_instructions("codex")
    got = answers(server)
    assert got["c1"] == "unsupported call: unified_exec"
    # Not offered, but a model that calls it anyway is served as before.
    assert json.loads(got["c2"])["metadata"]["exit_code"] == 0


# -- through the daemon's own agent process -------------------------------------------


def test_the_setting_travels_with_the_session_to_the_agent_process(module_daemon, tmp_path) -> None:
    sleeper = ["sleep", f"{random.randint(1000, 9999)}.{random.randint(100, 999)}"]
    with FakeModelServer() as server:
        server.script(
            exec_command("c1", cmd=" ".join(sleeper), login=False, yield_time_ms=300),
            response(assistant("Left it running.")),
        )
        client = module_daemon.client()
        session = client.open_session(configure_op(server, str(tmp_path), unified_exec=CODEX))
        collect(session, "session_configured")
        session.submit(UserInput([TextInput("start it")]))
        collect(session, "task_complete", timeout=30)
        first = server.requests[0]["json"]
        assert [t["name"] for t in first["tools"]][:2] == ["exec_command", "write_stdin"]
        assert "- `exec_command` runs `cmd`" in first["instructions"] and "argv array" not in first["instructions"]
        # The environment comes first, in Codex's shape (the policies of configure_op).
        assert first["input"][0]["content"][0]["text"].startswith(
            f"<environment_context>\n  <cwd>{tmp_path}</cwd>\n  <approval_policy>")
        assert "Process running with session ID 1000" in answers(server)["c1"]
        assert live_processes(sleeper)
        session.submit(Shutdown())
        events = collect(session, "shutdown_complete", timeout=30)
        assert [e.msg.call_id for e in events if tag(e) == "exec_command_end"] == ["c1"]
        deadline = time.monotonic() + 10
        while live_processes(sleeper) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not live_processes(sleeper)


def test_an_approved_retry_or_escalation_starts_the_session_unsandboxed(module_daemon, tmp_path, outside) -> None:
    retried = os.path.join(outside, "retried")
    escalated = os.path.join(outside, "escalated")
    with FakeModelServer() as server:
        server.script(
            seed("c1", "bash", "-c", f"echo x > {retried}", timeout_ms=5000),
            response(assistant("Retried.")),
            exec_command("c2", cmd=f"echo y > {escalated}", with_escalated_permissions=True,
                         justification="write outside", login=False, yield_time_ms=5000),
            response(assistant("Escalated.")),
        )

        async def body(h: Harness) -> None:
            await h.configure(sandbox_policy=WORKSPACE, unified_exec=SEED, approval_policy=AskForApproval.ON_FAILURE)
            sub = await h.say("write outside")
            request = await h.until(lambda e: e.id == sub and tag(e) == "exec_approval_request", timeout=30)
            assert request.msg.reason == "command failed; retry without sandbox?"
            await h.submit(ExecApproval(sub, ReviewDecision.APPROVED))
            assert tag(await h.done(sub, timeout=30)) == "task_complete"
            assert [b.call_id for b in h.of("exec_command_begin", sub)] == ["c1", "c1"]

            await h.configure(sandbox_policy=WORKSPACE, unified_exec=CODEX, approval_policy=AskForApproval.ON_REQUEST)
            sub = await h.say("write outside again")
            request = await h.until(lambda e: e.id == sub and tag(e) == "exec_approval_request", timeout=30)
            assert request.msg.command[-1] == f"echo y > {escalated}" and request.msg.reason == "write outside"
            await h.submit(ExecApproval(sub, ReviewDecision.APPROVED))
            assert tag(await h.done(sub, timeout=30)) == "task_complete"

        run(server, module_daemon, tmp_path, body)
    assert open(retried).read() == "x\n" and open(escalated).read() == "y\n"
    assert seed_answer(server, "c1")["session_id"] is None
    assert "Process exited with code 0" in answers(server)["c2"]
