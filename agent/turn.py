"""The task loop: model requests, their streamed answers, tool calls, until the model is done.

Codex's ``run_task`` / ``run_turn`` / ``handle_response_item``. A task (one user input)
runs turns; each turn is one model request whose input is the whole conversation plus
whatever the user typed meanwhile. While the answer streams, text and reasoning deltas
go out as events; each finished output item is recorded and, if it is a tool call,
carried out (:mod:`agent.tool_calls`) and its output recorded. A turn that produced no
tool output ends the task (unless more input arrived), with ``task_complete`` carrying
the last assistant message and the ``notify`` program told.

Every item is written to the rollout as it is recorded, before the events about it go
out; the rollout is synced to disk before the task's last event (``task_complete``, or
its ``error``).

A call left without output (the task was interrupted while it ran) is answered
``aborted`` in the next request (:func:`agent.items.with_aborted_outputs`).

Model errors: the client retries by itself (each retry announced as a
``background_event``); what it gives up on ends the task with an ``error`` event, and no
``task_complete``, as in Codex.

Compaction (:func:`run_compact_task`) asks the model to summarise the conversation with
:data:`SUMMARIZATION_PROMPT` as the instructions and no tools, then keeps only the
summary (Codex keeps the last message: the summary).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from agent import items as conv
from agent.apply_patch import TurnDiffTracker
from agent.model_client import (
    Completed,
    ModelError,
    OutputItemDone,
    OutputTextDelta,
    Prompt,
    ReasoningContentDelta,
    ReasoningSummaryDelta,
)
from agent.notify import spawn_notifier, turn_complete_payload
from agent.sandbox_files import FileAccessError
from agent.tool_calls import handle_response_item, session_files
from agent.tools import ToolOutput, tools_for
from broker.wire.protocol import (
    AgentMessageDeltaEvent,
    AgentMessageEvent,
    AgentReasoningDeltaEvent,
    AgentReasoningRawContentDeltaEvent,
    BackgroundEventEvent,
    TaskCompleteEvent,
    TaskStartedEvent,
    TurnDiffEvent,
)

if TYPE_CHECKING:
    from agent.session import AgentTask, Session

log = structlog.get_logger("agent.turn")

SUMMARIZATION_PROMPT = """\
You are summarising a conversation between a user and a coding agent so that the work \
can continue from your summary alone; the conversation itself will be discarded.

Write a concise summary that keeps everything needed to carry on:
- the user's goal and every requirement or preference they stated;
- what has been done so far: files changed (with paths), commands run and what they showed;
- the current state: what works, what fails, errors still open;
- the next steps that were planned.

