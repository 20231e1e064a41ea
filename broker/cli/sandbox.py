"""``sluice sandbox``: a command in the sandbox, here and now, without the daemon.

It treats stdin and terminals as ``sluice run`` does, so that trying a command here
tells what it will do through the daemon:

- ``-t``: a pty made here (outside the sandbox) is the command's terminal, of our
  window's size; our terminal is in raw mode meanwhile (restored on every way out), keys
  typed go to the pty, its output to our stdout, and SIGWINCH resizes it.
- Otherwise the command never gets a terminal of ours: a stdin that is a terminal is
  /dev/null (with ``-i``: relayed through a pipe, lines as the terminal hands them
  over, end of file at Ctrl-D), and a stdout or stderr that is a terminal is relayed
  through a pipe. A pipe, a file or /dev/null is handed to the command as it is.
- On a terminal (``-t`` or not) the command's output goes through
  :mod:`broker.cli.terminal_guard` unless ``--raw-escapes``.

SIGINT, SIGTERM and SIGHUP to sluice end the command's whole tree (SIGTERM, SIGKILL
after :data:`KILL_GRACE_S`; sluice then exits with 128 + that signal, as ``sluice run``
does); otherwise sluice exits with the
command's status (128+N when signal N killed it, 127 when it was not found).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import struct
import sys
import termios
import time

from broker.cli.base import USAGE_SANDBOX, caught_signals, command_of, env_report, fail, print_error, write_all
from broker.cli.terminal import NOT_A_TERMINAL, RawTerminal, is_terminal, window_size
from broker.cli.terminal_guard import ConfigValueError, output_guards
from broker.net.keys import default_keys_dir
from broker.net.runtime import RuntimeDir, ensure_sluice_home, hidden_paths
from broker.wire.results import EXIT_SIGNAL_BASE, EXIT_USAGE
from landlock_helper.__main__ import policy_from_args
from landlock_helper.env import filter_env
from landlock_helper.policy import MODES, PolicyError
from landlock_helper.spawn import SandboxError, spawn

# How much one read of a relayed stream takes.
RELAY_READ = 64 * 1024
# Exit status when the sandbox could not be set up (as ``python -m landlock_helper``).
EXIT_SETUP = 2
# After SIGTERM to the command's tree, how long until SIGKILL (as the executor's cancel):
# an interactive shell ignores SIGTERM.
KILL_GRACE_S = 0.5


# The flags of ``sluice sandbox`` (broker.cli.main's parser is where they are described):
# those that take a value, and the switches, by the attribute they set.
_VALUE_FLAGS = {"--sandbox": "sandbox", "--cwd": "cwd", "--writable": "writable", "--env": "env"}
_SWITCHES = {"--network": "network", "--env-report": "env_report", "-t": "tty", "--tty": "tty",
             "-i": "interactive", "--interactive": "interactive", "-it": None, "-ti": None,
             "--raw-escapes": "raw_escapes"}


class _Args:
    """What argparse would make of a plain ``sluice sandbox`` command line."""

    def __init__(self) -> None:
        self.sandbox = "workspace-write"
        self.cwd = None
        self.writable: list[str] = []
        self.env: list[str] = []
        self.network = self.env_report = self.tty = self.interactive = self.raw_escapes = False
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
    cwd = os.path.abspath(args.cwd) if args.cwd is not None else None
    if cwd is not None and not os.path.isdir(cwd):
        what = "is not a directory" if os.path.exists(cwd) else "does not exist"
        return fail(f"working directory {cwd} {what}", EXIT_USAGE)
    for path in args.writable:
        if not os.path.isabs(path):
            return fail(f"writable path must be absolute: {path!r}", EXIT_USAGE)
        if not os.path.exists(path):
            return fail(f"writable path does not exist: {path}", EXIT_USAGE)
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
    try:
        guards = output_guards(args.raw_escapes)
    except ConfigValueError as e:
        return fail(str(e), EXIT_USAGE)
    return _Relay(args.tty, args.interactive, one_shot, guards).run(command, cwd=cwd, env=env, policy=policy,
                                                                   hide=hide)


class _Relay:
    """Starts the command with the right ends of its stdio and moves bytes between ours
    and theirs until its whole tree is dead."""

    def __init__(self, tty: bool, interactive: bool, one_shot: bool = False, guards: dict | None = None) -> None:
        self.tty = tty
        self.guards = guards or {}  # our fd -> its TerminalGuard (broker.cli.terminal_guard), for a terminal
        self.interactive = interactive
        self.one_shot = one_shot
        # (from, to) pairs moved while the command runs; ``to`` for stdin is theirs.
        self.outputs: list[tuple[int, int]] = []
        self.stdin_to: int | None = None
        self.pending = b""
        self.mine: list[int] = []  # fds of ours to close at the end
        self.signum: int | None = None
        self.proc = None
        self.kill_at: float | None = None
        self.killed = False

    def _pipe(self) -> tuple[int, int]:
        r, w = os.pipe2(os.O_CLOEXEC)
        self.mine += [r, w]
        return r, w

    def _close(self, fd: int) -> None:
        if fd in self.mine:
            self.mine.remove(fd)
            os.close(fd)

    def _stdio(self) -> tuple[int | None, int, int, list[int]]:
        """The command's stdin (None: /dev/null), stdout and stderr, and which of those
        are ours to close once it has them."""
        if self.tty:
            master, slave = os.openpty()
            self.mine += [master, slave]
            rows, cols = window_size(0, 1, 2)
            fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
            self.master = master
            self.stdin_to = master
            self.outputs.append((master, 1))
            return slave, slave, slave, [slave]
        theirs = []
        stdin: int | None
        if is_terminal(0):
            if self.interactive:
                r, w = self._pipe()
                self.stdin_to = w
                stdin = r
                theirs.append(r)
            else:
                stdin = None
        else:
            stdin = 0 if _open(0) else None
        out = []
        for fd in (1, 2):
            if is_terminal(fd):
                r, w = self._pipe()
                self.outputs.append((r, fd))
                out.append(w)
                theirs.append(w)
            else:
                out.append(fd if _open(fd) else os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC))
                if out[-1] != fd:
                    self.mine.append(out[-1])
                    theirs.append(out[-1])
        return stdin, out[0], out[1], theirs

    def run(self, command, *, cwd, env, policy, hide) -> int:
        with self._signals():
            try:
                stdin, stdout, stderr, theirs = self._stdio()
                try:
                    proc = self.proc = spawn(command, cwd=cwd, env=env, policy=policy, stdin=stdin, stdout=stdout,
                                             stderr=stderr, hidden_paths=hide, tty=self.tty,
                                             one_shot=self.one_shot)
                finally:
                    for fd in theirs:
                        self._close(fd)
            except (SandboxError, OSError) as e:
                self._close_all()
                return fail(str(e), EXIT_SETUP)
            try:
                if self.signum is not None:  # told to stop while it was starting
                    self._stop()
                with RawTerminal(0) if self.tty else contextlib.nullcontext() as term:
                    self._pump(proc, term)
                for fd, guard in self.guards.items():
                    _write_out(fd, guard.flush())
                outcome = proc.wait()
            finally:
                proc.close()
                self._close_all()
        for note in outcome.notes:
            _say(note)  # already "sluice: ..."
        if outcome.limit:
            print_error(outcome.limit)
        if outcome.error:
            print_error(outcome.error)
        if self.signum is not None:
            # As `sluice run`: 130, 143, 129 when we were told to stop (and stopped the command).
            return EXIT_SIGNAL_BASE + self.signum
        if outcome.signal is not None:
            return EXIT_SIGNAL_BASE + outcome.signal
        return outcome.exit_code if outcome.exit_code is not None else 1

    def _close_all(self) -> None:
        for fd in list(self.mine):
            self._close(fd)

    def _stop(self) -> None:
        """SIGTERM to the command's tree now, SIGKILL after :data:`KILL_GRACE_S`."""
        if self.proc is not None and self.kill_at is None:
            self.proc.terminate()
            self.kill_at = time.monotonic() + KILL_GRACE_S

    @contextlib.contextmanager
    def _signals(self):
        """SIGINT, SIGTERM, SIGHUP end the command's tree (we relay until it is dead);
        every signal with a handler wakes the relay's select through the wakeup fd."""
        def end(signum, frame):
            self.signum = signum
            self._stop()

        with caught_signals(end) as self.wake:
            yield

    def _pump(self, proc, term: RawTerminal | None) -> None:
        done_fds = tuple(proc.done_fds)
        outputs = dict(self.outputs)
        reading_stdin = self.stdin_to is not None
        while True:
            if term is not None and term.resized():
                rows, cols = term.size()
                with contextlib.suppress(OSError):
                    fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
            dead = bool(done_fds) and all(_readable(fd) for fd in done_fds)
            if dead:
                # The whole tree is gone: what is left in the pipes (or the pty) is all there is.
                for src, dst in outputs.items():
                    _drain(src, dst, self.guards.get(dst))
                return
            rlist = [self.wake, *done_fds, *outputs]
            wlist = []
            if self.pending:
                wlist.append(self.stdin_to)
            elif reading_stdin:
                rlist.append(0)
            timeout = None if done_fds else 0.1
            if self.kill_at is not None and not self.killed:
                left = self.kill_at - time.monotonic()
                if left <= 0:
                    proc.kill()
                    self.killed = True
                else:
                    timeout = left if timeout is None else min(timeout, left)
            try:
                readable, writable, _ = select.select(rlist, wlist, [], timeout)
            except InterruptedError:
                continue
            if self.wake in readable:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self.wake, 512):
                        pass
            for src in [fd for fd in readable if fd in outputs]:
                data = _read(src)
                if data:
                    _write_out(outputs[src], data, self.guards.get(outputs[src]))
                elif data is not None:
                    del outputs[src]  # the command closed that stream (or every end of its pty)
            if 0 in readable:
                data = _read(0)
                if data is None:
                    pass
                elif data:
                    self.pending = data
                else:
                    reading_stdin = False
                    if not self.tty and self.stdin_to is not None:
                        self._close(self.stdin_to)  # end of file for the command
                        self.stdin_to = None
            if self.pending and self.stdin_to in writable:
                self._feed()
            if not done_fds and proc.poll() is not None:
                done_fds = ()
                for src, dst in outputs.items():
                    _drain(src, dst, self.guards.get(dst))
                return

    def _feed(self) -> None:
        """Part of what was typed (or piped) to the command, as much as it takes now."""
        fd = self.stdin_to
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        try:
            n = os.write(fd, self.pending)
        except BlockingIOError:
            n = 0
        except OSError:
            # The command closed its stdin (EPIPE) or its terminal: nothing more goes in.
            n = len(self.pending)
        finally:
            fcntl.fcntl(fd, fcntl.F_SETFL, flags)
        self.pending = self.pending[n:]


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def _say(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _read(fd: int) -> bytes | None:
    """What ``fd`` has (b"" at its end; None if nothing after all)."""
    try:
        return os.read(fd, RELAY_READ)
    except BlockingIOError:
        return None
    except OSError as e:
        if e.errno == errno.EIO:  # a pty's master once every end of its terminal is closed
            return b""
        raise


def _drain(src: int, dst: int, guard=None) -> None:
    while _readable(src):
        data = _read(src)
        if not data:
            return
        _write_out(dst, data, guard)


def _write_out(fd: int, data: bytes, guard=None) -> None:
    try:
        write_all(fd, guard.feed(data) if guard else data)
    except OSError:
        pass  # our stdout or stderr is gone: the command's output has nowhere to go
