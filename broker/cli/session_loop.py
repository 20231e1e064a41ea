"""The session loop: one frontend following one session, for ``sluice exec``,
``sluice attach`` and ``sluice bridge`` alike (:class:`SessionLoop`).

Events go out through a renderer (:mod:`broker.cli.render`) as they come; input comes in
from stdin; approval requests go to every attached frontend and the first answer wins:
the daemon then sends ``approval_resolved`` (who answered what) to all of them, and a
frontend that was still asking drops its question and says who answered. Ctrl-C
interrupts the running turn. What differs between the commands is where input comes
from and when the loop ends:

==========================  =================================================================
input                       when
==========================  =================================================================
terminal lines              ``attach`` with stdin a terminal: a line is a follow-up
                            ``user_input``, or the answer to the approval being asked
answers                     ``exec`` with stdin a terminal: a line answers the approval
                            being asked; nothing is read while none is
JSON Submissions            ``bridge`` always; ``attach --json`` with stdin not a terminal
none                        ``attach`` (human output) and ``exec`` with stdin not a terminal
==========================  =================================================================

``attach`` ends when the person detaches (or, ``--until-idle``, when the session is
idle), ``bridge`` once its stdin has ended and the session is idle, ``exec`` when the task
it submitted has ended (``one_task``).
"""

from __future__ import annotations

import collections
import os
import signal
import time
from typing import TYPE_CHECKING

from broker.cli.base import print_error
from broker.cli.render import HumanRenderer, describe_approval, parse_approval_answer, wants_full_view
from broker.cli.turns import APPROVAL_REQUESTS, SessionView, approval_answer, rollout_failed, tag_of, turn_end
from broker.client import Interrupted, UsageError
from broker.wire import frames as wire
from broker.wire.protocol import (
    ErrorEvent,
    Event,
    ProtocolError,
    ReviewDecision,
    Shutdown,
    TextInput,
    UserInput,
    decode_submission_json,
)
from broker.wire.results import EXIT_DAEMON_STOPPED, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_SIGNAL_BASE

if TYPE_CHECKING:
    from broker.client import Client
    from broker.client.sessions import ClientSession


# A second Ctrl-C this soon after the one that interrupted the turn detaches.
DOUBLE_CTRL_C_S = 1.0
# After the daemon said a session is gone: how long to watch for the connection dropping
# too (the daemon stopping), which is exit 125 rather than 1.
GONE_GRACE_S = 0.5
# How long to wait for that after the daemon said it is stopping: more than the grace it
# gives its agent and executors (broker.daemon.server.SHUTDOWN_GRACE_S, 3 s) before it closes.
STOPPING_WAIT_S = 10.0
# How often an attach that waits for another frontend to answer an approval looks whether
# one is still attached.
ANSWER_CHECK_S = 1.0
# How an attach that cannot answer approvals names itself to the other frontends.
WATCHING = "watching"
# The longest input line taken (a submission must fit in one message to the daemon).
MAX_LINE = wire.MAX_MESSAGE_SIZE

INPUT_NONE = "none"
INPUT_TERMINAL = "terminal"
INPUT_ANSWERS = "answers"
INPUT_JSON = "json"


# -- reading input ----------------------------------------------------------------------


