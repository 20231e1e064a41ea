"""The protocol's JSON is Codex's, byte for byte; msgpack carries the same messages."""

from __future__ import annotations

import base64
import json
import typing
import uuid

import msgspec
import pytest

from broker.wire.protocol import (
    AddFileChange,
    AddToHistory,
    AgentMessageDeltaEvent,
    AgentMessageEvent,
    AgentReasoningDeltaEvent,
    AgentReasoningEvent,
    AgentReasoningRawContentDeltaEvent,
    AgentReasoningRawContentEvent,
    ApplyPatchApprovalRequestEvent,
    ApprovalResolvedEvent,
    AskForApproval,
    BackgroundEventEvent,
    CallToolResult,
    Compact,
    ConfigureSession,
    DeleteFileChange,
    Duration,
    ErrorEvent,
    Event,
    EventMsg,
    ExecApproval,
    ExecApprovalRequestEvent,
    ExecCommandBeginEvent,
    ExecCommandEndEvent,
    ExecCommandOutputDeltaEvent,
    ExecCommandStdin,
    ExecCommandStdinTypedEvent,
    ExecOutputStream,
    GetHistoryEntryRequest,
    GetHistoryEntryResponseEvent,
    HistoryEntry,
    ImageInput,
    Interrupt,
    LocalImageInput,
    McpToolCallBeginEvent,
    McpToolCallEndEvent,
    ModelProviderInfo,
    Op,
    PatchApplyBeginEvent,
    PatchApplyEndEvent,
    PatchApproval,
    PlanItem,
    PlanUpdateEvent,
    STDIN_TYPED_MAX,
    STDIN_TYPED_SHOWN,
    ProtocolError,
    ReviewDecision,
    SessionConfiguredEvent,
    Shutdown,
    ShutdownCompleteEvent,
    StepStatus,
    Submission,
    TaskCompleteEvent,
    TaskStartedEvent,
    TextInput,
    TokenCountEvent,
    TurnAbortedEvent,
    TurnAbortReason,
    TurnDiffEvent,
    UpdateFileChange,
    UserInput,
    UserMessageEvent,
    WireApi,
    decode_event_json,
    decode_event_msgpack,
    decode_submission_json,
    decode_submission_msgpack,
    encode_json,
    encode_msgpack,
    parse_approval_policy,
)
from landlock_helper import policy as landlock_policy
from landlock_helper.policy import DiskWriteFolder, SandboxPermission, SandboxPolicy

pytestmark = pytest.mark.timeout(30)

SESSION_ID = uuid.UUID("67e55044-10b1-426f-9247-bb680e5fe0c8")

PROVIDER = ModelProviderInfo(
    name="OpenAI",
    base_url="https://api.openai.com/v1",
    env_key="OPENAI_API_KEY",
    wire_api=WireApi.RESPONSES,
)
PROVIDER_JSON = (
    '{"name":"OpenAI","base_url":"https://api.openai.com/v1","env_key":"OPENAI_API_KEY",'
    '"env_key_instructions":null,"wire_api":"responses","query_params":null,'
    '"http_headers":null,"env_http_headers":null,"request_max_retries":null,'
    '"stream_max_retries":null,"stream_idle_timeout_ms":null,"requires_openai_auth":false}'
)

