"""broker.cli.codex_json: seed events in, Codex 0.169 ``exec --json`` events out.

The four golden scenarios (tests/integration/test_exec_codex_json.py) check the common path
against Codex's own output; these check the rest of the mapping, one rule at a time, with
the seed events written as ``sluice exec --json`` prints them."""

from __future__ import annotations

import json

import pytest

from broker.cli.base import CliExit, take_json_format
from broker.cli.codex_json import NUL_COMMAND, CodexJsonl, join_command
from broker.cli.main import main as sluice_main
from broker.wire.protocol import TURN_INTERRUPTED, decode_event_json
from broker.wire.results import DAEMON_SHUTTING_DOWN, EXIT_USAGE

SESSION = "67e55044-10b1-426f-9247-bb680e5fe0c8"
CONFIGURED = {"type": "session_configured", "session_id": SESSION, "model": "m", "history_log_id": 0,
              "history_entry_count": 0}


def feed(*msgs: dict, turn: str = "t1", translator: CodexJsonl | None = None) -> list[dict]:
    """The Codex lines for these event bodies (``id`` the turn's unless a body says ``_id``)."""
    translator = translator or CodexJsonl()
    out: list[dict] = []
    for msg in msgs:
        msg = dict(msg)
        event_id = msg.pop("_id", "0" if msg["type"] == "session_configured" else turn)
        out += translator.event(decode_event_json(json.dumps({"id": event_id, "msg": msg})))
    return out + translator.finish()


def begin(call_id: str, command: list[str]) -> dict:
    return {"type": "exec_command_begin", "call_id": call_id, "command": command, "cwd": "/w"}


def end(call_id: str, exit_code: int, output: str = "") -> dict:
    return {"type": "exec_command_end", "call_id": call_id, "stdout": output, "stderr": "",
            "aggregated_output": output, "exit_code": exit_code, "duration": {"secs": 0, "nanos": 5},
            "formatted_output": output}


def tokens(inp: int, cached: int | None, out: int, reasoning: int | None) -> dict:
    return {"type": "token_count", "input_tokens": inp, "cached_input_tokens": cached, "output_tokens": out,
            "reasoning_output_tokens": reasoning, "total_tokens": inp + out}


STARTED = {"type": "task_started"}
COMPLETE = {"type": "task_complete", "last_agent_message": None}


# -- joining a command ---------------------------------------------------------------


@pytest.mark.parametrize(("argv", "shown"), [
    # As Codex 0.169 showed these exec_command calls (cmd run by /bin/bash -c).
    (["/bin/bash", "-c", "echo \"it's\" $HOME `x` \\ ok"],
     "/bin/bash -c \"echo \\\"it's\\\" \"'$HOME `x` '\"\\\\ ok\""),
    (["/bin/bash", "-c", "printf %s\\n 'a b' \"c'd\""], "/bin/bash -c \"printf %s\\\\n 'a b' \\\"c'd\\\"\""),
    (["/bin/bash", "-lc", "echo hi; echo err >&2"], "/bin/bash -lc 'echo hi; echo err >&2'"),
    (["ls", "-la", "a_b/c.d:e@f+g]"], "ls -la a_b/c.d:e@f+g]"),
    (["echo", ""], "echo ''"),
    (["echo", "a=b", "x,y"], "echo 'a=b' 'x,y'"),
    (["echo", "hé llo"], "echo 'hé llo'"),
    (["echo", "^x", "a^b", "!"], "echo '^x' a'^b' '!'"),
])
def test_commands_are_joined_as_codex_joins_them(argv, shown) -> None:
    assert join_command(argv) == shown


def test_a_command_with_a_nul_byte_is_shown_as_codex_shows_it() -> None:
    assert join_command(["echo", "a\0b"]) == NUL_COMMAND


# -- items ---------------------------------------------------------------------------


