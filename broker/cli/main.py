"""The ``sluice`` command line: run, exec, sessions, attach, bridge, mcp, sandbox, daemon, keys, executor, ray.

This module parses and dispatches; each command lives in a module of its own, imported
once it is chosen, so ``sluice run`` loads only the client (zmq, msgspec, the wire and
the policy) and its start-up stays small next to the command it runs: :mod:`.run`,
:mod:`.sandbox` (landlock_helper's command line), :mod:`.daemon`, :mod:`.keys` (``keys``,
``daemon --listen``, ``executor``), :mod:`.attach` (``sessions``, ``attach``),
:mod:`.bridge`, :mod:`.mcp`, :mod:`.cluster` (``ray``: sluice on a Ray cluster), and :mod:`.exec`,
which gets its arguments unparsed (it has its own, with the configuration's ``-c`` overrides:
:mod:`.config`).

Exit codes of ``sluice run``: the command's own exit code; 124 when it timed out;
128+N when it was killed by signal N; 130 / 143 / 129 when sluice itself got SIGINT /
SIGTERM / SIGHUP (the command is cancelled first and its tree is gone); 141 when our
stdout was closed; 127 when the command was not found, 126 when it could not be
executed; 125 when sluice or the daemon failed; 75 when the daemon shut down before the
command finished; 2 for bad usage.
"""

from __future__ import annotations

import os
import signal
import sys

from broker.cli.base import (
    JSON_HELP,
    USAGE_RUN,
    USAGE_SANDBOX,
    CliExit,
    add_connect_args,
    fail,
    hold_closed_stdio,
    leave,
    print_error,
    take_json_format,
    whole_number,
)
from broker.wire.results import EXIT_INTERRUPTED, EXIT_SIGNAL_BASE, EXIT_SLUICE, EXIT_USAGE


