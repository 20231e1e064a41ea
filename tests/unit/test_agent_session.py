"""agent.session: the Codex session loop driven in-process.

A scripted model server on loopback (``tests/support/fake_model.py``) answers the model requests;
a fake runner answers the commands. Each test submits Codex submissions and checks the
emitted events (their ``type`` tags and key fields) and what the model was sent.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from agent.instructions import PROJECT_DOC_SEPARATOR, base_instructions, user_shell
from agent.rollout import read_rollout
from agent.turn import COMPACT_DONE, START_SUMMARIZATION, SUMMARIZATION_PROMPT
from broker.wire.protocol import (
    NO_SESSION,
    TURN_INTERRUPTED,
    AddToHistory,
    AskForApproval,
    Compact,
    ExecApproval,
    GetHistoryEntryRequest,
    ImageInput,
    Interrupt,
    ModelProviderInfo,
    PatchApproval,
    ReviewDecision,
    Shutdown,
    TextInput,
    UserInput,
    UnifiedExecSettings,
    UserMessageEvent,
    WireApi,
    encode_json,
)
from landlock_helper.policy import SandboxPolicy
from tests.support.fake_model import (
    SESSION_API_KEY as API_KEY,
)
from tests.support.fake_model import (
    FakeExec,
    FakeRunner,
    Harness,
    assistant,
    call,
    conversation,
    gated,
    local_shell_call,
    outputs_of,
    reasoning,
    response,
    status,
    tag,
    usage,
    user_item,
)

pytestmark = pytest.mark.timeout(30)


def run(test: Callable[..., Any]) -> Any:
    return asyncio.run(test())


# -- configure ------------------------------------------------------------------------


def test_configure_answers_session_configured(server, tmp_path) -> None:
    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        event = await h.configure()
        assert tag(event) == "session_configured"
        assert event.msg.session_id == h.session.session_id and isinstance(event.msg.session_id, uuid.UUID)
        assert (event.msg.model, event.msg.history_log_id, event.msg.history_entry_count) == ("test-model", 0, 0)
        text = encode_json(event).decode()
        assert text == (f'{{"id":"s1","msg":{{"type":"session_configured","session_id":"{h.session.session_id}",'
                        '"model":"test-model","history_log_id":0,"history_entry_count":0}}')

    run(main)


def test_relative_cwd_and_ops_before_configure_are_errors(server, tmp_path) -> None:
    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        for op in (UserInput([TextInput("hi")]), Interrupt(), Compact(),
                   ExecApproval("x", ReviewDecision.APPROVED), PatchApproval("x", ReviewDecision.DENIED)):
            sub_id = await h.submit(op)
            assert tag(h.last(sub_id)) == "error" and h.last(sub_id).msg.message == NO_SESSION
        sub_id = await h.submit(h.configure_op(cwd="relative/dir"))
        assert h.last(sub_id).msg.message == "cwd is not absolute: 'relative/dir'"
        sub_id = await h.submit(h.configure_op(cwd=str(tmp_path / "missing")))
        assert tag(h.last(sub_id)) == "error" and "not a directory" in h.last(sub_id).msg.message
        assert h.session.config is None and not server.requests
        assert tag(await h.configure()) == "session_configured"

    run(main)


# -- a task ---------------------------------------------------------------------------


def test_user_input_runs_a_task_with_text_tokens_and_instructions(server, tmp_path) -> None:
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "AGENTS.md").write_text("Always run the tests.")
    server.script(response(reasoning("**Looking**"), assistant("Hello there."), deltas=["Hello ", "there."],
                           reasoning_deltas=["**Look", "ing**"]))

    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        await h.configure(instructions="Be brief.")
        sub_id = await h.say("hi")
        done = await h.done(sub_id)
        assert tag(done) == "task_complete" and done.msg.last_agent_message == "Hello there."
        assert h.tags(sub_id) == [
            "task_started", "user_message", "agent_reasoning_delta", "agent_reasoning_delta", "agent_message_delta",
            "agent_message_delta", "agent_reasoning", "agent_message", "token_count", "task_complete",
        ]
        assert [m.delta for m in h.of("agent_message_delta")] == ["Hello ", "there."]
        assert h.of("agent_reasoning")[0].text == "**Looking**"
        tokens = h.of("token_count")[0]
        assert (tokens.input_tokens, tokens.cached_input_tokens, tokens.output_tokens,
                tokens.reasoning_output_tokens, tokens.total_tokens) == (12, 4, 7, 2, 19)
        assert not h.session.running
        return h

    h = run(main)
    (request,) = server.requests
    assert request["path"] == "/v1/responses"
    assert request["headers"]["authorization"] == f"Bearer {API_KEY}"
    body = request["json"]
    assert body["model"] == "test-model" and body["stream"] is True
    # The environment comes first, as Codex's <environment_context> user message.
    environment = user_item(f"<environment_context>\n  <cwd>{tmp_path / 'work'}</cwd>\n"
                            "  <approval_policy>on-request</approval_policy>\n"
                            "  <sandbox_mode>workspace-write</sandbox_mode>\n"
                            "  <network_access>restricted</network_access>\n"
                            f"  <shell>{user_shell()}</shell>\n</environment_context>")
    assert body["input"] == [environment, user_item("hi")]
    assert body["instructions"] == base_instructions("seed") + "\n\nBe brief." + PROJECT_DOC_SEPARATOR + \
        "Always run the tests."
    assert [t["name"] for t in body["tools"]] == ["shell", "unified_exec", "apply_patch", "update_plan"]
    shell = body["tools"][0]["parameters"]["properties"]
    assert "with_escalated_permissions" in shell and "justification" in shell  # on-request offers escalation
    # The reasoning and the assistant message join the conversation, without their ids.
    assert h.session.history == [
        environment,
        user_item("hi"),
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "**Looking**"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello there."}]},
    ]


# -- tools ----------------------------------------------------------------------------


def test_shell_call_streams_output_and_answers_the_model(server, tmp_path) -> None:
    server.script(
        response(call("shell", {"command": ["ls", "-la"], "workdir": "sub", "timeout_ms": 5000}, "c1")),
        response(local_shell_call(["cat", "x"], "c2", timeout_ms=1000)),
        response(assistant("Two files.")),
    )

    async def main():
        runner = FakeRunner(lambda argv, sandboxed: FakeExec(stdout="a\nb\n", stderr="warn\n"))
        h = Harness(server, runner, tmp_path)
        (h.cwd / "sub").mkdir()
        await h.configure()
        sub_id = await h.say("list")
        assert (await h.done(sub_id)).msg.last_agent_message == "Two files."
        assert h.tags(sub_id) == [
            "task_started", "user_message",
            "exec_command_begin", "exec_command_output_delta", "exec_command_output_delta", "exec_command_end",
            "token_count",
            "exec_command_begin", "exec_command_output_delta", "exec_command_output_delta", "exec_command_end",
            "token_count",
            "agent_message_delta", "agent_message", "token_count", "task_complete",
        ]
        begin = h.of("exec_command_begin")[0]
        assert (begin.call_id, begin.command, begin.cwd) == ("c1", ["ls", "-la"], str(h.cwd / "sub"))
        deltas = h.of("exec_command_output_delta")
        assert [(d.call_id, str(d.stream), d.chunk) for d in deltas[:2]] == [
            ("c1", "stdout", b"a\nb\n"), ("c1", "stderr", b"warn\n")]
        end = h.of("exec_command_end")[0]
        assert (end.call_id, end.exit_code, end.stdout, end.stderr) == ("c1", 0, "a\nb\n", "warn\n")
        assert end.aggregated_output == "a\nb\nwarn\n" and end.formatted_output == "a\nb\nwarn\n"
        assert end.duration.seconds == 0.25
        # ls is known-safe: sandboxed, with the model's timeout; the local shell call too.
        assert [r.sandboxed for r in runner.runs] == [True, True]
        assert [r.timeout_ms for r in runner.runs] == [5000, 1000]
        # The workdir is where it runs; the sandbox's cwd root stays the session's.
        assert [(r.cwd, r.sandbox_cwd) for r in runner.runs] == [(str(h.cwd / "sub"), str(h.cwd)),
                                                                 (str(h.cwd), str(h.cwd))]
        assert h.of("exec_command_begin")[1].command == ["cat", "x"]

    run(main)
    second, third = server.requests[1]["json"], server.requests[2]["json"]
    second["input"], third["input"] = conversation(second["input"]), conversation(third["input"])
    assert second["input"][1] == {"type": "function_call", "name": "shell", "call_id": "c1",
                                  "arguments": '{"command": ["ls", "-la"], "workdir": "sub", "timeout_ms": 5000}'}
    assert json.loads(outputs_of(second)["c1"]) == {"output": "a\nb\nwarn\n",
                                                    "metadata": {"exit_code": 0, "duration_seconds": 0.3}}
    assert outputs_of(second)["c1"] == '{"output":"a\\nb\\nwarn\\n","metadata":{"exit_code":0,"duration_seconds":0.3}}'
    assert third["input"][3]["type"] == "local_shell_call" and "id" not in third["input"][3]
    assert json.loads(outputs_of(third)["c2"])["output"] == "a\nb\nwarn\n"


def test_long_output_is_cut_for_the_model_only(server, tmp_path) -> None:
    lines = "".join(f"line {i}\n" for i in range(1000))
    server.script(response(call("shell", {"command": ["seq", "1000"]}, "c1")), response(assistant("ok")))

    async def main():
        h = Harness(server, FakeRunner(lambda argv, sandboxed: FakeExec(stdout=lines, exit_code=2)), tmp_path)
        await h.configure()
        await h.done(await h.say("go"))
        streamed = b"".join(d.chunk for d in h.of("exec_command_output_delta"))
        assert streamed.decode() == lines
        end = h.of("exec_command_end")[0]
        # The end event carries the first 5 KiB, as the seed caps it: the deltas had it all.
        assert end.stdout == lines[:5 * 1024] and end.aggregated_output == lines[:5 * 1024] and end.exit_code == 2
        return end.formatted_output

    formatted = run(main)
    output = json.loads(outputs_of(server.requests[1]["json"])["c1"])
    assert output["metadata"]["exit_code"] == 2
    text = output["output"]
    assert text == formatted and len(text.encode()) <= 10 * 1024
    assert text.startswith("line 0\nline 1\n") and text.endswith("line 999")
    assert "\n[... omitted 744 of 1000 lines ...]\n\n" in text
    assert "line 127\n[... omitted" in text


def test_unknown_function_bad_arguments_and_plan(server, tmp_path) -> None:
    plan = {"explanation": "Start small.", "plan": [{"step": "read", "status": "completed"},
                                                    {"step": "fix", "status": "in_progress"}]}
    server.script(
        response(call("web_browse", {"url": "x"}, "c1"), call("shell", "{not json", "c2"),
                 call("shell", {"cmd": ["ls"]}, "c3"), call("update_plan", plan, "c4"),
                 call("update_plan", {"plan": [{"step": "x", "status": "done"}]}, "c5")),
        response(assistant("ok")),
    )

    async def main():
        runner = FakeRunner()
        h = Harness(server, runner, tmp_path)
        await h.configure()
        sub_id = await h.say("go")
        await h.done(sub_id)
        assert not runner.runs
        (update,) = h.of("plan_update", sub_id)
        assert update.explanation == "Start small."
        assert [(p.step, str(p.status)) for p in update.plan] == [("read", "completed"), ("fix", "in_progress")]
        assert h.tags(sub_id, deltas=False) == ["task_started", "user_message", "plan_update", "token_count", "agent_message",
                                                "token_count", "task_complete"]

    run(main)
    outputs = outputs_of(server.requests[1]["json"])
    assert outputs["c1"] == "unsupported call: web_browse"
    assert outputs["c2"].startswith("failed to parse function arguments: ")
    assert outputs["c3"].startswith("failed to parse function arguments: ") and "command" in outputs["c3"]
    assert outputs["c4"] == "Plan updated"
    assert outputs["c5"].startswith("failed to parse function arguments: ")


# -- patches --------------------------------------------------------------------------

CWD_ONLY = {"permissions": ["disk-full-read-access", "disk-write-cwd"]}


def cwd_only_policy():
    return msgspec.convert(CWD_ONLY, type=type(SandboxPolicy.from_mode("read-only")))


def add_file(path: str, text: str) -> str:
    return f"*** Begin Patch\n*** Add File: {path}\n+{text}\n*** End Patch"


def test_apply_patch_tool_and_heredoc_form_with_turn_diff(server, tmp_path) -> None:
    heredoc = ("apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: hello.txt\n@@\n-Hello\n+Hi\n"
               "*** End Patch\nEOF\n")
    server.script(
        response(call("apply_patch", {"input": add_file("hello.txt", "Hello")}, "p1")),
        response(call("shell", {"command": ["bash", "-lc", heredoc]}, "p2")),
        response(assistant("Patched.")),
    )

    async def main():
        runner = FakeRunner()
        h = Harness(server, runner, tmp_path)
        await h.configure(sandbox_policy=cwd_only_policy())
        sub_id = await h.say("patch it")
        await h.done(sub_id)
        assert not runner.runs  # a patch is file operations in the sandbox, not a command
        assert h.tags(sub_id, deltas=False) == [
            "task_started", "user_message", "patch_apply_begin", "patch_apply_end", "token_count", "turn_diff",
            "patch_apply_begin", "patch_apply_end", "token_count", "turn_diff",
            "agent_message", "token_count", "task_complete",
        ]
        begin = h.of("patch_apply_begin")[0]
        target = str(h.cwd / "hello.txt")
        assert begin.call_id == "p1" and begin.auto_approved is True
        assert encode_json(begin.changes).decode() == f'{{"{target}":{{"add":{{"content":"Hello\\n"}}}}}}'
        end = h.of("patch_apply_end")[0]
        assert end.success and end.stdout == "Success. Updated the following files:\nA hello.txt\n"
        assert (h.cwd / "hello.txt").read_text() == "Hi\n"
        first, last = h.of("turn_diff")
        assert "new file mode 100644" in first.unified_diff and "+Hello" in first.unified_diff
        assert "+Hi" in last.unified_diff and "b/hello.txt" in last.unified_diff

    run(main)
    output = json.loads(outputs_of(server.requests[1]["json"])["p1"])
    assert output == {"output": "Success. Updated the following files:\nA hello.txt\n",
                      "metadata": {"exit_code": 0, "duration_seconds": 0.0}}
    assert json.loads(outputs_of(server.requests[2]["json"])["p2"])["output"].endswith("M hello.txt\n")


def test_freeform_apply_patch_custom_tool_call_is_applied_and_others_answered(server, tmp_path) -> None:
    # Codex's freeform apply_patch: a Responses custom_tool_call whose input is the patch.
    patch = add_file("free.txt", "Free")
    server.script(
        response({"type": "custom_tool_call", "id": "ctc_1", "status": "completed", "call_id": "p1",
                  "name": "apply_patch", "input": patch},
                 {"type": "custom_tool_call", "call_id": "x1", "name": "web_browse", "input": "anything"}),
        response(assistant("Patched.")),
    )

    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        await h.configure(sandbox_policy=cwd_only_policy())
        sub_id = await h.say("patch it")
        await h.done(sub_id)
        assert (h.cwd / "free.txt").read_text() == "Free\n"
        assert [e.call_id for e in h.of("patch_apply_end")] == ["p1"] and h.of("patch_apply_end")[0].success
        assert "turn_diff" in h.tags(sub_id)

    run(main)
    second = conversation(server.requests[1]["json"]["input"])
    assert second[1] == {"type": "custom_tool_call", "call_id": "p1", "name": "apply_patch", "input": patch}
    outputs = {i["call_id"]: i for i in second if i["type"] == "custom_tool_call_output"}
    assert json.loads(outputs["p1"]["output"])["output"] == "Success. Updated the following files:\nA free.txt\n"
    assert outputs["x1"]["output"] == "unsupported custom tool call: web_browse"
    assert not [i for i in second if i["type"] == "function_call_output"]


def test_malformed_or_inapplicable_patch_goes_back_to_the_model(server, tmp_path) -> None:
    bad_update = "*** Begin Patch\n*** Update File: missing.txt\n@@\n-a\n+b\n*** End Patch"
    server.script(
        response(call("apply_patch", {"input": "*** Begin Patch\n*** Frobnicate: x\n*** End Patch"}, "p1"),
                 call("apply_patch", {"input": bad_update}, "p2")),
        response(assistant("sorry")),
    )

    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        await h.configure()
        sub_id = await h.say("patch it")
        await h.done(sub_id)
        assert "patch_apply_begin" not in h.tags(sub_id)

    run(main)
    outputs = outputs_of(server.requests[1]["json"])
    assert outputs["p1"].startswith("error: ") and "Frobnicate" in outputs["p1"]
    assert outputs["p2"].startswith("error: Failed to read file to update missing.txt")


def test_patch_outside_writable_roots_asks_with_grant_root(server, tmp_path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    server.script(
        response(call("apply_patch", {"input": add_file(str(outside / "a.txt"), "A")}, "p1")),
        response(call("apply_patch", {"input": add_file(str(outside / "b.txt"), "B")}, "p2")),
        response(assistant("done")),
        response(call("apply_patch", {"input": add_file(str(tmp_path / "elsewhere.txt"), "C")}, "p3")),
        response(assistant("refused")),
    )

    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        await h.configure(sandbox_policy=cwd_only_policy())
        sub_id = await h.say("write outside")
        request = (await h.until("apply_patch_approval_request")).msg
        assert request.call_id == "p1" and request.grant_root == str(outside)
        assert request.reason == f"grant write access to {outside} for this session"
        assert list(request.changes) == [str(outside / "a.txt")]
        assert not (outside / "a.txt").exists()
        await h.submit(PatchApproval(sub_id, ReviewDecision.APPROVED))
        assert tag(await h.done(sub_id)) == "task_complete"
        # Approved with its grant_root: the second patch there needed no approval.
        assert len(h.of("apply_patch_approval_request")) == 1
        assert [b.auto_approved for b in h.of("patch_apply_begin")] == [False, True]
        assert (outside / "a.txt").read_text() == "A\n" and (outside / "b.txt").read_text() == "B\n"
        assert h.session.granted_roots == [str(outside)]
        assert {"disk-write-folder": {"folder": str(outside)}} in msgspec.to_builtins(h.session.sandbox_policy)["permissions"]

        sub_id = await h.say("again")
        await h.until(lambda e: e.id == sub_id and tag(e) == "apply_patch_approval_request")
        await h.submit(PatchApproval(sub_id, ReviewDecision.DENIED))
        assert tag(await h.done(sub_id)) == "task_complete"
        assert not (tmp_path / "elsewhere.txt").exists()
        assert "patch_apply_begin" not in h.tags(sub_id)

    run(main)
    assert outputs_of(server.requests[4]["json"])["p3"] == "patch rejected by user"


def test_patch_outside_under_never_is_rejected(server, tmp_path) -> None:
    server.script(response(call("apply_patch", {"input": add_file(str(tmp_path / "x.txt"), "X")}, "p1")),
                  response(assistant("ok")))

    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        await h.configure(sandbox_policy=cwd_only_policy(), approval_policy=AskForApproval.NEVER)
        await h.done(await h.say("go"))
        assert not h.of("apply_patch_approval_request")

    run(main)
    assert outputs_of(server.requests[1]["json"])["p1"] == (
        "patch rejected: writing outside of the project; rejected by user approval settings")
    assert not (tmp_path / "x.txt").exists()


# -- approvals ------------------------------------------------------------------------


def test_exec_approvals_each_way(server, tmp_path) -> None:
    server.script(
        response(call("shell", {"command": ["make", "build"]}, "c1")),
        response(call("shell", {"command": ["make", "install"]}, "c2")),
        response(call("shell", {"command": ["make", "install"]}, "c3")),
        response(call("shell", {"command": ["rm", "-rf", "build"]}, "c4")),
        response(call("shell", {"command": ["ls"]}, "c5")),
        response(assistant("done")),
    )

    async def main():
        runner = FakeRunner()
        h = Harness(server, runner, tmp_path)
        await h.configure(approval_policy=AskForApproval.UNTRUSTED)
        sub_id = await h.say("build")
        first = await h.until("exec_approval_request")
        assert (first.id, first.msg.call_id, first.msg.command, first.msg.cwd) == (sub_id, "c1", ["make", "build"], str(h.cwd))
        assert "reason" not in encode_json(first).decode()
        await h.submit(ExecApproval(sub_id, ReviewDecision.APPROVED))
        await h.until(lambda e: tag(e) == "exec_approval_request" and e.msg.call_id == "c2")
        await h.submit(ExecApproval("c2", ReviewDecision.APPROVED_FOR_SESSION))  # by call id works too
        await h.until(lambda e: tag(e) == "exec_approval_request" and e.msg.call_id == "c4")
        await h.submit(ExecApproval(sub_id, ReviewDecision.DENIED))
        assert tag(await h.done(sub_id)) == "task_complete"
        # c3 repeated an approved-for-session command: not asked; ls is known-safe: not asked.
        assert [r.msg.call_id for r in h.events if tag(r) == "exec_approval_request"] == ["c1", "c2", "c4"]
        assert [(r.argv, r.sandboxed) for r in runner.runs] == [
            (["make", "build"], False), (["make", "install"], False), (["make", "install"], False), (["ls"], True)]
        assert ("make", "install") in h.session.approved_commands
        assert [e.msg.call_id for e in h.events if tag(e) == "exec_command_begin"] == ["c1", "c2", "c3", "c5"]

    run(main)
    outputs = {k: v for r in server.requests[1:] for k, v in outputs_of(r["json"]).items()}
    assert outputs["c4"] == "exec command rejected by user"
    assert json.loads(outputs["c1"])["metadata"]["exit_code"] == 0


def test_abort_decision_ends_the_task(server, tmp_path) -> None:
    server.script(response(call("shell", {"command": ["make"]}, "c1")), response(assistant("next")))

    async def main():
        runner = FakeRunner()
        h = Harness(server, runner, tmp_path)
        await h.configure(approval_policy=AskForApproval.UNTRUSTED)
        sub_id = await h.say("build")
        await h.until("exec_approval_request")
        await h.submit(ExecApproval(sub_id, ReviewDecision.ABORT))
        assert h.tags(sub_id)[-2:] == ["error", "turn_aborted"]
        assert h.of("error", sub_id)[0].message == TURN_INTERRUPTED
        assert str(h.of("turn_aborted", sub_id)[0].reason) == "interrupted"
        assert "task_complete" not in h.tags(sub_id) and not runner.runs and not h.session.running
        # The next task answers the dangling call with "aborted".
        await h.done(await h.say("carry on"))

    run(main)
    second = conversation(server.requests[1]["json"]["input"])
    assert [i["type"] for i in second] == ["message", "function_call", "function_call_output", "message"]
    assert second[2] == {"type": "function_call_output", "call_id": "c1", "output": "aborted"}


def test_escalation_request_asks_under_on_request(server, tmp_path) -> None:
    server.script(response(call("shell", {"command": ["pip", "install", "x"], "with_escalated_permissions": True,
                                          "justification": "needs network"}, "c1")),
                  response(assistant("ok")))

    async def main():
        runner = FakeRunner()
        h = Harness(server, runner, tmp_path)
        await h.configure()
        sub_id = await h.say("install")
        request = await h.until("exec_approval_request")
        assert request.msg.reason == "needs network"
        await h.submit(ExecApproval(sub_id, ReviewDecision.APPROVED))
        await h.done(sub_id)
        assert [r.sandboxed for r in runner.runs] == [False]

    run(main)


def denied_when_sandboxed(argv: list[str], sandboxed: bool) -> FakeExec:
    if sandboxed:
        return FakeExec(stderr="touch: cannot touch '/etc/x': Permission denied\n", exit_code=1)
    return FakeExec(stdout="done\n")


def test_sandbox_denial_asks_to_retry_unsandboxed(server, tmp_path) -> None:
    server.script(response(call("shell", {"command": ["touch", "/etc/x"]}, "c1")), response(assistant("ok")))

    async def main():
        runner = FakeRunner(denied_when_sandboxed)
        h = Harness(server, runner, tmp_path)
        await h.configure(approval_policy=AskForApproval.ON_FAILURE)
        sub_id = await h.say("touch")
        request = await h.until("exec_approval_request")
        assert request.msg.reason == "command failed; retry without sandbox?"
        assert request.msg.command == ["touch", "/etc/x"]
        await h.submit(ExecApproval(sub_id, ReviewDecision.APPROVED))
        await h.done(sub_id)
        assert h.tags(sub_id, deltas=False) == [
            "task_started", "user_message", "exec_command_begin", "exec_command_end", "background_event", "exec_approval_request",
            "background_event", "exec_command_begin", "exec_command_end", "token_count", "agent_message",
            "token_count", "task_complete",
        ]
        failed, retried = h.of("exec_command_end")
        assert failed.exit_code == 1 and retried.exit_code == 0 and retried.stdout == "done\n"
        notes = [m.message for m in h.of("background_event")]
        assert notes[0].startswith("Execution failed: sandbox denied exec error, exit code: 1")
        assert notes[1] == "retrying command without sandbox"
        assert [r.sandboxed for r in runner.runs] == [True, False]

    run(main)
    assert json.loads(outputs_of(server.requests[1]["json"])["c1"])["output"] == "done\n"


def test_an_approved_retry_is_remembered_for_the_same_command(server, tmp_path) -> None:
    touch = {"command": ["touch", "/etc/x"]}
    server.script(response(call("shell", touch, "c1")), response(call("shell", touch, "c2")),
                  response(call("shell", {"command": ["touch", "/etc/y"]}, "c3")), response(assistant("ok")))

    async def main():
        runner = FakeRunner(denied_when_sandboxed)
        h = Harness(server, runner, tmp_path)
        await h.configure(approval_policy=AskForApproval.ON_FAILURE)
        sub_id = await h.say("touch")
        await h.until("exec_approval_request")
        await h.submit(ExecApproval(sub_id, ReviewDecision.APPROVED))  # this once, as the seed counts it
        await h.until(lambda e: tag(e) == "exec_approval_request" and e.msg.call_id == "c3")
        await h.submit(ExecApproval(sub_id, ReviewDecision.DENIED))
        await h.done(sub_id)
        # c2 repeated the command approved to leave the sandbox: run outside it, unasked;
        # c3 is another command, tried in the sandbox first.
        assert [r.msg.call_id for r in [e for e in h.events if tag(e) == "exec_approval_request"]] == ["c1", "c3"]
        assert [(r.argv[-1], r.sandboxed) for r in runner.runs] == [
            ("/etc/x", True), ("/etc/x", False), ("/etc/x", False), ("/etc/y", True)]

    run(main)
    outputs = {k: v for r in server.requests[1:] for k, v in outputs_of(r["json"]).items()}
    assert json.loads(outputs["c1"])["output"] == json.loads(outputs["c2"])["output"] == "done\n"


def test_an_unknown_sandbox_permissions_value_is_an_error_for_the_model(server, tmp_path) -> None:
    server.script(response(call("shell", {"command": ["touch", "x"], "sandbox_permissions": "always"}, "c1")),
                  response(assistant("ok")))

    async def main():
        runner = FakeRunner()
        h = Harness(server, runner, tmp_path)
        await h.configure()
        await h.done(await h.say("touch"))
        assert not runner.runs and not h.of("exec_approval_request")

    run(main)
    assert outputs_of(server.requests[1]["json"])["c1"] == (
        "failed to parse function arguments: `sandbox_permissions` 'always' is not supported: "
        "use 'use_default' or 'require_escalated'")


@pytest.mark.parametrize("policy", [AskForApproval.ON_REQUEST, AskForApproval.NEVER])
def test_sandbox_denial_goes_to_the_model_under_on_request_and_never(server, tmp_path, policy) -> None:
    server.script(response(call("shell", {"command": ["touch", "/etc/x"]}, "c1")), response(assistant("ok")))

    async def main():
        runner = FakeRunner(denied_when_sandboxed)
        h = Harness(server, runner, tmp_path)
        await h.configure(approval_policy=policy)
        await h.done(await h.say("touch"))
        assert not h.of("exec_approval_request") and len(runner.runs) == 1

    run(main)
    # The seed's words, which tell the model the sandbox (not the command) said no.
    assert outputs_of(server.requests[1]["json"])["c1"] == (
        "failed in sandbox LinuxSeccomp with execution error: sandbox denied exec error, exit code: 1, "
        "stdout: , stderr: touch: cannot touch '/etc/x': Permission denied\n")


def test_timeout_and_plain_failure_are_not_escalated(server, tmp_path) -> None:
    server.script(response(call("shell", {"command": ["sleep", "9"], "timeout_ms": 50}, "c1"),
                           call("shell", {"command": ["bash", "-c", "false"]}, "c2")),
                  response(assistant("ok")))

    def respond(argv: list[str], sandboxed: bool) -> FakeExec:
        if argv[0] == "sleep":
            return FakeExec(stderr="Permission denied\n", exit_code=None, timed_out=True)
        return FakeExec(stdout="sandbox\n", exit_code=1)

    async def main():
        h = Harness(server, FakeRunner(respond), tmp_path)
        await h.configure(approval_policy=AskForApproval.ON_FAILURE)
        await h.done(await h.say("go"))
        assert not h.of("exec_approval_request")
        timed = h.of("exec_command_end")[0]
        assert timed.exit_code == 124 and timed.formatted_output.startswith("command timed out after 50 milliseconds\n")

    run(main)
    outputs = outputs_of(server.requests[1]["json"])
    assert json.loads(outputs["c1"])["metadata"]["exit_code"] == 124
    assert json.loads(outputs["c2"]) == {"output": "sandbox\n", "metadata": {"exit_code": 1, "duration_seconds": 0.3}}


# -- interrupts and input while running -------------------------------------------------


def test_interrupt_mid_command_cancels_it_and_answers_the_call_aborted(server, tmp_path) -> None:
    server.script(response(call("shell", {"command": ["sleep", "100"]}, "c1")), response(assistant("ok")))

    async def main():
        runner = FakeRunner(lambda argv, sandboxed: FakeExec(stdout="started\n", hang=True))
        h = Harness(server, runner, tmp_path)
        await h.configure()
        sub_id = await h.say("sleep")
        await h.until("exec_command_output_delta")
        await h.submit(Interrupt())
        # At once: the command was cancelled through the runner and the abort announced.
        assert runner.cancelled and runner.cancelled[0] == runner.runs[0].call_id
        assert h.tags(sub_id, deltas=False)[-4:] == ["exec_command_begin", "exec_command_end", "error", "turn_aborted"]
        end = h.of("exec_command_end")[0]
        assert (end.call_id, end.exit_code, end.formatted_output) == ("c1", 130, "aborted")
        # What it printed before it was stopped, as streamed, not empty strings.
        assert (end.stdout, end.stderr, end.aggregated_output) == ("started\n", "", "started\n")
        assert h.of("error", sub_id)[-1].message == "Turn interrupted"
        assert not h.session.running and "task_complete" not in h.tags(sub_id)
        # Interrupting with nothing running says nothing.
        count = len(h.events)
        await h.submit(Interrupt())
        assert len(h.events) == count
        await h.done(await h.say("what happened?"))

    run(main)
    second = conversation(server.requests[1]["json"]["input"])
    assert [i["type"] for i in second] == ["message", "function_call", "function_call_output", "message"]
    assert second[2] == {"type": "function_call_output", "call_id": "c1", "output": "aborted"}


def test_interrupt_while_the_model_streams(server, tmp_path) -> None:
    server.script(response(assistant("never finished"), complete=False, hang=True, server=server))

    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        await h.configure()
        sub_id = await h.say("hi")
        await h.until("agent_message_delta")
        await h.submit(Interrupt())
        assert h.tags(sub_id)[-2:] == ["error", "turn_aborted"]
        assert conversation(h.session.history) == [user_item("hi")]

    run(main)


def test_input_while_running_joins_the_next_request(server, tmp_path) -> None:
    gate = threading.Event()
    server.script(gated(response(call("shell", {"command": ["ls"]}, "c1")), gate), response(assistant("both done")))

    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        await h.configure()
        first = await h.say("list the files")
        await h.until("task_started")
        while not server.requests:
            await asyncio.sleep(0.002)
        second = await h.say("and count them")
        gate.set()
        assert (await h.done(first)).msg.last_agent_message == "both done"
        await h.settled()  # the first task's end, where a second would have started
        assert h.tags(second) == [] and h.tags().count("task_started") == 1

    run(main)
    assert len(server.requests) == 2
    body = server.requests[1]["json"]
    assert body["input"][1] == user_item("list the files")
    assert body["input"][-1] == user_item("and count them")


def test_input_during_the_last_turn_keeps_the_task_going(server, tmp_path) -> None:
    gate = threading.Event()
    server.script(gated(response(assistant("first answer")), gate), response(assistant("second answer")))

    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        await h.configure()
        first = await h.say("one")
        while not server.requests:
            await asyncio.sleep(0.002)
        await h.say("two")
        gate.set()
        assert (await h.done(first)).msg.last_agent_message == "second answer"

    run(main)
    assert server.requests[1]["json"]["input"][-1] == user_item("two")


# -- the model's errors -----------------------------------------------------------------


def test_model_retries_are_announced_and_failures_end_the_task(server, tmp_path) -> None:
    server.script(status(500, {"error": {"message": "overloaded"}}), response(assistant("recovered")),
                  status(401, {"error": {"message": "bad key"}}))

    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        await h.configure()
        sub_id = await h.say("hi")
        assert (await h.done(sub_id)).msg.last_agent_message == "recovered"
        (note,) = h.of("background_event", sub_id)
        assert note.message.startswith("stream error: unexpected status 500 Internal Server Error: overloaded; "
                                       "retrying 1/4 in ")
        sub_id = await h.say("again")
        failed = await h.done(sub_id)
        assert tag(failed) == "error" and failed.msg.message == "unexpected status 401 Unauthorized: bad key"
        assert h.tags(sub_id) == ["task_started", "user_message", "error"] and not h.session.running

    run(main)


def test_missing_api_key_names_the_variable(server, tmp_path) -> None:
    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        await h.configure(api_key=msgspec.UNSET)
        sub_id = await h.say("hi")
        failed = await h.done(sub_id)
        assert failed.msg.message == "missing API key: set FAKE_KEY"
        # The agent's own environment is the fallback.
        h.session.env["FAKE_KEY"] = "sk-from-env"
        await h.configure(api_key=msgspec.UNSET)
        await h.done(await h.say("hi"))

    server.script(response(assistant("ok")))
    run(main)
    assert server.requests[0]["headers"]["authorization"] == "Bearer sk-from-env"


# -- notify, rollout, history, compact, reconfigure, shutdown ---------------------------


def test_notify_after_each_turn(server, tmp_path) -> None:
    import sys

    out = tmp_path / "notified"
    out.mkdir()
    script = ("import sys, pathlib, json; p = json.loads(sys.argv[2]); "
              "pathlib.Path(sys.argv[1], p['turn-id']).write_text(sys.argv[2])")
    server.script(response(call("shell", {"command": ["ls"]}, "c1")), response(assistant("Listed.")))

    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        await h.configure(notify=[sys.executable, "-c", script, str(out)])
        sub_id = await h.say("list")
        await h.done(sub_id)
        for _ in range(1000):
            # Not just there: written (the notifier creates the file, then writes it).
            if (out / sub_id).exists() and (out / sub_id).read_text().endswith("}"):
                break
            await asyncio.sleep(0.01)
        return sub_id

    sub_id = run(main)
    assert json.loads((out / sub_id).read_text()) == {
        "type": "agent-turn-complete", "turn-id": sub_id, "input-messages": ["list"],
        "last-assistant-message": "Listed.",
    }


def test_rollout_written_redacted_and_resumed(server, tmp_path) -> None:
    server.script(
        response(call("shell", {"command": ["env"]}, "c1")),
        response(assistant("The key is set.")),
        response(assistant("Still here.")),
    )

    async def first():
        runner = FakeRunner(lambda argv, sandboxed: FakeExec(stdout=f"OPENAI_API_KEY={API_KEY}\n"))
        h = Harness(server, runner, tmp_path)
        await h.configure()
        await h.done(await h.say("show env"))
        sub_id = await h.submit(Shutdown())
        assert tag(h.last(sub_id)) == "shutdown_complete"
        # After shutdown the session takes nothing more.
        later = await h.say("hello?")
        assert h.last(later).msg.message == "the session is shut down"
        return h.session.session_id, list(h.session.history)

    session_id, history = run(first)
    (path,) = (tmp_path / "home" / "sessions").rglob("rollout-*.jsonl")
    assert path.name.endswith(f"-{session_id}.jsonl")
    text = path.read_text()
    assert API_KEY not in text and "[redacted]" in text
    saved = read_rollout(path)
    assert saved.session_id == session_id
    assert [i["type"] for i in saved.items] == ["message", "message", "function_call", "function_call_output",
                                                "message"]

    async def resumed():
        h = Harness(server, FakeRunner(), tmp_path)
        event = await h.configure(resume_path=str(path))
        assert event.msg.session_id == session_id and h.session.session_id == session_id
        await h.done(await h.say("still there?"))
        await h.submit(Shutdown())

    run(resumed)
    body = server.requests[2]["json"]
    # The environment is the same as the rollout's last: it is not told again.
    assert [i["type"] for i in body["input"]] == ["message", "message", "function_call", "function_call_output",
                                                  "message", "message"]
    assert body["input"][-1] == user_item("still there?") and len(conversation(body["input"])) == 5
    # The resumed session kept writing to the same file.
    assert read_rollout(path).items[-1]["content"][0]["text"] == "Still here."
    assert len(list((tmp_path / "home" / "sessions").rglob("rollout-*.jsonl"))) == 1


def test_a_named_session_resuming_takes_the_rollouts_id_and_a_held_rollout_is_refused(server, tmp_path) -> None:
    server.script(response(assistant("One.")), response(assistant("Two.")))
    named = uuid.uuid4()

    async def main():
        first = Harness(server, FakeRunner(), tmp_path)
        await first.configure()
        await first.done(await first.say("hi"))
        path = first.session.rollout.path
        # While the first session holds its rollout, nobody else resumes it (two writers,
        # one id): an error, and no session (never a fresh one in its place).
        other = Harness(server, FakeRunner(), tmp_path, session_id=named)
        sub_id = await other.submit(other.configure_op(resume_path=str(path)))
        assert other.tags(sub_id) == ["error"]
        assert "is in use by another session" in other.last(sub_id).msg.message
        assert other.session.session_id == named and other.session.config is None
        await first.submit(Shutdown())
        # Let go of, it is resumed, and the session is the rollout's, as in Codex, even
        # when the daemon named it (the daemon learns the id from session_configured).
        resumed = Harness(server, FakeRunner(), tmp_path, session_id=named)
        event = await resumed.configure(resume_path=str(path))
        assert event.msg.session_id == first.session.session_id == resumed.session.session_id != named
        await resumed.done(await resumed.say("again"))
        # Configured again with its own rollout: it lets go of it and takes it back.
        event = await resumed.configure(resume_path=str(path))
        assert tag(event) == "session_configured" and tag(resumed.events[-1]) == "session_configured"
        await resumed.submit(Shutdown())

    run(main)


def test_user_instructions_and_base_instructions_of_later_codex(server, tmp_path) -> None:
    server.script(response(assistant("a")), response(assistant("b")))

    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        (h.cwd / "AGENTS.md").write_text("Project doc: use tabs.\n")
        # user_instructions come as the frontend put them together: taken as they are,
        # AGENTS.md not read again; base_instructions replace the built-in ones.
        await h.configure(user_instructions="Be terse.", base_instructions="You are TestBot.", instructions="old")
        await h.done(await h.say("hi"))
        await h.configure()  # neither: the built-in instructions, the old field and AGENTS.md
        await h.done(await h.say("again"))

    run(main)
    first, second = (r["json"]["instructions"] for r in server.requests)
    assert first == "You are TestBot.\n\nBe terse."
    assert "use tabs" not in first and "old" not in first
    assert not second.startswith("You are TestBot.") and "use tabs" in second


def test_the_environment_is_told_once_and_again_only_where_it_changed(server, tmp_path) -> None:
    server.script(response(assistant("a")), response(assistant("b")), response(assistant("c")))

    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        await h.configure()
        await h.done(await h.say("one"))
        await h.configure(model="other-model")  # the environment is the same: nothing to tell
        await h.done(await h.say("two"))
        await h.configure(approval_policy=AskForApproval.NEVER)
        await h.done(await h.say("three"))

    run(main)
    texts = [i["content"][0]["text"] for i in server.requests[2]["json"]["input"] if i.get("role") == "user"]
    assert texts[0].startswith(f"<environment_context>\n  <cwd>{tmp_path / 'work'}</cwd>\n")
    assert texts[1:] == ["one", "two", "<environment_context>\n  <approval_policy>never</approval_policy>\n"
                         f"  <shell>{user_shell()}</shell>\n</environment_context>", "three"]


@pytest.mark.parametrize("mode", ["off", "seed", "codex"])
def test_each_tool_mode_gets_instructions_for_its_tools(server, tmp_path, mode) -> None:
    server.script(response(assistant("a")))

    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        await h.configure(unified_exec=UnifiedExecSettings(tools=mode))
        await h.done(await h.say("hi"))

    run(main)
    body = server.requests[0]["json"]
    assert body["instructions"] == base_instructions(mode)
    names = [t["name"] for t in body["tools"]]
    assert names == {"off": ["shell", "apply_patch", "update_plan"],
                     "seed": ["shell", "unified_exec", "apply_patch", "update_plan"],
                     "codex": ["exec_command", "write_stdin", "apply_patch", "update_plan"]}[mode]
    assert all(f"- `{name}` " in body["instructions"] for name in names)


def test_every_user_input_is_a_user_message_event(server, tmp_path) -> None:
    release = threading.Event()
    server.script(gated(response(call("shell", {"command": ["true"]}, "c1")), release),
                  response(assistant("done")))

    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        await h.configure()
        first = await h.submit(UserInput([TextInput("line one\nline two"), TextInput("more"),
                                          ImageInput("data:image/png;base64,AAAA")]))
        await h.until("task_started")
        second = await h.say("and also this")  # joins the running task
        release.set()
        await h.done(first)
        messages = [(e.id, e.msg) for e in h.events if tag(e) == "user_message"]
        assert messages == [(first, UserMessageEvent("line one\nline two\nmore", ["data:image/png;base64,AAAA"])),
                            (first, UserMessageEvent("and also this"))]
        assert second != first
        assert encode_json(h.events[[tag(e) for e in h.events].index("user_message")]).decode() == (
            f'{{"id":"{first}","msg":{{"type":"user_message","message":"line one\\nline two\\nmore",'
            '"images":["data:image/png;base64,AAAA"]}}')

    run(main)


def test_resume_from_a_bad_file_is_an_error_and_no_session(server, tmp_path) -> None:
    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        sub_id = await h.submit(h.configure_op(resume_path=str(tmp_path / "nope.jsonl")))
        assert h.tags(sub_id) == ["error"]
        assert h.last(sub_id).msg.message.startswith("could not resume the session: cannot read rollout")
        assert h.session.config is None and not list((tmp_path / "home").rglob("rollout-*"))

    run(main)


def test_resume_again_from_a_bad_file_changes_nothing(server, tmp_path) -> None:
    server.script(response(assistant("one")), response(assistant("two")))

    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        await h.configure()
        await h.done(await h.say("first"))
        before = (h.session.session_id, h.session.rollout.path, list(h.session.history))
        sub_id = await h.submit(h.configure_op(resume_path=str(tmp_path / "nope.jsonl")))
        assert h.tags(sub_id) == ["error"]
        assert (h.session.session_id, h.session.rollout.path, h.session.history) == before
        await h.done(await h.say("second"))

    run(main)
    assert [m["content"][0]["text"] for m in conversation(server.requests[1]["json"]["input"])
            if m["type"] == "message"] == ["first", "one", "second"]


def test_resume_with_a_corrupt_line_says_so_once_and_goes_on_without_it(server, tmp_path) -> None:
    sid = "67e55044-10b1-426f-9247-bb680e5fe0c8"
    path = tmp_path / "r.jsonl"
    lines = [json.dumps({"id": sid}).encode(), json.dumps(user_item("kept")).encode(),
             b'{"type":"message","role":"user","content":[{"type":"input_text","text":"lo\xffst"}]}',
             json.dumps(user_item("also kept")).encode()]
    path.write_bytes(b"\n".join(lines) + b"\n")
    server.script(response(assistant("Back.")))

    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        sub_id = await h.submit(h.configure_op(resume_path=str(path)))
        assert h.tags(sub_id) == ["session_configured", "background_event"]
        assert h.last(sub_id).msg.message == (
            f"rollout {path}: line 3 not readable (corrupt), skipped; the conversation goes on without them")
        await h.done(await h.say("next"))

    run(main)
    # The rollout told the model no environment: it is told now, after what was restored.
    sent = server.requests[0]["json"]["input"]
    assert sent[:2] == [user_item("kept"), user_item("also kept")] and sent[3] == user_item("next")
    assert sent[2]["content"][0]["text"].startswith("<environment_context>\n  <cwd>")


def test_history_add_and_get(server, tmp_path) -> None:
    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        await h.submit(AddToHistory("before configure works too"))
        await h.configure()
        await h.submit(AddToHistory("second"))
        path = tmp_path / "home" / "history.jsonl"
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        log_id = path.stat().st_ino
        sub_id = await h.submit(GetHistoryEntryRequest(offset=1, log_id=log_id))
        got = h.last(sub_id).msg
        assert tag(h.last(sub_id)) == "get_history_entry_response"
        assert (got.offset, got.log_id, got.entry.text, got.entry.session_id) == (
            1, log_id, "second", str(h.session.session_id))
        sub_id = await h.submit(GetHistoryEntryRequest(offset=5, log_id=log_id))
        assert encode_json(h.last(sub_id)).decode() == (
            f'{{"id":"{sub_id}","msg":{{"type":"get_history_entry_response","offset":5,"log_id":{log_id}}}}}')
        # A new session sees the entries in its session_configured.
        other = Harness(server, FakeRunner(), tmp_path)
        event = await other.configure()
        assert (event.msg.history_log_id, event.msg.history_entry_count) == (log_id, 2)

    run(main)


def test_compact_replaces_history_with_the_summary(server, tmp_path) -> None:
    server.script(
        response(assistant("First answer.")),
        response(assistant("SUMMARY: the user said hi."), token_usage=usage(50)),
        response(assistant("Continuing.")),
    )

    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        await h.configure()
        await h.done(await h.say("hi"))
        sub_id = await h.submit(Compact())
        done = await h.done(sub_id)
        assert tag(done) == "task_complete" and done.msg.last_agent_message is None
        assert h.tags(sub_id) == ["task_started", "token_count", "agent_message", "task_complete"]
        assert h.of("agent_message", sub_id)[0].message == COMPACT_DONE
        assert h.of("token_count", sub_id)[0].total_tokens == 50
        # The conversation starts over: the environment, then the summary.
        environment = h.session.history[0]
        assert environment["content"][0]["text"].startswith("<environment_context>\n  <cwd>")
        assert h.session.history == [environment, {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "SUMMARY: the user said hi."}]}]
        await h.done(await h.say("go on"))
        await h.submit(Shutdown())

    run(main)
    compact = server.requests[1]["json"]
    assert compact["instructions"] == SUMMARIZATION_PROMPT and compact["tools"] == []
    assert compact["input"][-1] == user_item(START_SUMMARIZATION)
    assert conversation(compact["input"])[:2] == [user_item("hi"), {"type": "message", "role": "assistant",
                                                      "content": [{"type": "output_text", "text": "First answer."}]}]
    after = server.requests[2]["json"]["input"]
    assert [i["role"] for i in after] == ["user", "assistant", "user"]
    (path,) = (tmp_path / "home" / "sessions").rglob("rollout-*.jsonl")
    assert [i["content"][0]["text"] for i in conversation(read_rollout(path).items)] == [
        "SUMMARY: the user said hi.", "go on", "Continuing."]


def test_compact_while_running_waits_for_the_task(server, tmp_path) -> None:
    gate = threading.Event()
    server.script(gated(response(assistant("answer")), gate), response(assistant("summary")))

    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        await h.configure()
        first = await h.say("hi")
        compact = await h.submit(Compact())
        gate.set()
        await h.session.wait_idle()  # both tasks, the queued one included
        assert tag(h.last(compact)) == "task_complete"
        order = [(e.id, tag(e)) for e in h.events if tag(e) in ("task_started", "task_complete")]
        assert order == [(first, "task_started"), (first, "task_complete"),
                         (compact, "task_started"), (compact, "task_complete")]

    run(main)


def test_reconfigure_aborts_and_keeps_history_and_approvals(server, tmp_path) -> None:
    server.script(
        response(call("shell", {"command": ["make"]}, "c1")),
        response(call("shell", {"command": ["sleep", "100"]}, "c2")),
        response(assistant("ok")),
    )

    async def main():
        runner = FakeRunner(lambda argv, sandboxed: FakeExec(hang=argv[0] == "sleep"))
        h = Harness(server, runner, tmp_path)
        await h.configure(approval_policy=AskForApproval.UNTRUSTED)
        session_id = h.session.session_id
        sub_id = await h.say("build")
        await h.until("exec_approval_request")
        await h.submit(ExecApproval(sub_id, ReviewDecision.APPROVED_FOR_SESSION))
        await h.until(lambda e: tag(e) == "exec_approval_request" and e.msg.call_id == "c2")
        await h.submit(ExecApproval(sub_id, ReviewDecision.APPROVED))
        await h.until(lambda e: tag(e) == "exec_command_begin" and e.msg.call_id == "c2")
        event = await h.configure(approval_policy=AskForApproval.UNTRUSTED, model="other-model")
        assert tag(event) == "session_configured" and event.msg.model == "other-model"
        assert event.msg.session_id == session_id
        assert h.tags(sub_id)[-2:] == ["error", "turn_aborted"] and runner.cancelled
        assert ("make",) in h.session.approved_commands
        assert len(conversation(h.session.history)) == 4  # user, c1 call and output, c2 call
        await h.done(await h.say("continue"))

    run(main)
    body = server.requests[2]["json"]
    assert body["model"] == "other-model"
    assert outputs_of(body)["c2"] == "aborted" and body["input"][-1] == user_item("continue")


def test_chat_completions_provider_drives_tool_calls(server, tmp_path) -> None:
    from tests.support.fake_model import chat_chunk, sse, sse_frame

    server.script(
        sse([chat_chunk({"role": "assistant", "content": ""}),
             chat_chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                         "function": {"name": "shell", "arguments": '{"command":'}}]}),
             chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '["ls"]}'}}]}),
             chat_chunk({}, "tool_calls"), b"data: [DONE]\n\n"]),
        sse([chat_chunk({"role": "assistant", "content": "Two "}), chat_chunk({"content": "files."}),
             chat_chunk({}, "stop"),
             sse_frame({"id": "x", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}),
             b"data: [DONE]\n\n"]),
    )

    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        provider = ModelProviderInfo(name="local", base_url=server.base_url, wire_api=WireApi.CHAT)
        await h.configure(provider=provider, api_key=msgspec.UNSET)
        sub_id = await h.say("list")
        assert (await h.done(sub_id)).msg.last_agent_message == "Two files."
        assert h.of("token_count", sub_id)[-1].total_tokens == 7

    run(main)
    messages = server.requests[1]["json"]["messages"]
    assert messages[-1]["role"] == "tool" and messages[-1]["tool_call_id"] == "call_a"
    assert "authorization" not in server.requests[0]["headers"]


def test_input_as_the_task_ends_starts_the_next_task(server, tmp_path, monkeypatch) -> None:
    server.script(response(assistant("first")), response(assistant("second")))
    hold: dict[str, asyncio.Event] = {}

    async def slow_notifier(argv, payload):
        hold["entered"].set()
        await hold["release"].wait()

    monkeypatch.setattr("agent.turn.spawn_notifier", slow_notifier)

    async def main():
        hold["entered"], hold["release"] = asyncio.Event(), asyncio.Event()
        h = Harness(server, FakeRunner(), tmp_path)
        await h.configure(notify=["true"])
        first = await h.say("one")
        await hold["entered"].wait()  # past its last model request, not yet complete
        second = await h.say("two")
        hold["release"].set()
        assert (await h.done(first)).msg.last_agent_message == "first"
        assert (await h.done(second)).msg.last_agent_message == "second"
        assert [tag(e) for e in h.events if e.id == second] == ["task_started", "user_message", "agent_message_delta",
                                                                "agent_message", "token_count", "task_complete"]

    run(main)
    assert server.requests[1]["json"]["input"][-1] == user_item("two")


def test_interrupt_drops_a_pending_approval(server, tmp_path) -> None:
    server.script(response(call("shell", {"command": ["make"]}, "c1")))

    async def main():
        runner = FakeRunner()
        h = Harness(server, runner, tmp_path)
        await h.configure(approval_policy=AskForApproval.UNTRUSTED)
        sub_id = await h.say("build")
        await h.until("exec_approval_request")
        await h.submit(Interrupt())
        assert h.tags(sub_id)[-2:] == ["error", "turn_aborted"]
        count = len(h.events)
        await h.submit(ExecApproval(sub_id, ReviewDecision.APPROVED))  # too late: nothing waits for it
        await h.settled()  # the interrupted task is gone: nothing is left to take the approval
        assert len(h.events) == count and not runner.runs
        await h.session.aclose()  # closing quietly: no events, nothing taken after
        await h.say("hello?")
        assert len(h.events) == count + 1 and h.events[-1].msg.message == "the session is shut down"

    run(main)
