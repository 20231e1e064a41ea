"""``sluice bridge``: Codex Submissions in on stdin, Events out on stdout, one JSON object
per line, for editors and scripts in any language. Without ``--session`` the first
submission must be ``configure_session``; at the end of stdin the bridge exits once the
session is idle. It follows the session with the session loop (:mod:`broker.cli.session_loop`), its input JSON."""

from __future__ import annotations


from broker.cli.attach import NoSuchSession, connect, daemon_gone, detach, no_session, resolve_session
from broker.cli.base import CliExit, print_error
from broker.cli.render import JsonRenderer
from broker.cli.session_loop import INPUT_JSON, LineReader, SessionLoop, bad_line, parse_submission
from broker.client import Client, DaemonError, SessionError
from broker.wire.protocol import NO_SESSION, ConfigureSession, ErrorEvent, Event
from broker.wire.results import EXIT_NOT_RUNNING, EXIT_OK, EXIT_USAGE


def bridge_main(args) -> int:
    """JSON lines both ways; see the module docstring and docs/protocol.md."""
    render = JsonRenderer()
    if args.since is not None and not args.session:
        print_error("error: --since goes with --session ID (a new session has nothing to replay)")
        return EXIT_USAGE
    try:
        client = connect(args, "sluice bridge", autostart=not args.session, session=args.session)
    except NoSuchSession as e:
        return no_session(e, render)
    except CliExit as e:
        # The reason is on stderr already; a program reading stdout gets it as an event too.
        render.error("cannot reach the daemon (see stderr)" if e.code != EXIT_NOT_RUNNING else "no daemon is running")
        raise
    reader = LineReader(0)
    with client:
        try:
            if args.session:
                try:
                    info = resolve_session(client, args.session)
                    session = client.attach(info.id, since=args.since)
                except NoSuchSession as e:
                    return no_session(e, render)
                except SessionError as e:
                    render.error(str(e))
                    print_error(f"error: {e}")
                    return EXIT_USAGE
                configured = None
            else:
                opened = _open_from_stdin(client, reader, render)
                if opened is None:
                    return EXIT_OK  # stdin ended before any session was asked for
                session, configured = opened
            with client.catch_signals():
                loop = SessionLoop(client, session, render, input_mode=INPUT_JSON, until_idle=True,
                                        turn_status=False, ctrl_c_interrupts=False, bad_input_events=True,
                                        reader=reader)
                if configured is not None:
                    loop.expect(configured, "configure_session")  # its session_configured is to come
                try:
                    return loop.run()
                finally:
                    detach(session)
        except DaemonError as e:
            return daemon_gone(render, str(e))


def _open_from_stdin(client: Client, reader: LineReader, render):
    """Read Submissions until a ``configure_session`` opens a session: (the session, that
    submission's id); None at end of input.

    Anything else before it is answered with Codex's ``error`` (no session yet); a bad line
    with an ``error`` event and a note on stderr. Lines after the opening one stay queued
    in ``reader`` for the session.
    """
    while True:
        while reader.lines:
            number, line = reader.lines.popleft()
            if line is not None and not line.strip():
                continue
            try:
                sub = parse_submission(line)
            except ValueError as e:
                bad_line(number, str(e), render)
                continue
            if not isinstance(sub.op, ConfigureSession):
                render.event(Event(id=sub.id, msg=ErrorEvent(NO_SESSION)))
                continue
            try:
                return client.open_session(sub.op, sub_id=sub.id), sub.id
            except SessionError as e:
                render.event(Event(id=sub.id, msg=ErrorEvent(str(e))))
        if reader.eof:
            return None
        # Nothing else to watch yet: block on stdin (Ctrl-C ends the process here).
        reader.fill()
