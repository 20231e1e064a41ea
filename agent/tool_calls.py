"""Carrying out what the model asked for: messages shown, commands run, patches applied.

Codex's ``handle_response_item``, ``handle_function_call``,
``handle_container_exec_with_params`` and ``handle_sandbox_error``, over sluice's
:class:`~agent.exec_runner.CommandRunner` and :mod:`agent.safety`.

A command (``shell``, ``container.exec``, a ``local_shell_call`` item):

1. ``workdir`` resolves against the session cwd (:func:`resolve_workdir`); one that is
   not a directory is answered ``error: <why>`` and nothing runs. It is only where the
   command runs: the sandbox's writable roots are the session's (its cwd and the roots
   granted this session), wherever the command runs, so a workdir of ``/``, ``..`` or
   ``.git`` is a read-only place (``.git`` stays read-only as a root's subdirectory).
   An argv that invokes apply_patch
   (``["apply_patch", PATCH]`` or ``bash -lc "apply_patch <<'EOF' ..."``) is a patch (below);
   one whose patch does not parse or apply is answered ``error: <why>``.
2. :func:`agent.safety.assess_command_safety` decides: run it in the sandbox, ask
   (``exec_approval_request``; approved commands run unsandboxed, ``approved_for_session``
   ones from then on without asking), or refuse (``exec command rejected: <why>``; a
   denial: ``exec command rejected by user``). An escalation request is either spelling
   (:func:`agent.tools.escalation_requested`).
3. ``exec_command_begin``, an ``exec_command_output_delta`` per chunk, ``exec_command_end``.
4. A sandboxed run that failed the way sandbox denials fail, under ``untrusted`` or
   ``on-failure``: a ``background_event``, then ``exec_approval_request`` with the reason
   "command failed; retry without sandbox?"; approved, it runs again unsandboxed (a new
   begin / deltas / end with the same call id) and, as in the seed, joins the commands
   that run unsandboxed without asking; denied, the model gets the failure.
5. The model gets :func:`agent.tools.format_exec_output` of the output; but for a
   sandboxed run that failed the way sandbox denials fail, under ``on-request`` or
   ``never``, the seed's :func:`agent.tools.format_sandbox_denial` (``failed in sandbox
   LinuxSeccomp with execution error: sandbox denied exec error, exit code: N, stdout:
   ..., stderr: ...``), the hint to ask for escalation.

A patch: :func:`agent.safety.assess_patch_safety` over every path it writes; a request
(``apply_patch_approval_request``, with ``grant_root`` when the patch leaves the
writable roots: approving it opens that root for the rest of the session) or a refusal
(``patch rejected: <why>`` / ``patch rejected by user``); then ``patch_apply_begin``,
the patch applied in the session's sandbox (verified first against the files as the
sandbox reads them, then written atomically by a sandboxed process of the session's
policy, a granted root included: the agent never writes with its own rights; a write
the sandbox refuses fails the patch), ``patch_apply_end``, and the turn's diff tracker
updated. Unasked, one sandboxed process reads and then writes. A patch approved into a
protected ``.git``/``.sluice`` (never a root to grant) has that one write run without
the write restrictions.

Long-lived commands (:mod:`agent.unified_exec`; the seed's ``unified_exec``, Codex's
``exec_command`` / ``write_stdin``, answered only when the session's ``unified_exec``
setting offers them): starting one goes through steps 1, 2, 4 and 5 above exactly as a
``shell`` command (:func:`approve_command`, :func:`approve_retry`: the retry, or the
denial text, when the command exits within its first wait looking denied), and its request says
``interactive`` when the session would take input. Input to a running session that runs
without the sandbox is asked for, each write on its own (:func:`approve_input`; an
``exec_approval_request`` with ``stdin`` and ``process_id`` set, refused:
``write_stdin rejected by user`` and nothing written), under every policy but ``never``
and unless the session's policy is danger-full-access
(:func:`agent.safety.input_needs_approval`): an approval covers the command, not what
the model types into it afterwards. A sandboxed session's input stays in its sandbox
and is not asked for. An interrupt cancels the call waiting on a session, not the
session.

Interrupted while a command runs: the command is cancelled through the runner and its
``exec_command_end`` says so (exit code 130, ``formatted_output`` "aborted", and the
output it streamed before, capped as below) before the cancellation goes on.

``exec_command_end`` carries the first :data:`~agent.exec_runner.MAX_STREAM_OUTPUT`
characters of ``stdout``, ``stderr`` and ``aggregated_output``, as the seed caps them: the
deltas carried every byte already; ``formatted_output`` is the output as the model was
shown it (a denial's text wraps it, in step 5).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import secrets
import stat
import time
from typing import TYPE_CHECKING

import structlog

from agent.apply_patch import (
    ApplyOutcome,
    ApplyPatchAction,
    ParsedPatch,
    PatchError,
    change_ops,
    maybe_parse_apply_patch,
    outcome_of,
    paths_to_read,
    verify_patch,
)
from agent.sandbox_files import Conversation, FileAccessError, SandboxFiles
from agent.exec_runner import ExecResult, StreamedOutput, cap_stream_output
from agent.items import Item, output_texts
from agent.safety import (
    RETRY_WITHOUT_SANDBOX_REASON,
    AskUser,
    AutoApprove,
    Reject,
    assess_command_safety,
    assess_patch_safety,
    input_needs_approval,
    should_report_denial,
    should_retry_unsandboxed,
    writable_roots_for,
)
from agent.tools import (
    APPLY_PATCH,
    CONTAINER_EXEC,
    EXEC_COMMAND,
    PLAN_UPDATED,
    SHELL,
    UNIFIED_EXEC,
    UPDATE_PLAN,
    WRITE_STDIN,
    ArgumentError,
    ShellParams,
    ToolOutput,
    clamp_yield_time,
    escalation_requested,
    format_exec_command_output,
    format_exec_output,
    format_sandbox_denial,
    format_unified_exec_output,
    model_output_text,
    parse_apply_patch_arguments,
    parse_exec_command_arguments,
    parse_plan_arguments,
    parse_shell_arguments,
    parse_unified_exec_arguments,
    parse_write_stdin_arguments,
    sandbox_denied_error,
    shell_params_from_local_call,
)
from agent.unified_exec import (
    DEFAULT_WINSIZE,
    Collected,
    ExecSession,
    UnknownSessionId,
    clamp_timeout,
    session_env,
)
from broker.wire.frames import Winsize
from broker.wire.protocol import (
    AgentMessageEvent,
    AgentReasoningEvent,
    AgentReasoningRawContentEvent,
    ApplyPatchApprovalRequestEvent,
    BackgroundEventEvent,
    CallToolResult,
    Duration,
    ExecApprovalRequestEvent,
    ExecCommandBeginEvent,
    ExecCommandEndEvent,
    ExecCommandOutputDeltaEvent,
    ExecOutputStream,
    McpToolCallBeginEvent,
    McpToolCallEndEvent,
    PatchApplyBeginEvent,
    PatchApplyEndEvent,
    ReviewDecision,
    SandboxPolicy,
)
from broker.wire.results import EXIT_INTERRUPTED, new_call_id

if TYPE_CHECKING:
    from agent.session import AgentTask, Session

log = structlog.get_logger("agent.tool_calls")

ABORTED = "aborted"
REJECTED_BY_USER = "exec command rejected by user"
PATCH_REJECTED_BY_USER = "patch rejected by user"
INPUT_REJECTED_BY_USER = "write_stdin rejected by user"
_APPROVED = (ReviewDecision.APPROVED, ReviewDecision.APPROVED_FOR_SESSION)
# The policy of the one write batch of a patch approved into a protected .git/.sluice.
UNRESTRICTED_WRITES = SandboxPolicy.from_mode("danger-full-access")


async def handle_response_item(sess: Session, task: AgentTask, item: Item) -> ToolOutput | None:
    """Show ``item`` to the frontends; carry it out if it is a call. Returns the call's output."""
    kind = item.get("type")
    sub_id = task.sub_id
    if kind == "message":
        for text in output_texts(item):
            sess.send(sub_id, AgentMessageEvent(text))
        return None
    if kind == "reasoning":
        for part in item.get("summary") or []:
            sess.send(sub_id, AgentReasoningEvent(part.get("text", "")))
        if sess.show_raw_agent_reasoning:
            for part in item.get("content") or []:
                sess.send(sub_id, AgentReasoningRawContentEvent(part.get("text", "")))
        return None
    if kind == "function_call":
        return await handle_function_call(sess, task, item.get("name", ""), item.get("arguments", ""), item["call_id"])
    if kind == "local_shell_call":
        call_id = item.get("call_id") or ""
        if not call_id:
            return ToolOutput("", "LocalShellCall without call_id or id")
        action = item.get("action") or {}
        if action.get("type", "exec") != "exec":
            return ToolOutput(call_id, f"unsupported local shell action: {action.get('type')}")
        try:
            params = shell_params_from_local_call(action)
        except ArgumentError as err:
            return ToolOutput(call_id, str(err))
        return await handle_exec(sess, task, params, call_id)
    if kind == "custom_tool_call":
        return await handle_custom_tool_call(sess, task, item.get("name", ""), item.get("input", ""),
                                             item.get("call_id") or "")
    return None