# (submission, its JSON exactly as Codex writes it)
SUBMISSIONS = {
    "configure_session": (
        Submission(
            "0",
            ConfigureSession(
                provider=PROVIDER,
                model="o4-mini",
                approval_policy=AskForApproval.ON_REQUEST,
                sandbox_policy=SandboxPolicy([SandboxPermission.DISK_FULL_READ_ACCESS]),
                cwd="/work",
            ),
        ),
        '{"id":"0","op":{"type":"configure_session","provider":' + PROVIDER_JSON + ","
        '"model":"o4-mini","instructions":null,"approval_policy":"on-request",'
        '"sandbox_policy":{"permissions":["disk-full-read-access"]},'
        '"disable_response_storage":false,"cwd":"/work"}}',
    ),
    "configure_session_full": (
        Submission(
            "0",
            ConfigureSession(
                provider=ModelProviderInfo(name="local", base_url="http://localhost:11434/v1"),
                model="o3",
                instructions="be brief",
                approval_policy=AskForApproval.UNTRUSTED,
                sandbox_policy=SandboxPolicy(
                    [
                        SandboxPermission.DISK_FULL_READ_ACCESS,
                        SandboxPermission.DISK_WRITE_CWD,
                        {"disk-write-folder": DiskWriteFolder("/srv/out")},
                    ]
                ),
                disable_response_storage=True,
                notify=["notify-send", "done"],
                cwd="/work",
                resume_path="/home/me/.sluice/rollout.jsonl",
            ),
        ),
        '{"id":"0","op":{"type":"configure_session","provider":{"name":"local",'
        '"base_url":"http://localhost:11434/v1","env_key":null,"env_key_instructions":null,'
        '"wire_api":"chat","query_params":null,"http_headers":null,"env_http_headers":null,'
        '"request_max_retries":null,"stream_max_retries":null,"stream_idle_timeout_ms":null,'
        '"requires_openai_auth":false},"model":"o3","instructions":"be brief",'
        '"approval_policy":"untrusted","sandbox_policy":{"permissions":["disk-full-read-access",'
        '"disk-write-cwd",{"disk-write-folder":{"folder":"/srv/out"}}]},'
        '"disable_response_storage":true,"notify":["notify-send","done"],"cwd":"/work",'
        '"resume_path":"/home/me/.sluice/rollout.jsonl"}}',
    ),
    "user_input": (
        Submission(
            "1",
            UserInput(
                [
                    TextInput("fix the tests"),
                    ImageInput("data:image/png;base64,iVBORw0KGgo="),
                    LocalImageInput("/tmp/shot.png"),
                ]
            ),
        ),
        '{"id":"1","op":{"type":"user_input","items":[{"type":"text","text":"fix the tests"},'
        '{"type":"image","image_url":"data:image/png;base64,iVBORw0KGgo="},'
        '{"type":"local_image","path":"/tmp/shot.png"}]}}',
    ),
    "interrupt": (Submission("2", Interrupt()), '{"id":"2","op":{"type":"interrupt"}}'),
    "exec_approval": (
        Submission("3", ExecApproval("1", ReviewDecision.APPROVED_FOR_SESSION)),
        '{"id":"3","op":{"type":"exec_approval","id":"1","decision":"approved_for_session"}}',
    ),
    "patch_approval": (
        Submission("4", PatchApproval("1", ReviewDecision.ABORT)),
        '{"id":"4","op":{"type":"patch_approval","id":"1","decision":"abort"}}',
    ),
    "add_to_history": (
        Submission("5", AddToHistory("ls -la")),
        '{"id":"5","op":{"type":"add_to_history","text":"ls -la"}}',
    ),
    "get_history_entry_request": (
        Submission("6", GetHistoryEntryRequest(offset=3, log_id=1234)),
        '{"id":"6","op":{"type":"get_history_entry_request","offset":3,"log_id":1234}}',
    ),
    "compact": (Submission("7", Compact()), '{"id":"7","op":{"type":"compact"}}'),
    "shutdown": (Submission("8", Shutdown()), '{"id":"8","op":{"type":"shutdown"}}'),
    # sluice's own: a person types into a running interactive command (``by`` is the daemon's to set).
    "exec_command_stdin": (
        Submission("9", ExecCommandStdin("call_3", "print(6*7)\n")),
        '{"id":"9","op":{"type":"exec_command_stdin","call_id":"call_3","stdin":"print(6*7)\\n"}}',
    ),
    "exec_command_stdin_by": (
        Submission("9", ExecCommandStdin("call_3", "\u0003", by="frontend-4 (sluice web)")),
        '{"id":"9","op":{"type":"exec_command_stdin","call_id":"call_3","stdin":"\\u0003",'
        '"by":"frontend-4 (sluice web)"}}',
    ),
}

