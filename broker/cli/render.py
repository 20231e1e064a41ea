"""How the frontends (``sluice exec``, ``sluice attach``) show a session's events: for a
person, or as JSON lines.

:class:`HumanRenderer`: the agent's words go to stdout as they stream (so
``sluice exec ... > answer.txt`` keeps just the answer); everything else goes to stderr:
a header, each command (``$ cmd``) with its output as it comes and how it ended, patches,
the plan, reasoning, retries and token usage. Plain ASCII, no colours when not a terminal.

:class:`JsonRenderer`: one Codex-shaped event per line on stdout,
``{"id":...,"msg":{...},"seq":N}``, exactly as :func:`broker.wire.protocol.encode_json` writes
it (output chunks base64).

:class:`CodexJsonRenderer` (``--json=codex``): the same events as Codex 0.169's ``codex exec
--json`` prints them (``thread.started``, ``item.completed``...), made by
:class:`broker.cli.codex_json.CodexJsonl`.

All of them write straight to the file descriptors (no buffering between an event and the
screen) and note a closed stdout instead of failing.

Approval requests are not rendered by :meth:`HumanRenderer.event`: the frontend decides
whether to ask (:meth:`_Output.ask_approval`: :func:`approval_question`, a patch as its
unified diff per file, a shell script as the script, in plain words that an approved
command runs without the sandbox and whether it keeps running as an interactive
session, and last, right above the question, the real command and its directory; ``v``
shows what a long one left out; :func:`parse_approval_answer`; :meth:`_Output.answered`
confirms the answer in one line) or only to say what was asked (:func:`describe_approval`). An ``approval_resolved`` event
is shown as who answered what, unless the answer was this frontend's own (``me``); a
command approved (here or elsewhere) is marked as running WITHOUT the sandbox when it
starts. A patch applied is summed up (files, +/- lines).

Terminal safety: everything from the model, a server or a command is shown with its
control characters escaped (:func:`safe_text`, :class:`SafeStream`), so ``\x1b[31m`` or
an OSC sequence is seen, not obeyed; ``sluice run`` (not here) keeps a command's colours
and drops on a terminal only what acts outside the screen (:mod:`broker.cli.terminal_guard`).
What a question shows of model-controlled text goes further (:func:`visible`): one line,
nothing invisible or look-alike, the model's own words labelled and bounded
(:func:`model_words`), so no text of the model's can pass for the question's.

Less noise: token counts are summed and shown once when a turn ends (each as it comes
with ``verbose``); an interrupt the frontend announced itself is not announced again. On
a terminal, while a turn runs and nothing is shown, a status line on stderr says the agent
is at work (:meth:`HumanRenderer.tick`), cleared before anything else is written.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import time
import unicodedata

import msgspec

from broker.cli.base import write_all
from broker.cli.codex_json import CodexJsonl
from broker.wire.protocol import (
    RETRY_WITHOUT_SANDBOX_REASON,
    TURN_INTERRUPTED,
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
    ExecCommandStdinTypedEvent,
    FileChange,
    McpToolCallBeginEvent,
    McpToolCallEndEvent,
    PatchApplyBeginEvent,
    PatchApplyEndEvent,
    PlanUpdateEvent,
    ReviewDecision,
    SessionConfiguredEvent,
    StepStatus,
    TaskCompleteEvent,
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


# -- terminal safety --------------------------------------------------------------------

# C0 controls but \t and \n, DEL, and C1 controls (U+0080-U+009F): what would let text
# from the model, a server or a command drive the terminal (colours, titles, cursor moves,
# OSC 52 clipboard writes...). \r only when a \n follows it (a CRLF line end).
_UNSAFE = re.compile("\r(?!\n)|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\x80-\x9f]")


def _escape(match: re.Match) -> str:
    char = match.group()
    return "\\r" if char == "\r" else f"\\x{ord(char):02x}"


def safe_text(text: str) -> str:
    """``text`` with every terminal control character shown as its escape (``\x1b``,
    ``\r``), so it is seen instead of obeyed; ``\n``, ``\t`` and CRLF line ends stay."""
    return _UNSAFE.sub(_escape, text)


# What a question shows of text the model controls (a command, a path, a file name, its
# justification) must read as exactly what it is, on the line where it is printed. Beyond
# what safe_text escapes: every line break and tab (a justification of 40 newlines would
# push the real command off the screen), the invisible characters (bidi controls that
# reorder a line, zero-width ones, soft hyphens, tags), spaces other than the space (a
# no-break space joins two words into one argument), combining marks (U+0338 overlays a
# stroke), private-use and unassigned ones (a font may draw anything), and non-ASCII
# punctuation and symbols: the look-alikes of "/" (U+2215, U+2044, U+29F8, U+FF0F...),
# quotes, dashes, pipes and semicolons that would make a path or a command read as
# another. Letters and digits of every script stay, except the forms that fold to ASCII
# (fullwidth, mathematical) and the Latin clicks drawn as "|" and "!".
_VISIBLE_CATEGORIES = frozenset({"L", "N"})
_LOOKALIKE_LETTERS = frozenset("\u01c0\u01c1\u01c2\u01c3")
_NOT_PLAIN = re.compile("[^ -~]")  # printable ASCII is always itself
_NAMED_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _visible_char(char: str) -> str:
    if " " <= char <= "~":
        return char
    if char in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[char]
    code = ord(char)
    if code < 0xA0:  # C0, DEL, C1
        return f"\\x{code:02x}"
    if (unicodedata.category(char)[0] in _VISIBLE_CATEGORIES and char not in _LOOKALIKE_LETTERS
            and not unicodedata.normalize("NFKC", char).isascii()):
        return char
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def visible(text: str, *, limit: int | None = None, tabs: bool = False) -> str:
    """``text`` as a question shows what the model controls: one line on which every
    character is either plainly itself or its escape (``\n``, ``\x1b``, ``\u202e``,
    ``\u2215``; see the comment above for which). ``limit``: at most that many
    characters of the result, then how many were left out. ``tabs``: a tab stays (a line
    of a script or a diff; a tab only moves the cursor right, over blanks)."""
    def show(char: str) -> str:
        return char if tabs and char == "\t" else _visible_char(char)

    if limit is None:
        return _NOT_PLAIN.sub(lambda match: show(match.group()), text)
    shown: list[str] = []
    length = 0
    for index, char in enumerate(text):  # stops at the limit: no more work than it shows
        piece = show(char)
        if length + len(piece) > limit:
            return "".join(shown) + f"... ({len(text) - index} more characters)"
        shown.append(piece)
        length += len(piece)
    return "".join(shown)


class SafeStream:
    """:func:`safe_text` for a byte stream that may split characters (and a CRLF) across
    chunks: :meth:`feed` returns what can be shown so far, :meth:`flush` the rest."""

    def __init__(self) -> None:
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._held + chunk
        keep = 0
        # An incomplete UTF-8 sequence (or a \r whose \n may come next) waits for the rest.
        for back in range(1, min(4, len(data)) + 1):
            byte = data[-back]
            if back == 1 and byte == 0x0D:
                keep = 1
                break
            if byte & 0xC0 == 0xC0:  # a lead byte: complete if enough bytes follow it
                need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
                keep = back if back < need else 0
                break
            if byte < 0x80:
                break
        self._held = data[len(data) - keep:] if keep else b""
        return self._show(data[:len(data) - keep])

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return self._show(held)

    @staticmethod
    def _show(data: bytes) -> bytes:
        return safe_text(data.decode("utf-8", "replace")).encode("utf-8")


# -- patches ----------------------------------------------------------------------------


def _diff_lines(text: str) -> list[str]:
    return text.splitlines()


def change_counts(change: FileChange) -> tuple[int, int]:
    """Lines (added, removed) by one file's change (a deleted file: unknown, 0 and 0)."""
    if isinstance(change, AddFileChange):
        return len(change.content.splitlines()), 0
    if isinstance(change, UpdateFileChange):
        lines = _diff_lines(change.unified_diff)
        added = sum(1 for line in lines if line.startswith("+") and not line.startswith("+++ "))
        removed = sum(1 for line in lines if line.startswith("-") and not line.startswith("--- "))
        return added, removed
    return 0, 0