async def handle_custom_tool_call(sess: Session, task: AgentTask, name: str, text: str, call_id: str) -> ToolOutput:
    """A freeform call (Responses ``custom_tool_call``): Codex's freeform ``apply_patch``,
    whose input is the patch itself, is applied as the ``apply_patch`` function is; any
    other name is answered that it is not a tool of this session."""
    if name == APPLY_PATCH:
        output = await handle_exec(sess, task, ShellParams(command=[APPLY_PATCH, text]), call_id)
    else:
        output = ToolOutput(call_id, f"unsupported custom tool call: {name}", success=False)
    return dataclasses.replace(output, custom=True)


async def handle_function_call(sess: Session, task: AgentTask, name: str, arguments: str, call_id: str) -> ToolOutput:
    try:
        if name in (SHELL, CONTAINER_EXEC):
            return await handle_exec(sess, task, parse_shell_arguments(arguments), call_id)
        if name == APPLY_PATCH:
            patch = parse_apply_patch_arguments(arguments)
            return await handle_exec(sess, task, ShellParams(command=[APPLY_PATCH, patch]), call_id)
        if name == UPDATE_PLAN:
            sess.send(task.sub_id, parse_plan_arguments(arguments))
            return ToolOutput(call_id, PLAN_UPDATED)
        # The interactive tools answer only when the session offers them.
        tools = sess.config.unified_exec.tools
        if name == UNIFIED_EXEC and tools == "seed":
            return await handle_unified_exec(sess, task, arguments, call_id)
        if name == EXEC_COMMAND and tools == "codex":
            return await handle_exec_command(sess, task, arguments, call_id)
        if name == WRITE_STDIN and tools == "codex":
            return await handle_write_stdin(sess, task, arguments, call_id)
        if sess.mcp is not None and name in sess.mcp.tools:
            return await handle_mcp_call(sess, task, name, arguments, call_id)
    except ArgumentError as err:
        return ToolOutput(call_id, str(err))
    return ToolOutput(call_id, f"unsupported call: {name}")


