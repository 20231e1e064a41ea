"""What the events of a session say, for every frontend command alike (exec, attach,
bridge): an event's type, whether it ends a turn and with what exit status, the session's
state as its events tell it (:class:`SessionView`), the answer to an approval request,
and whether a descriptor is a terminal to ask on."""

from __future__ import annotations

import os

from broker.wire import frames as wire
from broker.wire.protocol import (
    TURN_INTERRUPTED,
    Event,
    ExecApproval,
    PatchApproval,
    ReviewDecision,
    is_rollout_error,
)
from broker.wire.results import DAEMON_SHUTTING_DOWN, EXIT_DAEMON_STOPPED, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK

APPROVAL_REQUESTS = ("exec_approval_request", "apply_patch_approval_request")
# Events only a running task emits: they name the turn when its task_started was not seen.
TURN_EVENTS = frozenset({
    "agent_message", "agent_message_delta", "agent_reasoning", "agent_reasoning_delta",
    "agent_reasoning_raw_content", "agent_reasoning_raw_content_delta", "exec_command_begin",
    "exec_command_output_delta", "exec_command_end", "patch_apply_begin", "patch_apply_end",
    "turn_diff", "plan_update", "token_count", "background_event", *APPROVAL_REQUESTS,
})


def tag_of(event: Event) -> str:
    """The event's ``type`` as Codex spells it (``task_complete``, ``exec_command_begin``...)."""
    return type(event.msg).__struct_config__.tag


def turn_end(event: Event) -> int | None:
    """How ``event`` ends its turn, as an exit status: 0 completed, 130 aborted, 75 the
    daemon shut down, 1 failed (an error other than the interruption notice, or the
    rollout's failure, after which the session goes on: :func:`rollout_failed`); None if it
    does not end one."""
    tag = tag_of(event)
    if tag == "task_complete":
        return EXIT_OK
    if tag == "turn_aborted":
        return EXIT_INTERRUPTED
    if tag == "error" and event.msg.message.startswith(DAEMON_SHUTTING_DOWN):  # maybe with what ends unanswered
        return EXIT_DAEMON_STOPPED
    if tag == "error" and event.msg.message != TURN_INTERRUPTED and not is_rollout_error(event.msg.message):
        return EXIT_FAILED
    return None


def rollout_failed(event: Event) -> bool:
    """Whether ``event`` says the session's rollout file can no longer be written (a full
    disk): the session goes on, unrecorded."""
    return tag_of(event) == "error" and is_rollout_error(event.msg.message)


def approval_answer(request: Event, decision: ReviewDecision) -> ExecApproval | PatchApproval:
    """The Op that answers an approval request event with ``decision``."""
    if tag_of(request) == "exec_approval_request":
        return ExecApproval(request.id, decision)
    return PatchApproval(request.id, decision)


def isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


class SessionView:
    """A session's state as its events tell it: whether a turn runs and which, how the last
    one ended, which approval requests wait for an answer."""

    def __init__(self, info: wire.SessionInfo) -> None:
        self.running = info.state != wire.STATE_IDLE
        # The running (or last) turn's submission id; None until an event names it.
        self.turn: str | None = None
        # How the last turn ended, as an exit status: 0 completed, 1 failed, 130 aborted.
        self.outcome: int | None = None
        # call_id -> the request event, for approvals nobody has answered yet.
        self.requests: dict[str, Event] = {}
        # What the agent said last in the last turn that completed.
        self.last_message: str | None = None

    def update(self, event: Event) -> None:
        tag = tag_of(event)
        if tag == "task_started":
            self.running, self.turn, self.outcome = True, event.id, None
            return
        if tag in APPROVAL_REQUESTS:
            self.requests[event.msg.call_id] = event
        elif tag == "approval_resolved":
            self.requests.pop(event.msg.call_id, None)
        elif tag == "shutdown_complete":
            self._ended(self.outcome)
            return
        if not self.running:
            return
        if tag == "task_complete":
            self.last_message = event.msg.last_agent_message
        if self.turn is None:
            if tag in ("task_complete", "turn_aborted"):
                self._ended(turn_end(event))
            elif tag in TURN_EVENTS and event.id:
                self.turn = event.id
            return
        if event.id != self.turn:
            return
        outcome = turn_end(event)
        if outcome is not None:
            self._ended(outcome)

    def _ended(self, outcome: int | None) -> None:
        self.running = False
        self.outcome = outcome
        # What an ended turn asked can no longer be answered.
        self.requests.clear()