def test_a_run_opens_a_thread_and_a_turn_and_numbers_items_as_they_start_or_complete() -> None:
    out = feed(CONFIGURED, STARTED, {"type": "user_message", "message": "hi"},
               begin("c1", ["ls"]), {"type": "agent_message", "message": "meanwhile"}, end("c1", 0, "a\n"),
               {"type": "agent_message", "message": "done"}, COMPLETE)
    assert out[:2] == [{"type": "thread.started", "thread_id": SESSION}, {"type": "turn.started"}]
    assert [(e["type"], e.get("item", {}).get("id")) for e in out[2:]] == [
        ("item.started", "item_0"), ("item.completed", "item_1"), ("item.completed", "item_0"),
        ("item.completed", "item_2"), ("turn.completed", None)]
    assert out[4]["item"] == {"id": "item_0", "type": "command_execution", "command": "ls",
                              "aggregated_output": "a\n", "exit_code": 0, "status": "completed"}


def test_a_command_that_exits_non_zero_failed() -> None:
    out = feed(STARTED, begin("c1", ["false"]), end("c1", 1))
    assert out[-1]["item"]["status"] == "failed"
    assert out[-1]["item"]["exit_code"] == 1


def test_reasoning_summaries_of_two_responses_are_two_items() -> None:
    out = feed(STARTED, {"type": "agent_reasoning", "text": "First."}, tokens(1, 0, 1, 0),
               {"type": "agent_reasoning", "text": "Second."}, COMPLETE)
    assert [e["item"]["text"] for e in out if e.get("item")] == ["First.", "Second."]


def test_the_parts_of_a_reasoning_summary_are_one_item_and_an_empty_one_is_none() -> None:
    out = feed(STARTED, {"type": "agent_reasoning", "text": "**One**"}, {"type": "agent_reasoning_delta", "delta": "x"},
               {"type": "agent_reasoning", "text": "Two."}, begin("c1", ["ls"]),
               {"type": "agent_reasoning", "text": " "}, end("c1", 0), {"type": "agent_reasoning", "text": "Last."})
    assert out[1] == {"type": "item.completed", "item": {"id": "item_0", "type": "reasoning", "text": "**One**\nTwo."}}
    assert out[2]["type"] == "item.started"
    assert out[3]["type"] == "item.completed" and out[3]["item"]["type"] == "command_execution"
    # Events that end without a turn's end still give what was held.
    assert out[4] == {"type": "item.completed", "item": {"id": "item_2", "type": "reasoning", "text": "Last."}}


def test_a_patch_is_a_file_change_with_kinds_and_fails_when_it_failed() -> None:
    changes = {"/w/new": {"add": {"content": "x\n"}}, "/w/gone": "delete",
               "/w/moved": {"update": {"unified_diff": "", "move_path": "/w/there"}}}
    out = feed(STARTED, {"type": "patch_apply_begin", "call_id": "p", "auto_approved": True, "changes": changes},
               {"type": "patch_apply_end", "call_id": "p", "stdout": "", "stderr": "no", "success": False})
    kinds = [{"path": "/w/new", "kind": "add"}, {"path": "/w/gone", "kind": "delete"},
             {"path": "/w/moved", "kind": "update"}]
    assert out[1:] == [
        {"type": "item.started", "item": {"id": "item_0", "type": "file_change", "changes": kinds,
                                          "status": "in_progress"}},
        {"type": "item.completed", "item": {"id": "item_0", "type": "file_change", "changes": kinds,
                                            "status": "failed"}},
    ]