class LineReader:
    """Numbered lines from a file descriptor, one ``read`` at a time.

    :meth:`fill` does one ``os.read`` (call it when the fd is readable, or to block for
    more) and queues the complete lines in ``lines``; at end of input the unterminated
    rest is a line too and ``eof`` is set. A line longer than :data:`MAX_LINE` is queued
    as None the moment it grows past that, and the rest of it is skipped up to its
    newline, so one bad line never costs the ones after it.

    Linear in the input: the pieces of a line still being read are kept as a list and
    joined once, at its newline (appending every read to one growing buffer would copy
    a long line once per read: 12 s for a line of 40 MB).
    """

    READ_SIZE = 65536

    def __init__(self, fd: int = 0) -> None:
        self.fd = fd
        self.lines: collections.deque[tuple[int, bytes | None]] = collections.deque()
        self.eof = False
        # The line being read: its pieces so far and their total size.
        self._pieces: list[bytes] = []
        self._size = 0
        self._count = 0
        self._skipping = False

    def fill(self) -> None:
        if self.eof:
            return
        try:
            data = os.read(self.fd, self.READ_SIZE)
        except BlockingIOError:
            return
        except OSError:  # e.g. EIO from a terminal that went away: no more input either way
            data = b""
        if not data:
            self.eof = True
            if self._pieces:
                self._push(b"".join(self._pieces))
            self._pieces, self._size = [], 0
            return
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            self._take(data, start, end)
            if self._skipping:
                self._skipping = False  # the end of the overlong line, already reported
            else:
                self._push(b"".join(self._pieces))
            self._pieces, self._size = [], 0
            start = end + 1
        self._take(data, start, len(data))

    def _take(self, data: bytes, start: int, end: int) -> None:
        """Add ``data[start:end]`` (no newline in it) to the line being read."""
        if self._skipping or start == end:
            return
        self._size += end - start
        if self._size > MAX_LINE:
            self._count += 1
            self.lines.append((self._count, None))
            self._pieces, self._size = [], 0
            self._skipping = True
            return
        self._pieces.append(data[start:end] if start or end < len(data) else data)

    def _push(self, line: bytes) -> None:
        self._count += 1
        self.lines.append((self._count, line))


def parse_submission(line: bytes | None):
    """A JSON line as a Codex ``Submission``; ValueError with a one-line message if it is not."""
    if line is None:
        raise ValueError(f"longer than {MAX_LINE // (1024 * 1024)} MiB, the most one submission may be; "
                         "skipped to its end")
    try:
        return decode_submission_json(line)
    except ProtocolError as e:
        raise ValueError(" ".join(str(e).split())) from None


def bad_line(number: int, message: str, render=None) -> None:
    """Say that input line ``number`` was not taken, and why: on stderr, and to ``render``
    as an ``error`` event when given (a program reading stdout)."""
    text = f"line {number}: {message}"
    if render is not None:
        render.event(Event(id="", msg=ErrorEvent(text)))
    print_error(f"error: {text}")


def shut_down(session: ClientSession, wait_s: float, show=None) -> Event | None:
    """Submit ``shutdown`` and wait up to ``wait_s`` seconds for the session to say it has
    shut down (its rollout flushed): ``shutdown_complete``, or an ``error`` for the
    submission or for the whole session. That event; None if none came in time. ``show``
    is called with every event meanwhile."""
    sub_id = session.submit(Shutdown())
    deadline = time.monotonic() + wait_s
    while (remaining := deadline - time.monotonic()) > 0:
        event = session.next_event(remaining, interruptible=False)
        if event is None:
            return None
        if show is not None:
            show(event)
        tag = tag_of(event)
        if (event.id == sub_id and tag == "shutdown_complete") or (tag == "error" and event.id in (sub_id, "")):
            return event
    return None


# -- the loop -------------------------------------------------------------------------