async def handle_mcp_call(sess: Session, task: AgentTask, name: str, arguments: str, call_id: str) -> ToolOutput:
    """A tool of one of the session's MCP servers (offered as ``name``): as the seed does it,
    ``mcp_tool_call_begin``, the call (its server's timeout), ``mcp_tool_call_end``, and the
    result as the model's function output. No approval is asked, as in the seed: the server
    runs in the sandbox. An interrupt cancels the call (the server is told) and ends it
    with an error result."""
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except ValueError as err:
        return ToolOutput(call_id, f"failed to parse function arguments: {err}")
    tool = sess.mcp.tools[name]
    sess.send(task.sub_id, McpToolCallBeginEvent(call_id, tool.server, tool.name, parsed))
    try:
        outcome = await sess.mcp.call(name, parsed)
    except asyncio.CancelledError:
        cancelled = CallToolResult(content=[{"type": "text", "text": "cancelled: the turn was interrupted"}], is_error=True)
        sess.send(task.sub_id, McpToolCallEndEvent(call_id, False, cancelled))
        raise
    result = outcome.result
    shown = None if result is None else CallToolResult(
        content=result.get("content") if isinstance(result.get("content"), list) else [],
        is_error=result.get("isError") if isinstance(result.get("isError"), bool) else None,
        structured_content=result.get("structuredContent"),
    )
    if shown is None:
        shown = CallToolResult(content=[{"type": "text", "text": f"tool call failed: {outcome.why}"}], is_error=True)
    sess.send(task.sub_id, McpToolCallEndEvent(call_id, outcome.success, shown))
    return ToolOutput(call_id, outcome.output, outcome.success)