Do not invent anything. Write it as plain text addressed to the agent that will continue."""
START_SUMMARIZATION = "Start Summarization"
COMPACT_DONE = "Compact task completed"


@dataclass
class _Turn:
    """What one model request produced: its output items and the answers to its calls."""

    items: list[conv.Item] = field(default_factory=list)
    outputs: list[ToolOutput] = field(default_factory=list)


async def run_task(sess: Session, task: AgentTask) -> None:
    """A user task, from ``task_started`` to ``task_complete`` (or an error)."""
    sub_id = task.sub_id
    try:
        sess.send(sub_id, TaskStartedEvent())
        config = sess.config
        if config.missing_key is not None:
            sess.error(sub_id, config.missing_key)
            return
        # Every input is announced as it joins the conversation, so every attached
        # frontend (and a late one, from the journal) sees what was asked.
        first = conv.user_message(task.inputs)
        if task.inputs:
            sess.send(sub_id, conv.user_message_event(task.inputs))
        if first is not None:
            sess.record([first])
        task.input_messages = conv.input_texts(task.inputs) + task.input_messages
        task.diff = TurnDiffTracker(cwd=config.cwd)
        last_diff: str | None = None
        while True:
            for inputs in sess.take_pending_input():
                sess.send(sub_id, conv.user_message_event(inputs))
                message = conv.user_message(inputs)
                if message is not None:
                    sess.record([message])
            turn = await run_turn(sess, task)
            diff = await turn_diff(sess, task.diff)
            if diff is not None and diff != last_diff:
                last_diff = diff
                sess.send(sub_id, TurnDiffEvent(diff))
            if not turn.outputs and not sess.has_pending_input:
                break
        last_message = conv.last_assistant_message(turn.items)
        await sess.sync_rollout()
        if config.notify:
            payload = turn_complete_payload(sub_id, task.input_messages, last_message)
            await spawn_notifier(config.notify, payload)
        sess.send(sub_id, TaskCompleteEvent(last_message))
    except ModelError as err:
        log.info("turn failed", error=str(err))
        await sess.sync_rollout()
        sess.error(sub_id, str(err))
    except asyncio.CancelledError:
        raise
    except Exception as err:  # a bug: say so instead of leaving the frontends waiting
        log.exception("task failed")
        sess.error(sub_id, f"internal error: {err}")
    finally:
        sess.task_finished(task)


async def turn_diff(sess: Session, tracker: TurnDiffTracker) -> str | None:
    """The turn's diff so far, the files read as they are now through the session's
    sandbox (None: nothing changed, or they could not be read)."""
    if not tracker.tracks_anything:
        return None
    try:
        now = await session_files(sess).read(tracker.current_paths())
    except FileAccessError as err:
        log.warning("turn diff: files unreadable", error=str(err))
        return None
    return tracker.get_unified_diff(now)


def _prompt(sess: Session, **overrides: object) -> Prompt:
    config = sess.config
    fields = {
        "input": conv.with_aborted_outputs(sess.history),
        "instructions": config.instructions,
        "tools": tools_for(config.approval_policy, config.sandbox_policy, config.unified_exec.tools)
        + (sess.mcp.declarations() if sess.mcp is not None else []),
        "model": config.model,
        "reasoning": config.reasoning,
        "prompt_cache_key": str(sess.session_id),
    }
    fields.update(overrides)
    return Prompt(**fields)


async def run_turn(sess: Session, task: AgentTask) -> _Turn:
    """One model request and everything its answer asks for."""
    sub_id = task.sub_id
    turn = _Turn()

    def announce(message: str) -> None:
        sess.send(sub_id, BackgroundEventEvent(message))

    async for event in sess.client.stream(_prompt(sess), on_retry=announce):
        if isinstance(event, OutputTextDelta):
            sess.send(sub_id, AgentMessageDeltaEvent(event.delta))
        elif isinstance(event, ReasoningSummaryDelta):
            sess.send(sub_id, AgentReasoningDeltaEvent(event.delta))
        elif isinstance(event, ReasoningContentDelta):
            if sess.show_raw_agent_reasoning:
                sess.send(sub_id, AgentReasoningRawContentDeltaEvent(event.delta))
        elif isinstance(event, OutputItemDone):
            item = conv.normalize(event.item)
            if item.get("type") in conv.OUTPUT_TYPES:
                continue  # not something the model should send; Codex ignores it too
            turn.items.append(item)
            sess.record([item])
            output = await handle_response_item(sess, task, item)
            if output is not None:
                turn.outputs.append(output)
                sess.record([output.to_item()])
        elif isinstance(event, Completed):
            if event.token_usage is not None:
                sess.send(sub_id, event.token_usage)
    return turn


async def run_compact_task(sess: Session, task: AgentTask) -> None:
    """Summarise the conversation and keep only the summary."""
    sub_id = task.sub_id
    try:
        sess.send(sub_id, TaskStartedEvent())
        if sess.config.missing_key is not None:
            sess.error(sub_id, sess.config.missing_key)
            return
        request = conv.with_aborted_outputs(sess.history) + [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": START_SUMMARIZATION}]}
        ]
        prompt = _prompt(sess, input=request, instructions=SUMMARIZATION_PROMPT, tools=[])
        produced: list[conv.Item] = []

        def announce(message: str) -> None:
            sess.send(sub_id, BackgroundEventEvent(message))

        async for event in sess.client.stream(prompt, on_retry=announce):
            if isinstance(event, OutputItemDone):
                produced.append(conv.normalize(event.item))
            elif isinstance(event, Completed) and event.token_usage is not None:
                sess.send(sub_id, event.token_usage)
        summary = [item for item in produced if conv.output_texts(item)]
        if not summary:
            sess.error(sub_id, "the model returned no summary; the conversation was kept as it was")
            return
        # The conversation starts over from the summary, told its environment again (as Codex).
        sess.replace_history([sess.environment_item(), *summary[-1:]])
        await sess.sync_rollout()
        sess.send(sub_id, AgentMessageEvent(COMPACT_DONE))
        sess.send(sub_id, TaskCompleteEvent(None))
    except ModelError as err:
        sess.error(sub_id, str(err))
    except asyncio.CancelledError:
        raise
    except Exception as err:
        log.exception("compact task failed")
        sess.error(sub_id, f"internal error: {err}")
    finally:
        sess.task_finished(task)