def patch_summary(changes: dict[str, FileChange], cwd: str = "") -> str:
    """What a patch changed in one line: ``2 files changed, +5 -1 (A hello.py, M b.py)``."""
    added = removed = 0
    names = []
    for path, change in changes.items():
        plus, minus = change_counts(change)
        added += plus
        removed += minus
        names.append(f"{change_letter(change)} {visible(display_path(path, cwd))}{_moved(change, cwd)}")
    files = f"{len(changes)} file{'s' if len(changes) != 1 else ''} changed"
    return f"{files}, +{added} -{removed} ({', '.join(names)})"


def change_letter(change: FileChange) -> str:
    return {"add": "A", "delete": "D", "update": "M"}.get(change.tag, "?")


def _moved(change: FileChange, cwd: str) -> str:
    if isinstance(change, UpdateFileChange) and change.move_path:
        return f" -> {visible(display_path(change.move_path, cwd))}"
    return ""


def patch_diff(changes: dict[str, FileChange], cwd: str = "") -> list[tuple[str, str]]:
    """A patch as a unified diff per file, as (line, style) pairs: a ``diff`` header per
    file (bold), ``@@`` hunk lines (cyan), additions (green), removals (red), context."""
    shown: list[tuple[str, str]] = []
    for path, change in changes.items():
        name = visible(display_path(path, cwd))
        plus, minus = change_counts(change)
        if isinstance(change, AddFileChange):
            shown.append((f"A {name} (new file, +{plus})", "1"))
            shown.append(("--- /dev/null", "1"))
            shown.append((f"+++ b/{name}", "1"))
            lines = change.content.splitlines()
            if lines:
                shown.append((f"@@ -0,0 +1,{len(lines)} @@", "36"))
            shown += [("+" + visible(line, tabs=True), "32") for line in lines]
        elif isinstance(change, DeleteFileChange):
            shown.append((f"D {name} (deleted)", "1"))
        elif isinstance(change, UpdateFileChange):
            target = visible(display_path(change.move_path, cwd)) if change.move_path else name
            shown.append((f"M {name}{_moved(change, cwd)} (+{plus} -{minus})", "1"))
            shown.append((f"--- a/{name}", "1"))
            shown.append((f"+++ b/{target}", "1"))
            for line in _diff_lines(change.unified_diff):
                style = {"+": "32", "-": "31", "@": "36"}.get(line[:1], "")
                shown.append((visible(line, tabs=True), style))
    return shown