# (event message, the JSON of Event("1", msg) exactly as Codex writes it)
EVENTS = {
    "error": (ErrorEvent("model unreachable"), '{"type":"error","message":"model unreachable"}'),
    "task_started": (TaskStartedEvent(), '{"type":"task_started"}'),
    "task_complete": (
        TaskCompleteEvent("done"),
        '{"type":"task_complete","last_agent_message":"done"}',
    ),
    "task_complete_without_message": (
        TaskCompleteEvent(),
        '{"type":"task_complete","last_agent_message":null}',
    ),
    "token_count": (
        TokenCountEvent(
            input_tokens=1200,
            cached_input_tokens=1000,
            output_tokens=80,
            reasoning_output_tokens=64,
            total_tokens=1280,
        ),
        '{"type":"token_count","input_tokens":1200,"cached_input_tokens":1000,'
        '"output_tokens":80,"reasoning_output_tokens":64,"total_tokens":1280}',
    ),
    "token_count_unknown_parts": (
        TokenCountEvent(input_tokens=10, output_tokens=2, total_tokens=12),
        '{"type":"token_count","input_tokens":10,"cached_input_tokens":null,'
        '"output_tokens":2,"reasoning_output_tokens":null,"total_tokens":12}',
    ),
    "agent_message": (
        AgentMessageEvent("All green.\n"),
        '{"type":"agent_message","message":"All green.\\n"}',
    ),
    # Later Codex's user_message: what was asked; images only when there are any.
    "user_message": (
        UserMessageEvent("list the files"),
        '{"type":"user_message","message":"list the files"}',
    ),
    "user_message_with_images": (
        UserMessageEvent("what is this?\nand this?", ["data:image/png;base64,AAAA", "/w/shot.png"]),
        '{"type":"user_message","message":"what is this?\\nand this?",'
        '"images":["data:image/png;base64,AAAA","/w/shot.png"]}',
    ),
    "agent_message_delta": (
        AgentMessageDeltaEvent("All "),
        '{"type":"agent_message_delta","delta":"All "}',
    ),
    "agent_reasoning": (
        AgentReasoningEvent("**Reading the tests**"),
        '{"type":"agent_reasoning","text":"**Reading the tests**"}',
    ),
    "agent_reasoning_delta": (
        AgentReasoningDeltaEvent("**Read"),
        '{"type":"agent_reasoning_delta","delta":"**Read"}',
    ),
    "agent_reasoning_raw_content": (
        AgentReasoningRawContentEvent("thinking"),
        '{"type":"agent_reasoning_raw_content","text":"thinking"}',
    ),
    "agent_reasoning_raw_content_delta": (
        AgentReasoningRawContentDeltaEvent("thin"),
        '{"type":"agent_reasoning_raw_content_delta","delta":"thin"}',
    ),
    "session_configured": (
        SessionConfiguredEvent(SESSION_ID, "o4-mini", 0, 0),
        '{"type":"session_configured","session_id":"67e55044-10b1-426f-9247-bb680e5fe0c8",'
        '"model":"o4-mini","history_log_id":0,"history_entry_count":0}',
    ),
    "mcp_tool_call_begin": (
        McpToolCallBeginEvent("call_1", "docs", "search", {"query": "landlock", "limit": 3}),
        '{"type":"mcp_tool_call_begin","call_id":"call_1","server":"docs","tool":"search",'
        '"arguments":{"query":"landlock","limit":3}}',
    ),
    "mcp_tool_call_begin_without_arguments": (
        McpToolCallBeginEvent("call_1", "docs", "list"),
        '{"type":"mcp_tool_call_begin","call_id":"call_1","server":"docs","tool":"list",'
        '"arguments":null}',
    ),
    "mcp_tool_call_end": (
        McpToolCallEndEvent(
            "call_1", True, CallToolResult([{"type": "text", "text": "3 hits"}], is_error=False)
        ),
        '{"type":"mcp_tool_call_end","call_id":"call_1","success":true,'
        '"result":{"content":[{"type":"text","text":"3 hits"}],"isError":false}}',
    ),
    "mcp_tool_call_end_without_result": (
        McpToolCallEndEvent("call_1", False),
        '{"type":"mcp_tool_call_end","call_id":"call_1","success":false,"result":null}',
    ),
    "mcp_tool_call_end_without_is_error": (
        McpToolCallEndEvent("call_1", True, CallToolResult([])),
        '{"type":"mcp_tool_call_end","call_id":"call_1","success":true,"result":{"content":[]}}',
    ),
    "exec_command_begin": (
        ExecCommandBeginEvent("call_2", ["bash", "-lc", "pytest -q"], "/work"),
        '{"type":"exec_command_begin","call_id":"call_2","command":["bash","-lc","pytest -q"],'
        '"cwd":"/work"}',
    ),
    "exec_command_output_delta": (
        ExecCommandOutputDeltaEvent("call_2", ExecOutputStream.STDERR, b"\x00\xffok\n"),
        '{"type":"exec_command_output_delta","call_id":"call_2","stream":"stderr",'
        '"chunk":"AP9vawo="}',
    ),
    "exec_command_end": (
        ExecCommandEndEvent(
            call_id="call_2",
            stdout="1 passed\n",
            stderr="",
            aggregated_output="1 passed\n",
            exit_code=0,
            duration=Duration(secs=1, nanos=250_000_000),
            formatted_output="Exit code: 0\nOutput:\n1 passed\n",
        ),
        '{"type":"exec_command_end","call_id":"call_2","stdout":"1 passed\\n","stderr":"",'
        '"aggregated_output":"1 passed\\n","exit_code":0,"duration":{"secs":1,"nanos":250000000},'
        '"formatted_output":"Exit code: 0\\nOutput:\\n1 passed\\n"}',
    ),
    "exec_approval_request": (
        ExecApprovalRequestEvent("call_3", ["rm", "-rf", "build"], "/work"),
        '{"type":"exec_approval_request","call_id":"call_3","command":["rm","-rf","build"],'
        '"cwd":"/work"}',
    ),
    "exec_approval_request_with_reason": (
        ExecApprovalRequestEvent("call_3", ["make"], "/work", reason="retry without sandbox?"),
        '{"type":"exec_approval_request","call_id":"call_3","command":["make"],"cwd":"/work",'
        '"reason":"retry without sandbox?"}',
    ),
    "apply_patch_approval_request": (
        ApplyPatchApprovalRequestEvent("call_4", {"/work/new.txt": AddFileChange("hello\n")}),
        '{"type":"apply_patch_approval_request","call_id":"call_4",'
        '"changes":{"/work/new.txt":{"add":{"content":"hello\\n"}}}}',
    ),
    "apply_patch_approval_request_with_grant_root": (
        ApplyPatchApprovalRequestEvent(
            "call_4",
            {"/srv/old.txt": DeleteFileChange()},
            reason="write outside the workspace",
            grant_root="/srv",
        ),
        '{"type":"apply_patch_approval_request","call_id":"call_4",'
        '"changes":{"/srv/old.txt":"delete"},"reason":"write outside the workspace",'
        '"grant_root":"/srv"}',
    ),
    "background_event": (
        BackgroundEventEvent("stream disconnected, retrying 1/5"),
        '{"type":"background_event","message":"stream disconnected, retrying 1/5"}',
    ),
    "patch_apply_begin": (
        PatchApplyBeginEvent(
            "call_5",
            True,
            {
                "/work/a.py": UpdateFileChange("@@ -1 +1 @@\n-a\n+b\n"),
                "/work/b.py": UpdateFileChange("", move_path="/work/c.py"),
            },
        ),
        '{"type":"patch_apply_begin","call_id":"call_5","auto_approved":true,"changes":{'
        '"/work/a.py":{"update":{"unified_diff":"@@ -1 +1 @@\\n-a\\n+b\\n","move_path":null}},'
        '"/work/b.py":{"update":{"unified_diff":"","move_path":"/work/c.py"}}}}',
    ),
    "patch_apply_end": (
        PatchApplyEndEvent("call_5", "Success. Updated the following files:\nM a.py\n", "", True),
        '{"type":"patch_apply_end","call_id":"call_5",'
        '"stdout":"Success. Updated the following files:\\nM a.py\\n","stderr":"","success":true}',
    ),
    "turn_diff": (
        TurnDiffEvent("diff --git a/a.py b/a.py\n"),
        '{"type":"turn_diff","unified_diff":"diff --git a/a.py b/a.py\\n"}',
    ),
    "get_history_entry_response": (
        GetHistoryEntryResponseEvent(3, 1234, HistoryEntry("s1", 1720000000, "ls -la")),
        '{"type":"get_history_entry_response","offset":3,"log_id":1234,'
        '"entry":{"session_id":"s1","ts":1720000000,"text":"ls -la"}}',
    ),
    "get_history_entry_response_without_entry": (
        GetHistoryEntryResponseEvent(99, 1234),
        '{"type":"get_history_entry_response","offset":99,"log_id":1234}',
    ),
    "plan_update": (
        PlanUpdateEvent(
            explanation="two steps",
            plan=[
                PlanItem("read the failing test", StepStatus.COMPLETED),
                PlanItem("fix the parser", StepStatus.IN_PROGRESS),
                PlanItem("run the suite", StepStatus.PENDING),
            ],
        ),
        '{"type":"plan_update","explanation":"two steps","plan":['
        '{"step":"read the failing test","status":"completed"},'
        '{"step":"fix the parser","status":"in_progress"},'
        '{"step":"run the suite","status":"pending"}]}',
    ),
    "plan_update_without_explanation": (
        PlanUpdateEvent(plan=[]),
        '{"type":"plan_update","explanation":null,"plan":[]}',
    ),
    "turn_aborted": (
        TurnAbortedEvent(TurnAbortReason.INTERRUPTED),
        '{"type":"turn_aborted","reason":"interrupted"}',
    ),
    "turn_aborted_replaced": (
        TurnAbortedEvent(TurnAbortReason.REPLACED),
        '{"type":"turn_aborted","reason":"replaced"}',
    ),
    "shutdown_complete": (ShutdownCompleteEvent(), '{"type":"shutdown_complete"}'),
    "approval_resolved": (
        ApprovalResolvedEvent("c1", ReviewDecision.APPROVED, "frontend-3 (sluice attach)"),
        '{"type":"approval_resolved","call_id":"c1","decision":"approved","by":"frontend-3 (sluice attach)"}',
    ),
    "exec_command_stdin_typed": (
        ExecCommandStdinTypedEvent("call_3", "print(6*7)\n", "frontend-4 (sluice web)"),
        '{"type":"exec_command_stdin_typed","call_id":"call_3","stdin":"print(6*7)\\n","by":"frontend-4 (sluice web)"}',
    ),
    "exec_command_stdin_typed_cut": (
        ExecCommandStdinTypedEvent("call_3", "x", "frontend-4", omitted=9),
        '{"type":"exec_command_stdin_typed","call_id":"call_3","stdin":"x","by":"frontend-4","omitted":9}',
    ),
}