class WorkdirError(ValueError):
    """The model's ``workdir`` is not a directory a command can run in; says why."""


def resolve_workdir(session_cwd: str, workdir: str | None) -> str:
    """Where a command with ``workdir`` runs: ``workdir`` resolved against ``session_cwd``
    (absolute and normalised; the session cwd when there is none).

    Raises :class:`WorkdirError` when that is not an existing directory. Where it runs
    grants nothing: the sandbox's ``disk-write-cwd`` stays ``session_cwd``.
    """
    if not workdir:
        return session_cwd
    if "\0" in workdir:
        raise WorkdirError(f"workdir {workdir!r} contains a NUL byte")
    path = os.path.normpath(os.path.join(session_cwd, workdir))
    if path.startswith("//"):  # POSIX keeps a leading "//"; here it means "/"
        path = "/" + path.lstrip("/")
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise WorkdirError(f"workdir {workdir!r} does not exist ({path})") from None
    except OSError as err:
        raise WorkdirError(f"workdir {workdir!r} cannot be used ({path}): {err.strerror}") from None
    if not stat.S_ISDIR(mode):
        raise WorkdirError(f"workdir {workdir!r} is not a directory ({path})")
    return path


async def handle_exec(sess: Session, task: AgentTask, params: ShellParams, call_id: str) -> ToolOutput:
    config = sess.config
    argv = list(params.command)
    try:
        cwd = resolve_workdir(config.cwd, params.workdir)
    except WorkdirError as err:
        return ToolOutput(call_id, f"error: {err}", success=False)

    patch = maybe_parse_apply_patch(argv, cwd)
    if isinstance(patch, PatchError):
        return ToolOutput(call_id, f"error: {patch}")
    if patch is not None:
        return await apply_patch(sess, task, call_id, patch)

    decision = await approve_command(sess, task, call_id, argv, cwd, escalation_requested(params),
                                     params.justification)
    if isinstance(decision, ToolOutput):
        return decision
    sandboxed = decision

    timeout_ms = params.timeout_ms or sess.default_timeout_ms
    result, output = await run_command(sess, task, call_id, argv, cwd, sandboxed, timeout_ms)
    if sandboxed and should_retry_unsandboxed(result, config.approval_policy, sess.sandbox_policy):
        if not await approve_retry(sess, task, call_id, argv, cwd, result):
            return output  # the failure, as it was
        result, output = await run_command(sess, task, call_id, argv, cwd, False, timeout_ms)
    elif sandboxed and should_report_denial(result, config.approval_policy, sess.sandbox_policy):
        return _denial_output(call_id, result)
    return output


def session_files(sess: Session) -> SandboxFiles:
    """The session's files as a ``shell`` call of the session sees them: its policy
    (granted roots included), its directory, its limits."""
    return SandboxFiles(sess.runner, sess.sandbox_policy, sess.config.cwd, limits=sess.command_limits)


async def _verified(parsed: ParsedPatch, files: Conversation) -> ApplyPatchAction | PatchError:
    """``parsed`` checked against the files as the session's sandbox reads them."""
    reads, stats = paths_to_read(parsed)
    try:
        return verify_patch(parsed, await files.read(reads, stats))
    except PatchError as err:
        return err
    except FileAccessError as err:
        return PatchError(f"could not read the files the patch touches: {err}")


