"""How the frontends (``sluice exec``, ``sluice attach``) show a session's events: for a
person, or as JSON lines.

:class:`HumanRenderer`: the agent's words go to stdout as they stream (so
``sluice exec ... > answer.txt`` keeps just the answer); everything else goes to stderr:
a header, each command (``$ cmd``) with its output as it comes and how it ended, patches,
the plan, reasoning, retries and token usage. Plain ASCII, no colours when not a terminal.

:class:`JsonRenderer`: one Codex-shaped event per line on stdout,
``{"id":...,"msg":{...},"seq":N}``, exactly as :func:`broker.wire.protocol.encode_json` writes
it (output chunks base64).

Both write straight to the file descriptors (no buffering between an event and the
screen) and note a closed stdout instead of failing.

Approval requests are not rendered by :meth:`HumanRenderer.event`: the frontend decides
whether to ask (:data:`APPROVAL_PROMPT`, :func:`parse_approval_answer`) or only to say
what was asked (:func:`describe_approval`). An ``approval_resolved`` event is shown as
who answered what, unless the answer was this frontend's own (``me``).
"""

from __future__ import annotations

import os
import shlex

from broker.cli.base import write_all
from broker.wire.protocol import (
    AddFileChange,
    AgentMessageDeltaEvent,
    AgentMessageEvent,
    AgentReasoningDeltaEvent,
    AgentReasoningEvent,
    AgentReasoningRawContentEvent,
    ApplyPatchApprovalRequestEvent,
    ApprovalResolvedEvent,
    BackgroundEventEvent,
    DeleteFileChange,
    ErrorEvent,
    Event,
    ExecApprovalRequestEvent,
    ExecCommandBeginEvent,
    ExecCommandEndEvent,
    ExecCommandOutputDeltaEvent,
    PatchApplyBeginEvent,
    PatchApplyEndEvent,
    PlanUpdateEvent,
    ReviewDecision,
    SessionConfiguredEvent,
    StepStatus,
    TokenCountEvent,
    TurnAbortedEvent,
    UpdateFileChange,
    UserMessageEvent,
    encode_json,
)

_PLAN_MARKS = {StepStatus.COMPLETED: "[x]", StepStatus.IN_PROGRESS: "[>]", StepStatus.PENDING: "[ ]"}


def display_path(path: str, cwd: str) -> str:
    """``path`` relative to ``cwd`` when it is beneath it (shorter on screen), else as is."""
    if cwd and path.startswith(cwd.rstrip("/") + "/"):
        return os.path.relpath(path, cwd)
    return path


# -- approvals --------------------------------------------------------------------------

APPROVAL_PROMPT = "Allow? [y]es / [a]lways for this session / [n]o / abort: "

_ANSWERS = {
    "y": ReviewDecision.APPROVED, "yes": ReviewDecision.APPROVED,
    "a": ReviewDecision.APPROVED_FOR_SESSION, "always": ReviewDecision.APPROVED_FOR_SESSION,
    "n": ReviewDecision.DENIED, "no": ReviewDecision.DENIED,
    "abort": ReviewDecision.ABORT,
}

_DECISION_WORDS = {
    ReviewDecision.APPROVED: "approved",
    ReviewDecision.APPROVED_FOR_SESSION: "approved for this session",
    ReviewDecision.DENIED: "denied",
    ReviewDecision.ABORT: "denied and aborted the turn",
}


def parse_approval_answer(text: str) -> ReviewDecision | None:
    """The decision a person typed at :data:`APPROVAL_PROMPT`; None if it is not one."""
    return _ANSWERS.get(text.strip().lower())


def describe_approval(msg: ExecApprovalRequestEvent | ApplyPatchApprovalRequestEvent, cwd: str = "") -> str:
    """What an approval request asks, to follow "the agent asks to": ``run `ls` in /w (why)``."""
    if isinstance(msg, ExecApprovalRequestEvent):
        what = f"run `{shlex.join(msg.command)}` in {msg.cwd}"
    else:
        what = "apply a patch to " + ", ".join(display_path(path, cwd) for path in msg.changes)
        if msg.grant_root:
            what += f" (and allow writes beneath {msg.grant_root} for this session)"
    return what + (f" ({msg.reason})" if msg.reason else "")


def is_own(msg: ApprovalResolvedEvent, me: str) -> bool:
    """Whether ``msg.by`` (``frontend-7 (sluice attach)``) names the frontend ``me`` (``frontend-7``)."""
    return bool(me) and (msg.by == me or msg.by.startswith(me + " "))


