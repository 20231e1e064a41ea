"""``sluice sessions``, ``sluice attach`` and ``sluice bridge``: frontends for the sessions a daemon hosts.

A session lives in the daemon, not in the frontend that started it: ``sluice exec
--detach`` starts one and leaves, and any number of frontends attach to it, leave and come
back. Detaching never stops a session; ``shutdown`` (``sluice sessions close``, or the
daemon stopping) does.

- ``sluice sessions [--json]``: what the daemon hosts (:func:`sessions_main`). Never starts a
  daemon: with none running it says so and exits 3.
- ``sluice sessions close ID``: shut a session down (:func:`close_main`), as a ``shutdown``
  submission does; an unknown ID is one line and exit 2.
- ``sluice attach ID``: replay a session from the start of its current turn (or
  ``--since N``), then follow it live (:func:`attach_main`). ``ID`` may be any unique prefix.
  ``--json`` prints the events as JSON lines, ``--json=codex`` in Codex 0.169's ``codex exec
  --json`` schema (:mod:`broker.cli.codex_json`), opening with ``thread.started``.
- ``sluice bridge``: JSON lines both ways, Submissions in on stdin and Events out on stdout,
  for editors and scripts in any language (:mod:`broker.cli.bridge`).

Attach and bridge are one loop, :class:`Attachment`, with different inputs and endings:

==========================  =================================================================
input                       when
==========================  =================================================================
terminal lines              ``attach`` with stdin a terminal: a line is a follow-up
                            ``user_input``, or the answer to the approval being asked
JSON Submissions            ``bridge`` always; ``attach --json`` with stdin not a terminal
none                        ``attach`` (human output) with stdin not a terminal
==========================  =================================================================

Approval requests go to every attached frontend and the first answer wins: the daemon then
sends ``approval_resolved`` (who answered what) to all of them, and a frontend that was
still asking drops its question and says who answered.

Exit status of ``attach``: 0 when detached (Ctrl-D) or, with ``--until-idle``, when the last
turn completed; 1 when that turn failed, or the session was shut down by someone else or
lost with the agent, or (``--until-idle``) an approval waits that neither this attach nor
any other attached frontend can answer (:meth:`Attachment._check_answerable`); 130 when
that turn was aborted, or on leaving with Ctrl-C; 2 for an unknown or ambiguous ID (no
daemon running included: then there is no session, and no daemon is started to look);
125 when the daemon went away.
``bridge`` exits 0 once its stdin has ended and the session is idle.
"""

from __future__ import annotations

import collections
import datetime
import os
import select
import signal
import time
from typing import TYPE_CHECKING

import msgspec

from broker.cli.base import CliExit, connect_client, print_error, write_all
from broker.cli.render import (
    CodexJsonRenderer,
    HumanRenderer,
    JsonRenderer,
    describe_approval,
    parse_approval_answer,
    wants_full_view,
)
from broker.cli.turns import APPROVAL_REQUESTS, TURN_EVENTS, approval_answer, isatty, tag_of, turn_end
from broker.client import DaemonError, Interrupted, SessionError, UsageError, daemon_status
from broker.wire import frames as wire
from broker.wire.protocol import (
    ErrorEvent,
    Event,
    ProtocolError,
    Shutdown,
    TextInput,
    UserInput,
    decode_submission_json,
)
from broker.wire.results import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NOT_RUNNING,
    EXIT_OK,
    EXIT_SIGNAL_BASE,
    EXIT_SLUICE,
    EXIT_USAGE,
)

if TYPE_CHECKING:
    from broker.client import Client
    from broker.client.sessions import ClientSession


# A second Ctrl-C this soon after the one that interrupted the turn detaches.
DOUBLE_CTRL_C_S = 1.0
# After the daemon said a session is gone: how long to watch for the connection dropping
# too (the daemon stopping), which is exit 125 rather than 1.
GONE_GRACE_S = 0.5
# How often an attach that waits for another frontend to answer an approval looks whether
# one is still attached.
ANSWER_CHECK_S = 1.0
# How an attach that cannot answer approvals names itself to the other frontends.
WATCHING = "watching"
# How long `sluice sessions close` waits for the session to say it has shut down (its
# rollout flushed, its commands' trees killed).
CLOSE_WAIT_S = 10.0
# The longest input line taken (a submission must fit in one message to the daemon).
MAX_LINE = wire.MAX_MESSAGE_SIZE

INPUT_NONE = "none"
INPUT_TERMINAL = "terminal"
INPUT_JSON = "json"

_STATE_WORDS = {wire.STATE_IDLE: "idle", wire.STATE_RUNNING: "running", wire.STATE_WAITING: "waiting for approval"}


# -- connecting and finding a session ---------------------------------------------------


