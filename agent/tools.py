"""The tools the model is offered, their arguments, and how their results are worded.

Declarations are in the Responses API shape (``{"type": "function", "name", ...}``);
the model client converts them for Chat Completions. Codex's tools:

- ``shell``: ``command`` (argv array, required), ``workdir``, ``timeout_ms``; under
  ``on-request`` with a sandbox also ``with_escalated_permissions`` and
  ``justification`` (only that policy lets the model ask to leave the sandbox).
  ``container.exec`` is accepted as another name for it, and ``local_shell_call``
  output items are the same call in another shape.
- ``apply_patch``: ``input``, the patch text.
- ``update_plan``: ``explanation`` and ``plan`` (``step`` + ``status``), shown to the
  user as a ``plan_update`` event; the model gets ``Plan updated``.

Long-lived commands (:mod:`agent.unified_exec`), offered as the ``unified_exec`` setting
says (:func:`tools_for`):

- ``seed``: the seed's ``unified_exec`` (``input``: a command's argv, or with
  ``session_id`` the chunks to write to that session, joined by spaces; ``timeout_ms``),
  beside ``shell``. Its answer is the JSON ``{"session_id": "<id>" | null, "output"}``
  (:func:`format_unified_exec_output`).
- ``codex``: Codex's ``exec_command`` (``cmd`` run by ``shell`` (default bash) with
  ``-lc``, or ``-c`` when ``login`` is false; ``workdir``, ``yield_time_ms``,
  ``max_output_tokens``, ``tty``) and ``write_stdin`` (``session_id``, ``chars``,
  ``yield_time_ms``, ``max_output_tokens``) instead of ``shell``. Their answer is
  Codex's text (:func:`format_exec_command_output`): chunk id, wall time, "Process
  exited with code N" or "Process running with session ID N", the original token count,
  then the output, cut in the middle to ``max_output_tokens`` (about 4 bytes a token).
  Under ``on-request`` with a sandbox, ``exec_command`` offers escalation in Codex's
  current spelling: ``sandbox_permissions`` (``use_default`` or ``require_escalated``)
  and ``justification``.

Escalation is asked for in either spelling on every tool that runs a command (``shell``,
``container.exec``, ``unified_exec``, ``exec_command``): the seed's
``with_escalated_permissions: true`` or Codex's ``sandbox_permissions:
"require_escalated"`` (:func:`escalation_requested`); each tool offers the one its
origin does. Any other ``sandbox_permissions`` value is an :class:`ArgumentError`.

Arguments the model sends are JSON text; one that does not parse, or lacks what the
tool needs, is answered ``failed to parse function arguments: <why>`` so the model can
try again (:class:`ArgumentError`).

Command output for the model (:func:`format_exec_output`) is Codex's JSON::

    {"output":"...","metadata":{"exit_code":0,"duration_seconds":0.4}}

where ``output`` is stdout and stderr interleaved, cut by :func:`truncate_for_model` to
at most :data:`MODEL_FORMAT_MAX_LINES` lines and :data:`MODEL_FORMAT_MAX_BYTES` bytes:
the first 128 lines (up to 5 KiB), a marker ``[... omitted N of M lines ...]``, then
the last lines in what room is left (Codex's limits and marker; lines too long for whole
lines to fit are cut by bytes). Frontends get every byte through the output deltas;
only the model's copy is cut.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import msgspec

from broker.wire.protocol import AskForApproval, PlanItem, PlanUpdateEvent, SandboxPolicy

SHELL = "shell"
CONTAINER_EXEC = "container.exec"
APPLY_PATCH = "apply_patch"
UPDATE_PLAN = "update_plan"
UNIFIED_EXEC = "unified_exec"
EXEC_COMMAND = "exec_command"
WRITE_STDIN = "write_stdin"

# Codex's exec_command / write_stdin bounds.
EXEC_COMMAND_DEFAULT_YIELD_MS = 10_000
WRITE_STDIN_DEFAULT_YIELD_MS = 250
MIN_YIELD_TIME_MS = 250
MAX_YIELD_TIME_MS = 30_000
DEFAULT_MAX_OUTPUT_TOKENS = 10_000
APPROX_BYTES_PER_TOKEN = 4

MODEL_FORMAT_MAX_BYTES = 10 * 1024
MODEL_FORMAT_MAX_LINES = 256
MODEL_FORMAT_HEAD_LINES = MODEL_FORMAT_MAX_LINES // 2
MODEL_FORMAT_TAIL_LINES = MODEL_FORMAT_MAX_LINES - MODEL_FORMAT_HEAD_LINES
MODEL_FORMAT_HEAD_BYTES = MODEL_FORMAT_MAX_BYTES // 2

PLAN_UPDATED = "Plan updated"

# Codex's values of ``sandbox_permissions``; sluice has no per-command permission grants
# (Codex's ``with_additional_permissions``), so a model asking for one is told so.
USE_DEFAULT = "use_default"
REQUIRE_ESCALATED = "require_escalated"
SANDBOX_PERMISSIONS = (USE_DEFAULT, REQUIRE_ESCALATED)
# How Codex names its Linux sandbox in a denial (its SandboxType, as Rust debug-prints
# it): the words a model trained on Codex's traces knows to act on.
SANDBOX_TYPE = "LinuxSeccomp"
# Bytes kept free for the omission marker.
_MARKER_ROOM = 64


class ArgumentError(ValueError):
    """Function arguments that do not parse; ``str()`` is what the model is told."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"failed to parse function arguments: {reason}")