def event_json(msg_json: str) -> str:
    return '{"id":"1","msg":' + msg_json + "}"


# -- exact JSON ------------------------------------------------------------------------


def test_codex_pinned_session_configured_event():
    event = Event(
        id="1234",
        msg=SessionConfiguredEvent(
            session_id=SESSION_ID, model="o4-mini", history_log_id=0, history_entry_count=0
        ),
    )
    assert encode_json(event) == (
        b'{"id":"1234","msg":{"type":"session_configured",'
        b'"session_id":"67e55044-10b1-426f-9247-bb680e5fe0c8","model":"o4-mini",'
        b'"history_log_id":0,"history_entry_count":0}}'
    )


@pytest.mark.parametrize("name", SUBMISSIONS)
def test_submission_json_is_codex_json(name):
    submission, expected = SUBMISSIONS[name]
    assert encode_json(submission).decode() == expected


@pytest.mark.parametrize("name", EVENTS)
def test_event_json_is_codex_json(name):
    msg, expected = EVENTS[name]
    assert encode_json(Event("1", msg)).decode() == event_json(expected)


def test_every_op_and_event_type_is_pinned():
    op_types = {type(s.op) for s, _ in SUBMISSIONS.values()}
    msg_types = {type(m) for m, _ in EVENTS.values()}
    assert op_types == set(typing.get_args(Op))
    assert msg_types == set(typing.get_args(EventMsg))