def connect(args, name: str, *, autostart: bool, session: str | None = None) -> Client:
    """A client for ``args`` (``--connect`` or the local daemon). Without ``autostart`` and
    with no local daemon running: one line and :class:`CliExit` 3; or, when ``session``
    names the session wanted, :class:`NoSuchSession` (no daemon, no session), which every
    command says the same way (:func:`no_session`)."""
    if not autostart and not getattr(args, "connect", None):
        try:
            status = daemon_status()
        except DaemonError as e:  # a runtime dir not ours to trust
            print_error(str(e))
            raise CliExit(EXIT_SLUICE) from None
        if not status.running:
            if session is not None:
                raise NoSuchSession(f"no session {session!r} (no daemon is running, so there are no sessions)")
            print_error(f"no daemon is running (runtime dir {status.runtime_dir}), so there are no sessions")
            raise CliExit(EXIT_NOT_RUNNING)
    return connect_client(args, name=name, autostart=autostart)


class NoSuchSession(Exception):
    """``ID`` names no session, or more than one; ``str(e)`` is one line."""


def no_session(error: NoSuchSession, render=None) -> int:
    """How every frontend command (``exec --session``, ``attach``, ``bridge --session``)
    says that the session it was given does not exist: one line on stderr (and an
    ``error`` event for a JSON reader) and exit status 2."""
    if isinstance(render, JsonRenderer):
        render.error(str(error))
    print_error(f"error: {error}")
    return EXIT_USAGE


