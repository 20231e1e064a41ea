"""The ``sluice`` command line: run, exec, sessions, attach, bridge, sandbox, daemon, keys, executor.

Imports are lazy: ``sluice run`` loads only the client (zmq, msgspec, the wire and the
policy), so its start-up stays small next to the command it runs. ``sluice exec`` is
handed, arguments and all, to :mod:`broker.cli.exec` (it needs the agent's configuration);
``sluice sessions``, ``sluice attach`` and ``sluice bridge`` (frontends for the sessions
the daemon hosts) to :mod:`broker.cli.attach`; ``sluice sandbox`` to landlock_helper's
command line. The network commands (``keys``, ``daemon --listen``, ``executor``) are in
:mod:`broker.cli.keys`.

Exit codes of ``sluice run``: the command's own exit code; 124 when it timed out;
128+N when it was killed by signal N; 130 / 143 / 129 when sluice itself got SIGINT /
SIGTERM / SIGHUP (the command is cancelled first and its tree is gone); 141 when our
stdout was closed; 127 when the command was not found, 126 when it could not be
executed; 125 when sluice or the daemon failed; 2 for bad usage.
"""

from __future__ import annotations

import os
import sys

from broker.wire.results import EXIT_NOT_FOUND, EXIT_NOT_RUNNING, EXIT_SLUICE, EXIT_USAGE

# How long ``sluice run`` waits for a cancelled call to end before giving up.
CANCEL_WAIT_S = 5.0

USAGE_RUN = "sluice run [options] -- CMD ARGS..."
USAGE_SANDBOX = "sluice sandbox [options] -- CMD ARGS..."


class CliExit(Exception):
    """Leave a CLI command with this exit code (its message was already printed)."""

    def __init__(self, code: int) -> None:
        self.code = code