async def approve_command(
    sess: Session, task: AgentTask, call_id: str, argv: list[str], cwd: str, escalate: bool,
    justification: str | None, *, interactive: bool = False,
) -> bool | ToolOutput:
    """Whether to run ``argv`` sandboxed (True) or not (False), asking the user if the
    policies say so; a :class:`ToolOutput` for the model when it must not run.
    ``interactive``: it starts a session the model types into (the request says so)."""
    config = sess.config
    safety = assess_command_safety(argv, config.approval_policy, sess.sandbox_policy, sess.approved_commands, escalate)
    if isinstance(safety, Reject):
        return ToolOutput(call_id, f"exec command rejected: {safety.reason}")
    if isinstance(safety, AskUser):
        if justification == RETRY_WITHOUT_SANDBOX_REASON:
            justification = None  # frontends show that reason as sluice's, not as the model's
        request = ExecApprovalRequestEvent(call_id, argv, cwd, safety.reason or justification,
                                           interactive=interactive)
        decision = await sess.request_approval(task, call_id, request)
        if decision not in _APPROVED:
            return ToolOutput(call_id, REJECTED_BY_USER)
        if decision == ReviewDecision.APPROVED_FOR_SESSION:
            sess.approved_commands.add(tuple(argv))
        # Approved by a person: run unsandboxed, as Codex does (it is usually approved
        # precisely because it needs what the sandbox forbids).
        return False
    assert isinstance(safety, AutoApprove)
    return safety.run_sandboxed


async def approve_retry(sess: Session, task: AgentTask, call_id: str, argv: list[str], cwd: str,
                        result: ExecResult, *, interactive: bool = False) -> bool:
    """After a sandboxed run that looks denied: ask "retry without sandbox?"; True if approved.

    Approved once or for the session, the command joins the approved set, as in the seed:
    the user has seen it fail in the sandbox, so asking again for the same command would
    only repeat the failure first."""
    sess.send(task.sub_id, BackgroundEventEvent(f"Execution failed: {_denial_summary(result)}"))
    request = ExecApprovalRequestEvent(call_id, argv, cwd, RETRY_WITHOUT_SANDBOX_REASON, interactive=interactive)
    decision = await sess.request_approval(task, call_id, request)
    if decision not in _APPROVED:
        return False
    sess.approved_commands.add(tuple(argv))
    sess.send(task.sub_id, BackgroundEventEvent("retrying command without sandbox"))
    return True


# -- long-lived commands (unified exec) -----------------------------------------------


async def _start_session(
    sess: Session, task: AgentTask, call_id: str, argv: list[str], cwd: str, *, escalate: bool,
    justification: str | None, tty: Winsize | None, stdin: bool, timeout_s: float,
) -> tuple[ExecSession, list[str], Collected] | ToolOutput:
    """Approve and start ``argv`` as a session exactly as ``shell`` runs a command, and
    gather its first output; a sandboxed start that exits looking denied is retried
    unsandboxed if the user approves, or reported to the model as a denial, as for
    ``shell``."""
    decision = await approve_command(sess, task, call_id, argv, cwd, escalate, justification, interactive=stdin)
    if isinstance(decision, ToolOutput):
        return decision
    sandboxed = decision
    manager = sess.unified_exec
    notes: list[str] = []

    async def start(sandboxed: bool) -> tuple[ExecSession, Collected]:
        policy = sess.sandbox_policy if sandboxed else sess.unsandboxed_policy
        session, more = await manager.open(
            argv, cwd, policy, call_id=call_id, sub_id=task.sub_id, sandboxed=sandboxed, tty=tty, stdin=stdin,
            env=session_env(sess.command_env), sandbox_cwd=sess.config.cwd, env_passthrough=sess.command_env_passthrough,
            limits=sess.command_limits)
        notes.extend(more)
        return session, await manager.collect(session, timeout_s, task.sub_id)

    session, collected = await start(sandboxed)
    result = collected.result
    if sandboxed and result is not None:
        if should_retry_unsandboxed(result, sess.config.approval_policy, sess.sandbox_policy):
            if await approve_retry(sess, task, call_id, argv, cwd, result, interactive=stdin):
                session, collected = await start(False)
        elif should_report_denial(result, sess.config.approval_policy, sess.sandbox_policy):
            denial = _denial_output(call_id, result)
            # A session closed to make room is still news to the model.
            return dataclasses.replace(denial, content="".join(f"{note}\n" for note in notes) + denial.content)
    return session, notes, collected