# -- declarations ---------------------------------------------------------------------


def shell_tool(*, offer_escalation: bool) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "command": {"type": "array", "items": {"type": "string"}, "description": "The command to execute"},
        "workdir": {"type": "string", "description": "The working directory to execute the command in"},
        "timeout_ms": {"type": "number", "description": "The timeout for the command in milliseconds"},
    }
    if offer_escalation:
        properties["with_escalated_permissions"] = {
            "type": "boolean",
            "description": "Whether to request escalated permissions. Set to true if command needs "
            "to be run without sandbox restrictions",
        }
        properties["justification"] = {
            "type": "string",
            "description": "Only set if with_escalated_permissions is true. 1-sentence explanation "
            "of why we want to run this command.",
        }
    return {
        "type": "function",
        "name": SHELL,
        "description": "Runs a shell command and returns its output.",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": properties,
            "required": ["command"],
            "additionalProperties": False,
        },
    }


APPLY_PATCH_TOOL: dict[str, Any] = {
    "type": "function",
    "name": APPLY_PATCH,
    "description": (
        "Use the `apply_patch` tool to edit files. The patch starts with `*** Begin Patch` and "
        "ends with `*** End Patch`; in between, `*** Add File: PATH` (every line prefixed with +), "
        "`*** Delete File: PATH`, or `*** Update File: PATH` (optionally followed by "
        "`*** Move to: NEW_PATH`) with hunks introduced by `@@` (optionally followed by a line of "
        "context such as a class or function header) whose lines start with ' ' (context), '-' "
        "(removed) or '+' (added). Paths are relative to the working directory."
    ),
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {
            "input": {"type": "string", "description": "The entire contents of the apply_patch command"},
        },
        "required": ["input"],
        "additionalProperties": False,
    },
}

