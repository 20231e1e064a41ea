"""agent.tools and agent.items: tool declarations, arguments, output for the model, items."""

from __future__ import annotations

import json

import pytest

from agent.items import last_assistant_message, normalize, user_message, with_aborted_outputs
from agent.tools import (
    MODEL_FORMAT_MAX_BYTES,
    ArgumentError,
    escalation_requested,
    format_exec_output,
    format_sandbox_denial,
    model_output_text,
    parse_exec_command_arguments,
    parse_plan_arguments,
    parse_shell_arguments,
    parse_unified_exec_arguments,
    shell_params_from_local_call,
    tools_for,
    truncate_for_model,
)
from broker.wire.protocol import AskForApproval, ImageInput, LocalImageInput, TextInput
from landlock_helper.policy import SandboxPolicy

pytestmark = pytest.mark.timeout(10)


def test_escalation_is_offered_only_under_on_request_with_a_sandbox() -> None:
    sandboxed = SandboxPolicy.from_mode("workspace-write")

    def props(policy, sandbox):
        return set(tools_for(policy, sandbox)[0]["parameters"]["properties"])

    base = {"command", "workdir", "timeout_ms"}
    assert props(AskForApproval.ON_REQUEST, sandboxed) == base | {"with_escalated_permissions", "justification"}
    for policy in (AskForApproval.UNTRUSTED, AskForApproval.ON_FAILURE, AskForApproval.NEVER):
        assert props(policy, sandboxed) == base
    assert props(AskForApproval.ON_REQUEST, SandboxPolicy.from_mode("danger-full-access")) == base
    tool = tools_for(AskForApproval.NEVER, sandboxed)[0]
    assert tool["type"] == "function" and tool["name"] == "shell" and tool["parameters"]["required"] == ["command"]


def test_argument_errors_are_worded_for_the_model() -> None:
    assert parse_shell_arguments('{"command":["ls"],"timeout_ms":50}').timeout_ms == 50
    for bad in ("{", '{"command": "ls"}', '{"command": []}', '{"command": ["ls"], "timeout_ms": -1}', "[]"):
        with pytest.raises(ArgumentError, match="^failed to parse function arguments: "):
            parse_shell_arguments(bad)
    with pytest.raises(ArgumentError):
        parse_plan_arguments('{"plan": [{"step": "a"}]}')
    assert parse_plan_arguments('{"plan": []}').plan == []
    params = shell_params_from_local_call({"type": "exec", "command": ["ls"], "working_directory": "d", "timeout_ms": 9})
    assert (params.command, params.workdir, params.timeout_ms) == (["ls"], "d", 9)


@pytest.mark.parametrize("parse, base", [
    (parse_shell_arguments, {"command": ["ls"]}),
    (lambda text: parse_unified_exec_arguments(text)[0], {"input": ["ls"]}),
    (parse_exec_command_arguments, {"cmd": "ls"}),
], ids=["shell", "unified_exec", "exec_command"])
def test_escalation_in_either_spelling(parse, base) -> None:
    def escalated(**args) -> bool:
        return escalation_requested(parse(json.dumps({**base, **args})))

    assert escalated(with_escalated_permissions=True) and escalated(sandbox_permissions="require_escalated")
    assert not escalated() and not escalated(with_escalated_permissions=False)
    assert not escalated(sandbox_permissions="use_default")
    # Either asking is a request (the user is asked, or the policy refuses it).
    assert escalated(with_escalated_permissions=True, sandbox_permissions="use_default")
    assert parse(json.dumps({**base, "justification": "Fetch it?"})).justification == "Fetch it?"
    # Codex's per-command grants are not sluice's: the model is told, nothing is guessed.
    for value, shown in (("with_additional_permissions", "'with_additional_permissions'"), ("yes", "'yes'")):
        with pytest.raises(ArgumentError) as err:
            parse(json.dumps({**base, "sandbox_permissions": value}))
        assert str(err.value) == (f"failed to parse function arguments: `sandbox_permissions` {shown} is not "
                                  "supported: use 'use_default' or 'require_escalated'")


def test_the_sandbox_denial_is_the_seeds_text() -> None:
    assert format_sandbox_denial(1, "", "touch: cannot touch '/etc/x': Permission denied\n") == (
        "failed in sandbox LinuxSeccomp with execution error: sandbox denied exec error, exit code: 1, "
        "stdout: , stderr: touch: cannot touch '/etc/x': Permission denied\n")
    # Each stream is cut as any output for the model is.
    long = "".join(f"line {i}\n" for i in range(2000))
    text = format_sandbox_denial(159, long, long)
    stdout, stderr = text.split(", stdout: ", 1)[1].split(", stderr: ")
    assert stdout == stderr == truncate_for_model(long) != long
    assert text.startswith("failed in sandbox LinuxSeccomp with execution error: sandbox denied exec error, "
                           "exit code: 159, stdout: line 0\n")


