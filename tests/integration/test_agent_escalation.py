"""What the model is told about leaving the sandbox: a Session over a real daemon (real
executors, the real sandbox), driven by a scripted model, checked on the
``function_call_output`` texts the model is sent back.

- An escalation request in either spelling (the seed's ``with_escalated_permissions``,
  Codex's ``sandbox_permissions: "require_escalated"``) is asked under ``on-request`` and
  refused in the seed's words under ``never``, on every tool that runs a command.
- A retry without the sandbox, once approved, is not asked again for the same command.
- A command the sandbox denied is reported in the seed's words under ``on-request`` and
  ``never``, by ``shell`` and by ``exec_command``.
"""

from __future__ import annotations

import asyncio
import os
import re

import pytest

from agent.exec_runner import BrokerRunner
from broker.wire.protocol import AskForApproval, ExecApproval, ReviewDecision, UnifiedExecSettings
from landlock_helper.policy import SandboxPolicy
from tests.support.fake_model import FakeModelServer, Harness, assistant, call, outputs_of, response, tag

pytestmark = pytest.mark.timeout(90)

WORKSPACE = SandboxPolicy.from_mode("workspace-write")
DENIED_PREFIX = ("failed in sandbox LinuxSeccomp with execution error: sandbox denied exec error, exit code: 1, "
                 "stdout: , stderr: ")
NEVER_REJECTION = ("exec command rejected: approval policy is never; reject command — you should not ask for "
                   "escalated permissions if the approval policy is never")


def answers(server: FakeModelServer) -> dict[str, str]:
    """Every call's output the model was sent, by call id."""
    found: dict[str, str] = {}
    for request in server.requests:
        found.update(outputs_of(request["json"]))
    return found


def write_call(tool: str, call_id: str, path: str, **escalation) -> dict:
    """A call of ``tool`` that writes ``x`` to ``path`` with bash (no login shell, so
    the only output is bash's own complaint if the write is refused)."""
    script = f"echo x > {path}"
    if tool == "exec_command":
        return call(tool, {"cmd": script, "login": False, "yield_time_ms": 5000, **escalation}, call_id)
    if tool == "unified_exec":
        return call(tool, {"input": ["bash", "-c", script], "timeout_ms": 5000, **escalation}, call_id)
    return call(tool, {"command": ["bash", "-c", script], **escalation}, call_id)


def tools_setting(tool: str) -> UnifiedExecSettings:
    return UnifiedExecSettings(tools={"exec_command": "codex", "unified_exec": "seed"}.get(tool, "off"))


def drive(server: FakeModelServer, handle, tmp_path, body, **configure) -> None:
    """Run ``body(h)`` in a session over the daemon's executors, configured as given."""
    async def main() -> None:
        runner = await BrokerRunner.connect(handle.runtime)
        h = Harness(server, runner, tmp_path)
        try:
            await h.configure(**{"sandbox_policy": WORKSPACE, **configure})
            await body(h)
        finally:
            await h.session.aclose()
            await runner.aclose()

    asyncio.run(main())


def asked(h: Harness) -> list:
    return [e.msg for e in h.events if tag(e) == "exec_approval_request"]


# -- escalation requests --------------------------------------------------------------


@pytest.mark.parametrize(("tool", "escalation"), [
    ("exec_command", {"sandbox_permissions": "require_escalated"}),
    ("shell", {"sandbox_permissions": "require_escalated"}),
    ("shell", {"with_escalated_permissions": True}),
    ("unified_exec", {"sandbox_permissions": "require_escalated"}),
], ids=["exec_command-codex", "shell-codex", "shell-seed", "unified_exec-codex"])
def test_an_escalation_request_is_asked_under_on_request(module_daemon, tmp_path, outside, tool, escalation) -> None:
    target = os.path.join(outside, "escalated")
    with FakeModelServer() as server:
        server.script(response(write_call(tool, "c1", target, justification="Write the file outside?", **escalation)),
                      response(assistant("Done.")))

        async def body(h: Harness) -> None:
            sub = await h.say("write outside")
            request = await h.until(lambda e: e.id == sub and tag(e) == "exec_approval_request", timeout=30)
            assert request.msg.call_id == "c1" and request.msg.reason == "Write the file outside?"
            await h.submit(ExecApproval(sub, ReviewDecision.APPROVED))
            assert tag(await h.done(sub, timeout=30)) == "task_complete"

        drive(server, module_daemon, tmp_path, body, approval_policy=AskForApproval.ON_REQUEST,
              unified_exec=tools_setting(tool))
    # Approved: it ran outside the sandbox, and the model got its ordinary answer.
    assert open(target).read() == "x\n"
    output = answers(server)["c1"]
    assert not output.startswith(("exec command rejected", "failed in sandbox", "failed to parse"))
    if tool == "exec_command":
        assert "Process exited with code 0" in output