UPDATE_PLAN_TOOL: dict[str, Any] = {
    "type": "function",
    "name": UPDATE_PLAN,
    "description": (
        "Updates the task plan.\n"
        "Provide an optional explanation and a list of plan items, each with a step and status.\n"
        "At most one step can be in_progress at a time.\n"
    ),
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {
            "explanation": {"type": "string"},
            "plan": {
                "type": "array",
                "description": "The list of steps",
                "items": {
                    "type": "object",
                    "properties": {
                        "step": {"type": "string"},
                        "status": {"type": "string", "description": "One of: pending, in_progress, completed"},
                    },
                    "required": ["step", "status"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["plan"],
        "additionalProperties": False,
    },
}


def _sandbox_permissions_properties() -> dict[str, Any]:
    """Codex's escalation parameters for ``exec_command``."""
    return {
        "sandbox_permissions": {
            "type": "string",
            "enum": list(SANDBOX_PERMISSIONS),
            "description": "Per-command sandbox override. Defaults to `use_default`; use `require_escalated` "
            "for unsandboxed execution.",
        },
        "justification": {
            "type": "string",
            "description": "User-facing approval question for `require_escalated`; omit otherwise.",
        },
    }


UNIFIED_EXEC_TOOL: dict[str, Any] = {
    "type": "function",
    "name": UNIFIED_EXEC,
    "description": (
        "Runs a command in a terminal that stays open across calls, for interactive programs: "
        "shells, REPLs, debuggers, servers. Without session_id, input is the command to start "
        "(an argv, e.g. [\"bash\", \"-i\"]); with session_id, the input chunks (joined by spaces) "
        "are written to that session's terminal (end a line with \\n). Returns the output printed "
        "within timeout_ms, and the session_id while the process still runs."
    ),
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {
            "input": {
                "type": "array",
                "items": {"type": "string"},
                "description": "The command's argv when starting a session; otherwise the text to write to it",
            },
            "session_id": {
                "type": "string",
                "description": "The id of a running session to write to; omit it to start a new one",
            },
            "timeout_ms": {
                "type": "number",
                "description": "How long to wait for output, in milliseconds (default 1000, at most 60000)",
            },
        },
        "required": ["input"],
        "additionalProperties": False,
    },
}


def exec_command_tool(*, offer_escalation: bool) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "cmd": {"type": "string", "description": "The command line, run by the shell."},
        "workdir": {"type": "string",
                    "description": "Where to run it (relative to the session's directory); default: that directory."},
        "shell": {"type": "string", "description": "The shell that runs cmd (default /bin/bash)."},
        "login": {"type": "boolean", "description": "Run cmd in a login shell (-lc rather than -c); default true."},
        "tty": {"type": "boolean",
                "description": "Whether to allocate a terminal for the command, so that it can be written to "
                "later with write_stdin. Defaults to false (plain output, stdin closed)."},
        "yield_time_ms": {"type": "number",
                          "description": "Milliseconds to gather output before answering (default 10000, "
                          "at most 30000); a command that exits sooner answers at once."},
        "max_output_tokens": {"type": "number",
                              "description": "Most tokens of output to return (default 10000); the middle "
                              "of longer output is left out."},
    }
    if offer_escalation:
        properties.update(_sandbox_permissions_properties())
    return {
        "type": "function",
        "name": EXEC_COMMAND,
        "description": ("Starts a command and returns what it prints within yield_time_ms: with its exit "
                        "code if it has ended, else with a session ID for write_stdin to poll it or "
                        "(with tty) type into it."),
        "strict": False,
        "parameters": {"type": "object", "properties": properties, "required": ["cmd"],
                       "additionalProperties": False},
    }


WRITE_STDIN_TOOL: dict[str, Any] = {
    "type": "function",
    "name": WRITE_STDIN,
    "description": "Types chars into a session started by exec_command (empty: just wait) and returns what it printed since.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {
            "session_id": {"type": "number", "description": "The session ID exec_command returned."},
            "chars": {"type": "string", "description": "Text to type; \\n ends a line, \\u0003 is Ctrl-C. Empty: only poll."},
            "yield_time_ms": {"type": "number",
                              "description": "Milliseconds to gather output before answering (default 250)."},
            "max_output_tokens": {"type": "number",
                                  "description": "Most tokens of output to return (default 10000)."},
        },
        "required": ["session_id"],
        "additionalProperties": False,
    },
}