def test_format_exec_output_rounds_like_codex() -> None:
    assert format_exec_output("hi\n", 0, 0.25) == '{"output":"hi\\n","metadata":{"exit_code":0,"duration_seconds":0.3}}'
    assert json.loads(format_exec_output("é", 1, 1.04))["metadata"] == {"exit_code": 1, "duration_seconds": 1.0}
    assert format_exec_output("é", 1, 0).startswith('{"output":"é"')  # UTF-8, not \\u escapes


def test_truncate_for_model() -> None:
    short = "a\nb\n"
    assert truncate_for_model(short) is short
    many = "".join(f"{i}\n" for i in range(300))
    cut = truncate_for_model(many)
    assert cut.startswith("0\n1\n") and cut.endswith("\n299")
    assert "127\n[... omitted 44 of 300 lines ...]\n\n172\n" in cut
    wide = "".join(f"{i:04d}" + "x" * 200 + "\n" for i in range(100))  # few lines, too many bytes
    cut = truncate_for_model(wide)
    assert len(cut.encode()) <= MODEL_FORMAT_MAX_BYTES and cut.startswith("0000x")
    assert "\n[... omitted 51 of 100 lines ...]\n\n0075x" in cut and cut.endswith("0099" + "x" * 200)
    one_line = "é" * 20_000 + "END"  # no whole line fits: cut by bytes, UTF-8 kept whole
    cut = truncate_for_model(one_line)
    assert len(cut.encode()) <= MODEL_FORMAT_MAX_BYTES and cut.startswith("éé") and cut.endswith("éEND")
    assert "\n[... omitted 29828 of 40003 bytes ...]\n\n" in cut
    assert model_output_text("x\n", timed_out=True, timeout_ms=5) == "command timed out after 5 milliseconds\nx\n"


def test_user_message_and_local_images(tmp_path) -> None:
    png = tmp_path / "shot.png"
    png.write_bytes(b"\x89PNG")
    message = user_message([TextInput("look"), ImageInput("data:image/png;base64,AA=="), LocalImageInput(str(png)),
                            LocalImageInput(str(tmp_path / "missing.png"))])
    assert message == {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "look"},
        {"type": "input_image", "image_url": "data:image/png;base64,AA=="},
        {"type": "input_image", "image_url": "data:image/png;base64,iVBORw=="},
    ]}
    assert user_message([LocalImageInput(str(tmp_path / "missing.png"))]) is None


def test_normalize_and_aborted_outputs() -> None:
    item = {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": "hi", "annotations": []}]}
    assert normalize(item) == {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]}
    assert normalize({"type": "function_call", "id": "fc_1", "name": "shell", "arguments": "{}", "call_id": "c"}) == {
        "type": "function_call", "name": "shell", "arguments": "{}", "call_id": "c"}
    assert normalize({"type": "local_shell_call", "id": "ls_1", "status": "completed", "action": {}})["call_id"] == "ls_1"
    assert last_assistant_message([item, {"type": "message", "role": "user", "content": []}]) == "hi"
    history = [
        {"type": "function_call", "name": "shell", "arguments": "{}", "call_id": "a"},
        {"type": "function_call", "name": "shell", "arguments": "{}", "call_id": "b"},
        {"type": "function_call_output", "call_id": "b", "output": "ok"},
        {"type": "local_shell_call", "call_id": "c", "status": "completed", "action": {}},
    ]
    fixed = with_aborted_outputs(history)
    assert [(i["type"], i["call_id"]) for i in fixed] == [
        ("function_call", "a"), ("function_call_output", "a"), ("function_call", "b"),
        ("function_call_output", "b"), ("local_shell_call", "c"), ("function_call_output", "c")]
    assert fixed[1]["output"] == "aborted" and with_aborted_outputs(fixed) == fixed
    # A freeform call (custom_tool_call) left dangling is answered in its own kind.
    custom = [{"type": "custom_tool_call", "call_id": "d", "name": "apply_patch", "input": "x"},
              {"type": "custom_tool_call", "call_id": "e", "name": "apply_patch", "input": "y"},
              {"type": "custom_tool_call_output", "call_id": "e", "output": "ok"}]
    assert [(i["type"], i["call_id"]) for i in with_aborted_outputs(custom)] == [
        ("custom_tool_call", "d"), ("custom_tool_call_output", "d"), ("custom_tool_call", "e"),
        ("custom_tool_call_output", "e")]
    assert normalize({"type": "custom_tool_call", "id": "ctc_1", "status": "completed", "call_id": "d",
                      "name": "apply_patch", "input": "x"}) == custom[0]