def print_error(message: str) -> None:
    """One line on stderr, never a traceback."""
    try:
        sys.stderr.write(f"sluice: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _fail(message: str, code: int) -> int:
    print_error(f"error: {message}")
    return code


def add_connect_args(parser) -> None:
    """``--connect tcp://HOST:PORT --server-key FILE --key FILE``: a remote daemon (CurveZMQ)."""
    parser.add_argument("--connect", metavar="tcp://HOST:PORT", default=None,
                        help="a daemon on another host (started with --listen) instead of the local one")
    parser.add_argument("--server-key", metavar="FILE", default=None, help="with --connect: the daemon's public key file")
    parser.add_argument("--key", metavar="FILE", default=None,
                        help="with --connect: your key pair (NAME.key_secret from `sluice keys new NAME`)")


def remote_from_args(args):
    """The :class:`broker.net.keys.Remote` that ``--connect/--server-key/--key`` name, or None
    for the local daemon. Mistakes are printed as one line and raised as :class:`CliExit`."""
    if getattr(args, "connect", None):
        from broker.net.keys import KeyFileError, Remote

        try:
            return Remote.from_files(args.connect, args.server_key, args.key)
        except KeyFileError as e:
            raise CliExit(_fail(str(e), EXIT_USAGE)) from None
    if getattr(args, "server_key", None) or getattr(args, "key", None):
        raise CliExit(_fail("--server-key and --key go with --connect tcp://HOST:PORT", EXIT_USAGE))
    return None


def connect_client(args, *, name: str, autostart: bool = True):
    """A :class:`broker.client.connection.Client` for the frontend command ``args`` came from.

    The local daemon (started if needed and ``autostart``), or the one ``--connect``
    names. Failures are printed as one line and raised as :class:`CliExit`.
    """
    import broker.client as C

    remote = remote_from_args(args)
    try:
        return C.Client.connect(autostart=autostart, remote=remote, name=name)
    except C.DaemonError as e:
        raise CliExit(_fail(str(e), EXIT_SLUICE)) from None


def _parser():
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message):  # one line instead of usage + message
            print_error(f"error: {message} (see `{self.prog} --help`)")
            raise CliExit(EXIT_USAGE)

    def whole_number(minimum: int, what: str = "a whole number", floor: str | None = None):
        """An argparse type: an int of at least ``minimum``."""
        def parse(text: str) -> int:
            try:
                value = int(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
            if value < minimum:
                raise argparse.ArgumentTypeError(f"must be {floor or minimum} or more, got {value}")
            return value
        return parse

    positive_int = whole_number(1)
    event_seq = whole_number(0, "an event sequence number", "0 (every event)")
    count = whole_number(0)

    def policy_flags(p) -> None:
        p.add_argument("--sandbox", metavar="MODE", default="workspace-write",
                       help="read-only, workspace-write (default) or danger-full-access")
        p.add_argument("--writable", metavar="PATH", action="append", default=[],
                       help="an extra writable directory (absolute, existing); repeatable")
        p.add_argument("--network", action="store_true", help="allow network access")
        p.add_argument("--cwd", metavar="DIR", default=None, help="working directory (default: the current one)")
        p.add_argument("--env", metavar="NAME", action="append", default=[],
                       help="pass this variable through even if it looks secret; repeatable")
        p.add_argument("--env-report", action="store_true",
                       help="first say on stderr which variables are dropped as secret-looking (names only)")

    parser = Parser(prog="sluice", description="Run commands sandboxed, streamed and interruptible through the sluice daemon.")
    sub = parser.add_subparsers(dest="subcommand", metavar="{run,exec,sessions,attach,bridge,sandbox,daemon,keys,executor}", parser_class=Parser)

    run = sub.add_parser("run", usage=USAGE_RUN, help="run a command through the daemon",
                         description="Run CMD in the sandbox through the daemon (started if needed), "
                                     "streaming its output; exits with its exit code.")
    policy_flags(run)
    run.add_argument("--timeout-ms", metavar="N", type=positive_int, default=None,
                     help="kill the command after N milliseconds (exit 124)")
    run.add_argument("--json", action="store_true", help="print Codex-shaped events, one JSON object per line")
    add_connect_args(run)
    run.add_argument("command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    # Listed for --help only: main() hands ``exec`` to broker.cli.exec before parsing.
    sub.add_parser("exec", help="give the agent a task and watch it work (see `sluice exec --help`)", add_help=False)

    sessions = sub.add_parser("sessions", help="list the daemon's sessions",
                              description="List the sessions the daemon hosts (exit 3 when no daemon is running).")
    sessions.add_argument("--json", action="store_true", help="one JSON object per session per line")
    add_connect_args(sessions)

    attach = sub.add_parser("attach", help="follow a session, answer its approvals, give it input",
                            description="Replay a session from the start of its current turn (or --since N), then "
                                        "follow it live. On a terminal, lines typed are sent as input and approvals "
                                        "are asked; Ctrl-C interrupts the turn, Ctrl-D detaches. Detaching never "
                                        "stops the session.")
    attach.add_argument("id", metavar="ID", help="the session's id, or any unique prefix of it")
    attach.add_argument("--json", action="store_true",
                        help="print Codex-shaped events, one JSON object per line (with seq); "
                             "Submissions are read as JSON lines from stdin when it is not a terminal")
    attach.add_argument("--since", metavar="N", type=event_seq, default=None,
                        help="replay from event N (0: all) instead of the start of the current turn")
    attach.add_argument("--until-idle", action="store_true",
                        help="exit once the session is idle: 0 if its last turn completed, 1 if it failed, 130 if aborted")
    add_connect_args(attach)

    bridge = sub.add_parser("bridge", help="JSON lines both ways: Submissions on stdin, Events on stdout",
                            description="Submissions in on stdin and Events out on stdout, one JSON object per line. "
                                        "Without --session the first submission must be configure_session. "
                                        "At the end of stdin: exits once the session is idle.")
    bridge.add_argument("--session", metavar="ID", default=None, help="attach to this session (id or unique prefix)")
    bridge.add_argument("--since", metavar="N", type=event_seq, default=None,
                        help="with --session: replay from event N (0: all) instead of the start of the current turn")
    add_connect_args(bridge)

    sandbox = sub.add_parser("sandbox", usage=USAGE_SANDBOX, help="run a command in the sandbox here, without the daemon",
                             description="Apply the sandbox policy and run CMD directly (no daemon).")
    policy_flags(sandbox)
    sandbox.add_argument("command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    daemon = sub.add_parser("daemon", help="run the daemon in the foreground, or start/stop/status it in the background",
                            description="Without an action: run the daemon in the foreground. "
                                        "start: in the background; stop: stop it; status: exit 0 if running, 3 if not.")
    daemon.add_argument("action", nargs="?", choices=("start", "stop", "status"), default=None)
    daemon.add_argument("--executors", metavar="N", type=count, default=None,
                        help="executor processes (default: CPU count; 0: only executors that connect themselves)")
    daemon.add_argument("--log-json", action="store_true", help="log JSON lines (default: JSON when not a terminal)")
    from broker.cli.keys import add_keys_parser, add_listen_args

    add_listen_args(daemon)
    add_keys_parser(sub)
    # Listed for --help only: main() hands ``executor`` to the executor program before parsing.
    sub.add_parser("executor", help="run an executor here for a daemon on another host (see `sluice executor --help`)",
                   add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        # Handed over, arguments and all, before parsing: they have parsers of their own.
        if argv and argv[0] == "exec":
            from broker.cli.exec import main as exec_main

            return exec_main(argv[1:], prog="sluice exec")
        if argv and argv[0] == "executor":
            from broker.cli.keys import executor_main

            return executor_main(argv[1:])
        parser = _parser()
        args = parser.parse_args(argv)
        if args.subcommand == "run":
            return _run(args)
        if args.subcommand in ("sessions", "attach", "bridge"):
            from broker.cli import attach as attach_cli

            return getattr(attach_cli, f"{args.subcommand}_main")(args)
        if args.subcommand == "sandbox":
            return _sandbox(args)
        if args.subcommand == "daemon":
            return _daemon(args)
        if args.subcommand == "keys":
            from broker.cli.keys import keys_main

            return keys_main(args)
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    except CliExit as e:
        return e.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 141
    except Exception as e:  # a bug, not a user mistake: still one line unless asked for more
        if os.environ.get("SLUICE_DEBUG"):
            raise
        return _fail(f"internal error: {type(e).__name__}: {e} (set SLUICE_DEBUG=1 for a traceback)", EXIT_SLUICE)


def _env_report(passthrough: list[str]) -> None:
    """``--env-report``: the names (never the values) of the variables the command will
    not get, on stderr."""
    from landlock_helper.env import describe_dropped, split_env

    print_error(f"environment: {describe_dropped(split_env(os.environ, passthrough)[1])}")


def _command(args, usage: str) -> list[str]:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print_error(f"error: missing command; usage: {usage}")
        raise CliExit(EXIT_USAGE)
    return command


# -- sluice run -------------------------------------------------------------------------


def _run(args) -> int:
    command = _command(args, USAGE_RUN)
    import broker.client as C

    try:
        request = C.make_request(
            command,
            cwd=args.cwd,
            sandbox=args.sandbox,
            writable=args.writable,
            network=args.network,
            env_passthrough=args.env,
            timeout_ms=args.timeout_ms,
            check_paths=not args.connect,
        )
    except C.UsageError as e:
        return _fail(str(e), EXIT_USAGE)
    if args.env_report:
        _env_report(args.env)

    out = _JsonOutput(request) if args.json else _RawOutput()
    remote = remote_from_args(args)
    try:
        client = C.Client.connect(remote=remote, name="sluice run")
    except C.DaemonError as e:
        out.error(str(e))
        return _fail(str(e), EXIT_SLUICE)

    signum = None
    with client, client.catch_signals():
        call = client.submit_request(request, call_id=out.call_id, on_output=out.on_output)
        out.begin(client, call)
        try:
            try:
                result = client.wait(call)
            except C.Interrupted as e:
                signum = e.signum
                client.cancel(call)
                # Further signals are noted but do not cut the wait short: the tree must die first.
                result = client.wait(call, CANCEL_WAIT_S, interruptible=False)
        except TimeoutError:
            print_error(f"the command did not end within {CANCEL_WAIT_S:g} s of being cancelled; exiting anyway")
            return 128 + signum if signum else EXIT_SLUICE
        except C.DaemonError as e:
            out.error(str(e))
            return _fail(str(e), EXIT_SLUICE)

    out.end(result)
    if signum is not None:
        return 128 + signum
    if out.stdout_closed:
        return 141
    if result.error is not None:
        code = result.returncode
        if code == EXIT_NOT_FOUND:
            print_error(f"command not found: {command[0]}")
        else:
            print_error(f"error: {result.error}")
        return code
    if result.stdout_dropped or result.stderr_dropped:
        pass  # streaming mode shows everything; the captured copy is what was capped
    return result.returncode


def write_all(fd: int, data) -> None:
    """Write all of ``data`` to ``fd``, waiting out a non-blocking tty or pipe."""
    while data:
        try:
            n = os.write(fd, data)
        except BlockingIOError:  # a non-blocking tty or pipe handed to us: wait until writable
            import select

            select.select([], [fd], [])
            continue
        if n == len(data):
            return
        data = memoryview(data)[n:]


class _RawOutput:
    """Bytes of the command's stdout/stderr to ours, as they come."""

    call_id = None

    def __init__(self) -> None:
        self.stdout_closed = False
        self._client = None
        self._call = None

    def begin(self, client, call) -> None:
        self._client = client
        self._call = call

    def on_output(self, call, stream, chunk) -> None:
        if stream == 2:
            try:
                write_all(2, chunk)
            except OSError:
                pass
            return
        if self.stdout_closed:
            return
        try:
            write_all(1, chunk)
        except BrokenPipeError:
            # Like a command writing into a closed pipe: stop it.
            self.stdout_closed = True
            if self._client is not None:
                self._client.cancel(call)

    def error(self, message: str) -> None:
        pass

    def end(self, result) -> None:
        pass


class _JsonOutput:
    """Codex-shaped events, one JSON object per line on stdout."""

    def __init__(self, request) -> None:
        from broker.wire import protocol
        from broker.wire.results import new_call_id

        self.P = protocol
        self.request = request
        self.call_id = new_call_id()
        self.stdout_closed = False
        self._names = {1: "stdout", 2: "stderr"}

    def _emit(self, msg) -> None:
        if self.stdout_closed:
            return
        try:
            write_all(1, self.P.encode_json(self.P.Event(id=self.call_id, msg=msg)) + b"\n")
        except BrokenPipeError:
            self.stdout_closed = True

    def begin(self, client, call) -> None:
        self._emit(self.P.ExecCommandBeginEvent(call_id=self.call_id, command=list(self.request.argv), cwd=self.request.cwd))

    def on_output(self, call, stream, chunk) -> None:
        self._emit(self.P.ExecCommandOutputDeltaEvent(call_id=self.call_id, stream=self._names.get(stream, "stdout"), chunk=bytes(chunk)))

    def error(self, message: str) -> None:
        self._emit(self.P.ErrorEvent(message=message))

    def end(self, result) -> None:
        if result.error is not None:
            self.error(result.error)
        stdout = result.stdout.decode("utf-8", "replace")
        stderr = result.stderr.decode("utf-8", "replace")
        aggregated = stdout + stderr
        self._emit(
            self.P.ExecCommandEndEvent(
                call_id=self.call_id,
                stdout=stdout,
                stderr=stderr,
                aggregated_output=aggregated,
                exit_code=result.returncode,
                duration=self.P.Duration.from_seconds(result.duration_s),
                formatted_output=aggregated,
            )
        )


# -- sluice sandbox ---------------------------------------------------------------------


def _sandbox(args) -> int:
    command = _command(args, USAGE_SANDBOX)
    from landlock_helper.policy import MODES

    if args.sandbox not in MODES:
        return _fail(f"unknown sandbox mode {args.sandbox!r}; expected one of {', '.join(MODES)}", EXIT_USAGE)
    cwd = os.path.abspath(args.cwd) if args.cwd is not None else None
    if cwd is not None and not os.path.isdir(cwd):
        what = "is not a directory" if os.path.exists(cwd) else "does not exist"
        return _fail(f"working directory {cwd} {what}", EXIT_USAGE)
    for path in args.writable:
        if not os.path.isabs(path):
            return _fail(f"writable path must be absolute: {path!r}", EXIT_USAGE)
        if not os.path.exists(path):
            return _fail(f"writable path does not exist: {path}", EXIT_USAGE)
    helper_argv = ["--sandbox", args.sandbox]
    for path in args.writable:
        helper_argv += ["--writable", path]
    if args.network:
        helper_argv.append("--network")
    if cwd is not None:
        helper_argv += ["--cwd", cwd]
    for name in args.env:
        helper_argv += ["--env", name]
    if args.env_report:
        _env_report(args.env)
    from broker.net.keys import default_keys_dir
    from broker.net.runtime import RuntimeDir, ensure_sluice_home, hidden_paths

    # A daemon may be running for this user: its socket and token stay out of reach, and
    # so does sluice's home (config, sessions, CurveZMQ keys), made first if missing so
    # that it can be hidden (and the command cannot make one of its own).
    problem = ensure_sluice_home()
    if problem:
        print_error(f"warning: {problem}")
    for path in hidden_paths(RuntimeDir.default().path, default_keys_dir()):
        helper_argv += ["--hide", path]
    helper_argv += ["--", *command]
    from landlock_helper.__main__ import main as helper_main

    return helper_main(helper_argv, prog="sluice")


# -- sluice daemon ----------------------------------------------------------------------


def _daemon(args) -> int:
    from broker.cli.keys import listen_argv, listen_from_args
    from broker.net.runtime import RuntimeDir, RuntimeDirError

    runtime = RuntimeDir.default()
    listen = listen_from_args(args) if args.action in (None, "start") else None
    if args.action is None:
        from broker.daemon.server import DaemonAlreadyRunning, serve
        from broker.daemon.listener import ListenError

        try:
            return serve(runtime, executors=args.executors, log_json=True if args.log_json else None, listen=listen)
        except DaemonAlreadyRunning as e:
            return _fail(str(e) or f"a daemon is already running in {runtime.path}", 1)
        except (RuntimeDirError, ListenError) as e:
            return _fail(str(e), 1)

    import broker.client as C

    if args.action == "status":
        try:
            status = C.daemon_status(runtime)
        except C.DaemonError as e:
            return _fail(str(e), 1)
        print(f"sluice: {status.describe()}", flush=True)
        return 0 if status.running else EXIT_NOT_RUNNING

    if args.action == "stop":
        try:
            pid = C.stop_daemon(runtime)
        except C.DaemonError as e:
            return _fail(str(e), 1)
        print(f"sluice: daemon stopped (pid {pid})" if pid else f"sluice: daemon not running (runtime dir {runtime.path})", flush=True)
        return 0

    # start
    try:
        status = C.daemon_status(runtime)
    except C.DaemonError as e:
        return _fail(str(e), 1)
    if status.running:
        print(f"sluice: {status.describe()}", flush=True)
        return 0
    extra = []
    if args.executors is not None:
        extra += ["--executors", str(args.executors)]
    if args.log_json:
        extra.append("--log-json")
    extra += listen_argv(args)
    try:
        pid = C.start_daemon(runtime, args=extra)
    except C.DaemonError as e:
        return _fail(str(e), 1)
    print(f"sluice: daemon started (pid {pid}, socket {runtime.socket_path})", flush=True)
    return 0