def test_a_typing_event_carries_a_bounded_part_of_what_was_typed():
    small = ExecCommandStdinTypedEvent.of(ExecCommandStdin("c", "ls\n", by="frontend-2 (sluice attach)"))
    assert small == ExecCommandStdinTypedEvent("c", "ls\n", "frontend-2 (sluice attach)")
    typed = "\x1b]0;title\x07" + "y" * STDIN_TYPED_MAX
    big = ExecCommandStdinTypedEvent.of(ExecCommandStdin("c", typed, by="f"))
    assert big.stdin == typed[:STDIN_TYPED_SHOWN] and big.omitted == len(typed) - STDIN_TYPED_SHOWN
    assert len(encode_json(Event("1", big))) < 2 * STDIN_TYPED_SHOWN  # a small message, whatever was typed


def test_strings_are_escaped_like_serde_json():
    text = "tab\tquote\"back\\slash/\x01\x1f\x7f é \u2028"
    expected = '"tab\\tquote\\"back\\\\slash/\\u0001\\u001f\x7f é \u2028"'
    assert encode_json(AgentMessageEvent(text)) == (
        '{"type":"agent_message","message":' + expected + "}"
    ).encode()


# -- round trips -----------------------------------------------------------------------


@pytest.mark.parametrize("name", SUBMISSIONS)
def test_submission_round_trips(name):
    submission, expected = SUBMISSIONS[name]
    assert decode_submission_json(expected) == submission
    assert decode_submission_json(encode_json(submission)) == submission
    assert decode_submission_msgpack(encode_msgpack(submission)) == submission


@pytest.mark.parametrize("name", EVENTS)
def test_event_round_trips(name):
    msg, expected = EVENTS[name]
    event = Event("1", msg, seq=7)
    assert decode_event_json(event_json(expected)) == Event("1", msg)
    assert decode_event_json(encode_json(event)) == event
    assert decode_event_msgpack(encode_msgpack(event)) == event


def test_json_and_msgpack_carry_the_same_message():
    msg, _ = EVENTS["patch_apply_begin"]
    event = Event("1", msg, seq=3)
    as_json = msgspec.json.decode(encode_json(event))
    as_msgpack = msgspec.msgpack.decode(encode_msgpack(event))
    assert as_json == as_msgpack


def test_decoded_values_have_their_python_types():
    event = decode_event_json(event_json(EVENTS["session_configured"][1]))
    assert event.msg.session_id == SESSION_ID
    op = decode_submission_json(SUBMISSIONS["configure_session_full"][1]).op
    assert op.approval_policy is AskForApproval.UNTRUSTED
    assert op.provider.wire_api is WireApi.CHAT
    assert op.sandbox_policy.permissions[0] is SandboxPermission.DISK_FULL_READ_ACCESS


def test_omitted_optional_fields_decode_as_codex_defaults():
    submission = decode_submission_json(
        '{"id":"0","op":{"type":"configure_session","provider":{"name":"x"},"model":"m",'
        '"approval_policy":"never","sandbox_policy":{"permissions":[]},"cwd":"/w"}}'
    )
    op = submission.op
    assert op.instructions is None
    assert op.disable_response_storage is False
    assert op.notify is msgspec.UNSET and op.resume_path is msgspec.UNSET
    assert op.provider == ModelProviderInfo(name="x")
    task_complete = decode_event_json('{"id":"1","msg":{"type":"task_complete"}}')
    assert task_complete.msg == TaskCompleteEvent()
    change = decode_event_json(
        '{"id":"1","msg":{"type":"patch_apply_begin","call_id":"c","auto_approved":false,'
        '"changes":{"/a":{"update":{"unified_diff":"d"}}}}}'
    ).msg.changes["/a"]
    assert change == UpdateFileChange("d", None)