# -- commands ---------------------------------------------------------------------------

_SHELLS = ("bash", "sh", "zsh", "dash", "ksh")


def shell_script(command: list[str]) -> str | None:
    """The script of ``bash -lc SCRIPT`` (``-c``, ``sh``, ``zsh``, ``/bin/bash``...), else None."""
    if len(command) == 3 and os.path.basename(command[0]) in _SHELLS and command[1] in ("-c", "-lc", "-cl"):
        return command[2]
    return None


def command_text(command: list[str]) -> str:
    """A command on one line, as it starts: a one-line shell script as its text,
    anything else shell-quoted, and either one :func:`visible`."""
    script = shell_script(command)
    if script is not None and "\n" not in script.strip():
        return visible(script.strip())
    return visible(shlex.join(command))


# -- approvals --------------------------------------------------------------------------

APPROVAL_PROMPT = "Allow? [y]es / [a]lways for this session / [n]o / abort: "
APPROVAL_PROMPT_VIEW = "Allow? [y]es / [a]lways for this session / [n]o / abort / [v]iew in full: "

# How many lines of an MCP tool's text result are shown (the model gets all of it).
MCP_RESULT_LINES = 20

# How many lines of a script or a diff a question shows before "[v] shows all".
QUESTION_LINES = 30

NO_SANDBOX = "If approved, it runs WITHOUT the sandbox: with your full access to files and network."

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


def wants_full_view(text: str) -> bool:
    """Whether a person typed ``v`` (view the whole script or diff) at the prompt."""
    return text.strip().lower() in ("v", "view")


# How much of the model's own words (a justification) a question shows: they are its
# claim about the command, never the command.
MODEL_WORDS_CHARS = 300
# How much of a command line, a list of files or an input a question shows before
# "[v] shows all".
COMMAND_CHARS = 1000

Lines = list[tuple[str, str]]

RETRIED = "It failed in the sandbox the way sandbox denials fail; approved, it runs again without it."
INTERACTIVE = "If approved, it keeps running as an interactive session: the model types into it afterwards."


def model_words(text: str) -> str:
    """The model's justification as a question shows it: labelled, one line, bounded."""
    return f'the model says: "{visible(text, limit=MODEL_WORDS_CHARS)}"'


def _clipped(text: str, full: bool) -> str:
    """:func:`visible` ``text``, cut after :data:`COMMAND_CHARS` unless ``full``."""
    return visible(text, limit=None if full else COMMAND_CHARS)


def _command_line(command: list[str], full: bool) -> str:
    return _clipped(shlex.join(command), full)


def _files(changes: dict[str, FileChange], cwd: str, full: bool) -> str:
    return _clipped(", ".join(display_path(path, cwd) for path in changes), full)