def tools_for(approval_policy: AskForApproval, sandbox_policy: SandboxPolicy,
              unified_exec: str = "off") -> list[dict[str, Any]]:
    """The tools offered to the model in a session with these policies and this
    ``unified_exec`` setting (``off``, ``seed`` or ``codex``)."""
    offer = approval_policy == AskForApproval.ON_REQUEST and not sandbox_policy.is_unrestricted()
    if unified_exec == "codex":
        return [exec_command_tool(offer_escalation=offer), WRITE_STDIN_TOOL, APPLY_PATCH_TOOL, UPDATE_PLAN_TOOL]
    tools = [shell_tool(offer_escalation=offer), APPLY_PATCH_TOOL, UPDATE_PLAN_TOOL]
    if unified_exec == "seed":
        tools.insert(1, UNIFIED_EXEC_TOOL)
    return tools


# -- arguments ------------------------------------------------------------------------


class _EscalationParams(msgspec.Struct, forbid_unknown_fields=False, kw_only=True):
    """The arguments of every command tool that ask to run outside the sandbox, in either
    spelling (:func:`escalation_requested`)."""

    with_escalated_permissions: bool | None = None
    sandbox_permissions: str | None = None
    justification: str | None = None


class ShellParams(_EscalationParams):
    command: list[str]
    workdir: str | None = None
    timeout_ms: int | None = None


class UnifiedExecParams(_EscalationParams):
    input: list[str]
    session_id: str | int | None = None
    timeout_ms: int | None = None


class ExecCommandParams(_EscalationParams):
    cmd: str
    workdir: str | None = None
    shell: str | None = None
    login: bool | None = None
    tty: bool = False
    yield_time_ms: int = EXEC_COMMAND_DEFAULT_YIELD_MS
    max_output_tokens: int | None = None


class WriteStdinParams(msgspec.Struct, forbid_unknown_fields=False):
    session_id: int
    chars: str = ""
    yield_time_ms: int = WRITE_STDIN_DEFAULT_YIELD_MS
    max_output_tokens: int | None = None


class _PatchParams(msgspec.Struct):
    input: str


class _PlanParams(msgspec.Struct):
    plan: list[PlanItem]
    explanation: str | None = None


