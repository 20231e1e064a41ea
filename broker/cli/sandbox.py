"""``sluice sandbox``: a command in the sandbox, here and now, without the daemon.

It treats stdin and terminals as ``sluice run`` does, so that trying a command here
tells what it will do through the daemon, and relays them in the same loop
(:mod:`broker.cli.relay`):

- ``-t``: a pty made here (outside the sandbox) is the command's terminal, of our
  window's size; our terminal is in raw mode meanwhile (restored on every way out), keys
  typed go to the pty, its output to our stdout, and SIGWINCH resizes it.
- Otherwise the command never gets a descriptor of ours (:mod:`landlock_helper.relay`):
  its stdin, stdout and stderr are pipes of ours, relayed to and from ours (spliced
  when ours is a pipe or a file), or the sandbox's own /dev/null where ours is
  /dev/null. A stdin that is a terminal is /dev/null (with ``-i``: relayed, lines as
  the terminal hands them over, end of file at Ctrl-D).
- On a terminal (``-t`` or not) the command's output goes through
  :mod:`broker.cli.terminal_guard` unless ``--raw-escapes``.

SIGINT, SIGTERM and SIGHUP to sluice end the command's whole tree (SIGTERM, SIGKILL
after :data:`KILL_GRACE_S`; sluice then exits with 128 + the first of them, as ``sluice
run`` does); otherwise sluice exits with the
command's status (128+N when signal N killed it, 127 when it was not found).
"""

from __future__ import annotations

import os
import select
import sys
import time

from broker.cli.base import (
    USAGE_SANDBOX,
    ConfigError,
    command_of,
    env_report,
    fail,
    host_tmp_check,
    print_error,
    run_roots,
)
from broker.cli.home_writes import HomeWrites
from broker.cli.relay import RelayLoop
from broker.cli.terminal import DEFAULT_ESCAPE, NOT_A_TERMINAL, escape_char, is_terminal
from broker.cli.terminal_guard import output_guards, relay_filter
from broker.net.keys import default_keys_dir
from broker.net.runtime import RuntimeDir, ensure_sluice_home, hidden_paths
from broker.wire.results import EXIT_SIGNAL_BASE, EXIT_USAGE
from landlock_helper.__main__ import policy_from_args
from landlock_helper.env import filter_env
from landlock_helper.policy import MODES, PolicyError, run_paths
from landlock_helper.relay import Relay
from landlock_helper.spawn import SandboxError, spawn

# Exit status when the sandbox could not be set up (as ``python -m landlock_helper``).
EXIT_SETUP = 2
# After SIGTERM to the command's tree, how long until SIGKILL (as the executor's cancel):
# an interactive shell ignores SIGTERM.
KILL_GRACE_S = 0.5


# The flags of ``sluice sandbox`` (broker.cli.main's parser is where they are described):
# those that take a value, and the switches, by the attribute they set.
_VALUE_FLAGS = {"--sandbox": "sandbox", "--cwd": "cwd", "--writable": "writable", "--readable": "readable",
                "--env": "env", "--escape-char": "escape"}
_SWITCHES = {"--network": "network", "--env-report": "env_report", "-t": "tty", "--tty": "tty",
             "-i": "interactive", "--interactive": "interactive", "-it": None, "-ti": None,
             "--raw-escapes": "raw_escapes"}


class _Args:
    """What argparse would make of a plain ``sluice sandbox`` command line."""

    def __init__(self) -> None:
        self.sandbox = "workspace-write"
        self.cwd = None
        self.writable: list[str] = []
        self.readable: list[str] = []
        self.env: list[str] = []
        self.network = self.env_report = self.tty = self.interactive = self.raw_escapes = False
        self.escape = DEFAULT_ESCAPE
        self.command: list[str] = []


def quick_args(argv: list[str]) -> _Args | None:
    """``sluice sandbox``'s arguments (those after ``sandbox``) read without argparse, or
    None for anything but the plain forms (``--help``, an abbreviation, an unknown flag, a
    value that looks like a flag, no command): argparse then decides, and words every
    message and the help.

    ``sluice sandbox`` is a start-up that is timed against bubblewrap's, and importing
    argparse and building the parser would cost it more than everything it runs in the
    command's sandbox. The forms read here mean what they mean to argparse: the flags,
    ``--flag=VALUE``, ``-it``, and the command from the first word that is not a flag on
    (with a leading ``--``, dropped later by :func:`command_of`, as for argparse's)."""
    args = _Args()
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--" or not word.startswith("-") or word == "-":
            args.command = argv[i:]
            return args
        name, eq, value = word.partition("=")
        if name in _VALUE_FLAGS:
            if not eq:
                if i + 1 >= len(argv) or argv[i + 1].startswith("-"):
                    return None
                i += 1
                value = argv[i]
            attr = _VALUE_FLAGS[name]
            if isinstance(getattr(args, attr), list):
                getattr(args, attr).append(value)
            else:
                setattr(args, attr, value)
        elif word in _SWITCHES:
            for attr in (_SWITCHES[word],) if _SWITCHES[word] else ("tty", "interactive"):
                setattr(args, attr, True)
        else:
            return None
        i += 1
    return None  # no command: argparse says so