def _session_text(notes: list[str], collected: Collected) -> str:
    text = "".join(f"{note}\n" for note in notes) + _text(collected.output)
    result = collected.result
    if result is not None and result.error and result.error not in text:
        text += f"{result.error}\n"  # it never ran (or its executor failed): say why
    if result is not None and result.limit:
        text += f"sluice: {result.limit}\n"
    return text


async def handle_unified_exec(sess: Session, task: AgentTask, arguments: str, call_id: str) -> ToolOutput:
    """The seed's ``unified_exec`` tool."""
    params, session_id = parse_unified_exec_arguments(arguments)
    timeout_ms, warning = clamp_timeout(params.timeout_ms)
    manager = sess.unified_exec
    if session_id is None:
        argv = list(params.input)
        cwd = sess.config.cwd
        patch = maybe_parse_apply_patch(argv, cwd)
        if isinstance(patch, PatchError):
            return ToolOutput(call_id, f"error: {patch}")
        if patch is not None:
            return await apply_patch(sess, task, call_id, patch)
        started = await _start_session(sess, task, call_id, argv, cwd, escalate=escalation_requested(params),
                                       justification=params.justification, tty=DEFAULT_WINSIZE, stdin=True,
                                       timeout_s=timeout_ms / 1000)
        if isinstance(started, ToolOutput):
            return started
        session, notes, collected = started
    else:
        try:
            session = manager.get(session_id)
        except UnknownSessionId as err:
            return ToolOutput(call_id, f"unified exec failed: {err}", success=False)
        notes = []
        text = " ".join(params.input)
        refused = await approve_input(sess, task, call_id, session, text)
        if refused is not None:
            return refused
        await manager.write(session, text.encode(), task.sub_id)
        collected = await manager.collect(session, timeout_ms / 1000, task.sub_id)
    output = (warning or "") + _session_text(notes, collected)
    live_id = None if collected.result is not None else session.id
    return ToolOutput(call_id, format_unified_exec_output(live_id, output), success=True)


STDIN_CLOSED = "stdin is closed for this session; rerun exec_command with tty=true to keep stdin open"
DEFAULT_SHELL = "/bin/bash"


async def handle_exec_command(sess: Session, task: AgentTask, arguments: str, call_id: str) -> ToolOutput:
    """Codex's ``exec_command``: ``cmd`` in a shell, as a session."""
    params = parse_exec_command_arguments(arguments)
    try:
        cwd = resolve_workdir(sess.config.cwd, params.workdir)
    except WorkdirError as err:
        return ToolOutput(call_id, f"exec_command failed: {err}", success=False)
    shell = params.shell or (DEFAULT_SHELL if os.path.exists(DEFAULT_SHELL) else "/bin/sh")
    login = True if params.login is None else params.login
    argv = [shell, "-lc" if login else "-c", params.cmd]
    patch = maybe_parse_apply_patch(argv, cwd)
    if isinstance(patch, PatchError):
        return ToolOutput(call_id, f"error: {patch}")
    if patch is not None:
        return await apply_patch(sess, task, call_id, patch)
    started = await _start_session(
        sess, task, call_id, argv, cwd, escalate=escalation_requested(params),
        justification=params.justification, tty=DEFAULT_WINSIZE if params.tty else None, stdin=params.tty,
        timeout_s=clamp_yield_time(params.yield_time_ms) / 1000)
    if isinstance(started, ToolOutput):
        return started
    session, notes, collected = started
    return _exec_command_answer(call_id, session, collected, _session_text(notes, collected), params.max_output_tokens)


async def handle_write_stdin(sess: Session, task: AgentTask, arguments: str, call_id: str) -> ToolOutput:
    """Codex's ``write_stdin``: type into a session (or only poll it)."""
    params = parse_write_stdin_arguments(arguments)
    manager = sess.unified_exec
    try:
        session = manager.get(params.session_id)
    except UnknownSessionId as err:
        return ToolOutput(call_id, f"write_stdin failed: {err}", success=False)
    if params.chars:
        if session.process is None or not session.process.tty:
            return ToolOutput(call_id, f"write_stdin failed: {STDIN_CLOSED}", success=False)
        refused = await approve_input(sess, task, call_id, session, params.chars)
        if refused is not None:
            return refused
        await manager.write(session, params.chars.encode(), task.sub_id)
    collected = await manager.collect(session, clamp_yield_time(params.yield_time_ms) / 1000, task.sub_id)
    return _exec_command_answer(call_id, session, collected, _session_text([], collected), params.max_output_tokens)