def _decode(arguments: str, kind: type) -> Any:
    try:
        params = msgspec.json.decode(arguments.encode() if isinstance(arguments, str) else arguments, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as err:
        raise ArgumentError(str(err)) from None
    value = getattr(params, "sandbox_permissions", None)
    if value is not None and value not in SANDBOX_PERMISSIONS:
        raise ArgumentError(f"`sandbox_permissions` {value!r} is not supported: use "
                            + " or ".join(f"{v!r}" for v in SANDBOX_PERMISSIONS))
    return params


def escalation_requested(params: _EscalationParams) -> bool:
    """Whether the call asks to run outside the sandbox, in either spelling (the seed's
    ``with_escalated_permissions`` or Codex's ``sandbox_permissions``)."""
    return bool(params.with_escalated_permissions) or params.sandbox_permissions == REQUIRE_ESCALATED


def parse_shell_arguments(arguments: str) -> ShellParams:
    params = _decode(arguments, ShellParams)
    if not params.command:
        raise ArgumentError("`command` must name a program")
    if params.timeout_ms is not None and params.timeout_ms <= 0:
        raise ArgumentError("`timeout_ms` must be a positive number of milliseconds")
    return params


def parse_unified_exec_arguments(arguments: str) -> tuple[UnifiedExecParams, int | None]:
    """The seed tool's arguments and its session id as a number (None: start one)."""
    params = _decode(arguments, UnifiedExecParams)
    session_id = params.session_id
    if isinstance(session_id, str):
        try:
            session_id = int(session_id.strip())
        except ValueError:
            raise ArgumentError(f"invalid session_id: {params.session_id!r} is not a number") from None
    if session_id is None and not params.input:
        raise ArgumentError("missing command line for unified exec request")
    return params, session_id


def parse_exec_command_arguments(arguments: str) -> ExecCommandParams:
    params = _decode(arguments, ExecCommandParams)
    if not params.cmd.strip():
        raise ArgumentError("`cmd` must not be empty")
    return params


def parse_write_stdin_arguments(arguments: str) -> WriteStdinParams:
    return _decode(arguments, WriteStdinParams)


def clamp_yield_time(ms: int) -> int:
    """Codex's bounds for ``yield_time_ms``."""
    return min(max(ms, MIN_YIELD_TIME_MS), MAX_YIELD_TIME_MS)


def parse_apply_patch_arguments(arguments: str) -> str:
    return _decode(arguments, _PatchParams).input


def parse_plan_arguments(arguments: str) -> PlanUpdateEvent:
    params = _decode(arguments, _PlanParams)
    return PlanUpdateEvent(explanation=params.explanation, plan=params.plan)


def shell_params_from_local_call(action: dict[str, Any]) -> ShellParams:
    """The ``action`` of a ``local_shell_call`` item (``{"type": "exec", "command", ...}``)."""
    try:
        return msgspec.convert(
            {
                "command": action.get("command"),
                "workdir": action.get("working_directory"),
                "timeout_ms": action.get("timeout_ms"),
            },
            ShellParams,
        )
    except msgspec.ValidationError as err:
        raise ArgumentError(str(err)) from None


# -- output ---------------------------------------------------------------------------


def _take_bytes(text: str, budget: int) -> str:
    return text.encode("utf-8")[: max(budget, 0)].decode("utf-8", errors="ignore")


def _take_last_bytes(text: str, budget: int) -> str:
    if budget <= 0:
        return ""
    data = text.encode("utf-8")
    return data[-budget:].decode("utf-8", errors="ignore") if len(data) > budget else text


def truncate_for_model(text: str) -> str:
    """``text`` if it is short enough for the model, else its head and tail around a marker.

    Whole lines are kept: up to 128 from the start within 5 KiB, then up to 128 from the
    end in what room is left, and the marker says how many lines were left out. Output
    whose lines are too long for that (a minified file, a progress bar) is cut by bytes
    instead, and the marker counts bytes.
    """
    size = len(text.encode("utf-8"))
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    total = len(lines)
    if size <= MODEL_FORMAT_MAX_BYTES and total <= MODEL_FORMAT_MAX_LINES:
        return text
    head: list[str] = []
    used = 0
    for line in lines[:MODEL_FORMAT_HEAD_LINES]:
        cost = len(line.encode("utf-8")) + 1
        if used + cost > MODEL_FORMAT_HEAD_BYTES:
            break
        head.append(line)
        used += cost
    tail: list[str] = []
    budget = MODEL_FORMAT_MAX_BYTES - used - _MARKER_ROOM
    for line in reversed(lines[len(head):]):
        cost = len(line.encode("utf-8")) + 1
        if len(tail) == MODEL_FORMAT_TAIL_LINES or cost > budget:
            break
        tail.append(line)
        budget -= cost
    tail.reverse()
    omitted = total - len(head) - len(tail)
    if head and tail:
        return "\n".join(head) + f"\n[... omitted {omitted} of {total} lines ...]\n\n" + "\n".join(tail)
    start = _take_bytes(text, MODEL_FORMAT_HEAD_BYTES)
    end = _take_last_bytes(text, MODEL_FORMAT_MAX_BYTES - len(start.encode("utf-8")) - _MARKER_ROOM)
    dropped = size - len(start.encode("utf-8")) - len(end.encode("utf-8"))
    return f"{start}\n[... omitted {dropped} of {size} bytes ...]\n\n{end}"


def model_output_text(aggregated: str, *, timed_out: bool = False, timeout_ms: int | None = None) -> str:
    """What the model (and ``exec_command_end.formatted_output``) shows of a command's output."""
    text = truncate_for_model(aggregated)
    if timed_out:
        text = f"command timed out after {timeout_ms} milliseconds\n{text}"
    return text


def format_exec_output(output: str, exit_code: int, duration_s: float) -> str:
    """Codex's ``{"output", "metadata": {"exit_code", "duration_seconds"}}``, duration to 0.1 s
    (halves rounded up, as Rust's ``round``)."""
    payload = {
        "output": output,
        "metadata": {"exit_code": exit_code, "duration_seconds": math.floor(max(duration_s, 0.0) * 10 + 0.5) / 10},
    }
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def sandbox_denied_error(exit_code: int, stdout: str, stderr: str) -> str:
    """Codex's error for a command the sandbox denied (its ``SandboxErr::Denied``)."""
    return f"sandbox denied exec error, exit code: {exit_code}, stdout: {stdout}, stderr: {stderr}"


def format_sandbox_denial(exit_code: int, stdout: str, stderr: str) -> str:
    """What the seed answers a call whose command the sandbox denied, when nobody is
    asked to retry it (``on-request``, ``never``): stdout and stderr apart, each cut as
    any output for the model is (:func:`truncate_for_model`)."""
    error = sandbox_denied_error(exit_code, truncate_for_model(stdout), truncate_for_model(stderr))
    return f"failed in sandbox {SANDBOX_TYPE} with execution error: {error}"


def format_unified_exec_output(session_id: int | None, output: str) -> str:
    """The seed tool's answer: ``{"session_id": "<id>" | null, "output": "..."}``."""
    payload = {"session_id": None if session_id is None else str(session_id), "output": output}
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def approx_token_count(text: str) -> int:
    return (len(text.encode("utf-8")) + APPROX_BYTES_PER_TOKEN - 1) // APPROX_BYTES_PER_TOKEN


def truncate_to_tokens(text: str, max_tokens: int) -> str:
    """``text`` if it fits ``max_tokens`` (at 4 bytes a token), else its head and tail,
    half the budget each, around ``…N tokens truncated…``."""
    budget = max(0, max_tokens) * APPROX_BYTES_PER_TOKEN
    data = text.encode("utf-8")
    if len(data) <= budget:
        return text
    head = _take_bytes(text, budget // 2)
    tail = _take_last_bytes(text, budget - len(head.encode("utf-8")))
    removed = len(data) - len(head.encode("utf-8")) - len(tail.encode("utf-8"))
    marker = f"…{(removed + APPROX_BYTES_PER_TOKEN - 1) // APPROX_BYTES_PER_TOKEN} tokens truncated…"
    return f"{head}{marker}{tail}"


def format_exec_command_output(
    output: str,
    *,
    chunk_id: str,
    wall_time_s: float,
    exit_code: int | None,
    session_id: int | None,
    max_output_tokens: int | None,
) -> str:
    """Codex's text for ``exec_command`` / ``write_stdin``: what the model reads."""
    lines = [f"Chunk ID: {chunk_id}", f"Wall time: {wall_time_s:.4f} seconds"]
    if exit_code is not None:
        lines.append(f"Process exited with code {exit_code}")
    if session_id is not None:
        lines.append(f"Process running with session ID {session_id}")
    lines.append(f"Original token count: {approx_token_count(output)}")
    lines.append("Output:")
    lines.append(truncate_to_tokens(output, DEFAULT_MAX_OUTPUT_TOKENS if max_output_tokens is None
                                    else max_output_tokens))
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """A call's answer for the model's next request: ``function_call_output``, or
    ``custom_tool_call_output`` for a freeform (``custom_tool_call``) call. ``content`` is
    text, or (an MCP result with an image) a list of function output items."""

    call_id: str
    content: str | list[dict[str, Any]]
    success: bool | None = None
    custom: bool = False

    def to_item(self) -> dict[str, Any]:
        # Codex serialises FunctionCallOutputPayload as the bare content string.
        kind = "custom_tool_call_output" if self.custom else "function_call_output"
        return {"type": kind, "call_id": self.call_id, "output": self.content}