@pytest.mark.parametrize(("success", "is_error", "status"), [
    (True, None, "completed"), (True, False, "completed"), (False, True, "failed"), (True, True, "failed"),
])
def test_an_mcp_call_keeps_its_result_and_fails_on_an_error_result(success, is_error, status) -> None:
    result = {"content": [{"type": "text", "text": "r"}], "structuredContent": {"n": 1}}
    if is_error is not None:
        result["isError"] = is_error
    out = feed(STARTED,
               {"type": "mcp_tool_call_begin", "call_id": "m", "server": "s", "tool": "t", "arguments": {"a": 1}},
               {"type": "mcp_tool_call_end", "call_id": "m", "success": success, "result": result})
    assert out[2]["item"] == {"id": "item_0", "type": "mcp_tool_call", "server": "s", "tool": "t",
                              "arguments": {"a": 1}, "result": {"content": [{"type": "text", "text": "r"}],
                                                                "structured_content": {"n": 1}},
                              "error": None, "status": status}


def test_an_mcp_call_without_a_result_failed_with_an_error() -> None:
    out = feed(STARTED, {"type": "mcp_tool_call_begin", "call_id": "m", "server": "s", "tool": "t"},
               {"type": "mcp_tool_call_end", "call_id": "m", "success": False})
    item = out[2]["item"]
    assert (item["arguments"], item["result"], item["status"]) == (None, None, "failed")
    assert item["error"]["message"]


def test_the_plan_is_a_todo_list_started_updated_and_completed_with_the_turn() -> None:
    def plan(*statuses: str) -> dict:
        return {"type": "plan_update", "explanation": None,
                "plan": [{"step": f"s{i}", "status": s} for i, s in enumerate(statuses)]}

    out = feed(STARTED, plan("in_progress", "pending"), plan("completed", "in_progress"),
               {"type": "agent_message", "message": "ok"}, COMPLETE)
    todo = {"id": "item_0", "type": "todo_list", "items": [{"text": "s0", "completed": True},
                                                           {"text": "s1", "completed": False}]}
    assert [e["type"] for e in out] == ["turn.started", "item.started", "item.updated", "item.completed",
                                        "item.completed", "turn.completed"]
    assert out[1]["item"]["items"] == [{"text": "s0", "completed": False}, {"text": "s1", "completed": False}]
    assert out[2]["item"] == todo
    assert out[4]["item"] == todo


# -- turns ---------------------------------------------------------------------------


def test_usage_is_the_sum_of_the_token_counts_seen() -> None:
    translator = CodexJsonl()
    first = feed(STARTED, tokens(10, 4, 3, 1), COMPLETE, translator=translator)
    second = feed(STARTED, tokens(5, None, 2, None), COMPLETE, turn="t2", translator=translator)
    assert first[-1] == {"type": "turn.completed", "usage": {
        "input_tokens": 10, "cached_input_tokens": 4, "cache_write_input_tokens": 0, "output_tokens": 3,
        "reasoning_output_tokens": 1}}
    assert second[-1]["usage"] == {"input_tokens": 15, "cached_input_tokens": 4, "cache_write_input_tokens": 0,
                                   "output_tokens": 5, "reasoning_output_tokens": 1}


@pytest.mark.parametrize("message", ["unexpected status 401 Unauthorized: no", DAEMON_SHUTTING_DOWN])
def test_an_error_that_ends_the_turn_is_an_error_then_turn_failed(message) -> None:
    out = feed(STARTED, {"type": "plan_update", "plan": [{"step": "a", "status": "pending"}]},
               {"type": "error", "message": message})
    assert [e["type"] for e in out] == ["turn.started", "item.started", "error", "item.completed", "turn.failed"]
    assert out[2] == {"type": "error", "message": message}
    assert out[4] == {"type": "turn.failed", "error": {"message": message}}


def test_an_aborted_turn_ends_with_nothing_of_its_own() -> None:
    out = feed(STARTED, {"type": "plan_update", "plan": [{"step": "a", "status": "pending"}]},
               {"type": "error", "message": TURN_INTERRUPTED}, {"type": "turn_aborted", "reason": "interrupted"})
    assert [e["type"] for e in out] == ["turn.started", "item.started", "item.completed"]