def resolve_session(client: Client, text: str) -> wire.SessionInfo:
    """The session whose id is ``text`` or starts with it; :class:`NoSuchSession` if none or several."""
    wanted = text.strip().lower()
    if not wanted:
        raise NoSuchSession("the session id is empty")
    sessions = client.list_sessions().sessions
    matches = [s for s in sessions if s.id == wanted] or [s for s in sessions if s.id.startswith(wanted)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        hosted = "the daemon hosts no sessions" if not sessions else "`sluice sessions` lists them"
        raise NoSuchSession(f"no session {text!r} ({hosted})")
    shown = ", ".join(s.id for s in matches[:4]) + (", ..." if len(matches) > 4 else "")
    raise NoSuchSession(f"{text!r} matches {len(matches)} sessions ({shown}); give more of the id")


# -- sluice sessions --------------------------------------------------------------------


def sessions_main(args) -> int:
    if args.action == "close":
        return close_main(args)
    client = connect(args, "sluice sessions", autostart=False)
    with client:
        listing = client.list_sessions()
    sessions = sorted(listing.sessions, key=lambda s: s.created)
    if args.json:
        for info in sessions:
            write_all(1, session_json(info) + b"\n")
    elif sessions:
        write_all(1, sessions_table(sessions, time.time()).encode("utf-8", "replace"))
    else:
        print_error("no sessions")
    return EXIT_OK


def close_main(args) -> int:
    """``sluice sessions close ID``: shut the session down as a ``shutdown`` submission
    does (its running turn and commands end, its rollout is flushed, every attached
    frontend is told), and wait until it has."""
    if not args.id:
        print_error("error: `sluice sessions close` needs the session's ID (`sluice sessions` lists them)")
        return EXIT_USAGE
    try:
        client = connect(args, "sluice sessions close", autostart=False, session=args.id)
    except NoSuchSession as e:
        return no_session(e)
    with client:
        try:
            info = resolve_session(client, args.id)
        except NoSuchSession as e:
            return no_session(e)
        session = client.session(info.id)
        sub_id = session.submit(Shutdown())
        deadline = time.monotonic() + CLOSE_WAIT_S
        while (remaining := deadline - time.monotonic()) > 0:
            event = session.next_event(remaining, interruptible=False)
            if event is None:
                break
            tag = tag_of(event)
            if event.id == sub_id and tag == "shutdown_complete":
                print_error(f"session {info.id} closed")
                return EXIT_OK
            if tag == "error" and event.id in (sub_id, ""):
                print_error(f"error: session {info.id}: {event.msg.message}")
                return EXIT_FAILED
        print_error(f"error: session {info.id} did not close within {CLOSE_WAIT_S:g} s")
        return EXIT_FAILED


def session_json(info: wire.SessionInfo) -> bytes:
    """One session as ``sluice sessions --json`` prints it: the SessionInfo fields, plus
    ``created_at``, the creation time in ISO-8601 UTC next to the unix time."""
    fields = msgspec.structs.asdict(info)
    out = {}
    for name, value in fields.items():
        out[name] = value
        if name == "created":
            stamp = datetime.datetime.fromtimestamp(value, datetime.timezone.utc)
            out["created_at"] = stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return msgspec.json.encode(out)


def sessions_table(sessions: list[wire.SessionInfo], now: float) -> str:
    home = os.path.expanduser("~")
    rows = [("ID", "STATE", "MODEL", "FRONTENDS", "AGE", "CWD")]
    for s in sessions:
        cwd = s.cwd
        if home not in ("", "/") and (cwd == home or cwd.startswith(home + "/")):
            cwd = "~" + cwd[len(home):]
        rows.append((s.id, s.state, s.model or "-", str(len(s.frontends)), format_age(now - s.created), cwd or "-"))
    # Every column but the last (the cwd, as long as it is) padded to its widest cell;
    # the count right-aligned.
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for *cells, last in rows:
        padded = [cell.rjust(width) if i == 3 else cell.ljust(width)
                  for i, (cell, width) in enumerate(zip(cells, widths, strict=True))]
        lines.append("  ".join([*padded, last]).rstrip())
    return "\n".join(lines) + "\n"


def format_age(seconds: float) -> str:
    """``42s``, ``5m``, ``3h``, ``2d``."""
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


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


# -- what the events say ----------------------------------------------------------------


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


# -- the loop -------------------------------------------------------------------------


class Attachment:
    """One frontend following one session: events out through ``render``, input in.

    ``input_mode``: :data:`INPUT_TERMINAL`, :data:`INPUT_JSON` or :data:`INPUT_NONE` (see the
    module docstring). ``until_idle``: return once the replay is over, the session idle,
    nothing this frontend submitted still on its way and (JSON input) stdin at its end;
    with ``turn_status`` the status is how the last turn ended, else 0. ``ctrl_c_interrupts``:
    SIGINT interrupts a running turn (a second one within :data:`DOUBLE_CTRL_C_S`, or one
    while idle, detaches); otherwise any of SIGINT/SIGTERM/SIGHUP detaches at once.
    ``bad_input_events``: a bad JSON line is also answered with an ``error`` event on stdout.

    :meth:`run` returns the exit status; the caller detaches. Raises
    :class:`broker.client.errors.DaemonError` when the daemon goes away.
    """

    def __init__(self, client: Client, session: ClientSession, render, *, input_mode: str,
                 until_idle: bool = False, turn_status: bool = True, ctrl_c_interrupts: bool = True,
                 bad_input_events: bool = False, reader: LineReader | None = None,
                 fail_unanswerable: bool = False) -> None:
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
        info = self.info = session.info or wire.SessionInfo(id=session.id)
        # Where the session works: patch paths are shown relative to it.
        self.cwd = info.cwd
        self.view = SessionView(info)
        # Events up to the session's newest at attach are the replay (some may be queued already).
        self.replay_from = next((e.seq for e in session.events if e.seq), session.last_seq + 1)
        self.replay_end = info.seq
        self.replaying = self.replay_from <= info.seq
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
            fds = (self.reader.fd,) if self.input_mode != INPUT_NONE and not self.reader.eof else ()
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
        self.render.event(event)
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
        elif tag == "error" and not event.id:
            self._check_session_still_there()
        if self.asking and self.render.fresh_line:
            # Something was shown below the question: ask again underneath.
            self.render.reprompt()

    def _settle(self, event: Event, tag: str) -> None:
        """Strike off the submissions of ours this event shows the effect of."""
        if event.id in self.awaiting:
            del self.awaiting[event.id]
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
            elif self.input_mode == INPUT_TERMINAL:
                self._queue_question(event)
            elif self.human and not self.fail_unanswerable:
                self._say_waiting(event)
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

    def _check_session_still_there(self) -> None:
        """The daemon spoke about the session as a whole (the agent died, the daemon is
        stopping, an unreadable submission): go on only if the session still exists."""
        if any(s.id == self.session.id for s in self.client.list_sessions().sessions):
            return
        # A daemon that is stopping says so to every session, then closes the connection.
        deadline = time.monotonic() + GONE_GRACE_S
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
        return self.input_mode == INPUT_TERMINAL or (self.input_mode == INPUT_JSON and not self.reader.eof)

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
        if self.input_mode == INPUT_TERMINAL:
            self._queue_question(event)
        elif self.human and not self.fail_unanswerable:
            self._say_waiting(event)

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
        op = approval_answer(event, decision)
        self.session.submit(op)
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
            if self.input_mode == INPUT_TERMINAL:
                self._on_typed(line or b"")
            else:
                self._on_json_line(number, line)
        if reader.eof and self.input_mode == INPUT_TERMINAL and self.status is None:
            # Ctrl-D: leave the session to itself.
            self.render.note("detached; the session goes on")
            self.status = EXIT_OK

    def _on_typed(self, line: bytes) -> None:
        text = line.decode("utf-8", "replace").rstrip("\r")
        self.render.echoed(True)
        if self.asking:
            self._answer(text)
            return
        if not text.strip():
            return
        self._submit(UserInput([TextInput(text)]))

    def _on_json_line(self, number: int, line: bytes | None) -> None:
        if line is not None and not line.strip():
            return
        try:
            sub = parse_submission(line)
        except ValueError as e:
            self._bad_line(number, str(e))
            return
        try:
            self._submit(sub.op, sub.id)
        except UsageError as e:  # more than the daemon takes in one message
            self._bad_line(number, str(e))

    def _bad_line(self, number: int, message: str) -> None:
        text = f"line {number}: {message}"
        if self.bad_input_events:
            self.render.event(Event(id="", msg=ErrorEvent(text)))
        print_error(f"error: {text}")

    def _submit(self, op, sub_id: str | None = None) -> None:
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

    # -- signals ----------------------------------------------------------------------

    def _on_signal(self, signum: int) -> None:
        if signum == signal.SIGINT and self.input_mode == INPUT_TERMINAL:
            self.render.echoed(False)  # after the ^C the terminal showed
        if signum != signal.SIGINT or not self.ctrl_c_interrupts:
            self.status = EXIT_SIGNAL_BASE + signum
            return
        now = time.monotonic()
        if not self.view.running or now - self.last_interrupt < DOUBLE_CTRL_C_S:
            self.render.note("detached; the session goes on")
            self.status = EXIT_INTERRUPTED
            return
        self.last_interrupt = now
        self.session.interrupt()
        # The agent drops what the turn asked; so do we.
        self.questions.clear()
        self.asking = False
        self.render.interrupt_noted = True
        self.render.note("interrupting the turn (Ctrl-C again within 1 s to detach)")


# -- sluice attach ----------------------------------------------------------------------


def attach_main(args) -> int:
    render = None
    if args.json:
        render = CodexJsonRenderer() if args.json_format == "codex" else JsonRenderer()
    stdin_is_terminal = isatty(0)
    if stdin_is_terminal:
        input_mode = INPUT_TERMINAL
    else:
        input_mode = INPUT_JSON if args.json else INPUT_NONE
    reader = LineReader(0)
    if input_mode == INPUT_JSON and _readable_now(0):
        reader.fill()  # an empty stdin (</dev/null) is known at once: then attach only watches
    watching = input_mode == INPUT_NONE or reader.eof
    try:
        client = connect(args, f"sluice attach, {WATCHING}" if watching else "sluice attach", autostart=False,
                         session=args.id)
    except NoSuchSession as e:
        return no_session(e, render)
    with client:
        try:
            info = resolve_session(client, args.id)
        except NoSuchSession as e:
            return no_session(e, render)
        except DaemonError as e:
            return daemon_gone(render, str(e))
        if render is None:
            render = HumanRenderer({"cwd": info.cwd}, label="configured", me=client.peer_id)
        elif isinstance(render, CodexJsonRenderer):
            render.thread(info.id)  # the replay starts with the current turn
        with client.catch_signals((signal.SIGINT, signal.SIGTERM, signal.SIGHUP)):
            try:
                session = client.attach(info.id, since=args.since)
            except SessionError as e:
                print_error(f"error: {e}")
                return EXIT_USAGE
            except DaemonError as e:
                return daemon_gone(render, str(e))
            attachment = Attachment(client, session, render, input_mode=input_mode, until_idle=args.until_idle,
                                    reader=reader, fail_unanswerable=args.until_idle)
            if not args.json:
                _header(render, attachment, client.peer_id, terminal=stdin_is_terminal)
            try:
                return attachment.run()
            except DaemonError as e:
                return daemon_gone(render, str(e))
            finally:
                render.finish()
                detach(session)


def _readable_now(fd: int) -> bool:
    try:
        return bool(select.select([fd], [], [], 0)[0])
    except (OSError, ValueError):
        return False


def _header(render, attachment: Attachment, me: str, *, terminal: bool) -> None:
    """The line that opens a human-mode attach: the session, where and what, and who else watches."""
    info = attachment.info
    others = [name for name in info.frontends if name != me and not name.startswith(me + " ")]
    parts = [f"session {info.id}"]
    if info.cwd:
        parts.append(info.cwd)
    if info.model:
        parts.append(f"model {info.model}")
    parts.append(_STATE_WORDS.get(info.state, info.state))
    parts.append("also attached: " + ", ".join(others) if others else "no other frontend attached")
    render.line("sluice attach: " + ", ".join(parts), "1")
    if attachment.replaying:
        first, last = attachment.replay_from, attachment.replay_end
        render.note(f"replaying {f'events {first}-{last}' if last > first else f'event {first}'}, then following live")
    if terminal:
        render.note("type a message to send it; Ctrl-C interrupts the turn, Ctrl-D detaches")


def detach(session) -> None:
    try:
        session.detach()
    except DaemonError:
        pass  # the daemon is gone: nothing to detach from


def daemon_gone(render, message: str) -> int:
    if isinstance(render, JsonRenderer):
        render.error(message)
    print_error(f"error: {message}")
    return EXIT_SLUICE