def test_configure_session_api_key_is_sluices_own_and_hidden():
    """The resolved key rides after Codex's fields, only when set, and never in repr."""
    base = SUBMISSIONS["configure_session"][0]
    with_key = Submission("0", msgspec.structs.replace(base.op, api_key="sk-secret-123"))
    assert encode_json(base) == SUBMISSIONS["configure_session"][1].encode()
    assert encode_json(with_key) == (
        SUBMISSIONS["configure_session"][1][:-2] + ',"api_key":"sk-secret-123"}}'
    ).encode()
    assert decode_submission_json(encode_json(with_key)).op.api_key == "sk-secret-123"
    assert decode_submission_msgpack(encode_msgpack(with_key)).op.api_key == "sk-secret-123"
    assert base.op.api_key is msgspec.UNSET
    assert "sk-secret" not in repr(with_key) and "api_key=<hidden>" in repr(with_key.op)
    assert "model='o4-mini'" in repr(with_key.op)


# -- seq -------------------------------------------------------------------------------


def test_seq_is_written_only_when_set():
    started = Event("1", TaskStartedEvent())
    assert encode_json(started) == b'{"id":"1","msg":{"type":"task_started"}}'
    assert (
        encode_json(Event("1", TaskStartedEvent(), seq=42))
        == b'{"id":"1","msg":{"type":"task_started"},"seq":42}'
    )
    assert encode_json(Event("1", TaskStartedEvent(), seq=0)).endswith(b',"seq":0}')


def test_seq_round_trips_and_defaults_to_none():
    assert decode_event_json(b'{"id":"1","msg":{"type":"task_started"}}').seq is None
    event = decode_event_json(b'{"id":"1","msg":{"type":"task_started"},"seq":42}')
    assert event.seq == 42
    assert decode_event_msgpack(encode_msgpack(event)).seq == 42
    assert "seq" not in msgspec.msgpack.decode(encode_msgpack(Event("1", TaskStartedEvent())))


# -- output chunks ---------------------------------------------------------------------


def test_chunk_is_base64_in_json_and_raw_in_msgpack():
    raw = bytes(range(256))
    event = Event("1", ExecCommandOutputDeltaEvent("c", ExecOutputStream.STDOUT, raw))
    wire = json.loads(encode_json(event))
    assert wire["msg"]["chunk"] == base64.b64encode(raw).decode()
    assert msgspec.msgpack.decode(encode_msgpack(event))["msg"]["chunk"] == raw
    assert decode_event_json(encode_json(event)).msg.chunk == raw
    assert decode_event_msgpack(encode_msgpack(event)).msg.chunk == raw


def test_bad_base64_chunk_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="chunk"):
        decode_event_json(
            '{"id":"1","msg":{"type":"exec_command_output_delta","call_id":"c",'
            '"stream":"stdout","chunk":"not base64!"}}'
        )


# -- Duration --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "secs", "nanos"),
    [
        (0, 0, 0),
        (1.25, 1, 250_000_000),
        (0.000000001, 0, 1),
        (2.9999999999, 3, 0),
        (86400, 86400, 0),
    ],
)
def test_duration_from_seconds(seconds, secs, nanos):
    assert Duration.from_seconds(seconds) == Duration(secs, nanos)


def test_duration_seconds():
    assert Duration(1, 500_000_000).seconds == 1.5
    assert Duration.from_seconds(3.75).seconds == 3.75


@pytest.mark.parametrize("seconds", [-1, float("nan"), float("inf")])
def test_duration_rejects_what_rust_cannot_hold(seconds):
    with pytest.raises(ValueError, match="duration"):
        Duration.from_seconds(seconds)


def test_duration_nanos_are_checked_on_decode():
    with pytest.raises(ProtocolError, match="nanos"):
        decode_event_json(
            '{"id":"1","msg":{"type":"exec_command_end","call_id":"c","stdout":"","stderr":"",'
            '"aggregated_output":"","exit_code":0,"duration":{"secs":0,"nanos":1000000000},'
            '"formatted_output":""}}'
        )


# -- approval policy -------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["untrusted", "on-failure", "on-request", "never"])
def test_parse_approval_policy_accepts_codex_names(policy):
    assert parse_approval_policy(policy) == AskForApproval(policy)
    assert parse_approval_policy(policy) == policy