def test_errors_that_end_no_turn_are_error_items_once_the_thread_started() -> None:
    out = feed({"type": "error", "message": "cannot reach the agent", "_id": ""})
    assert out == [{"type": "error", "message": "cannot reach the agent"}]
    out = feed(CONFIGURED, {"type": "error", "message": "MCP client for `x` failed to start", "_id": "0"}, STARTED,
               {"type": "error", "message": "rollout: no space left on device: /h/r.jsonl"},
               {"type": "error", "message": "not for this turn", "_id": "other"}, COMPLETE)
    assert [e["type"] for e in out] == ["thread.started", "item.completed", "turn.started", "item.completed",
                                        "item.completed", "turn.completed"]
    assert out[1]["item"] == {"id": "item_0", "type": "error", "message": "MCP client for `x` failed to start"}
    assert out[3]["item"]["message"] == "rollout: no space left on device: /h/r.jsonl"


def test_an_item_still_open_when_the_turn_ends_completes_as_it_stands() -> None:
    translator = CodexJsonl()
    out = feed(STARTED, begin("c1", ["bash"]), COMPLETE, translator=translator)
    assert [e["type"] for e in out] == ["turn.started", "item.started", "item.completed", "turn.completed"]
    assert out[2]["item"] == out[1]["item"]
    later = feed(STARTED, end("c1", 0), turn="t2", translator=translator)
    assert later[-1]["item"] == {"id": "item_1", "type": "command_execution", "command": "bash",
                                 "aggregated_output": "", "exit_code": 0, "status": "completed"}


def test_a_turn_joined_after_its_start_starts_with_its_first_event() -> None:
    out = feed({"type": "agent_reasoning", "text": "Hm."}, begin("c1", ["ls"]), end("c1", 0), COMPLETE)
    assert [e["type"] for e in out] == ["turn.started", "item.completed", "item.started", "item.completed",
                                        "turn.completed"]
    assert out[1]["item"] == {"id": "item_0", "type": "reasoning", "text": "Hm."}


def test_what_codex_does_not_print_is_not_printed() -> None:
    out = feed(STARTED, {"type": "agent_message_delta", "delta": "x"},
               {"type": "exec_command_output_delta", "call_id": "c", "stream": "stdout", "chunk": "eA=="},
               {"type": "background_event", "message": "stream error: x; retrying 1/4 in 1s…"},
               {"type": "exec_approval_request", "call_id": "c", "command": ["rm"], "cwd": "/"},
               {"type": "approval_resolved", "call_id": "c", "decision": "denied", "by": "f"},
               {"type": "turn_diff", "unified_diff": ""}, {"type": "user_message", "message": "m"})
    assert out == [{"type": "turn.started"}]


# -- the option ----------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "expected"), [
    (["--json", "hi"], (["--json", "hi"], "seed")),
    (["--json=seed", "hi"], (["--json", "hi"], "seed")),
    (["-s", "read-only", "--json=codex", "hi"], (["-s", "read-only", "--json", "hi"], "codex")),
    (["hi"], (["hi"], "seed")),
    (["--", "--json=codex"], (["--", "--json=codex"], "seed")),
])
def test_json_format_is_named_only_with_an_equals_sign(argv, expected) -> None:
    assert take_json_format(argv) == expected


def test_an_unknown_json_format_is_one_line_and_exit_2(capsys) -> None:
    with pytest.raises(CliExit) as caught:
        take_json_format(["--json=xml", "hi"])
    assert caught.value.code == EXIT_USAGE
    assert capsys.readouterr().err == "sluice: error: --json=xml: the format is seed (the default) or codex\n"
    assert sluice_main(["exec", "--json=codex-ish", "hi"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--json=codex-ish" in err


def test_a_thread_starts_once_per_run() -> None:
    translator = CodexJsonl()
    assert translator.thread(SESSION) == [{"type": "thread.started", "thread_id": SESSION}]
    assert feed(CONFIGURED, STARTED, translator=translator) == [{"type": "turn.started"}]