def sandbox_main(args, *, one_shot: bool = False) -> int:
    """``sluice sandbox`` with its parsed ``args``; its exit code. ``one_shot``: this
    process is the ``sluice`` program and ends with the command, so it supervises the
    sandbox itself (landlock_helper.spawn's ``one_shot``: one process fewer), which changes
    its namespaces for good; never in a process that goes on."""
    command = command_of(args, USAGE_SANDBOX)
    if args.sandbox not in MODES:
        return fail(f"unknown sandbox mode {args.sandbox!r}; expected one of {', '.join(MODES)}", EXIT_USAGE)
    if args.tty and not is_terminal(0):
        return fail(NOT_A_TERMINAL, EXIT_USAGE)
    try:
        escape = escape_char(args.escape)
    except ValueError as e:
        return fail(str(e), EXIT_USAGE)
    try:
        args.writable, args.readable = run_roots(args)
        run_paths(args.cwd, args.writable, args.readable)
    except (ConfigError, PolicyError) as e:
        return fail(str(e), EXIT_USAGE)
    if args.env_report:
        env_report(args.env)
    # A daemon may be running for this user: its socket and token stay out of reach, and
    # so does sluice's home (config, sessions, CurveZMQ keys), made first if missing so
    # that it can be hidden (and the command cannot make one of its own).
    problem = ensure_sluice_home()
    if problem:
        print_error(f"warning: {problem}")
    hide = hidden_paths(RuntimeDir.default().path, default_keys_dir())
    try:
        policy, cwd = policy_from_args(args)
    except PolicyError as e:
        return fail(str(e), EXIT_SETUP)
    env = filter_env(os.environ, args.env)
    code = host_tmp_check(command, cwd, env, policy, args.readable)
    if code is not None:
        return code
    try:
        screen = relay_filter(output_guards(args.raw_escapes))
    except ConfigError as e:
        return fail(str(e), EXIT_USAGE)
    # What a person reads on a terminal: a write refused under the home directory gets a hint.
    watch = HomeWrites(writable=policy.writable_roots(cwd, env)) \
        if is_terminal(2) and not (args.tty or policy.full_write) else None
    loop = RelayLoop(tty=args.tty, interactive=args.interactive, escape=escape, screen=screen, watch=watch)
    # A terminal is never the command's stdin: read through a pipe with -i, else /dev/null.
    return _sandboxed(loop, command, stdin=args.interactive or not is_terminal(0), one_shot=one_shot, watch=watch,
                      cwd=cwd, env=env, policy=policy, hide=hide, readable=args.readable)


class _Sandboxed:
    """A command of ours, relayed (:class:`~broker.cli.relay.RelayLoop`) until its whole
    tree is dead: a :class:`~broker.cli.relay.Running`."""

    feeds = True

    def __init__(self, proc, relay: Relay) -> None:
        self.proc = proc
        self.relay = relay
        self.done_fds = tuple(proc.done_fds)
        self.kill_at: float | None = None

    def watched(self) -> tuple[int, ...]:
        return self.done_fds

    def timeout(self) -> float | None:
        timeout = None if self.done_fds else 0.1  # no fd tells its end: polled
        if self.kill_at is not None:
            left = max(0.0, self.kill_at - time.monotonic())
            timeout = left if timeout is None else min(timeout, left)
        return timeout

    def heard(self, ready: list[int]):
        if self.kill_at is not None and time.monotonic() >= self.kill_at:
            self.kill_at = None
            self.proc.kill()
        if self.done_fds and all(_readable(fd) for fd in self.done_fds) \
                or not self.done_fds and self.proc.poll() is not None:
            # The whole tree is gone: what is left in the pipes (or the pty) is all there is.
            self.relay.drain()
            return self.proc.wait()
        return None

    def stop(self, signum: int) -> None:
        """SIGTERM to the command's tree now, SIGKILL after :data:`KILL_GRACE_S`."""
        self.proc.terminate()
        self.kill_at = time.monotonic() + KILL_GRACE_S

    def pass_signal(self, signum: int) -> None:
        self.proc.signal_command(signum)


def _sandboxed(loop: RelayLoop, command, *, stdin: bool, one_shot: bool, watch: HomeWrites | None,
               cwd, env, policy, hide, readable=()) -> int:
    """Start the command with its stdio from ``loop`` (``stdin``: ours is relayed to it)
    and relay until its whole tree is dead; our exit code."""
    with loop.signals():
        try:
            try:
                stdin, stdout, stderr = loop.stdio(stdin)
                proc = spawn(command, cwd=cwd, env=env, policy=policy, stdin=stdin, stdout=stdout,
                             stderr=stderr, hidden_paths=hide, tty=loop.tty, one_shot=one_shot, readable=readable)
            finally:
                loop.relay.handed_over()
        except (SandboxError, OSError) as e:
            loop.relay.close()
            return fail(str(e), EXIT_SETUP)
        try:
            outcome = loop.run(_Sandboxed(proc, loop.relay))
        finally:
            proc.close()
            loop.close()
    for note in outcome.notes:
        _say(note)  # already "sluice: ..."
    if outcome.limit:
        print_error(outcome.limit)
    if outcome.error:
        print_error(outcome.error)
    elif watch is not None and loop.signum is None and outcome.signal is None and outcome.exit_code:
        hint = watch.hint()
        if hint:
            print_error(hint)
    if loop.signum is not None:
        # As `sluice run`: 130, 143, 129 when we were told to stop (and stopped the command).
        return EXIT_SIGNAL_BASE + loop.signum
    if outcome.signal is not None:
        return EXIT_SIGNAL_BASE + outcome.signal
    return outcome.exit_code if outcome.exit_code is not None else 1


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def _say(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