class SessionLoop:
    """One frontend following one session: events out through ``render``, input in.

    ``input_mode``: :data:`INPUT_TERMINAL`, :data:`INPUT_ANSWERS`, :data:`INPUT_JSON` or
    :data:`INPUT_NONE` (see the module docstring). ``until_idle``: return once the replay
    is over, the session idle, nothing this frontend submitted still on its way and (JSON
    input) stdin at its end; with ``turn_status`` the status is how the last turn ended,
    else 0. ``ctrl_c_interrupts``:
    SIGINT interrupts a running turn (a second one within :data:`DOUBLE_CTRL_C_S`, or one
    while idle, detaches); otherwise any of SIGINT/SIGTERM/SIGHUP detaches at once.
    ``bad_input_events``: a bad JSON line is also answered with an ``error`` event on stdout.
    ``one_task``: the frontend gave the session a task and leaves with it (``sluice exec``):
    an error about the session as a whole (the agent died, the daemon is stopping) ends the
    loop with its status (:func:`~broker.cli.turns.turn_end`), a second Ctrl-C leaves at
    once whenever it comes, and an approval this frontend cannot answer is denied, with a
    note, rather than left to other frontends. ``info``: the session as it was found, when
    the client has not attached to it yet (then nothing is replayed).

    :meth:`run` returns the exit status; the caller detaches. Raises
    :class:`broker.client.errors.DaemonError` when the daemon goes away.
    """

    def __init__(self, client: Client, session: ClientSession, render, *, input_mode: str,
                 until_idle: bool = False, turn_status: bool = True, ctrl_c_interrupts: bool = True,
                 bad_input_events: bool = False, reader: LineReader | None = None,
                 fail_unanswerable: bool = False, one_task: bool = False,
                 info: wire.SessionInfo | None = None) -> None:
        self.client = client
        self.session = session
        self.render = render
        self.human = isinstance(render, HumanRenderer)
        self.input_mode = input_mode
        self.until_idle = until_idle
        self.turn_status = turn_status
        self.ctrl_c_interrupts = ctrl_c_interrupts
        self.bad_input_events = bad_input_events
        self.reader = reader or LineReader(0)
        self.one_task = one_task
        info = self.info = info or session.info or wire.SessionInfo(id=session.id)
        # Where the session works: patch paths are shown relative to it.
        self.cwd = info.cwd
        self.view = SessionView(info)
        # Events up to the session's newest at attach are the replay (some may be queued already).
        self.replay_from = next((e.seq for e in session.events if e.seq), session.last_seq + 1)
        self.replay_end = info.seq
        self.replaying = session.attached and self.replay_from <= info.seq
        # Oldest first, as the daemon lists them.
        self.pending_at_attach = list(info.pending_approvals)
        # Approval requests to ask on the terminal, oldest first; the first is on screen
        # while ``asking``.
        self.questions: list[Event] = []
        self.asking = False
        # Submissions of ours whose effect has not shown yet: sub id -> op type.
        self.awaiting: dict[str, str] = {}
        self.shutdown_ids: set[str] = set()
        self.last_interrupt = -DOUBLE_CTRL_C_S
        self.interrupted = False  # this frontend interrupted a turn
        self.left_on_signal = False  # the loop ended at a signal, not with the session's events
        self.unrecorded = False  # the agent said the rollout can no longer be written
        self.lagged = session.lagged
        self.status: int | None = None
        # Leave (exit 1) when an approval waits and nobody attached can answer it.
        self.fail_unanswerable = fail_unanswerable
        self._next_answer_check = 0.0
        self._waiting_on: tuple[str, ...] = ()
        # Requests (call ids) this frontend sent an answer to, not yet resolved.
        self._answered: set[str] = set()

    def expect(self, sub_id: str, kind: str) -> None:
        """A submission of ``kind`` this frontend made before the loop: wait for its effect too."""
        self.awaiting[sub_id] = kind

    # -- the loop ---------------------------------------------------------------------

    def run(self) -> int:
        if not self.replaying:
            self._replayed()
        self._take_lines()
        while self.status is None:
            if self._idle_exit():
                break
            self._check_answerable()
            if self.status is not None:
                break
            fds = (self.reader.fd,) if self._reading() else ()
            timeout = None if self.replaying else self.render.tick_interval
            if self._unanswerable():  # look again soon: the frontend that could answer may leave
                timeout = min(timeout or ANSWER_CHECK_S, ANSWER_CHECK_S)
            try:
                got = self.session.next_event(timeout, fds=fds)
            except Interrupted as e:
                self._on_signal(e.signum)
                continue
            if got is None:
                self.render.busy = self.view.running and not self.asking
                self.render.tick()
                continue
            if isinstance(got, int):
                self.reader.fill()
                self._take_lines()
            else:
                self._on_event(got)
        return self.status

    def _reading(self) -> bool:
        if self.reader.eof or self.input_mode == INPUT_NONE:
            return False
        # Typed answers only: what is typed meanwhile waits in the terminal for the question.
        return self.input_mode != INPUT_ANSWERS or self.asking

    def _idle_exit(self) -> bool:
        if not self.until_idle or self.replaying or self.view.running or self.awaiting:
            return False
        if self.input_mode == INPUT_JSON and not self.reader.eof:
            return False
        self.status = (self.view.outcome or EXIT_OK) if self.turn_status else EXIT_OK
        return True

    # -- events -----------------------------------------------------------------------

    def _on_event(self, event: Event) -> None:
        tag = tag_of(event)
        self.view.update(event)
        self._settle(event, tag)
        self.show(event)
        if tag in APPROVAL_REQUESTS:
            self._on_request(event)
        elif tag == "approval_resolved":
            self._forget_question(event.msg.call_id)
            self._answered.discard(event.msg.call_id)
        if any(q.msg.call_id not in self.view.requests for q in self.questions):
            self._drop_moot_questions()
        if self.replaying and event.seq is not None and event.seq >= self.replay_end:
            self.replaying = False
            self._replayed()
        self._note_lag()
        if tag == "shutdown_complete":
            self._session_shut_down(event)
        elif tag == "error" and not event.id and self.one_task:
            self.status = turn_end(event)
        elif tag == "error" and not event.id:
            self._check_session_still_there(event)
        if self.asking and self.render.fresh_line:
            # Something was shown below the question: ask again underneath.
            self.render.reprompt()

    def show(self, event: Event) -> None:
        """Render ``event``; note when it says the session is no longer recorded."""
        self.render.event(event)
        if rollout_failed(event) and not self.unrecorded:
            self.unrecorded = True
            if not self.human:  # the event is on stdout; the one line for a person on stderr
                print_error(f"error: {event.msg.message}")

    def _settle(self, event: Event, tag: str) -> None:
        """Strike off the submissions of ours this event shows the effect of."""
        if event.id in self.awaiting:
            kind = self.awaiting.pop(event.id)
            if kind == "user_input" and tag == "error" and turn_end(event) is not None:
                self.view.outcome = turn_end(event)  # refused before its turn started
        if tag == "task_started":
            # Input of ours that had not started its own task by now joined this one.
            for sub_id, op in list(self.awaiting.items()):
                if op == "user_input":
                    del self.awaiting[sub_id]

    def _replayed(self) -> None:
        """The replay is over: what it left pending is asked now."""
        for call_id in self.pending_at_attach:
            event = self.view.requests.get(call_id)
            if event is None:
                self.render.note(f"an approval request ({call_id}) waits from before the replay; "
                                 "attach with a lower --since to see it")
            else:
                self._on_request(event)
        self.pending_at_attach.clear()

    def _note_lag(self) -> None:
        lagged = self.session.lagged
        if lagged != self.lagged:
            self.lagged = lagged
            self.render.note("fell behind the session; catching up from the daemon's log")

    def _session_shut_down(self, event: Event) -> None:
        if event.id in self.shutdown_ids:
            self.status = EXIT_OK
            return
        self.render.note("the session was shut down")
        self.status = EXIT_FAILED

    def _check_session_still_there(self, event: Event) -> None:
        """The daemon spoke about the session as a whole (the agent died, the daemon is
        stopping, an unreadable submission): go on only if the session still exists."""
        stopping = turn_end(event) == EXIT_DAEMON_STOPPED
        if not stopping and any(s.id == self.session.id for s in self.client.list_sessions().sessions):
            return
        # A daemon that is stopping says so to every session, then closes the connection:
        # once its agent and executors have stopped, when it says so.
        deadline = time.monotonic() + (STOPPING_WAIT_S if stopping else GONE_GRACE_S)
        while (remaining := deadline - time.monotonic()) > 0 and self.session.failure is None:
            self.client.poll(remaining)
        if self.session.failure is not None:
            raise self.session.failure
        self.render.note("the session is gone")
        self.status = EXIT_FAILED

    # -- approvals nobody can answer ----------------------------------------------------

    def can_answer(self) -> bool:
        """Whether an approval can be answered here: typed at the terminal, or sent as a
        Submission on stdin (until stdin ends)."""
        return self.input_mode == INPUT_TERMINAL or (
            self.input_mode in (INPUT_ANSWERS, INPUT_JSON) and not self.reader.eof)

    def _unanswerable(self) -> bool:
        """An approval waits, and this frontend, which is to wait for the session to be
        idle, cannot answer it."""
        return (self.fail_unanswerable and not self.replaying and not self.can_answer()
                and any(call_id not in self._answered for call_id in self.view.requests))

    def _check_answerable(self) -> None:
        """While :meth:`_unanswerable`: wait if another attached frontend can answer (a
        terminal's ``sluice attach``, a bridge, a program), saying once which; else say
        that nobody can, in one line, and leave with status 1. Frontends that only watch
        (:data:`WATCHING`) cannot answer; a program that can but never does is waited for."""
        if not self._unanswerable():
            self._waiting_on = ()
            return
        now = time.monotonic()
        if now < self._next_answer_check:
            return
        self._next_answer_check = now + ANSWER_CHECK_S
        me = self.client.peer_id
        infos = [s for s in self.client.list_sessions().sessions if s.id == self.session.id]
        others = tuple(name for info in infos for name in info.frontends
                       if name != me and not name.startswith(me + " ") and not name.endswith(f", {WATCHING})"))
        request = next(e for call_id, e in self.view.requests.items() if call_id not in self._answered)
        what = describe_approval(request.msg, self.cwd)
        if others:
            if others != self._waiting_on:
                self._waiting_on = others
                self.render.note(f"the agent asks to {what}; waiting for {', '.join(others)} to answer")
            return
        message = (f"the agent asks to {what}, and no attached frontend can answer: answer from a terminal "
                   f"with `sluice attach {self.session.id[:8]}`, or start the task with "
                   "`--approval-policy never` so that nothing waits")
        self.render.error(message)
        if not self.human:
            print_error(f"error: {message}")
        self.status = EXIT_FAILED

    # -- approvals --------------------------------------------------------------------

    def _on_request(self, event: Event) -> None:
        if self.replaying and event.msg.call_id not in self.pending_at_attach:
            if self.human:  # answered since: shown for the record
                self.render.line(f"the agent asked to {describe_approval(event.msg, self.cwd)}", "33")
            return
        if self.replaying:
            return  # still waiting: asked once the replay is over (see _replayed)
        if self.input_mode in (INPUT_TERMINAL, INPUT_ANSWERS) and self.can_answer():
            self._queue_question(event)
        elif self.one_task:
            self._deny(event, "there is no terminal to ask")
        elif self.human and not self.fail_unanswerable:
            self._say_waiting(event)

    def _deny(self, event: Event, why: str) -> None:
        self.render.note(f"denied: the agent asked to {describe_approval(event.msg, self.cwd)}, and {why}")
        self.render.note_once("run on a terminal, or choose --approval-policy / --sandbox to avoid asking")
        self.submit(approval_answer(event, ReviewDecision.DENIED))

    def _say_waiting(self, event: Event) -> None:
        self.render.line(f"the agent asks to {describe_approval(event.msg, self.cwd)}; "
                         f"answer from a terminal with `sluice attach {self.session.id[:8]}`", "1;33")

    def _queue_question(self, event: Event) -> None:
        if all(q.msg.call_id != event.msg.call_id for q in self.questions):
            self.questions.append(event)
        self._ask_next()

    def _ask_next(self) -> None:
        if self.asking or not self.questions:
            return
        event = self.questions[0]
        self.render.ask_approval(event.msg, self.cwd)
        self.asking = True

    def _answer(self, text: str) -> None:
        if wants_full_view(text):
            self.render.ask_approval(self.questions[0].msg, self.cwd, full=True)
            return
        decision = parse_approval_answer(text)
        if decision is None:
            self.render.reprompt()
            return
        event = self.questions.pop(0)
        self.asking = False
        self.submit(approval_answer(event, decision))
        self.render.answered(event.msg, decision)
        self._ask_next()

    def _forget_question(self, call_id: str) -> None:
        """Someone answered ``call_id`` (the renderer said who): stop asking it."""
        if self.questions and self.asking and self.questions[0].msg.call_id == call_id:
            self.asking = False
        self.questions = [q for q in self.questions if q.msg.call_id != call_id]
        self._ask_next()

    def _drop_moot_questions(self) -> None:
        """The turn ended (or moved on) without these being answered: stop asking them."""
        if self.asking and self.questions[0].msg.call_id not in self.view.requests:
            self.asking = False
            self.render.note("the approval request is moot now (its turn ended)")
        self.questions = [q for q in self.questions if q.msg.call_id in self.view.requests]
        self._ask_next()

    # -- input --------------------------------------------------------------------------

    def _take_lines(self) -> None:
        reader = self.reader
        while reader.lines and self.status is None:
            number, line = reader.lines.popleft()
            if self.input_mode in (INPUT_TERMINAL, INPUT_ANSWERS):
                self._on_typed(line or b"")
            else:
                self._on_json_line(number, line)
        if reader.eof and self.input_mode == INPUT_TERMINAL and self.status is None:
            # Ctrl-D: leave the session to itself.
            self.render.note("detached; the session goes on")
            self.status = EXIT_OK
        elif reader.eof and self.input_mode == INPUT_ANSWERS and self.questions:
            self.render.note("end of input: denied")
            self.asking = False
            for event in self.questions:
                self.submit(approval_answer(event, ReviewDecision.DENIED))
            self.questions.clear()

    def _on_typed(self, line: bytes) -> None:
        text = line.decode("utf-8", "replace").rstrip("\r")
        self.render.echoed(True)
        if self.asking:
            self._answer(text)
            return
        if not text.strip() or self.input_mode == INPUT_ANSWERS:
            return
        self.submit(UserInput([TextInput(text)]))

    def _on_json_line(self, number: int, line: bytes | None) -> None:
        if line is not None and not line.strip():
            return
        try:
            sub = parse_submission(line)
        except ValueError as e:
            self._bad_line(number, str(e))
            return
        try:
            self.submit(sub.op, sub.id)
        except UsageError as e:  # more than the daemon takes in one message
            self._bad_line(number, str(e))

    def _bad_line(self, number: int, message: str) -> None:
        bad_line(number, message, self.render if self.bad_input_events else None)

    def submit(self, op, sub_id: str | None = None) -> str:
        """Submit ``op`` to the session, and follow until it has taken effect; its id."""
        kind = type(op).__struct_config__.tag
        sub_id = self.session.submit(op, sub_id)
        if kind in ("exec_approval", "patch_approval"):
            # An answer names the request's turn: what that turn asks now is answered.
            self._answered.update(call_id for call_id, e in self.view.requests.items() if e.id == op.id)
        if kind == "shutdown":
            self.shutdown_ids.add(sub_id)
        # What will show this submission took effect: an event with its id (user_input
        # while a turn runs joins that turn instead, and shows as nothing of its own).
        if kind in ("configure_session", "compact", "shutdown", "get_history_entry_request") or (
                kind == "user_input" and not self.view.running):
            self.awaiting[sub_id] = kind
        return sub_id

    # -- signals ----------------------------------------------------------------------

    def _on_signal(self, signum: int) -> None:
        if signum == signal.SIGINT and self.input_mode in (INPUT_TERMINAL, INPUT_ANSWERS):
            self.render.echoed(False)  # after the ^C the terminal showed
        if signum != signal.SIGINT or not self.ctrl_c_interrupts:
            self.status = EXIT_SIGNAL_BASE + signum
            self.left_on_signal = True
            return
        now = time.monotonic()
        if self.one_task and self.interrupted:
            self.render.note("interrupted again: leaving")
            self.status = EXIT_INTERRUPTED
            self.left_on_signal = True
            return
        if not self.one_task and (not self.view.running or now - self.last_interrupt < DOUBLE_CTRL_C_S):
            self.render.note("detached; the session goes on")
            self.status = EXIT_INTERRUPTED
            return
        self.last_interrupt = now
        self.interrupted = True
        self.session.interrupt()
        # The agent drops what the turn asked; so do we.
        self.questions.clear()
        self.asking = False
        self.render.interrupt_noted = True
        self.render.note("interrupting (Ctrl-C again to leave at once)" if self.one_task
                         else "interrupting the turn (Ctrl-C again within 1 s to detach)")