class _Output:
    # This frontend's peer id (``frontend-7``), once connected.
    me = ""

    def __init__(self, out_fd: int = 1, err_fd: int = 2) -> None:
        self.out_fd = out_fd
        self.err_fd = err_fd
        self.stdout_closed = False

    def out(self, data: bytes) -> None:
        if self.stdout_closed or not data:
            return
        try:
            write_all(self.out_fd, data)
        except BrokenPipeError:
            self.stdout_closed = True

    def err(self, data: bytes) -> None:
        if not data:
            return
        try:
            write_all(self.err_fd, data)
        except OSError:
            pass

    def ask_approval(self, msg: ExecApprovalRequestEvent | ApplyPatchApprovalRequestEvent, cwd: str = "") -> None:
        """An approval request as a question for the person at the terminal, and the prompt
        for the answer (:func:`parse_approval_answer` reads it); the same in every frontend."""
        self.line(f"The agent asks to {describe_approval(msg, cwd)}.", "1;33")
        self.prompt(APPROVAL_PROMPT)


class HumanRenderer(_Output):
    """Events for a person; see the module docstring. ``header`` items open the session line."""

    def __init__(self, header: dict[str, str] | None = None, *, out_fd: int = 1, err_fd: int = 2,
                 color: bool | None = None, label: str = "sluice exec", me: str = "",
                 show_reasoning: bool = True) -> None:
        super().__init__(out_fd, err_fd)
        self.header = header or {}
        # Opens the line a session_configured event is shown as.
        self.label = label
        # This frontend's peer id (``frontend-7``): its own approval answers are not echoed.
        self.me = me
        # False: the agent's reasoning (summaries and raw text) is not shown.
        self.show_reasoning = show_reasoning
        if color is None:
            color = os.isatty(err_fd) and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
        self.color = color
        self.cwd = self.header.get("cwd", "")
        self._message_streamed = False
        self._message_open = False  # stdout has a partial line of agent text
        self._reasoning_streamed = False
        self._reasoning_open = False
        self._err_at_line_start = True
        self._streamed_calls: set[str] = set()

    # -- helpers ----------------------------------------------------------------------

    def _style(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def line(self, text: str, style: str = "") -> None:
        """A line of sluice's own on stderr, starting on a fresh line."""
        self._close_open_lines()
        if not self._err_at_line_start:
            self.err(b"\n")
        self.err((self._style(text, style) if style else text).encode("utf-8", "replace") + b"\n")
        self._err_at_line_start = True

    def _raw_err(self, data: bytes) -> None:
        if data:
            self.err(data)
            self._err_at_line_start = data.endswith(b"\n")

    def _close_open_lines(self) -> None:
        if self._message_open:
            self.out(b"\n")
            self._message_open = False
        if self._reasoning_open:
            self._raw_err(b"\n")
            self._reasoning_open = False

    def note(self, text: str) -> None:
        self.line(f"sluice: {text}", "2")

    @property
    def fresh_line(self) -> bool:
        """Whether stderr's last line is complete (nothing is left open, such as a prompt)."""
        return self._err_at_line_start

    def echoed(self, newline: bool) -> None:
        """The terminal echoed what a person typed: a line, newline and all, or a control
        character such as ``^C`` (what follows it goes on a new line)."""
        self._err_at_line_start = newline

    def prompt(self, text: str) -> None:
        """A question on stderr, the cursor left after it; the next line starts afresh."""
        self._close_open_lines()
        if not self._err_at_line_start:
            self._raw_err(b"\n")
        self._raw_err(text.encode("utf-8", "replace"))

    def error(self, message: str) -> None:
        self.line(f"error: {message}", "31")

    # -- events -----------------------------------------------------------------------

    def event(self, event: Event) -> None:
        msg = event.msg
        handler = getattr(self, "_on_" + type(msg).__struct_config__.tag, None)
        if handler is not None:
            handler(msg)

    def _on_session_configured(self, msg: SessionConfiguredEvent) -> None:
        parts = [f"session {msg.session_id}", f"model {msg.model}"]
        parts += [f"{k} {v}" for k, v in self.header.items() if k not in ("model",)]
        self.line(f"{self.label}: " + ", ".join(parts), "2")

    def _on_user_message(self, msg: UserMessageEvent) -> None:
        # What was asked, on one line: the first line of the text, and how many more.
        lines = msg.message.splitlines() or [""]
        more = f" (+{len(lines) - 1} lines)" if len(lines) > 1 else ""
        images = f" [{len(msg.images)} image(s)]" if msg.images else ""
        self.line(f"user: {lines[0]}{more}{images}", "1")

    def _on_agent_message_delta(self, msg: AgentMessageDeltaEvent) -> None:
        if self._reasoning_open:
            self._raw_err(b"\n")
            self._reasoning_open = False
        self.out(msg.delta.encode("utf-8", "replace"))
        self._message_streamed = True
        self._message_open = not msg.delta.endswith("\n")

    def _on_agent_message(self, msg: AgentMessageEvent) -> None:
        if not self._message_streamed:
            self._close_open_lines()
            self.out(msg.message.encode("utf-8", "replace"))
            self._message_open = not msg.message.endswith("\n")
        self._message_streamed = False
        if self._message_open:
            self.out(b"\n")
            self._message_open = False

    def _on_agent_reasoning_delta(self, msg: AgentReasoningDeltaEvent) -> None:
        if not self.show_reasoning:
            return
        if not self._reasoning_open:
            self._close_open_lines()
            if not self._err_at_line_start:
                self._raw_err(b"\n")
            self._raw_err(self._style("thinking: ", "2;3").encode())
            self._reasoning_open = True
        self._raw_err(self._style(msg.delta, "2;3").encode("utf-8", "replace"))
        self._reasoning_streamed = True

    def _on_agent_reasoning(self, msg: AgentReasoningEvent) -> None:
        if not self.show_reasoning:
            return
        if not self._reasoning_streamed:
            self.line(f"thinking: {msg.text}", "2;3")
        self._reasoning_streamed = False
        if self._reasoning_open:
            self._raw_err(b"\n")
            self._reasoning_open = False

    def _on_agent_reasoning_raw_content(self, msg: AgentReasoningRawContentEvent) -> None:
        # Sent only when the user asked for it (show_raw_agent_reasoning); shown whole, once.
        if self.show_reasoning:
            self.line(f"reasoning: {msg.text}", "2;3")

    def _on_exec_command_begin(self, msg: ExecCommandBeginEvent) -> None:
        where = f"   (in {msg.cwd})" if msg.cwd and msg.cwd != self.cwd else ""
        self.line(f"$ {shlex.join(msg.command)}{where}", "1")

    def _on_exec_command_output_delta(self, msg: ExecCommandOutputDeltaEvent) -> None:
        self._close_open_lines()
        self._streamed_calls.add(msg.call_id)
        self._raw_err(msg.chunk)

    def _on_exec_command_end(self, msg: ExecCommandEndEvent) -> None:
        if msg.call_id not in self._streamed_calls and msg.aggregated_output:
            self._raw_err(msg.aggregated_output.encode("utf-8", "replace"))
        self._streamed_calls.discard(msg.call_id)
        seconds = msg.duration.seconds
        self.line(f"[exit {msg.exit_code}, {seconds:.2f}s]", "32" if msg.exit_code == 0 else "31")

    def _on_patch_apply_begin(self, msg: PatchApplyBeginEvent) -> None:
        self.line("patch" + ("" if msg.auto_approved else " (approved)") + ":", "1")
        for path, change in msg.changes.items():
            path = display_path(path, self.cwd)
            if isinstance(change, AddFileChange):
                self.line(f"  A {path}")
            elif isinstance(change, DeleteFileChange):
                self.line(f"  D {path}")
            elif isinstance(change, UpdateFileChange):
                moved = f" -> {display_path(change.move_path, self.cwd)}" if change.move_path else ""
                self.line(f"  M {path}{moved}")

    def _on_patch_apply_end(self, msg: PatchApplyEndEvent) -> None:
        if msg.success:
            self.line("[patch applied]", "32")
        else:
            detail = (msg.stderr or msg.stdout).strip()
            self.line("[patch failed]" + (f" {detail}" if detail else ""), "31")

    def _on_plan_update(self, msg: PlanUpdateEvent) -> None:
        self.line("plan:", "1")
        if msg.explanation:
            self.line(f"  {msg.explanation}", "2")
        for item in msg.plan:
            self.line(f"  {_PLAN_MARKS.get(item.status, '[ ]')} {item.step}")

    def _on_token_count(self, msg: TokenCountEvent) -> None:
        inp = f"{msg.input_tokens} in" + (f" ({msg.cached_input_tokens} cached)" if msg.cached_input_tokens else "")
        out = f"{msg.output_tokens} out" + (
            f" ({msg.reasoning_output_tokens} reasoning)" if msg.reasoning_output_tokens else "")
        self.line(f"tokens: {inp}, {out}, {msg.total_tokens} total", "2")

    def _on_background_event(self, msg: BackgroundEventEvent) -> None:
        self.line(f"- {msg.message}", "2")

    def _on_error(self, msg: ErrorEvent) -> None:
        self.error(msg.message)

    def _on_turn_aborted(self, msg: TurnAbortedEvent) -> None:
        self.line(f"turn aborted ({msg.reason})", "33")

    def _on_approval_resolved(self, msg: ApprovalResolvedEvent) -> None:
        if not is_own(msg, self.me):
            self.line(f"{msg.by} answered: {_DECISION_WORDS.get(msg.decision, str(msg.decision))}", "33")

    def finish(self) -> None:
        self._close_open_lines()


class JsonRenderer(_Output):
    """One Codex-shaped event per line on stdout; sluice's own notes on stderr."""

    def event(self, event: Event) -> None:
        self.out(encode_json(event) + b"\n")

    def note(self, text: str) -> None:
        self.err(f"sluice: {text}\n".encode("utf-8", "replace"))

    def line(self, text: str, style: str = "") -> None:
        self.err(text.encode("utf-8", "replace") + b"\n")

    def prompt(self, text: str) -> None:
        self.err(text.encode("utf-8", "replace"))

    # Questions go to stderr, events to stdout: a question is never shown again below them.
    fresh_line = False

    def echoed(self, newline: bool) -> None:
        pass

    def error(self, message: str) -> None:
        self.event(Event(id="", msg=ErrorEvent(message)))

    def finish(self) -> None:
        pass