async def approve_input(sess: Session, task: AgentTask, call_id: str, session: ExecSession,
                        text: str) -> ToolOutput | None:
    """Ask before ``text`` is typed into ``session`` when the policies say so
    (:func:`agent.safety.input_needs_approval`); the refusal for the model, or None to go
    on. Every write asks on its own: "always" approves this input, not the next (an
    unsandboxed shell is not handed over by one answer)."""
    if not text or not input_needs_approval(session.sandboxed, sess.config.approval_policy, sess.sandbox_policy):
        return None
    request = ExecApprovalRequestEvent(call_id, session.argv, session.cwd, interactive=True, stdin=text,
                                       process_id=str(session.id))
    if await sess.request_approval(task, call_id, request) not in _APPROVED:
        return ToolOutput(call_id, INPUT_REJECTED_BY_USER, success=False)
    return None


def _exec_command_answer(call_id: str, session: ExecSession, collected: Collected, text: str,
                         max_output_tokens: int | None) -> ToolOutput:
    result = collected.result
    content = format_exec_command_output(
        text, chunk_id=secrets.token_hex(3), wall_time_s=collected.wall_time_s,
        exit_code=result.returncode if result is not None else None,
        session_id=session.id if result is None else None, max_output_tokens=max_output_tokens)
    return ToolOutput(call_id, content, success=True)


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _clip(text: str, limit: int = 200) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _denial_summary(result: ExecResult) -> str:
    """The denial for a person (a background event): stdout and stderr clipped short."""
    return sandbox_denied_error(result.returncode, _clip(_text(result.stdout)), _clip(_text(result.stderr)))


def _denial_output(call_id: str, result: ExecResult) -> ToolOutput:
    """The seed's answer to a call whose command the sandbox denied (under ``on-request``
    and ``never``)."""
    return ToolOutput(call_id, format_sandbox_denial(result.returncode, _text(result.stdout), _text(result.stderr)),
                      success=False)


async def run_command(
    sess: Session, task: AgentTask, call_id: str, argv: list[str], cwd: str, sandboxed: bool, timeout_ms: int
) -> tuple[ExecResult, ToolOutput]:
    """Run one command with its begin / delta / end events; the result and the model's answer."""
    sub_id = task.sub_id
    sess.send(sub_id, ExecCommandBeginEvent(call_id, argv, cwd))

    streamed = StreamedOutput()

    def on_output(stream: ExecOutputStream, chunk: bytes) -> None:
        streamed.add(stream, chunk)
        sess.send(sub_id, ExecCommandOutputDeltaEvent(call_id, stream, chunk))

    policy = sess.sandbox_policy if sandboxed else sess.unsandboxed_policy
    run_id = new_call_id()  # unique at the broker, whatever the model called it
    task.running_calls.add(run_id)
    started = time.monotonic()
    try:
        # The session's cwd, never the workdir, is what disk-write-cwd makes writable.
        result = await sess.runner.run(argv, cwd, policy, timeout_ms, on_output, call_id=run_id, env=sess.command_env,
                                       sandbox_cwd=sess.config.cwd, env_passthrough=sess.command_env_passthrough,
                                       limits=sess.command_limits)
    except asyncio.CancelledError:
        # What it printed before it was stopped, as far as it streamed.
        out, err, both = streamed.texts()
        sess.send(sub_id, ExecCommandEndEvent(
            call_id=call_id, stdout=out, stderr=err, aggregated_output=both, exit_code=EXIT_INTERRUPTED,
            duration=Duration.from_seconds(time.monotonic() - started), formatted_output=ABORTED,
        ))
        raise
    finally:
        task.running_calls.discard(run_id)

    stdout, stderr = _text(result.stdout), _text(result.stderr)
    aggregated = _text(result.aggregated)
    if result.error and result.error not in stderr:
        # It never ran (or its executor failed): the reason is all the output there is.
        stderr = f"{stderr}{result.error}\n" if stderr else f"{result.error}\n"
        aggregated = f"{aggregated}{result.error}\n"
    if result.limit:
        # A resource limit it ran into ("killed: memory limit 512 MiB reached"): the model
        # must know, or it retries the same thing.
        stderr = f"{stderr}sluice: {result.limit}\n"
        aggregated = f"{aggregated}sluice: {result.limit}\n"
    duration = result.duration_s or (time.monotonic() - started)
    exit_code = result.returncode
    formatted = model_output_text(aggregated, timed_out=result.timed_out, timeout_ms=timeout_ms)
    sess.send(sub_id, ExecCommandEndEvent(
        call_id=call_id, stdout=cap_stream_output(stdout), stderr=cap_stream_output(stderr),
        aggregated_output=cap_stream_output(aggregated), exit_code=exit_code,
        duration=Duration.from_seconds(duration), formatted_output=formatted,
    ))
    output = ToolOutput(call_id, format_exec_output(formatted, exit_code, duration), success=exit_code == 0)
    return result, output