def _parser(argv: list[str] = ()):
    """The ``sluice`` parser for ``argv``. When its first argument names a command, that
    command's parser is the only one made (argparse would consult no other, and making
    every command's options costs a plain ``sluice run`` more than its own parsing does);
    otherwise (``--help``, ``--version``, a mistake) every command's is."""
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message):  # one line instead of usage + message
            print_error(f"error: {message} (see `{self.prog} --help`)")
            raise CliExit(EXIT_USAGE)

    def policy_flags(p, sandbox_default: str | None = "workspace-write",
                     sandbox_help: str = "read-only, workspace-write (default) or danger-full-access",
                     cwd_help: str = "working directory (default: the current one)") -> None:
        p.add_argument("--sandbox", metavar="MODE", default=sandbox_default, help=sandbox_help)
        p.add_argument("--writable", metavar="PATH", action="append", default=[],
                       help="an extra writable directory (absolute, existing); repeatable")
        p.add_argument("--network", action="store_true", help="allow network access")
        p.add_argument("--cwd", metavar="DIR", default=None, help=cwd_help)
        p.add_argument("--env", metavar="NAME", action="append", default=[],
                       help="pass this variable through even if it looks secret; repeatable")
        p.add_argument("--env-report", action="store_true",
                       help="first say on stderr which variables are dropped as secret-looking (names only)")

    def readable_flag(p) -> None:
        p.add_argument("--readable", metavar="PATH", action="append", default=[],
                       help="show this directory read-only at its own path (one in the host's /tmp, which the "
                            "sandbox's own /tmp hides: a venv, a tool); repeatable")

    def terminal_flags(p) -> None:
        p.add_argument("-t", "--tty", action="store_true",
                       help="give the command a terminal (a pty in the sandbox): your terminal in raw mode, its keys, "
                            "Ctrl-C and Ctrl-Z included, go to the command, its window size follows yours; "
                            "stdin must be a terminal")
        p.add_argument("-i", "--interactive", action="store_true",
                       help="keep stdin attached even when it is a terminal (lines typed reach the command, "
                            "Ctrl-D ends them); -it for a terminal both ways")
        p.add_argument("--escape-char", metavar="CHAR", dest="escape", default="~",
                       help="with -t, right after Enter: CHAR. ends the command, CHAR? lists the escapes, "
                            "CHARCHAR types CHAR (as ssh's ~.); 'none': every key goes to the command "
                            "(default: ~)")
        p.add_argument("--raw-escapes", action="store_true",
                       help="pass every escape sequence of the command's output to your terminal (by default, "
                            "on a terminal, those that set the clipboard or title or make the terminal answer "
                            "are dropped); pipes and files get every byte either way")

    def limit_flags(p) -> None:
        p.add_argument("--memory", metavar="SIZE", default=None,
                       help="memory limit of the command's tree (512M, 1G; 0: none; default: half of RAM where a "
                            "memory cgroup enforces it); the command is killed at the limit")
        p.add_argument("--pids-limit", metavar="N", default=None,
                       help="processes and threads the command may have at once (default 1024; -1 or 0: none)")
        p.add_argument("--file-size", metavar="SIZE", default=None,
                       help="largest file the command may write (default 8G; 0: none)")
        p.add_argument("--cpu-time", metavar="SECONDS", default=None,
                       help="CPU time per process (60, 5m; default: none)")

    def run_args(run) -> None:
        policy_flags(run)
        readable_flag(run)
        terminal_flags(run)
        run.add_argument("--timeout-ms", metavar="N", type=whole_number(1), default=None,
                         help="kill the command after N milliseconds (exit 124)")
        limit_flags(run)
        run.add_argument("--json", action="store_true", help="print Codex-shaped events, one JSON object per line")
        run.add_argument("--via-broker", action="store_true",
                         help="pass the output through the daemon's socket, even where the command could write "
                              "to this command's stdout and stderr itself (as it does by default on this host)")
        add_connect_args(run)
        run.add_argument("command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def sessions_args(sessions) -> None:
        sessions.add_argument("action", nargs="?", choices=("close",), default=None,
                              help="close ID: shut the session down (its turn and commands end)")
        sessions.add_argument("id", nargs="?", metavar="ID", default=None, help=argparse.SUPPRESS)
        sessions.add_argument("--json", action="store_true", help="one JSON object per session per line")
        add_connect_args(sessions)

    event_seq = whole_number(0, "an event sequence number", "0 (every event)")

    def attach_args(attach) -> None:
        attach.add_argument("id", metavar="ID", help="the session's id, or any unique prefix of it")
        attach.add_argument("--json", action="store_true",
                            help=JSON_HELP + "; Submissions are read as JSON lines from stdin "
                                             "when it is not a terminal")
        attach.add_argument("--since", metavar="N", type=event_seq, default=None,
                            help="replay from event N (0: all) instead of the start of the current turn")
        attach.add_argument("--until-idle", action="store_true",
                            help="exit once the session is idle: 0 if its last turn completed, 1 if it failed (or an approval "
                                 "waits that no attached frontend can answer), 130 if aborted")
        add_connect_args(attach)

    def bridge_args(bridge) -> None:
        bridge.add_argument("--session", metavar="ID", default=None, help="attach to this session (id or unique prefix)")
        bridge.add_argument("--since", metavar="N", type=event_seq, default=None,
                            help="with --session: replay from event N (0: all) instead of the start of the current turn")
        add_connect_args(bridge)

    def mcp_args(mcp) -> None:
        policy_flags(mcp, None, "read-only, workspace-write or danger-full-access (default: sandbox_mode in "
                                "config.toml, else workspace-write)",
                     "the workspace: commands run here or below, never elsewhere (default: the current directory)")
        limit_flags(mcp)

    def sandbox_args(sandbox) -> None:
        policy_flags(sandbox)
        readable_flag(sandbox)
        terminal_flags(sandbox)
        sandbox.add_argument("command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    def daemon_args(daemon) -> None:
        count = whole_number(0)
        seconds = whole_number(1, "a number of seconds")
        daemon.add_argument("action", nargs="?", choices=("start", "stop", "status", "logs"), default=None)
        daemon.add_argument("--json", action="store_true", help="status: one JSON object")
        daemon.add_argument("-n", "--lines", metavar="N", type=count, default=20, help="logs: the last N lines (default 20)")
        daemon.add_argument("-f", "--follow", action="store_true", help="logs: then follow it until Ctrl-C")
        daemon.add_argument("--force", action="store_true",
                            help="stop: even while sessions wait for approval (they end unanswered)")
        daemon.add_argument("--executors", metavar="N", type=count, default=None,
                            help="executor processes (default: $SLUICE_EXECUTORS, else the CPU count; at most 4 per "
                                 "CPU; 0: only executors that connect themselves)")
        daemon.add_argument("--log-json", action="store_true", help="log JSON lines (default: JSON when not a terminal)")
        daemon.add_argument("--suspend-limit", metavar="SECONDS", type=seconds, default=None,
                            help="how long a stopped (Ctrl-Z) frontend keeps its commands running (default: 3600)")
        daemon.add_argument("--executor-wait", metavar="SECONDS", type=seconds, default=None,
                            help="how long a command waits while no executor is connected before it fails (default: 30)")

        def heartbeat(text: str) -> float:
            try:
                value = float(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
            if not 0.1 <= value <= 10:  # also refuses nan and inf
                raise argparse.ArgumentTypeError(f"must be from 0.1 to 10 seconds, got {text}")
            return value

        daemon.add_argument("--heartbeat", metavar="SECONDS", type=heartbeat, default=None,
                            help="how often the daemon pings its peers; a peer silent for 10 heartbeats is given up "
                                 "and its commands fail (default: 1)")

        def journal_size(text: str) -> int:
            from landlock_helper.limits import LimitError, parse_size

            try:
                n = parse_size(text, "--journal-limit")
            except LimitError as e:
                raise argparse.ArgumentTypeError(str(e)) from None
            if n < 1024 * 1024:
                raise argparse.ArgumentTypeError(f"must be 1M or more, got {text!r}")
            return n

        daemon.add_argument("--journal-limit", metavar="SIZE", type=journal_size, default=None,
                            help="what the session journals in the runtime dir hold together, at most (default: "
                                 "1G, and no more than a quarter of the filesystem they are on); past it, the oldest "
                                 "events of the biggest sessions go first")
        from broker.cli.keys import add_listen_args

        add_listen_args(daemon)

    def keys_args(keys) -> None:
        from broker.cli.keys import add_keys_args

        add_keys_args(keys)

    def ray_args(ray) -> None:
        from broker.cli.cluster import add_ray_args

        add_ray_args(ray)

    # Each command: its name, how it is listed and introduced, and its options (None: it
    # is listed for --help only, as main() hands it over before parsing).
    commands = {
        "run": ({"usage": USAGE_RUN, "help": "run a command through the daemon",
                 "description": "Run CMD in the sandbox through the daemon (started if needed), "
                                "streaming its output; exits with its exit code."}, run_args),
        "exec": ({"help": "give the agent a task and watch it work (see `sluice exec --help`)", "add_help": False},
                 None),
        "sessions": ({"help": "list the daemon's sessions, or close one",
                      "usage": "sluice sessions [--json] | sluice sessions close ID",
                      "description": "List the sessions the daemon hosts (exit 3 when no daemon is running); "
                                     "close ID: shut one down."},
                     sessions_args),
        "attach": ({"help": "follow a session, answer its approvals, give it input",
                    "description": "Replay a session from the start of its current turn (or --since N), then "
                                   "follow it live. On a terminal, lines typed are sent as input and approvals "
                                   "are asked; Ctrl-C interrupts the turn, Ctrl-D detaches. Detaching never "
                                   "stops the session."}, attach_args),
        "bridge": ({"help": "JSON lines both ways: Submissions on stdin, Events on stdout",
                    "description": "Submissions in on stdin and Events out on stdout, one JSON object per line. "
                                   "Without --session the first submission must be configure_session. "
                                   "At the end of stdin: exits once the session is idle."}, bridge_args),
        "mcp": ({"usage": "sluice mcp [--sandbox MODE] [--cwd WORKSPACE] [--writable PATH]... [--network] [options]",
                 "help": "serve MCP over stdio: tools that run commands in the sandbox",
                 "description": "Speak MCP (JSON-RPC over stdio) to an MCP client such as Claude Code, Cursor or "
                                "Codex, and offer it tools that run commands through the daemon (started if "
                                "needed), each in the sandbox: run, session_start, session_write, session_read, "
                                "session_close. The policy is fixed by these flags and $SLUICE_HOME/config.toml "
                                "(sandbox_mode, [sandbox_workspace_write], [limits]); no tool argument can widen "
                                "it. A tool's cwd must lie inside the workspace (--cwd). At the end of stdin every "
                                "command and session is killed, then sluice mcp exits."}, mcp_args),
        "sandbox": ({"usage": USAGE_SANDBOX, "help": "run a command in the sandbox here, without the daemon",
                     "description": "Apply the sandbox policy and run CMD directly (no daemon)."}, sandbox_args),
        "daemon": ({"help": "run the daemon in the foreground, or start/stop/status it in the background",
                    "description": "Without an action: run the daemon in the foreground. "
                                   "start: in the background; stop: stop it; status: what it runs (exit 0 "
                                   "if running, 3 if not); logs: its log (a daemon started in the background)."},
                   daemon_args),
        "keys": ({"help": "make CurveZMQ key pairs for connecting over the network",
                  "description": "sluice keys new NAME: write NAME.key (public, to share) and NAME.key_secret "
                                 "(secret, mode 0600) for daemons, frontends and executors that connect over tcp."},
                 keys_args),
        "executor": ({"help": "run an executor here for a daemon on another host (see `sluice executor --help`)",
                      "add_help": False}, None),
        "web": ({"help": "the daemon's sessions in a browser (see `sluice web --help`)", "add_help": False}, None),
        "ray": ({"help": "sluice on a Ray cluster: up, status, down (needs the ray extra)",
                 "description": "up: start the daemon and an executor on every node of the Ray cluster, keys "
                                "handed out through Ray; status: executors by node; down: revoke the keys and "
                                "stop it all. Frontends on the cluster then use --ray."}, ray_args),
    }
    from broker.wire.version import SLUICE_VERSION

    parser = Parser(prog="sluice", description="Run commands sandboxed, streamed and interruptible through the sluice daemon.")
    parser.add_argument("--version", action="version", version=f"sluice {SLUICE_VERSION}")
    sub = parser.add_subparsers(dest="subcommand", metavar=f"{{{','.join(commands)}}}", parser_class=Parser)
    only = argv[0] if argv and argv[0] in commands else None
    for name, (listed, add_args) in commands.items():
        if only is None or name == only:
            p = sub.add_parser(name, **listed)
            if add_args is not None:
                add_args(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``sluice`` command ``argv`` and return its exit code. Without ``argv`` this is
    the ``sluice`` program itself (the console script, ``python -m broker``), on its own
    command line: then a finished ``sluice run`` or ``sluice sandbox`` leaves the process at
    once (:func:`leave`), and ``sluice sandbox`` supervises its sandbox itself."""
    program = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    hold_closed_stdio()  # before any socket or pipe of ours can take a closed one's number
    # Each command's module is imported once it is chosen: ``sluice run`` does not pay for
    # the daemon's, the agent's or the sandbox's imports, nor they for the client's.
    try:
        # Handed over, arguments and all, before parsing: they have parsers of their own.
        if argv and argv[0] == "exec":
            from broker.cli.exec import main as exec_main

            return exec_main(argv[1:], prog="sluice exec")
        if argv and argv[0] == "executor":
            from broker.cli.keys import executor_main

            return executor_main(argv[1:])
        if argv and argv[0] == "web":
            from broker.web.serve import main as web_main

            return web_main(argv[1:])
        if argv and argv[0] == "sandbox":
            # Its plain forms are read without argparse (see quick_args); the rest by the parser.
            from broker.cli.sandbox import quick_args, sandbox_main

            code = sandbox_main(quick_args(argv[1:]) or _parser(argv).parse_args(argv), one_shot=program)
            if program:
                leave(code)
            return code
        json_format = "seed"
        if argv and argv[0] == "attach":
            argv, json_format = take_json_format(argv)
        parser = _parser(argv)
        args = parser.parse_args(argv)
        args.json_format = json_format
        if args.subcommand == "run":
            from broker.cli.run import run_main

            code = run_main(args)
            if program:
                leave(code)
            return code
        if args.subcommand in ("sessions", "attach"):
            from broker.cli import attach

            return getattr(attach, f"{args.subcommand}_main")(args)
        if args.subcommand == "bridge":
            from broker.cli.bridge import bridge_main

            return bridge_main(args)
        if args.subcommand == "mcp":
            from broker.cli.mcp import mcp_main

            return mcp_main(args)
        if args.subcommand == "daemon":
            from broker.cli.daemon import daemon_main

            return daemon_main(args)
        if args.subcommand == "keys":
            from broker.cli.keys import keys_main

            return keys_main(args)
        if args.subcommand == "ray":
            from broker.cli.cluster import ray_main

            return ray_main(args)
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    except CliExit as e:
        return e.code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_SIGNAL_BASE + signal.SIGPIPE
    except Exception as e:  # a bug, not a user mistake: still one line unless asked for more
        if os.environ.get("SLUICE_DEBUG"):
            raise
        return fail(f"internal error: {type(e).__name__}: {e} (set SLUICE_DEBUG=1 for a traceback)", EXIT_SLUICE)
