"""``sluice sandbox``: a command in the sandbox, here and now, without the daemon.

It treats stdin and terminals as ``sluice run`` does, so that trying a command here
tells what it will do through the daemon:

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
after :data:`KILL_GRACE_S`; sluice then exits with 128 + that signal, as ``sluice run``
does); otherwise sluice exits with the
command's status (128+N when signal N killed it, 127 when it was not found).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import struct
import sys
import termios
import time

from broker.cli.base import (
    USAGE_SANDBOX,
    ConfigError,
    caught_signals,
    command_of,
    env_report,
    fail,
    host_tmp_check,
    print_error,
    run_roots,
)
from broker.cli.home_writes import HomeWrites
from broker.cli.terminal import (
    DEFAULT_ESCAPE,
    NOT_A_TERMINAL,
    CtrlC,
    EscapeKeys,
    RawTerminal,
    escape_char,
    is_terminal,
    window_size,
)
from broker.cli.terminal_guard import output_guards, relay_filter
from broker.net.keys import default_keys_dir
from broker.net.runtime import RuntimeDir, ensure_sluice_home, hidden_paths
from broker.wire.results import EXIT_SIGNAL_BASE, EXIT_USAGE
from landlock_helper.__main__ import policy_from_args
from landlock_helper.env import filter_env
from landlock_helper.policy import MODES, PolicyError
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
    cwd = os.path.abspath(args.cwd) if args.cwd is not None else None
    if cwd is not None and not os.path.isdir(cwd):
        what = "is not a directory" if os.path.exists(cwd) else "does not exist"
        return fail(f"working directory {cwd} {what}", EXIT_USAGE)
    try:
        args.writable, args.readable = run_roots(args)
    except ConfigError as e:
        return fail(str(e), EXIT_USAGE)
    for path in args.writable:
        if not os.path.isabs(path):
            return fail(f"writable path must be absolute: {path!r}", EXIT_USAGE)
        if not os.path.exists(path):
            return fail(f"writable path does not exist: {path}", EXIT_USAGE)
    for path in args.readable:
        if not os.path.isabs(path):
            return fail(f"readable path must be absolute: {path!r}", EXIT_USAGE)
        if not os.path.isdir(path):
            what = "is not a directory" if os.path.exists(path) else "does not exist"
            return fail(f"readable path {path} {what}", EXIT_USAGE)
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
    return _Sandboxed(args.tty, args.interactive, one_shot, screen, watch, escape).run(
        command, cwd=cwd, env=env, policy=policy, hide=hide, readable=args.readable)


class _Sandboxed:
    """Starts the command with its stdio (:class:`~landlock_helper.relay.Relay`: pipes of
    ours, or a pty) and moves bytes between ours and theirs until its whole tree is dead."""

    def __init__(self, tty: bool, interactive: bool, one_shot: bool = False, screen=None,
                 watch: HomeWrites | None = None, escape: str | None = DEFAULT_ESCAPE) -> None:
        self.tty = tty
        self.interactive = interactive
        self.escapes = EscapeKeys(escape)  # -t: ~. ends the command
        self.ctrl_c = CtrlC() if interactive and not tty else None  # -i: Ctrl-C is passed to the command
        self.term: RawTerminal | None = None
        self.one_shot = one_shot
        self.watch = watch
        # screen: broker.cli.terminal_guard.relay_filter; the watch sees what it passes
        self.relay = Relay(terminal_filter=watch.screen(screen) if watch is not None else screen)
        self.signum: int | None = None
        self.proc = None
        self.kill_at: float | None = None
        self.killed = False

    def _stdio(self) -> tuple[int | None, int | None, int | None]:
        """The command's stdin, stdout and stderr (None: the sandbox's /dev/null)."""
        if self.tty:
            slave = self.relay.terminal(key_filter=self._keys)
            self._resize(*window_size(0, 1, 2))
            return slave, slave, slave
        # A terminal is never the command's: read through a pipe with -i, else /dev/null.
        stdin = self.relay.input(0) if self.interactive or not is_terminal(0) else None
        return stdin, self.relay.output(1), self.relay.output(2)

    def run(self, command, *, cwd, env, policy, hide, readable=()) -> int:
        with self._signals():
            try:
                try:
                    stdin, stdout, stderr = self._stdio()
                    proc = self.proc = spawn(command, cwd=cwd, env=env, policy=policy, stdin=stdin, stdout=stdout,
                                             stderr=stderr, hidden_paths=hide, tty=self.tty,
                                             one_shot=self.one_shot, readable=readable)
                finally:
                    self.relay.handed_over()
            except (SandboxError, OSError) as e:
                self.relay.close()
                return fail(str(e), EXIT_SETUP)
            try:
                if self.signum is not None:  # told to stop while it was starting
                    self._stop()
                with RawTerminal(0) if self.tty else contextlib.nullcontext() as self.term:
                    self._pump(proc, self.term)
                outcome = proc.wait()
            finally:
                proc.close()
                self.relay.close()
        if self.relay.error:
            print_error(self.relay.error)
        for note in outcome.notes:
            _say(note)  # already "sluice: ..."
        if outcome.limit:
            print_error(outcome.limit)
        if outcome.error:
            print_error(outcome.error)
        elif self.watch is not None and self.signum is None and outcome.signal is None and outcome.exit_code:
            hint = self.watch.hint()
            if hint:
                print_error(hint)
        if self.signum is not None:
            # As `sluice run`: 130, 143, 129 when we were told to stop (and stopped the command).
            return EXIT_SIGNAL_BASE + self.signum
        if outcome.signal is not None:
            return EXIT_SIGNAL_BASE + outcome.signal
        return outcome.exit_code if outcome.exit_code is not None else 1

    def _resize(self, rows: int, cols: int) -> None:
        fcntl.ioctl(self.relay.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def _stop(self) -> None:
        """SIGTERM to the command's tree now, SIGKILL after :data:`KILL_GRACE_S`."""
        if self.proc is not None and self.kill_at is None:
            self.proc.terminate()
            self.kill_at = time.monotonic() + KILL_GRACE_S

    def _keys(self, keys: bytes) -> bytes:
        """-t: the keys typed, less the escapes (:class:`EscapeKeys`), which act here."""
        keys, asked = self.escapes.feed(keys)
        if asked == EscapeKeys.HELP and self.term is not None:
            self.term.say(self.escapes.help())
        elif asked == EscapeKeys.END:
            if self.term is not None:
                self.term.say(self.escapes.ending())
            self.signum = signal.SIGHUP  # as if its terminal hung up
            self._stop()
        return keys

    @contextlib.contextmanager
    def _signals(self):
        """SIGINT, SIGTERM, SIGHUP end the command's tree (we relay until it is dead),
        except that with -i SIGINT is passed to the command (:class:`CtrlC`); every signal
        with a handler wakes the relay's select through the wakeup fd."""
        def end(signum, frame):
            if signum == signal.SIGINT and self.ctrl_c is not None and self.ctrl_c.passes(self.proc is not None):
                self.proc.signal_command(signal.SIGINT)
                return
            self.signum = signum
            self._stop()

        with caught_signals(end) as self.wake:
            yield

    def _pump(self, proc, term: RawTerminal | None) -> None:
        done_fds = tuple(proc.done_fds)
        while True:
            if term is not None and term.resized():
                with contextlib.suppress(OSError):
                    self._resize(*term.size())
            if done_fds and all(_readable(fd) for fd in done_fds) or not done_fds and proc.poll() is not None:
                # The whole tree is gone: what is left in the pipes (or the pty) is all there is.
                self.relay.drain()
                return
            timeout = None if done_fds else 0.1
            if self.kill_at is not None and not self.killed:
                left = self.kill_at - time.monotonic()
                if left <= 0:
                    proc.kill()
                    self.killed = True
                else:
                    timeout = left if timeout is None else min(timeout, left)
            if self.wake in self.relay.step([self.wake, *done_fds], timeout):
                with contextlib.suppress(BlockingIOError):
                    while os.read(self.wake, 512):
                        pass


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def _say(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
