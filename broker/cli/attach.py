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

Both follow the session with the one session loop of every frontend
(:class:`broker.cli.session_loop.SessionLoop`), with different inputs and endings.

Exit status of ``attach``: 0 when detached (Ctrl-D) or, with ``--until-idle``, when the last
turn completed; 1 when that turn failed, or the session was shut down by someone else or
lost with the agent, or (``--until-idle``) an approval waits that neither this attach nor
any other attached frontend can answer (:meth:`SessionLoop._check_answerable`); 130 when
that turn was aborted, or on leaving with Ctrl-C; 2 for an unknown or ambiguous ID (no
daemon running included: then there is no session, and no daemon is started to look);
125 when the daemon went away.
``bridge`` exits 0 once its stdin has ended and the session is idle.
"""

from __future__ import annotations

import datetime
import os
import select
import time
from typing import TYPE_CHECKING

import msgspec

from broker.cli.base import CliExit, connect_client, print_error, write_all
from broker.cli.render import CodexJsonRenderer, HumanRenderer, JsonRenderer
from broker.cli.session_loop import (
    INPUT_JSON,
    INPUT_NONE,
    INPUT_TERMINAL,
    WATCHING,
    LineReader,
    SessionLoop,
    shut_down,
)
from broker.cli.turns import isatty, tag_of
from broker.client import DaemonError, SessionError, daemon_status
from broker.wire import frames as wire
from broker.wire.results import EXIT_FAILED, EXIT_NOT_RUNNING, EXIT_OK, EXIT_SLUICE, EXIT_USAGE

if TYPE_CHECKING:
    from broker.client import Client


# How long `sluice sessions close` waits for the session to say it has shut down (its
# rollout flushed, its commands' trees killed).
CLOSE_WAIT_S = 10.0

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
        event = shut_down(client.session(info.id), CLOSE_WAIT_S)
        if event is None:
            print_error(f"error: session {info.id} did not close within {CLOSE_WAIT_S:g} s")
            return EXIT_FAILED
        if tag_of(event) == "error":
            print_error(f"error: session {info.id}: {event.msg.message}")
            return EXIT_FAILED
        print_error(f"session {info.id} closed")
        return EXIT_OK


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
        with client.catch_signals():
            try:
                session = client.attach(info.id, since=args.since)
            except SessionError as e:
                print_error(f"error: {e}")
                return EXIT_USAGE
            except DaemonError as e:
                return daemon_gone(render, str(e))
            loop = SessionLoop(client, session, render, input_mode=input_mode, until_idle=args.until_idle,
                                    reader=reader, fail_unanswerable=args.until_idle)
            if not args.json:
                _header(render, loop, client.peer_id, terminal=stdin_is_terminal)
            try:
                return loop.run()
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


def _header(render, loop: SessionLoop, me: str, *, terminal: bool) -> None:
    """The line that opens a human-mode attach: the session, where and what, and who else watches."""
    info = loop.info
    others = [name for name in info.frontends if name != me and not name.startswith(me + " ")]
    parts = [f"session {info.id}"]
    if info.cwd:
        parts.append(info.cwd)
    if info.model:
        parts.append(f"model {info.model}")
    parts.append(_STATE_WORDS.get(info.state, info.state))
    parts.append("also attached: " + ", ".join(others) if others else "no other frontend attached")
    render.line("sluice attach: " + ", ".join(parts), "1")
    if loop.replaying:
        first, last = loop.replay_from, loop.replay_end
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