@pytest.mark.parametrize(
    ("older", "policy"),
    [
        ("unless-allow-listed", AskForApproval.UNTRUSTED),
        # Early Codex's "writes within the writable roots are auto-approved".
        ("auto-edit", AskForApproval.ON_REQUEST),
    ],
)
def test_parse_approval_policy_maps_older_names(older, policy):
    assert parse_approval_policy(older) is policy


@pytest.mark.parametrize("value", ["sometimes", "On-Request", "Auto-Edit", ""])
def test_parse_approval_policy_refuses_with_one_line(value):
    with pytest.raises(ValueError) as info:
        parse_approval_policy(value)
    message = str(info.value)
    assert "\n" not in message
    assert "untrusted, on-failure, on-request, never" in message


@pytest.mark.parametrize(
    ("older", "policy"),
    [("unless-allow-listed", AskForApproval.UNTRUSTED), ("auto-edit", AskForApproval.ON_REQUEST)],
)
@pytest.mark.parametrize("decode", [decode_submission_json, lambda data: decode_submission_msgpack(
    encode_msgpack(msgspec.json.decode(data)))])
def test_approval_policy_on_the_wire_takes_the_seeds_older_names(older, policy, decode):
    # The seeds' protocol.rs spells these; they arrive as the aliases they are and are
    # written back under the policy's own name.
    sub = decode(SUBMISSIONS["configure_session"][1].replace('"on-request"', f'"{older}"'))
    assert sub.op.approval_policy is policy
    assert encode_json(sub) == SUBMISSIONS["configure_session"][1].replace('"on-request"', f'"{policy}"').encode()


@pytest.mark.parametrize("value", ['"sometimes"', '"Auto-Edit"', "3", "null"])
def test_approval_policy_on_the_wire_refuses_other_values_in_one_line(value):
    with pytest.raises(ProtocolError) as info:
        decode_submission_json(SUBMISSIONS["configure_session"][1].replace('"on-request"', value))
    message = str(info.value)
    assert "\n" not in message and ("approval policy" in message or "approval_policy" in message)


def test_configure_session_takes_the_later_codex_instruction_fields():
    data = SUBMISSIONS["configure_session"][1].replace(
        '"instructions":null,',
        '"user_instructions":"be terse","base_instructions":"You are a test agent.","instructions":null,')
    sub = decode_submission_json(data)
    assert sub.op.user_instructions == "be terse" and sub.op.base_instructions == "You are a test agent."
    assert encode_json(sub) == data.encode()
    # Written only when set: the earlier shape stays byte for byte.
    assert encode_json(decode_submission_json(SUBMISSIONS["configure_session"][1])) == (
        SUBMISSIONS["configure_session"][1].encode())


# -- sandbox policy --------------------------------------------------------------------


@pytest.mark.parametrize("mode", landlock_policy.MODES)
@pytest.mark.parametrize(
    "writable_roots", [(), ("/srv/out",), ("/srv/out/", "/data", "/srv/out"), ("/tmp",)]
)
@pytest.mark.parametrize("network", [False, True])
def test_sandbox_policy_json_matches_landlock_helper(mode, writable_roots, network):
    ours = SandboxPolicy.from_mode(mode, writable_roots=writable_roots, network=network)
    theirs = landlock_policy.SandboxPolicy.from_mode(
        mode, writable_roots=writable_roots, network=network
    )
    assert encode_json(ours) == json.dumps(theirs.to_json(), separators=(",", ":")).encode()
    assert landlock_policy.SandboxPolicy.from_json(msgspec.to_builtins(ours)) == theirs


def test_sandbox_modes_spelled_out():
    assert encode_json(SandboxPolicy.from_mode("read-only")) == (
        b'{"permissions":["disk-full-read-access"]}'
    )
    assert encode_json(SandboxPolicy.from_mode("workspace-write", ["/srv"])) == (
        b'{"permissions":["disk-full-read-access","disk-write-platform-user-temp-folder",'
        b'"disk-write-platform-global-temp-folder","disk-write-cwd",'
        b'{"disk-write-folder":{"folder":"/srv"}}]}'
    )
    assert encode_json(SandboxPolicy.from_mode("danger-full-access", network=True)) == (
        b'{"permissions":["disk-full-read-access","disk-full-write-access","network-full-access"]}'
    )


def test_sandbox_policy_questions():
    read_only = SandboxPolicy.from_mode("read-only", ["/srv", "/data"])
    assert read_only.has_full_disk_read_access()
    assert not read_only.has_full_disk_write_access()
    assert not read_only.has_full_network_access()
    assert not read_only.is_unrestricted()
    assert read_only.writable_folders == ["/srv", "/data"]
    assert SandboxPolicy.from_mode("read-only", network=True).has_full_network_access()
    assert SandboxPolicy.from_mode("danger-full-access").is_unrestricted()