def describe_approval(msg: ExecApprovalRequestEvent | ApplyPatchApprovalRequestEvent, cwd: str = "") -> str:
    """What an approval request asks, in one line, to follow "the agent asks to":
    ``run `ls` in /w without the sandbox (the model says: "...")``; model-controlled text
    made :func:`visible` and bounded, as in :func:`approval_question`."""
    if isinstance(msg, ApplyPatchApprovalRequestEvent):
        what = f"apply a patch to {_files(msg.changes, cwd, False)}"
        if msg.grant_root:
            what += f" (and allow writes beneath {visible(msg.grant_root)} for this session)"
        return what
    command = f"`{_command_line(msg.command, False)}` in {visible(msg.cwd)}"
    if msg.stdin is not None:
        return (f"type `{_clipped(msg.stdin, False)}` into session {msg.process_id} "
                f"({command}), which runs without the sandbox")
    what = f"run {command} without the sandbox"
    if msg.interactive:
        what += ", as an interactive session"
    if msg.reason == RETRY_WITHOUT_SANDBOX_REASON:
        return what + " (it failed in the sandbox)"
    return what + (f" ({model_words(msg.reason)})" if msg.reason else "")


def approval_question(msg: ExecApprovalRequestEvent | ApplyPatchApprovalRequestEvent, cwd: str = "",
                      *, full: bool = False) -> tuple[list[tuple[str, str]], bool]:
    """An approval request as the lines (text, style) of a question for a person, and
    whether some were left out (shown by asking again with ``full``).

    Whatever comes before, the last lines, right above the question, are what would
    run and where: the command (shell-quoted) and its directory, the files a patch
    writes, or the input for a session and the session it goes to. Everything the
    model controls is :func:`visible` (one line each, nothing invisible or look-alike),
    and its justification is labelled as its own and bounded (:func:`model_words`): no
    text of the model's can pass for a line of sluice's, nor push the real command off
    the screen. Above them: a script as its lines, a patch as its diff (both cut after
    :data:`QUESTION_LINES` lines), whether it runs without the sandbox, and whether it
    keeps running as an interactive session."""
    if isinstance(msg, ApplyPatchApprovalRequestEvent):
        head, body, tail = _patch_question(msg, cwd, full)
    elif msg.stdin is not None:
        head, body, tail = _input_question(msg, full)
    else:
        head, body, tail = _command_question(msg, full)
    cut = not full and len(body) > QUESTION_LINES + 2
    if cut:
        left = len(body) - QUESTION_LINES
        body = body[:QUESTION_LINES] + [(f"... {left} more lines ([v] shows them all)", "2")]
    # The command, files or input cut short (they say so themselves) count too.
    cut = cut or (not full and tail != _tail_in_full(msg, cwd))
    return head + body + tail, cut


def _tail_in_full(msg: ExecApprovalRequestEvent | ApplyPatchApprovalRequestEvent, cwd: str) -> Lines:
    if isinstance(msg, ApplyPatchApprovalRequestEvent):
        return _patch_question(msg, cwd, True)[2]
    return (_input_question if msg.stdin is not None else _command_question)(msg, True)[2]


def _command_question(msg: ExecApprovalRequestEvent, full: bool) -> tuple[Lines, Lines, Lines]:
    head = [("The agent asks to run a command without the sandbox.", "1;33")]
    if msg.reason == RETRY_WITHOUT_SANDBOX_REASON:
        head.append((f"  {RETRIED}", ""))
    elif msg.reason:
        head.append((f"  {model_words(msg.reason)}", ""))
    body: Lines = []
    script = shell_script(msg.command)
    if script is not None and "\n" in script.strip():
        head.append((f"  Its {os.path.basename(msg.command[0])} script, line by line:", ""))
        body = [("    " + visible(line, tabs=True), "") for line in script.strip("\n").splitlines()]
    tail = [(INTERACTIVE, "1;31")] if msg.interactive else []
    tail += [(NO_SANDBOX, "1;31"),
             (f"  command: {_command_line(msg.command, full)}", "1"),
             (f"  in: {visible(msg.cwd)}", "1")]
    return head, body, tail


def _input_question(msg: ExecApprovalRequestEvent, full: bool) -> tuple[Lines, Lines, Lines]:
    head = [(f"The agent asks to type into session {msg.process_id}, which runs WITHOUT the sandbox.", "1;33")]
    tail = [("What it types runs with your full access to files and network; "
             "approving lets this input through, and asks again for the next.", "1;31"),
            (f"  session {msg.process_id} runs: {_command_line(msg.command, full)}", "1"),
            (f"  in: {visible(msg.cwd)}", "1"),
            (f"  input: {_clipped(msg.stdin or '', full)}", "1")]
    return head, [], tail