@pytest.mark.parametrize("tool", ["exec_command", "shell"])
def test_an_escalation_request_under_never_is_refused_in_the_seeds_words(module_daemon, tmp_path, outside,
                                                                         tool) -> None:
    target = os.path.join(outside, "escalated")
    with FakeModelServer() as server:
        server.script(response(write_call(tool, "c1", target, sandbox_permissions="require_escalated",
                                          justification="Write the file outside?")),
                      response(assistant("Done.")))

        async def body(h: Harness) -> None:
            sub = await h.say("write outside")
            assert tag(await h.done(sub, timeout=30)) == "task_complete"
            assert not asked(h) and not h.of("exec_command_begin", sub)

        drive(server, module_daemon, tmp_path, body, approval_policy=AskForApproval.NEVER,
              unified_exec=tools_setting(tool))
    assert answers(server)["c1"] == NEVER_REJECTION
    assert not os.path.exists(target)


# -- an approved retry ----------------------------------------------------------------


@pytest.mark.parametrize("tool", ["shell", "exec_command"])
def test_an_approved_retry_is_not_asked_again_for_the_same_command(module_daemon, tmp_path, outside, tool) -> None:
    target = os.path.join(outside, "retried")
    with FakeModelServer() as server:
        server.script(response(write_call(tool, "c1", target)), response(assistant("Retried.")),
                      response(write_call(tool, "c2", target)), response(assistant("Again.")))

        async def body(h: Harness) -> None:
            sub = await h.say("write outside")
            request = await h.until(lambda e: e.id == sub and tag(e) == "exec_approval_request", timeout=30)
            assert request.msg.reason == "command failed; retry without sandbox?"
            await h.submit(ExecApproval(sub, ReviewDecision.APPROVED))  # once, not for the session
            assert tag(await h.done(sub, timeout=30)) == "task_complete"
            os.unlink(target)
            # The same command again: run outside the sandbox at once, nobody asked.
            sub = await h.say("and again")
            assert tag(await h.done(sub, timeout=30)) == "task_complete"
            assert [r.call_id for r in asked(h)] == ["c1"]
            assert [b.call_id for b in h.of("exec_command_begin", sub)] == ["c2"]

        drive(server, module_daemon, tmp_path, body, approval_policy=AskForApproval.ON_FAILURE,
              unified_exec=tools_setting(tool))
    assert open(target).read() == "x\n"
    got = answers(server)
    for call_id in ("c1", "c2"):
        if tool == "exec_command":
            assert "Process exited with code 0" in got[call_id]
        else:
            assert '"exit_code":0' in got[call_id]


# -- a sandbox denial -----------------------------------------------------------------


@pytest.mark.parametrize("policy", [AskForApproval.ON_REQUEST, AskForApproval.NEVER])
@pytest.mark.parametrize("tool", ["shell", "exec_command"])
def test_a_sandbox_denial_is_reported_in_the_seeds_words(module_daemon, tmp_path, outside, tool, policy) -> None:
    victim = os.path.join(outside, "victim")
    with FakeModelServer() as server:
        server.script(response(write_call(tool, "c1", victim)),
                      # A plain failure in the same sandbox is not a denial.
                      response(write_call(tool, "c2", "/nonexistent-dir/x")),
                      response(assistant("Done.")))

        async def body(h: Harness) -> None:
            sub = await h.say("write outside")
            assert tag(await h.done(sub, timeout=30)) == "task_complete"
            assert not asked(h)

        drive(server, module_daemon, tmp_path, body, approval_policy=policy, unified_exec=tools_setting(tool))
    assert open(victim).read() == "original\n"
    got = answers(server)
    denial = got["c1"]
    assert denial.startswith(DENIED_PREFIX), denial
    # stderr as bash wrote it (exec_command names its shell by path).
    stderr = denial[len(DENIED_PREFIX):]
    assert re.fullmatch(rf"(/bin/)?bash: line 1: {re.escape(victim)}: (Read-only file system|Permission denied)\n",
                        stderr), denial
    assert not got["c2"].startswith("failed in sandbox") and "No such file or directory" in got["c2"]