@pytest.mark.parametrize(
    ("mode", "roots", "needle"),
    [("yolo", (), "unknown sandbox mode 'yolo'"), ("read-only", ("rel/dir",), "absolute")],
)
def test_sandbox_policy_from_mode_refuses_with_one_line(mode, roots, needle):
    with pytest.raises(ValueError, match=needle) as info:
        SandboxPolicy.from_mode(mode, roots)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("permissions", "needle"),
    [
        ('["disk-read-everything"]', "disk-read-everything"),
        ('[{"disk-write-folder":{"folder":"relative"}}]', "absolute"),
        ('[{"disk-write-folder":{}}]', "folder"),
        ('[{"network":{}}]', "network"),
        ("[{}]", "disk-write-folder"),
    ],
)
def test_bad_sandbox_permission_is_a_protocol_error(permissions, needle):
    data = SUBMISSIONS["configure_session"][1].replace(
        '{"permissions":["disk-full-read-access"]}', '{"permissions":' + permissions + "}"
    )
    with pytest.raises(ProtocolError, match=needle):
        decode_submission_json(data)


# -- file changes ----------------------------------------------------------------------


def test_file_changes_compare_and_match_by_value():
    assert AddFileChange("x") == AddFileChange("x")
    assert AddFileChange("x") != AddFileChange("y")
    assert DeleteFileChange() == DeleteFileChange()
    assert UpdateFileChange("d") != AddFileChange("d")
    assert repr(UpdateFileChange("d", "/b")) == "UpdateFileChange(unified_diff='d', move_path='/b')"
    match UpdateFileChange("d", "/b"):
        case UpdateFileChange(diff, move_path):
            assert (diff, move_path) == ("d", "/b")


@pytest.mark.parametrize(
    "change",
    [
        '"remove"',
        '{"add":{}}',
        '{"add":{"content":1}}',
        '{"update":{"move_path":"/x"}}',
        '{"update":{"unified_diff":"d","move_path":3}}',
        '{"add":{"content":"x"},"delete":null}',
        "{}",
        "3",
    ],
)
def test_bad_file_change_is_a_protocol_error(change):
    data = (
        '{"id":"1","msg":{"type":"patch_apply_begin","call_id":"c","auto_approved":true,'
        '"changes":{"/a":' + change + "}}}"
    )
    with pytest.raises(ProtocolError, match="a file change is") as info:
        decode_event_json(data)
    assert "$.msg.changes" in str(info.value)


# -- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"id":"1","op":{"type":"reboot"}}', "unknown op type 'reboot'"),
        (b'{"id":"1","op":{}}', "invalid submission: Object missing required field `type`"),
        (b'{"id":"1","op":{"type":"user_input"}}', "missing required field `items`"),
        (
            b'{"id":"1","op":{"type":"user_input","items":[{"type":"audio"}]}}',
            "`$.op.items[0].type`",
        ),
        (b'{"id":1,"op":{"type":"interrupt"}}', "Expected `str`, got `int` - at `$.id`"),
        (b'{"op":{"type":"interrupt"}}', "missing required field `id`"),
        (b'{"id":"1","op":{"type":"exec_approval","id":"2","decision":"yes"}}', "`$.op.decision`"),
        (b'{"id":"1","op":', "invalid submission: Input data was truncated"),
        (b"[]", "invalid submission: Expected `object`, got `array`"),
    ],
)
def test_bad_submission_json(data, message):
    with pytest.raises(ProtocolError) as info:
        decode_submission_json(data)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"id":"1","msg":{"type":"explode"}}', "unknown event type 'explode'"),
        (b'{"id":"1","msg":{"type":"error"}}', "invalid event: Object missing required field"),
        (b'{"id":"1","msg":{"type":"turn_aborted","reason":"bored"}}', "`$.msg.reason`"),
        (b'{"id":"1","msg":{"type":"task_started"},"seq":"7"}', "`$.seq`"),
        (b"not json", "invalid event: JSON is malformed"),
    ],
)
def test_bad_event_json(data, message):
    with pytest.raises(ProtocolError) as info:
        decode_event_json(data)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_bad_msgpack():
    with pytest.raises(ProtocolError, match="unknown event type 'nope'"):
        decode_event_msgpack(msgspec.msgpack.encode({"id": "1", "msg": {"type": "nope"}}))
    with pytest.raises(ProtocolError, match="unknown op type 'nope'"):
        decode_submission_msgpack(msgspec.msgpack.encode({"id": "1", "op": {"type": "nope"}}))
    with pytest.raises(ProtocolError, match="invalid event"):
        decode_event_msgpack(b"\xc1")


def test_protocol_error_is_a_value_error():
    with pytest.raises(ValueError):
        decode_event_json(b"{}")