def _patch_question(msg: ApplyPatchApprovalRequestEvent, cwd: str, full: bool) -> tuple[Lines, Lines, Lines]:
    count = len(msg.changes)
    head = [(f"The agent asks to apply a patch to {count} file{'s' if count != 1 else ''}:", "1;33")]
    if msg.reason and not msg.grant_root:  # with a grant_root, the reason is the grant
        head.append((f"  {model_words(msg.reason)}", ""))
    tail = []
    if msg.grant_root:
        tail.append((f"If approved, the agent may also write anywhere beneath {visible(msg.grant_root)} "
                     "for the rest of this session.", "1;31"))
    tail.append((f"  files: {_files(msg.changes, cwd, full)}", "1"))
    if cwd:
        tail.append((f"  in: {visible(cwd)}", "1"))
    return head, patch_diff(msg.changes, cwd), tail


def answer_confirmation(msg: ExecApprovalRequestEvent | ApplyPatchApprovalRequestEvent,
                        decision: ReviewDecision) -> str:
    """The one line that confirms an answer: what happens now."""
    command = isinstance(msg, ExecApprovalRequestEvent)
    if command and msg.stdin is not None and decision in (ReviewDecision.APPROVED, ReviewDecision.APPROVED_FOR_SESSION):
        return f"approved: typing this input into session {msg.process_id} (the next input is asked about again)"
    if decision == ReviewDecision.APPROVED:
        return "approved: running it without the sandbox" if command else "approved: applying the patch"
    if decision == ReviewDecision.APPROVED_FOR_SESSION:
        if command:
            return ("approved for this session: this command runs without the sandbox, "
                    "and from now on without asking")
        return "approved for this session: applying the patch"
    if decision == ReviewDecision.ABORT:
        return "denied: the turn is aborted"
    return "denied: the model is told so"


def is_own(msg: ApprovalResolvedEvent, me: str) -> bool:
    """Whether ``msg.by`` (``frontend-7 (sluice attach)``) names the frontend ``me`` (``frontend-7``)."""
    return bool(me) and (msg.by == me or msg.by.startswith(me + " "))


def format_tokens(counts: list[TokenCountEvent]) -> str:
    """Token usage (summed over ``counts``) in one line: ``tokens: 10 in (2 cached), 5 out, 15 total``."""
    def total(name: str) -> int:
        return sum(getattr(c, name) or 0 for c in counts)
    cached, reasoning = total("cached_input_tokens"), total("reasoning_output_tokens")
    inp = f"{total('input_tokens')} in" + (f" ({cached} cached)" if cached else "")
    out = f"{total('output_tokens')} out" + (f" ({reasoning} reasoning)" if reasoning else "")
    return f"tokens: {inp}, {out}, {total('total_tokens')} total"


class _Output:
    # This frontend's peer id (``frontend-7``), once connected.
    me = ""

    def __init__(self, out_fd: int = 1, err_fd: int = 2) -> None:
        self.out_fd = out_fd
        self.err_fd = err_fd
        self.stdout_closed = False
        self._notes: set[str] = set()

    def _before_output(self) -> None:
        """Called before anything is written (a status line to clear)."""

    def out(self, data: bytes) -> None:
        if self.stdout_closed or not data:
            return
        self._before_output()
        try:
            write_all(self.out_fd, data)
        except BrokenPipeError:
            self.stdout_closed = True

    def err(self, data: bytes) -> None:
        if not data:
            return
        self._before_output()
        try:
            write_all(self.err_fd, data)
        except OSError:
            pass

    def ask_approval(self, msg: ExecApprovalRequestEvent | ApplyPatchApprovalRequestEvent, cwd: str = "",
                     *, full: bool = False) -> None:
        """An approval request as a question for the person at the terminal, and the prompt
        for the answer (:func:`parse_approval_answer` reads it; ``v`` asks again with
        ``full``: :func:`wants_full_view`); the same in every frontend."""
        lines, cut = approval_question(msg, cwd, full=full)
        for text, style in lines:
            self.line(text, style)
        self.approval_prompt = APPROVAL_PROMPT_VIEW if cut else APPROVAL_PROMPT
        self.prompt(self.approval_prompt)

    approval_prompt = APPROVAL_PROMPT

    def reprompt(self) -> None:
        """The approval prompt again, after an answer that was not one."""
        self.prompt(self.approval_prompt)

    def answered(self, msg: ExecApprovalRequestEvent | ApplyPatchApprovalRequestEvent,
                 decision: ReviewDecision) -> None:
        """This frontend answered ``msg``: one line says what happens now."""
        self.line(answer_confirmation(msg, decision), "33")