async def apply_patch(sess: Session, task: AgentTask, call_id: str, parsed: ParsedPatch) -> ToolOutput:
    """Verify, approve and write ``parsed``. With nothing to ask (the common case) one
    sandboxed process reads the files, then, once verified here, writes the change; an
    approval between the two means a process of its own for the write, in the policy
    the approval leaves (a root granted, or none of the write restrictions)."""
    config = sess.config
    async with session_files(sess).conversation() as files:
        action = await _verified(parsed, files)
        if isinstance(action, PatchError):
            return ToolOutput(call_id, f"error: {action}")
        policy = sess.sandbox_policy
        roots = writable_roots_for(policy, config.cwd, sess.command_env)
        safety = assess_patch_safety(action.written_paths(), config.approval_policy, roots, config.cwd,
                                     sandbox_policy=policy)
        if isinstance(safety, AutoApprove):
            return await _write_patch(sess, task, call_id, action, files, auto_approved=True)
    if isinstance(safety, Reject):
        return ToolOutput(call_id, f"patch rejected: {safety.reason}", success=False)
    request = ApplyPatchApprovalRequestEvent(call_id, action.changes, safety.reason, safety.grant_root)
    decision = await sess.request_approval(task, call_id, request)
    if decision not in _APPROVED:
        return ToolOutput(call_id, PATCH_REJECTED_BY_USER, success=False)
    if safety.grant_root is not None:
        sess.grant_root(safety.grant_root)
    writer = session_files(sess)  # a root granted above is in its policy now
    if safety.unrestricted:
        # Approved into a protected .git/.sluice: this batch alone, not the session.
        writer = SandboxFiles(sess.runner, UNRESTRICTED_WRITES, config.cwd, limits=sess.command_limits)
    return await _write_patch(sess, task, call_id, action, writer, auto_approved=False)


async def _write_patch(sess: Session, task: AgentTask, call_id: str, action: ApplyPatchAction,
                       files: SandboxFiles | Conversation, *, auto_approved: bool) -> ToolOutput:
    sess.send(task.sub_id, PatchApplyBeginEvent(call_id, auto_approved, action.changes))
    if task.diff is not None:
        task.diff.on_patch_begin(action)
    started = time.monotonic()
    # Written in the sandbox, so the kernel decides at the moment of each write, as for
    # a command of the session.
    try:
        # Shielded: an interrupt must not stop the sandbox between two renames.
        answer = await asyncio.shield(files.run(change_ops(action)))
        outcome = outcome_of(action, answer.get("failed"))
    except FileAccessError as err:
        outcome = ApplyOutcome("", f"Failed to apply the patch: {err}\n", False)
    duration = time.monotonic() - started
    sess.send(task.sub_id, PatchApplyEndEvent(call_id, outcome.stdout, outcome.stderr, outcome.success))
    text = outcome.stdout if outcome.success else outcome.stderr
    return ToolOutput(call_id, format_exec_output(text, 0 if outcome.success else 1, duration), success=outcome.success)