class HumanRenderer(_Output):
    """Events for a person; see the module docstring. ``header`` items open the session line."""

    def __init__(self, header: dict[str, str] | None = None, *, out_fd: int = 1, err_fd: int = 2,
                 color: bool | None = None, label: str = "sluice exec", me: str = "",
                 show_reasoning: bool = True, verbose: bool = False, status: bool | None = None) -> None:
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
        # True: every token_count as it comes; else the turn's sum once at its end.
        self.verbose = verbose
        # A status line while the model is at work (see :meth:`tick`): only on a terminal.
        if status is None:
            status = os.isatty(err_fd) and os.environ.get("TERM") != "dumb"
        self.status = status
        self.busy = False  # a turn is running
        self._status_shown = False
        self._last_output = time.monotonic()
        self._spin = 0
        self._turn_tokens: list[TokenCountEvent] = []
        # The frontend said "interrupting" itself: the turn's end needs no more lines.
        self.interrupt_noted = False
        self.cwd = self.header.get("cwd", "")
        # Inputs this frontend submitted: their user_message events are not shown again.
        self.own_inputs: list[str] = []
        self._streams: dict[str, SafeStream] = {}
        self._patches: dict[str, dict[str, FileChange]] = {}
        # Approval requests seen (call_id -> request), and what was approved: commands a
        # person approved run without the sandbox, and so do those approved for the session.
        self._requests: dict[str, ExecApprovalRequestEvent | ApplyPatchApprovalRequestEvent] = {}
        self._unsandboxed_calls: set[str] = set()
        self._unsandboxed_commands: set[tuple[str, ...]] = set()
        self._message_streamed = False
        self._message_open = False  # stdout has a partial line of agent text
        self._reasoning_streamed = False
        self._reasoning_open = False
        self._err_at_line_start = True
        self._streamed_calls: set[str] = set()

    # -- helpers ----------------------------------------------------------------------

    # -- the status line ------------------------------------------------------------

    # How often a frontend waiting for events should call :meth:`tick` (None: never).
    @property
    def tick_interval(self) -> float | None:
        return 0.1 if self.status else None

    def tick(self, now: float | None = None) -> None:
        """Nothing came for a while: on a terminal, while a turn runs and nothing else is
        on the line, a status line on stderr says the agent is at work (cleared as soon
        as anything is written). ``now``: the monotonic clock's time (default: read it)."""
        if not (self.status and self.busy) or self._message_open or self._reasoning_open:
            return
        if not self._err_at_line_start:
            return
        idle = (time.monotonic() if now is None else now) - self._last_output
        if idle < 0.3 and not self._status_shown:
            return
        frames = "|/-\\"
        self._spin += 1
        text = f"{frames[self._spin % len(frames)]} working ({idle:.0f}s; Ctrl-C interrupts)"
        try:
            write_all(self.err_fd, b"\r\x1b[K" + self._style(text, "2").encode())
        except OSError:
            return
        self._status_shown = True

    def _before_output(self) -> None:
        self._last_output = time.monotonic()
        if self._status_shown:
            self._status_shown = False
            try:
                write_all(self.err_fd, b"\r\x1b[K")
            except OSError:
                pass

    def _style(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def line(self, text: str, style: str = "") -> None:
        """A line of sluice's own on stderr, starting on a fresh line."""
        self._close_open_lines()
        if not self._err_at_line_start:
            self.err(b"\n")
        text = safe_text(text)
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

    def note_once(self, text: str) -> None:
        """:meth:`note`, unless this very note was made before."""
        if text not in self._notes:
            self._notes.add(text)
            self.note(text)

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
        self._raw_err(safe_text(text).encode("utf-8", "replace"))

    def error(self, message: str) -> None:
        self.line(f"error: {message}", "31")

    # -- approvals ----------------------------------------------------------------------

    def ask_approval(self, msg, cwd: str = "", *, full: bool = False) -> None:
        self._requests[msg.call_id] = msg
        super().ask_approval(msg, cwd, full=full)

    def answered(self, msg, decision: ReviewDecision) -> None:
        self._approved(msg, decision)
        super().answered(msg, decision)

    def _approved(self, msg, decision: ReviewDecision) -> None:
        if not isinstance(msg, ExecApprovalRequestEvent) or msg.stdin is not None:
            return
        if decision in (ReviewDecision.APPROVED, ReviewDecision.APPROVED_FOR_SESSION):
            self._unsandboxed_calls.add(msg.call_id)
        if decision == ReviewDecision.APPROVED_FOR_SESSION:
            self._unsandboxed_commands.add(tuple(msg.command))

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
        # What was asked, on one line: the first line of the text, and how many more;
        # not what this frontend's own person just typed.
        if msg.message in self.own_inputs:
            self.own_inputs.remove(msg.message)
            return
        lines = msg.message.splitlines() or [""]
        more = f" (+{len(lines) - 1} lines)" if len(lines) > 1 else ""
        images = f" [{len(msg.images)} image(s)]" if msg.images else ""
        self.line(f"user: {lines[0]}{more}{images}", "1")

    def _start_message(self) -> None:
        """Before the agent's text: end what stderr left open, such as a program's
        ``>>> `` prompt, so the text starts on a line of its own (on a terminal both
        streams share the screen)."""
        if self._message_open:
            return
        if self._reasoning_open:
            self._reasoning_open = False
        if not self._err_at_line_start:
            self._raw_err(b"\n")

    def _on_agent_message_delta(self, msg: AgentMessageDeltaEvent) -> None:
        self._start_message()
        self.out(safe_text(msg.delta).encode("utf-8", "replace"))
        self._message_streamed = True
        self._message_open = not msg.delta.endswith("\n")

    def _on_agent_message(self, msg: AgentMessageEvent) -> None:
        if not self._message_streamed:
            self._close_open_lines()
            self._start_message()
            self.out(safe_text(msg.message).encode("utf-8", "replace"))
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
        self._raw_err(self._style(safe_text(msg.delta), "2;3").encode("utf-8", "replace"))
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
        where = f"   (in {visible(msg.cwd)})" if msg.cwd and msg.cwd != self.cwd else ""
        unsandboxed = msg.call_id in self._unsandboxed_calls or tuple(msg.command) in self._unsandboxed_commands
        self._unsandboxed_calls.discard(msg.call_id)
        script = shell_script(msg.command)
        if script is not None and "\n" in script.strip():
            self.line(f"$ {os.path.basename(msg.command[0])} script{where}:", "1")
            for text in script.strip("\n").splitlines():
                self.line(f"    {visible(text, tabs=True)}", "1")
        else:
            self.line(f"$ {command_text(msg.command)}{where}", "1")
        if unsandboxed:
            self.line("  (running WITHOUT the sandbox, as approved)", "1;31")

    def _on_exec_command_output_delta(self, msg: ExecCommandOutputDeltaEvent) -> None:
        self._close_open_lines()
        self._streamed_calls.add(msg.call_id)
        stream = self._streams.setdefault(msg.call_id, SafeStream())
        self._raw_err(stream.feed(msg.chunk))

    def _on_exec_command_end(self, msg: ExecCommandEndEvent) -> None:
        stream = self._streams.pop(msg.call_id, None)
        if stream is not None:
            self._raw_err(stream.flush())
        if msg.call_id not in self._streamed_calls and msg.aggregated_output:
            self._raw_err(safe_text(msg.aggregated_output).encode("utf-8", "replace"))
        self._streamed_calls.discard(msg.call_id)
        seconds = msg.duration.seconds
        self.line(f"[exit {msg.exit_code}, {seconds:.2f}s]", "32" if msg.exit_code == 0 else "31")

    def _on_mcp_tool_call_begin(self, msg: McpToolCallBeginEvent) -> None:
        args = "" if msg.arguments is None else json.dumps(msg.arguments, ensure_ascii=False)
        if len(args) > 200:
            args = args[:200] + "..."
        self.line(f"mcp: {msg.server}.{msg.tool}({args})", "1")

    def _on_mcp_tool_call_end(self, msg: McpToolCallEndEvent) -> None:
        # What the server said, made safe like everything else (a server is no more
        # trusted with the terminal than the model is).
        texts = [item.get("text", "") for item in (msg.result.content if msg.result else [])
                 if isinstance(item, dict) and item.get("type") == "text"]
        lines = "\n".join(texts).splitlines()
        for text in lines[:MCP_RESULT_LINES]:
            self.line(f"  {text}")
        if len(lines) > MCP_RESULT_LINES:
            self.line(f"  ... {len(lines) - MCP_RESULT_LINES} more lines", "2")
        failed = not msg.success or (msg.result is not None and msg.result.is_error)
        self.line("[mcp error]" if failed else "[mcp ok]", "31" if failed else "32")

    def _on_exec_approval_request(self, msg: ExecApprovalRequestEvent) -> None:
        self._requests[msg.call_id] = msg

    _on_apply_patch_approval_request = _on_exec_approval_request

    def _on_patch_apply_begin(self, msg: PatchApplyBeginEvent) -> None:
        self._patches[msg.call_id] = msg.changes
        if msg.auto_approved:
            # Nobody was asked: the diff is shown here instead of in the question.
            self.line("patch:", "1")
            for text, style in patch_diff(msg.changes, self.cwd):
                self.line(text, style)
        # Else the question showed the diff, and the answer was confirmed (or, answered
        # elsewhere, said who answered): the end's summary is next.

    def _on_patch_apply_end(self, msg: PatchApplyEndEvent) -> None:
        changes = self._patches.pop(msg.call_id, None)
        if msg.success:
            summary = f": {patch_summary(changes, self.cwd)}" if changes else ""
            self.line(f"[patch applied{summary}]", "32")
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
        if self.verbose:
            self.line(format_tokens([msg]), "2")
        else:
            self._turn_tokens.append(msg)

    def _flush_tokens(self) -> None:
        if self._turn_tokens:
            counts, self._turn_tokens = self._turn_tokens, []
            self.line(format_tokens(counts), "2")

    def _on_task_started(self, msg) -> None:
        self.busy = True
        self.interrupt_noted = False

    def _on_task_complete(self, msg: TaskCompleteEvent) -> None:
        self.busy = False
        self._flush_tokens()

    def _on_background_event(self, msg: BackgroundEventEvent) -> None:
        self.line(f"- {msg.message}", "2")

    def _on_error(self, msg: ErrorEvent) -> None:
        if msg.message == TURN_INTERRUPTED:
            return  # the turn_aborted that follows says it
        self.error(msg.message)

    def _on_turn_aborted(self, msg: TurnAbortedEvent) -> None:
        self.busy = False
        self._flush_tokens()
        if self.interrupt_noted and msg.reason == "interrupted":
            self.interrupt_noted = False
            return  # the frontend's own "interrupting" line said it
        self.line(f"turn aborted ({msg.reason})", "33")

    def _on_approval_resolved(self, msg: ApprovalResolvedEvent) -> None:
        request = self._requests.pop(msg.call_id, None)
        if request is not None:
            self._approved(request, msg.decision)
        if not is_own(msg, self.me):
            self.line(f"{msg.by} answered: {_DECISION_WORDS.get(msg.decision, str(msg.decision))}", "33")

    def _on_exec_command_stdin_typed(self, msg: ExecCommandStdinTypedEvent) -> None:
        cut = f" (+{msg.omitted} characters not in the event)" if msg.omitted else ""
        self.line(f"{visible(msg.by, limit=60)} typed into {visible(msg.call_id, limit=40)}: "
                  f"{visible(msg.stdin, limit=120)}{cut}", "33")

    def finish(self) -> None:
        self._flush_tokens()
        self._before_output()
        self._close_open_lines()


class JsonRenderer(_Output):
    """One Codex-shaped event per line on stdout; sluice's own notes on stderr."""

    def event(self, event: Event) -> None:
        self.out(encode_json(event) + b"\n")

    def note(self, text: str) -> None:
        self.err(f"sluice: {text}\n".encode("utf-8", "replace"))

    def note_once(self, text: str) -> None:
        if text not in self._notes:
            self._notes.add(text)
            self.note(text)

    # No status line among JSON lines.
    tick_interval = None
    interrupt_noted = False

    def tick(self, now: float | None = None) -> None:
        pass

    def line(self, text: str, style: str = "") -> None:
        self.err(safe_text(text).encode("utf-8", "replace") + b"\n")

    def prompt(self, text: str) -> None:
        self.err(safe_text(text).encode("utf-8", "replace"))

    # Questions go to stderr, events to stdout: a question is never shown again below them.
    fresh_line = False

    def echoed(self, newline: bool) -> None:
        pass

    def error(self, message: str) -> None:
        self.event(Event(id="", msg=ErrorEvent(message)))

    def finish(self) -> None:
        pass


class CodexJsonRenderer(JsonRenderer):
    """``--json=codex``: Codex 0.169's ``codex exec --json`` lines on stdout, as
    :class:`~broker.cli.codex_json.CodexJsonl` makes them from the events; notes on stderr."""

    def __init__(self, out_fd: int = 1, err_fd: int = 2) -> None:
        super().__init__(out_fd, err_fd)
        self.codex = CodexJsonl()

    def event(self, event: Event) -> None:
        self._lines(self.codex.event(event))

    def thread(self, session_id: str) -> None:
        """Open with ``thread.started`` for a session joined after its start."""
        self._lines(self.codex.thread(session_id))

    def finish(self) -> None:
        self._lines(self.codex.finish())

    def _lines(self, lines: list[dict]) -> None:
        self.out(b"".join(msgspec.json.encode(line) + b"\n" for line in lines))
