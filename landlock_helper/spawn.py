"""Spawn one command inside the sandbox, as a tree that can be killed whole.

A sandbox is three processes, each forked (never exec'd) so nothing is re-imported:

``supervisor``
    Makes the sandbox's cgroups when the caller wants resource limits
    (:mod:`landlock_helper.limits`), unshares the PID, mount and IPC namespaces (a
    network namespace too for a command without network, and a user namespace when not
    root), forks the init, reports the init's pid, and waits for
    it; then reports the cgroups' counters and removes them. It dies with its parent
    (``PR_SET_PDEATHSIG``; with cgroups, that signal is SIGTERM: it kills the init and
    removes them first), and the init dies with the supervisor the same way, so a
    crashed executor never leaves a sandbox behind.
``init`` (pid 1 of the new PID namespace)
    Builds the filesystem view (:func:`landlock_helper.mounts.prepare`: /proc, a private
    /dev and /tmp, hidden paths, everything read-only), forks the command process, reaps
    everything, turns SIGTERM into "SIGTERM to every process in the namespace", and when
    the command exits reports its wait status and exits. It also performs every ``connect`` of the command, through the seccomp
    listener the command hands it before exec, refusing unix peers outside the sandbox
    (:mod:`landlock_helper.unix_guard`). The kernel then SIGKILLs whatever is left in
    the namespace (background jobs, setsid or double-forked escapees), and the init's
    pidfd turns readable only after all of them are gone.
``command``
    Joins the sandbox's cgroups, prepares its Landlock ruleset, then waits for the
    command's spec, whose rlimits it sets before exec. On receipt it
    binds the writable roots read-write and their ``.git``/``.sluice`` read-only, each
    checked against what the caller pinned (:func:`landlock_helper.mounts.apply`), drops
    capabilities, sets NO_NEW_PRIVS, restricts itself with Landlock and seccomp (handing
    the filter's listener to the init), and execs. A danger-full-access command gets a
    sandbox with the host's view instead.

A process that makes one sandbox and then exits (``sluice sandbox``) can be the
supervisor itself (:func:`spawn` with ``one_shot=True``): one Python process fewer to
fork and end. It unshares the PID and IPC (and network) namespaces (and enters the user
namespace) for good, and its init unshares the mount namespace as it starts, so the
caller keeps the host's view; the init dies with the caller as it would with a supervisor.

All of that up to "waits for the spec" happens before anyone asks for a command, so a
sandbox can be *warm*: :class:`Spawner` keeps a few warm sandboxes per executor, made
by a small zygote process forked before the executor loads anything big (forking a
small process is several times cheaper). Starting a command in a warm sandbox costs one
message and an exec (and, with limits, writing them into the sandbox's cgroups: the
caller never makes, joins or removes a cgroup, which can wait on the kernel's cgroup
lock). :func:`spawn` makes a sandbox on the spot and starts it.

Each sandbox has a control socket (``SOCK_SEQPACKET``): the caller sends the spec and
the command's stdio fds on it, and reads back tagged lines: ``C <cgroup name>`` and
``P <init pid>`` from the supervisor, ``E <code> <message>`` if the command could not
start, ``S <wait status>`` from the init, ``L <oom kills> <refused forks>`` from the
supervisor once the tree is dead (with cgroups), ``X <message>`` if set-up failed. The
caller watches :attr:`SandboxedProcess.done_fds` (the init's pidfd and, with cgroups, a
pipe the supervisor closes once it has sent ``L``): when all are readable the whole
tree is dead and :meth:`~SandboxedProcess.poll` has the outcome. (The supervisor then
removes the cgroups and exits; nobody waits for that.)
"""

from __future__ import annotations

import _signal
import ctypes
import dataclasses
import errno
import fcntl
import gc
import importlib
import marshal
import os
import resource
import select
import signal
import socket
import sys
import termios
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from landlock_helper import _libc, landlock, login_shell, mounts, namespaces, seccomp, unix_guard
from landlock_helper.outcome import PASSABLE_SIGNALS, Outcome, SandboxError
from landlock_helper.policy import SandboxPolicy

if TYPE_CHECKING:
    from landlock_helper import limits

# Largest spec (argv + env + policy) a caller may send; SEQPACKET needs it in one piece.
MAX_SPEC = 4 * 1024 * 1024
# Fds sent with it: stdout, stderr and stdin.
_MAX_FDS = 3
# How long a supervisor keeps trying to remove its sandbox's cgroups (busy for a moment
# after the tree is gone).
CGROUP_REMOVE_S = 5.0
# After a fork the system refused, the pool is topped up again after this long, doubling.
FORK_BACKOFF_FIRST_S = 0.1
FORK_BACKOFF_MAX_S = 5.0


_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# Queued to the init with a signal number as its value (:meth:`Process.signal_command`):
# "send this to the command's process group", as a terminal sends Ctrl-C.
_PASS = signal.SIGRTMIN + 3
_INIT_WAITED = {signal.SIGCHLD, _PASS, *_FORWARDED}
_SIG_DFL = int(signal.SIG_DFL)


@dataclass(frozen=True)
class _Template:
    """What every sandbox of one caller shares, fixed before any is made."""

    hidden_paths: tuple[str, ...]
    scratch: str | None  # the host dir that is /tmp inside; None: the host's view (danger-full-access)
    # A network namespace of the sandbox's own: for commands without network (the usual
    # shape, and every warm sandbox's). Abstract unix socket names live per network
    # namespace: with it, the command's are its own in both directions.
    netns: bool
    as_root: bool
    uid: int
    gid: int
    cap_last: int
    seccomp_progs: dict  # network allowed? -> compiled BPF program
    # Where each sandbox gets cgroups of its own for its command's limits (see
    # landlock_helper.limits); empty: no cgroups, rlimits only.
    cgroups: tuple = ()

    @classmethod
    def make(cls, hidden_paths, *, restricted: bool = True, network: bool = False, cgroups: bool = False) -> _Template:
        progs = {}
        if _libc.ARCH is not None:
            progs = {net: seccomp.compile_program(seccomp.build(net)) for net in (False, True)}
        mounts.prime()
        try:
            scratch = mounts.scratch_dir() if restricted else None
        except (OSError, mounts.PinError) as e:
            raise SandboxError(f"cannot make the sandbox's /tmp: {_describe(e)}") from None
        return cls(
            hidden_paths=tuple(os.path.abspath(p) for p in hidden_paths), scratch=scratch,
            netns=restricted and not network, as_root=os.geteuid() == 0, uid=os.geteuid(), gid=os.getegid(),
            cap_last=namespaces.last_cap(), seccomp_progs=progs,
            cgroups=_limits().mechanism().hierarchies if cgroups else (),
        )


def _limits():
    """:mod:`landlock_helper.limits`, loaded when a sandbox has limits or cgroups: a
    one-shot sandbox without them (``sluice sandbox``) does not pay for its import. (An
    executor has it loaded before it forks anything.)"""
    from landlock_helper import limits

    return limits


def _check(argv, cwd, policy: SandboxPolicy, sandbox_cwd: str | None, env, hidden=(), readable=(),
           sandbox_hidden=()) -> mounts.Plan | None:
    """What the caller can know is wrong before a sandbox is used (cheap, no fork), and
    the directories the sandbox is built from, resolved once, here (None: unrestricted).
    ``hidden``: hidden for this command only; ``sandbox_hidden``: by its sandbox."""
    if not sys.platform.startswith("linux"):
        raise SandboxError(f"no sandbox for platform {sys.platform!r}; refusing to run unsandboxed")
    if not argv:
        raise SandboxError("no command given")
    if not os.path.isabs(cwd):
        raise SandboxError(f"cwd must be an absolute path: {cwd}")
    if not os.path.isdir(cwd):
        raise SandboxError(f"cwd does not exist or is not a directory: {cwd}")
    if not policy.unrestricted:
        try:
            landlock.require_abi()
        except landlock.LandlockUnavailable as e:
            raise SandboxError(str(e)) from None
        if _libc.ARCH is None:
            raise SandboxError(f"no seccomp filter for architecture {_libc.MACHINE!r}; refusing to run")
        try:
            return mounts.pin(policy, cwd, sandbox_cwd or cwd, env, hidden, readable, sandbox_hidden)
        except (OSError, mounts.PinError) as e:
            raise SandboxError(_describe(e)) from None
    return None


# How the command's stdin is given in its spec: /dev/null, the third fd sent, or the
# third fd as a terminal that becomes the command's controlling terminal (its stdout and
# stderr are then the same terminal).
STDIN_NULL, STDIN_FD, STDIN_TTY = 0, 1, 2


def _stdio_mode(stdin: int | None, stdout: int | None, stderr: int | None, tty: bool) -> tuple[int, bool, bool]:
    """The spec's stdio: how stdin is given, and whether stdout and stderr are the
    sandbox's own /dev/null (None) rather than fds sent with it."""
    if tty and None in (stdin, stdout, stderr):
        raise SandboxError("a terminal needs its fd as stdin, stdout and stderr")
    return STDIN_TTY if tty else STDIN_NULL if stdin is None else STDIN_FD, stdout is None, stderr is None


# sluice's own programs a sandbox can run in place of exec'ing a command: the command
# process, sandboxed exactly as for a command, calls the module's ``serve()`` over its
# stdin and stdout, then exits with what it returns. The module is imported before any
# sandbox is forked (:func:`_load_builtin`), so nothing of sluice, nor an interpreter,
# needs to be visible inside the sandbox.
BUILTINS = {"fileops": "landlock_helper.fileops"}


def _load_builtin(name: str | None) -> None:
    if name is None:
        return
    if name not in BUILTINS:
        raise SandboxError(f"no builtin {name!r} (known: {', '.join(sorted(BUILTINS))})")
    module = importlib.import_module(BUILTINS[name])
    module.rehearse()


def _encode_spec(argv, cwd, env, policy: SandboxPolicy, plan: mounts.Plan | None,
                 stdio: tuple[int, bool, bool] = (STDIN_NULL, False, False),
                 limited: _Limited | None = None, builtin: str | None = None) -> bytes:
    env = dict(env)
    env["PWD"] = cwd
    rlimits, shm_size = (tuple(limited.rlimits), limited.limits.memory) if limited else ((), 0)
    spec = marshal.dumps(([str(a) for a in argv], cwd, env, policy.to_json(),
                          None if plan is None else plan.to_spec(), stdio, rlimits, shm_size, builtin))
    if len(spec) > MAX_SPEC:
        raise SandboxError(f"command and environment too large ({len(spec)} bytes, at most {MAX_SPEC})")
    return spec


class SandboxedProcess:
    """A running sandboxed command; see the module docstring for the process layout."""

    def __init__(self, sup_pid: int, init_pid: int, ctl: socket.socket, early: list[bytes], *,
                 reap: bool, plan: mounts.Plan | None = None, limited: _Limited | None = None,
                 reported: int | None = None) -> None:
        self.pid = sup_pid
        self.init_pid = init_pid
        self._ctl = ctl
        self._lines = early
        self._reap = reap  # the supervisor is our child (not a zygote's): we must wait for it
        self._sup_fd: int | None = _pidfd(sup_pid)
        self._init_fd: int | None = _pidfd(init_pid)
        self._sup_done = False
        self._killed = False
        self._outcome: Outcome | None = None
        self._plan = plan
        self._limited = limited
        # The sandbox has cgroups: once the tree is dead its supervisor reports their
        # counters (then this pipe reaches EOF) and removes them; it is never killed on
        # purpose, and its report is waited for.
        self._reported = reported
        self._cgroup = reported is not None

    @property
    def done_fds(self) -> tuple[int, ...]:
        """Readable once the whole tree is dead.

        That is the init's pidfd: the kernel kills and waits for every other process
        of the namespace before it reports the init gone. (The supervisor may take a
        while longer, tearing down the mount namespace; nobody needs to wait for that.)
        """
        if self._cgroup:
            return tuple(fd for fd in (self._init_fd, self._reported) if fd is not None)
        return (self._init_fd,) if self._init_fd is not None else ((self._sup_fd,) if self._sup_fd else ())

    def terminate(self) -> None:
        """SIGTERM to every process of the command's tree (the init forwards it)."""
        if self._outcome is None and self._init_fd is not None:
            _pidfd_signal(self._init_fd, signal.SIGTERM)

    def signal_command(self, sig: int) -> None:
        """``sig`` (one of :data:`PASSABLE_SIGNALS`) to the command's process group, as a
        terminal sends Ctrl-C to its foreground job: the init passes it on. What the
        command started in groups of its own does not get it."""
        if sig not in PASSABLE_SIGNALS:
            raise ValueError(f"signal {sig} cannot be passed to a command")
        if self._outcome is None and self._init_fd is not None:
            try:
                _libc.pidfd_queue_signal(self._init_fd, _PASS, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL the init, which makes the kernel kill every process in its namespace."""
        if self._outcome is not None:
            return
        self._killed = True
        if self._cgroup:
            # The supervisor ends by itself once the init is gone, after removing the cgroups.
            if self._init_fd is not None:
                _pidfd_signal(self._init_fd, signal.SIGKILL)
            return
        for fd in (self._init_fd, self._sup_fd):
            if fd is not None:
                _pidfd_signal(fd, signal.SIGKILL)

    def poll(self) -> Outcome | None:
        """The outcome once the whole tree is dead, else None. Never blocks."""
        if self._outcome is not None:
            return self._outcome
        if not all(_readable(fd) for fd in self.done_fds):
            return None
        self._lines += _drain(self._ctl)
        outcome = _outcome(self._lines, self._killed)
        if self._plan is not None:
            notes = mounts.quarantine_planted(self._plan)
            if notes:
                outcome = outcome._replace(notes=tuple(notes))
        if self._limited is not None:
            hit = self._limited.what_hit(_counters(self._lines), outcome.signal)
            if hit:
                outcome = outcome._replace(limit=hit)
        self._outcome = outcome
        return outcome

    def wait(self, timeout: float | None = None) -> Outcome | None:
        """Block until :meth:`poll` has an outcome (or ``timeout`` seconds pass)."""
        while True:
            outcome = self.poll()
            if outcome is not None:
                return outcome
            poller = select.poll()
            for fd in self.done_fds:
                poller.register(fd, select.POLLIN)
            if not poller.poll(None if timeout is None else timeout * 1000) and timeout is not None:
                return self.poll()

    def close(self) -> None:
        for fd in (self._sup_fd, self._init_fd, self._reported):
            if fd is not None:
                os.close(fd)
        self._sup_fd = self._init_fd = self._reported = None
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None  # type: ignore[assignment]
        if self._reap and not self._sup_done:
            # Never leave a zombie. Once the tree is dead the supervisor exits at once;
            # before that, killing it takes the tree with it (pdeathsig); one with cgroups
            # kills the tree on SIGTERM and removes them before it exits.
            if self._outcome is None:
                _kill_quietly(self.pid, signal.SIGTERM if self._cgroup else signal.SIGKILL)
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self._sup_done = True

    def __del__(self) -> None:
        if getattr(self, "_ctl", None) is not None:
            self.close()


class _Limited:
    """The limits of one command on the trusted side: resolved, the rlimits its command
    process sets before exec, and what goes into its sandbox's cgroups."""

    def __init__(self, asked: limits.Limits, template: _Template) -> None:
        limits = _limits()
        self.limits = limits.resolve(asked)
        self.cgroups = template.cgroups
        covered = {c for h in template.cgroups for c in h.controllers}
        self.rlimits = limits.plan_rlimits(self.limits, covered, template.as_root, asked)

    def apply(self, cgroup_name: str | None) -> None:
        """Just before the command is handed over: its limits into its sandbox's cgroups
        (a write to files of theirs, which takes none of the kernel's cgroup locks)."""
        if cgroup_name is None or not self.cgroups:
            return
        try:
            _limits().CommandCgroup(self.cgroups, cgroup_name).set_limits(self.limits)
        except OSError as e:
            raise SandboxError(f"cannot set the command's limits: {_describe(e)}") from None

    def what_hit(self, counters: dict[str, int] | None, sig: int | None) -> str | None:
        return _limits().what_hit(self.limits, counters, sig)


def _limited(asked: limits.Limits | None, template: _Template) -> _Limited | None:
    return None if asked is None else _Limited(asked, template)


def _counters(lines: list[bytes]) -> dict[str, int] | None:
    """The supervisor's ``L <oom kills> <refused forks>`` line, if it sent one."""
    for raw in lines:
        if raw.startswith(b"L "):
            try:
                oom, refused = (int(x) for x in raw[2:].split())
            except ValueError:
                return None
            return {"oom_kill": oom, "pids_max": refused}
    return None


def _outcome(lines: list[bytes], killed: bool) -> Outcome:
    exit_code = sig = error = None
    for raw in lines:
        tag, _, rest = raw.decode(errors="replace").partition(" ")
        if tag == "S":
            status = int(rest)
            if os.WIFSIGNALED(status):
                sig = os.WTERMSIG(status)
            elif exit_code is None:
                exit_code = os.waitstatus_to_exitcode(status)
        elif tag == "E":
            code, _, error = rest.partition(" ")
            exit_code = int(code)
        elif tag == "X":
            error = rest
    if exit_code is None and sig is None and error is None:
        # The init never reported: it was killed (by us, or with its supervisor).
        sig = signal.SIGKILL if killed else None
        if not killed:
            error = "the sandbox died without reporting the command's status"
    return Outcome(exit_code, sig, error)


def _wait_pid(pid: int, timeout: float) -> None:
    """Wait up to ``timeout`` seconds for ``pid`` to end (not reaping it)."""
    fd = _pidfd(pid)
    if fd is None:
        return
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.poll(timeout * 1000)
    finally:
        os.close(fd)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None  # already gone: nothing of it is left to wait for


def _kill_quietly(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _pidfd_signal(fd: int, sig: int) -> None:
    try:
        signal.pidfd_send_signal(fd, sig)
    except ProcessLookupError:
        pass


def _readable(fd: int) -> bool:
    poller = select.poll()  # not select(): a busy executor has fds above FD_SETSIZE
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _drain(sock: socket.socket) -> list[bytes]:
    lines = []
    while True:
        try:
            data = sock.recv(65536, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return lines
        except OSError:
            return lines
        if not data:
            return lines
        lines.append(data)


class _Warm:
    """A sandbox whose command process is waiting for its spec."""

    def __init__(self, sup_pid: int, ctl: socket.socket, *, reap: bool, cgroups: bool = False,
                 reported: int | None = None, network: bool = False) -> None:
        self.sup_pid = sup_pid
        self.network = network  # in the host's network namespace, for a command with network
        self.ctl = ctl
        self.reap = reap
        self.cgroups = cgroups  # its supervisor makes cgroups (and ends on SIGTERM)
        # With cgroups: a pipe's read end, at EOF once the supervisor has reported them.
        self.reported = reported
        self.init_pid: int | None = None
        self.cgroup: str | None = None  # the name of the sandbox's cgroups, if it has some
        self.early: list[bytes] = []

    def _absorb(self, block: bool) -> bool:
        """Read what the sandbox has said so far; False once it is known to be dead."""
        while True:
            flags = 0 if block and self.init_pid is None else socket.MSG_DONTWAIT
            try:
                data = self.ctl.recv(65536, flags)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                return False
            if not data:
                return False  # EOF: every process of the sandbox is gone
            if data.startswith(b"P "):
                self.init_pid = int(data[2:])
            elif data.startswith(b"C "):
                self.cgroup = data[2:].decode()
            else:
                self.early.append(data)
                if data.startswith(b"X "):
                    return False

    def usable(self) -> bool:
        """False when the sandbox died or failed while waiting (its zygote was killed, ...)."""
        return self._absorb(block=False)

    def wait_init_pid(self) -> None:
        """Block until the supervisor has said who the init is (microseconds when warm)."""
        alive = True
        while alive and self.init_pid is None:
            alive = self._absorb(block=True)
        if not alive or self.init_pid is None:
            failures = [m[2:].decode(errors="replace") for m in self.early if m.startswith(b"X ")]
            self.discard()
            raise SandboxError(failures[-1] if failures else "the sandbox died while being set up")

    def start(self, spec: bytes, stdin, stdout, stderr, plan: mounts.Plan | None = None,
              limited: _Limited | None = None) -> SandboxedProcess:
        self.wait_init_pid()
        if limited is not None:
            try:
                limited.apply(self.cgroup)
            except SandboxError:
                self.discard()
                raise
        fds = [fd for fd in (stdout, stderr, stdin) if fd is not None]
        try:
            socket.send_fds(self.ctl, [spec], fds)
        except OSError as e:
            self.discard()
            raise SandboxError(f"cannot hand the command to its sandbox: {e.strerror}") from None
        proc = SandboxedProcess(self.sup_pid, self.init_pid, self.ctl, self.early, reap=self.reap,
                                plan=plan, limited=limited, reported=self.reported)
        self.reported = None  # the process owns it now
        return proc

    def discard(self) -> None:
        """Tear down an unused sandbox (its command process sees EOF and exits)."""
        self.ctl.close()
        if self.reported is not None:
            os.close(self.reported)
            self.reported = None
        if self.reap:
            # One with cgroups ends the sandbox on SIGTERM and removes them before it exits.
            _kill_quietly(self.sup_pid, signal.SIGTERM if self.cgroups else signal.SIGKILL)
            try:
                os.waitpid(self.sup_pid, 0)
            except ChildProcessError:
                pass


def _fork_with_socket(sndbuf: int = 0) -> tuple[int, socket.socket, socket.socket]:
    """A SEQPACKET pair, then ``os.fork``: (pid, our end, the child's end). A fork the
    system refuses (no processes or memory left) is a :class:`SandboxError` saying so,
    which the caller reports for that one command; the pair is closed then."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    if sndbuf:
        mine.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    try:
        return os.fork(), mine, theirs
    except OSError as e:
        mine.close()
        theirs.close()
        raise SandboxError(f"cannot fork: {(e.strerror or str(e)).lower()}") from None


# What ``ps`` shows for the sandbox's init (its pid 1): a short name, not the command line
# of the process it was forked from (an executor's, with its token file's path).
INIT_NAME = b"sluice-init"
PR_SET_NAME = 15
# Where this process's command line lies in its memory: (start, end), read once here,
# before the forks, and the same in every child forked from us.
_argv_area: tuple[int, int] | None = None


def _find_argv_area() -> tuple[int, int]:
    global _argv_area
    if _argv_area is None:
        try:
            with open("/proc/self/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            # proc(5): arg_start and arg_end are fields 48 and 49; these are from field 3 on.
            _argv_area = (int(fields[45]), int(fields[46]))
        except (OSError, IndexError, ValueError):
            _argv_area = (0, 0)
    return _argv_area


def _rename_self(name: bytes) -> None:
    """Make this process show as ``name``: its comm (``ps -o comm``, ``top``) and its
    command line (``ps -ef``). The command line is rewritten in place, in the memory the
    kernel reads /proc/PID/cmdline from (ours, copied at fork): the name, then zeros to the
    end, so nothing of the old one is left. Best effort: a kernel that shows no area is left be."""
    comm = ctypes.create_string_buffer(name[:15])
    _libc.prctl(PR_SET_NAME, ctypes.addressof(comm))
    start, end = _find_argv_area()
    if not start or end - start <= len(name):
        return
    ctypes.memset(start, 0, end - start)
    ctypes.memmove(start, name, len(name))


def _make_warm(template: _Template, *, reap: bool) -> _Warm:
    """Fork a supervisor (and through it init and command) from this process."""
    _find_argv_area()
    reported_r = reported_w = None
    if template.cgroups:
        reported_r, reported_w = os.pipe2(os.O_CLOEXEC)
    parent = os.getpid()
    try:
        pid, mine, theirs = _fork_with_socket(MAX_SPEC + 65536)
    except SandboxError:
        if reported_r is not None:
            os.close(reported_r)
            os.close(reported_w)
        raise
    if pid == 0:
        mine.close()
        if reported_r is not None:
            os.close(reported_r)
        _child_main(_supervisor, theirs.fileno(), template, parent, theirs.fileno(), reported_w)
    theirs.close()
    if reported_w is not None:
        os.close(reported_w)
    return _Warm(pid, mine, reap=reap, cgroups=bool(template.cgroups), reported=reported_r)


def spawn(argv, *, cwd, env, policy: SandboxPolicy, stdout: int | None, stderr: int | None, stdin: int | None = None,
          hidden_paths=(), sandbox_cwd: str | None = None, limits: limits.Limits | None = None,
          tty: bool = False, one_shot: bool = False, builtin: str | None = None, readable=()) -> SandboxedProcess:
    """Start ``argv`` under ``policy`` in a sandbox made now; raises SandboxError.

    ``stdout``/``stderr``/``stdin`` are fds the command gets as its own (the caller may
    close its copies once this returns); None is the sandbox's own /dev/null, opened
    inside it (mounted read-only there, so the command cannot change it). ``tty=True``: they
    are a terminal (a pty's slave, made by the caller outside the sandbox), which becomes
    the controlling terminal of the command's session, so that its line discipline
    signals the command's foreground job (Ctrl-C, Ctrl-Z, window changes). ``cwd`` is where the
    command runs; ``sandbox_cwd`` (default: ``cwd``) is what the policy's
    ``disk-write-cwd`` means: the session's directory, never a model-chosen workdir.
    ``readable``: directories shown read-only, at their own path, where the sandbox would
    not show them (the host's /tmp is not the sandbox's). ``limits``
    (:class:`landlock_helper.limits.Limits`; its unset fields take the defaults) are the
    command's resource limits; None: none of ours.

    ``one_shot=True`` (without ``limits``) is for a process that makes this one sandbox and
    forks nothing else afterwards: it becomes the sandbox's supervisor itself, so its
    PID and IPC namespaces (and, when not root, its user namespace) are the sandbox's
    from now on; its mount namespace stays the host's (see the module docstring).
    """
    if sys.platform == "darwin":  # pragma: no cover - exercised on macOS only
        from landlock_helper.darwin import spawn_seatbelt

        if builtin is not None:
            # Seatbelt applies at exec: the builtin runs in this interpreter, exec'd
            # under the profile (which lets it read the interpreter and sluice's code).
            _load_builtin(builtin)
            package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            argv = [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {package!r}); "
                    f"import {BUILTINS[builtin]} as m; sys.exit(m.serve())"]
        return spawn_seatbelt(argv, cwd=cwd, env=env, policy=policy, stdout=stdout, stderr=stderr,
                              stdin=stdin, hidden_paths=hidden_paths, sandbox_cwd=sandbox_cwd, tty=tty)
    mode = _stdio_mode(stdin, stdout, stderr, tty)
    plan = _check(argv, cwd, policy, sandbox_cwd, env, readable=readable, sandbox_hidden=hidden_paths)
    _load_builtin(builtin)
    template = _Template.make(hidden_paths, restricted=plan is not None, network=policy.network,
                              cgroups=limits is not None)
    limited = _limited(limits, template)
    spec = _encode_spec(argv, cwd, env, policy, plan, mode, limited, builtin)
    if one_shot and limited is None:
        return _supervise_here(template).start(spec, stdin, stdout, stderr, plan)
    return _make_warm(template, reap=True).start(spec, stdin, stdout, stderr, plan, limited)


def _supervise_here(template: _Template) -> _Warm:
    """``spawn(one_shot=True)``: unshare here and fork the init from this process."""
    _find_argv_area()
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    mine.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_SPEC + 65536)
    try:
        namespaces.enter(template.uid, template.gid, template.as_root, mount=False, net=template.netns)
        init = os.fork()
    except OSError as e:
        mine.close()
        theirs.close()
        raise SandboxError(f"cannot make the sandbox: {_describe(e).lower()}") from None
    if init == 0:
        mine.close()
        _child_main(_init_here, theirs.fileno(), template, theirs.fileno())
    theirs.close()
    warm = _Warm(init, mine, reap=True)
    warm.init_pid = init  # it is ours: no supervisor to say who it is
    return warm


class Spawner:
    """Keeps warm sandboxes for one caller (an executor), made by a small zygote process.

    Create it *early*, before the caller imports anything large: the zygote is a fork of
    the caller as it is then, and every sandbox is a fork of the zygote. The caller calls
    :meth:`refill` when :attr:`fileno` is readable (or just before it needs sandboxes).
    """

    def __init__(self, hidden_paths=(), *, pool: int = 4, cgroups: bool = True) -> None:
        """``cgroups``: every sandbox gets cgroups of its own (where this process may make
        them, see :func:`landlock_helper.limits.mechanism`), for its command's limits."""
        if not sys.platform.startswith("linux"):
            raise SandboxError("the warm-sandbox pool needs Linux")
        self.pool = pool
        for name in BUILTINS:  # before the zygote: every sandbox is a fork of it
            _load_builtin(name)
        # Warm sandboxes in the host's network namespace, for commands with network: none
        # until the first such command comes, then this many.
        self.network_pool = 0
        self.template = _Template.make(hidden_paths, cgroups=cgroups)
        self._ready: list[_Warm] = []
        # What the zygote was asked for and has not answered yet (it answers in order):
        # for each, whether with network.
        self._asked: list[bool] = []
        self._sock: socket.socket | None = None
        self.zygote_pid = 0
        # The last fork the system refused ("cannot fork: ..."), until one succeeds, and when
        # to try again on our own (each command that needs a sandbox tries at once).
        self.failure: str | None = None
        self._backoff = 0.0
        self._retry_at = 0.0
        self._start_zygote()

    def _failed(self, why: str) -> None:
        self.failure = why
        self._backoff = min(max(self._backoff * 2, FORK_BACKOFF_FIRST_S), FORK_BACKOFF_MAX_S)
        self._retry_at = time.monotonic() + self._backoff

    def _recovered(self) -> None:
        self.failure = None
        self._backoff = 0.0

    def _start_zygote(self) -> None:
        parent = os.getpid()
        pid, mine, theirs = _fork_with_socket()
        if pid == 0:
            mine.close()
            _child_main(_zygote, None, self.template, parent, theirs)
        theirs.close()
        self.zygote_pid = pid
        self._sock = mine
        self._sock.setblocking(False)
        self._asked = []
        self._top_up()

    @property
    def fileno(self) -> int | None:
        """The zygote's socket, to watch for readability; None while there is no zygote
        (it could not be forked again: the next :meth:`spawn` tries)."""
        return None if self._sock is None else self._sock.fileno()

    def _ask(self, n: int, network: bool = False) -> None:
        for _ in range(n):
            try:
                self._sock.send(b"N" if network else b"W")
            except OSError:  # EPIPE: the zygote is gone
                self._restart_zygote()
                return
            self._asked.append(network)

    def _top_up(self) -> None:
        """Ask the zygote for what the pools lack, counting what it has not answered yet."""
        for network, wanted in ((False, self.pool), (True, self.network_pool)):
            ready = sum(warm.network == network for warm in self._ready)
            missing = wanted - ready - self._asked.count(network)
            if missing > 0 and self._sock is not None:
                self._ask(missing, network)

    def _restart_zygote(self) -> None:
        """The zygote died (killed by someone?), and its sandboxes with it (they die
        with their parent): start over, from us as we are now. If that fork is refused,
        there is no zygote until a later :meth:`spawn` or :meth:`refill` makes one."""
        for warm in self._ready:
            warm.discard()
        self._ready.clear()
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            self._reap_zygote()
        self._asked = []
        try:
            self._start_zygote()
        except SandboxError as e:
            self._failed(str(e))

    def _ensure_zygote(self, *, now: bool) -> None:
        """Without a zygote: make one (``now``, or when the back-off has passed); raises
        :class:`SandboxError` with the reason when ``now`` and it cannot be made."""
        if self._sock is not None or (not now and time.monotonic() < self._retry_at):
            return
        try:
            self._start_zygote()
        except SandboxError as e:
            self._failed(str(e))
            if now:
                raise

    def refill(self, *, block: bool = False, network: bool = False) -> None:
        """Take the sandboxes the zygote has made; ask for more to keep the pools full.

        A sandbox the zygote could not fork (``F`` instead of one) is a failure: the pool
        is not topped up again before the back-off has passed, and a blocking call
        raises :class:`SandboxError` with the reason if no sandbox of the kind it waits
        for (``network``) is coming."""
        self._ensure_zygote(now=block)
        if self._sock is None:
            return
        while self._asked:
            try:
                msg, fds, _, _ = socket.recv_fds(self._sock, 64, 2, 0 if block else socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except ConnectionResetError:
                msg = b""
            if not msg:
                self._restart_zygote()
                return
            kind = self._asked.pop(0)
            if msg.startswith(b"F "):
                for fd in fds:
                    os.close(fd)
                self._failed(msg[2:].decode(errors="replace"))
                if block and network not in self._asked and not self._ready_of(network):
                    raise SandboxError(self.failure)
                continue
            ctl = socket.socket(fileno=fds[0])
            ctl.setblocking(True)
            self._ready.append(_Warm(int(msg[2:]), ctl, reap=False, cgroups=bool(self.template.cgroups),
                                     reported=fds[1] if len(fds) > 1 else None, network=kind))
            self._recovered()
            block = False
        if self.failure is not None and time.monotonic() < self._retry_at:
            return  # backing off: a command that needs a sandbox asks for one itself
        self._top_up()

    def _ready_of(self, network: bool) -> list[_Warm]:
        return [warm for warm in self._ready if warm.network == network]

    def spawn(self, argv, *, cwd, env, policy: SandboxPolicy, stdout: int | None, stderr: int | None,
              stdin: int | None = None, sandbox_cwd: str | None = None,
              limits: limits.Limits | None = None, tty: bool = False, hidden_paths=(),
              builtin: str | None = None, readable=()) -> SandboxedProcess:
        """Like :func:`spawn`, in a warm sandbox (waiting for one only if none is ready);
        ``hidden_paths`` are hidden for this command besides the pool's.

        Warm sandboxes are read-only views, most without network (a network namespace of
        their own), and from the first command with network on also a few in the host's
        network namespace; a danger-full-access command gets one of the host's view, made
        on the spot.
        """
        mode = _stdio_mode(stdin, stdout, stderr, tty)
        plan = _check(argv, cwd, policy, sandbox_cwd, env, hidden_paths, readable, self.template.hidden_paths)
        if builtin is not None and builtin not in BUILTINS:
            raise SandboxError(f"no builtin {builtin!r} (known: {', '.join(sorted(BUILTINS))})")
        limited = _limited(limits, self.template)
        spec = _encode_spec(argv, cwd, env, policy, plan, mode, limited, builtin)
        if plan is None:
            template = dataclasses.replace(self.template, scratch=None, netns=False)
            return _make_warm(template, reap=True).start(spec, stdin, stdout, stderr, None, limited)
        network = policy.network
        if network and not self.network_pool:
            self.network_pool = max(1, self.pool // 2)
        self.refill()
        while True:
            while not self._ready_of(network):
                self._ensure_zygote(now=True)
                if network not in self._asked:
                    self._ask(1, network)
                self.refill(block=True, network=network)
            warm = self._pick(network)
            if warm.usable():
                break
            warm.discard()
        proc = warm.start(spec, stdin, stdout, stderr, plan, limited)
        self.refill()
        return proc

    def _pick(self, network: bool) -> _Warm:
        """The oldest ready sandbox of the kind (``network``) whose supervisor has reported
        its init (starting it does not wait), else the oldest: under a fork storm in another
        sandbox, making one can take seconds, and the caller must not wait on it when
        another is ready."""
        kind = self._ready_of(network)
        for warm in kind:
            if warm.init_pid is None:
                warm.usable()  # reads what it has said so far, without waiting
            if warm.init_pid is not None:
                self._ready.remove(warm)
                return warm
        self._ready.remove(kind[0])
        return kind[0]

    def close(self) -> None:
        for warm in self._ready:
            warm.discard()
        self._ready.clear()
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            if self.template.cgroups:
                # The zygote, told by the EOF, waits for its sandboxes' supervisors, which remove
                # their cgroups as they end (killing it would kill them first: pdeathsig).
                _wait_pid(self.zygote_pid, CGROUP_REMOVE_S + 1.0)
            _kill_quietly(self.zygote_pid)
            self._reap_zygote()

    def _reap_zygote(self) -> None:
        try:
            os.waitpid(self.zygote_pid, 0)
        except ChildProcessError:
            pass


# --- children: everything below runs in forked children -------------------------


def _child_main(fn, report_fd: int | None, *args) -> None:
    """Run ``fn`` in a forked child and never return into the caller's code."""
    try:
        _reset_signals()
        fn(*args)
    except BaseException as e:  # noqa: BLE001 - the child must report, then die
        if report_fd is not None:
            try:
                os.write(report_fd, f"X sandbox set-up failed: {_describe(e)}".encode())
            except Exception:
                pass
    finally:
        os._exit(1)


def _describe(e: BaseException) -> str:
    if isinstance(e, (mounts.PinError, SandboxError)):
        return str(e)
    if isinstance(e, OSError) and e.strerror:
        return e.strerror if e.filename is None else f"{e.strerror}: {e.filename}"
    return f"{type(e).__name__}: {e}"


_RESET = tuple(int(s) for s in (*_FORWARDED, signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGQUIT,
                                 signal.SIGUSR1, signal.SIGUSR2))


def _reset_signals() -> None:
    # The caller's Python-level handlers and wakeup fd must not run in our children.
    # Through _signal, and only where a handler is set: signal.signal's conversions of
    # handlers to and from enums cost a forked process more (its pages copied) than the
    # whole reset, in each of a sandbox's three processes.
    signal.set_wakeup_fd(-1)
    for sig in _RESET:
        if _signal.getsignal(sig) != _SIG_DFL:
            _signal.signal(sig, _SIG_DFL)


def _die_with_parent(parent: int | None, sig: int = signal.SIGKILL) -> None:
    """SIGKILL (or ``sig``) us when our parent dies; ``parent`` None when it is outside our
    PID namespace.

    (The init cannot see its parent: getppid() is 0 there. The supervisor waits for the
    init before it can exit on its own, so only a SIGKILL can race with this prctl.)
    """
    _libc.prctl(_libc.PR_SET_PDEATHSIG, sig)
    if parent is not None and os.getppid() != parent:  # died before the prctl took effect
        os._exit(1)


def _close_fds_except(keep: set[int]) -> None:
    low = 3
    for fd in sorted(k for k in keep if k >= 3):
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)


def _zygote(template: _Template, parent: int, sock: socket.socket) -> None:
    """Make a warm sandbox for every ``W`` (``N``: with the host's network) received;
    exit when the caller goes away."""
    _die_with_parent(parent)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a caller gone is an EOF or EPIPE here
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    _close_fds_except({sock.fileno(), wake_r, wake_w})
    # What every sandbox's fork copies and every exit of one of its processes frees is
    # what is resident here: so not the freed memory of the caller's start-up (its reads
    # of source and bytecode, a sixth of the rest); and no garbage collection in a sandbox
    # process walks (and so copies) the objects that were here before it.
    gc.freeze()
    _libc.trim_heap()
    # Reap supervisors as soon as they exit: SIGCHLD wakes the poll through the pipe.
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    sock.setblocking(True)
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        _reap_any()
        for fd, _ in poller.poll():
            if fd == wake_r:
                while True:
                    try:
                        if not os.read(wake_r, 4096):
                            break
                    except BlockingIOError:
                        break
                continue
            try:
                msg = sock.recv(64)
            except InterruptedError:
                continue
            except OSError:
                msg = b""
            if msg:
                try:
                    # "N": one in the host's network namespace, for a command with network.
                    warm = _make_warm(template if msg != b"N" else dataclasses.replace(template, netns=False),
                                      reap=False)
                except SandboxError as e:
                    warm = None
                    try:
                        sock.send(f"F {e}".encode())  # out of processes or memory: the caller decides
                    except OSError:
                        msg = b""  # the caller is gone
            if msg and warm is not None:
                fds = [warm.ctl.fileno()] + ([warm.reported] if warm.reported is not None else [])
                try:
                    socket.send_fds(sock, [f"S {warm.sup_pid}".encode()], fds)
                except OSError:
                    msg = b""  # the caller is gone; this sandbox ends as its ctl closes
                finally:
                    warm.discard()  # our copies (the zygote reaps its supervisors itself)
            if not msg:
                if template.cgroups:
                    # Dying now would kill the supervisors (pdeathsig) before they remove
                    # their sandboxes' cgroups: let them finish first.
                    _wait_children(CGROUP_REMOVE_S)
                os._exit(0)


def _wait_children(timeout: float) -> None:
    """Reap children until there are none left, for up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.005)


def _reap_any() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _supervisor(template: _Template, parent: int, ctl: int, reported: int | None = None) -> None:
    # With cgroups, the parent's death (or our caller's SIGTERM) is a SIGTERM: we kill the
    # init, which takes the whole sandbox with it as a SIGKILL to us would, and then still
    # remove the cgroups.
    init_pid: list[int] = []
    told: list[bool] = []
    if template.cgroups:
        def end_sandbox(signum, frame) -> None:
            told.append(True)
            if init_pid:
                _kill_quietly(init_pid[0])

        signal.signal(signal.SIGTERM, end_sandbox)
        _die_with_parent(parent, signal.SIGTERM)
    else:
        _die_with_parent(parent)
    _close_fds_except({ctl} if reported is None else {ctl, reported})
    # Our words may find the caller gone (a sandbox discarded early): EPIPE, not death.
    # (The init and the command get the default back, as every child does.)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    cgroup = None
    join_fds: list[int] = []
    if template.cgroups:
        # The sandbox's own cgroups, made here (off the caller's path: making and removing
        # cgroups can wait seconds on the kernel's cgroup lock); its command joins them.
        cgroup = _limits().CommandCgroup.make(template.cgroups)
    try:
        if cgroup is not None:
            join_fds = cgroup.procs_fds()
            os.write(ctl, f"C {cgroup.name}".encode())
        if told:
            raise SandboxError("the sandbox was ended while being made")
        namespaces.enter(template.uid, template.gid, template.as_root, net=template.netns)
        init = os.fork()
        if init == 0:
            if reported is not None:
                os.close(reported)  # only we may say when the report is done
            _child_main(_init, ctl, template, ctl, join_fds)
        init_pid.append(init)
        if told:
            _kill_quietly(init)
    except BaseException:
        if cgroup is not None:
            cgroup.remove()
        raise
    for fd in join_fds:
        os.close(fd)
    try:
        os.write(ctl, f"P {init}".encode())
    except OSError:
        pass  # discarded already: the sandbox ends as it sees the EOF
    if cgroup is None:
        os.close(ctl)
    while True:
        try:
            os.waitpid(init, 0)
            break
        except ChildProcessError:
            break
    if cgroup is not None:
        # The whole tree is dead (the kernel waited for the namespace before the init
        # could be reaped): say which limits it hit, then remove the cgroups.
        counters = cgroup.counters()
        try:
            os.write(ctl, f"L {counters['oom_kill']} {counters['pids_max']}".encode())
        except OSError:
            pass
        os.close(ctl)
        if reported is not None:
            os.close(reported)  # the caller is done waiting; the rest is ours
        cgroup.remove(CGROUP_REMOVE_S)
    os._exit(0)


def _init_here(template: _Template, ctl: int) -> None:
    """The init of a one-shot sandbox (its caller is its supervisor): first what the
    supervisor would have done for it: none of the caller's fds, a mount namespace of its own."""
    _die_with_parent(None)
    _close_fds_except({ctl})
    _libc.unshare(_libc.CLONE_NEWNS)
    _init(template, ctl, [])


def _init(template: _Template, ctl: int, join_fds: list[int]) -> None:
    _die_with_parent(None)
    _rename_self(INIT_NAME)
    # Out of our caller's process group: a Ctrl-C on the caller's terminal is for the
    # caller (`sluice sandbox`), which decides what the command gets (with -i, only a
    # SIGINT for the command's own group; without, the end of the tree through us).
    os.setpgid(0, 0)
    signal.pthread_sigmask(signal.SIG_BLOCK, _INIT_WAITED)
    view = mounts.prepare(template.hidden_paths, template.scratch)
    # The command hands its seccomp listener over on this channel; we answer its connects.
    guard, guard_end = unix_guard.Guard.open()
    child = os.fork()
    if child == 0:
        _child_main(_command, ctl, template, ctl, view, guard_end, join_fds)
    os.close(guard_end)
    for fd in join_fds:
        os.close(fd)
    # Not dumpable: nothing in the sandbox may read our memory or take our fds (the listener).
    _libc.prctl(_libc.PR_SET_DUMPABLE, 0)
    status = _reap_until(child, guard)
    os.write(ctl, f"S {status}".encode())
    os._exit(0)


def _reap_until(main_child: int, guard: unix_guard.Guard) -> int:
    """Reap every process that ends up with us, answer the command's connects, turn
    SIGTERM/SIGINT/SIGHUP into SIGTERM to the namespace; return the main child's wait status."""
    signals = _libc.signalfd(_INIT_WAITED)
    watched: list[int] = []
    poller = select.poll()
    while True:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return 0
            if pid == 0:
                break
            if pid == main_child:
                return status
        if watched != [signals, *guard.fds()]:  # the guard's fds change twice at most
            watched = [signals, *guard.fds()]
            poller = select.poll()
            for fd in watched:
                poller.register(fd, select.POLLIN)
        for fd, events in poller.poll():
            if fd != signals:
                guard.ready(fd, events)
                continue
            try:
                infos = os.read(signals, 16 * _libc.SIGNALFD_SIGINFO_SIZE)
            except BlockingIOError:
                continue
            ending = False
            for i in range(0, len(infos), _libc.SIGNALFD_SIGINFO_SIZE):
                signo = int.from_bytes(infos[i:i + 4], sys.byteorder)
                if signo == _PASS:
                    _pass_on(main_child, infos, i)
                elif signo != signal.SIGCHLD:
                    ending = True
            if ending:
                try:
                    os.kill(-1, signal.SIGTERM)  # everyone in this namespace except us
                except ProcessLookupError:
                    pass


def _pass_on(main_child: int, infos: bytes, at: int) -> None:
    """A signal the executor queued for the command's process group (its value)."""
    sig = int.from_bytes(infos[at + _libc.SIGNALFD_SSI_INT:at + _libc.SIGNALFD_SSI_INT + 4], sys.byteorder,
                         signed=True)
    if sig in PASSABLE_SIGNALS:
        try:
            os.killpg(main_child, sig)  # the command's own session and group (it called setsid)
        except ProcessLookupError:
            pass


def _rehearse() -> None:
    """Run, once and on dummy data, what the command process runs after the spec comes.

    A warm sandbox is a fork: the first time its Python touches an object (a function, a
    type, a cached code path), the kernel copies that page. Touched here, while nobody
    waits, those copies are off the command's path (about 0.4 ms of it)."""
    policy = SandboxPolicy.from_mode("workspace-write", writable_roots=["/"])
    SandboxPolicy.from_json(marshal.loads(marshal.dumps(policy.to_json())))
    mounts.Plan.from_spec((("/", 0, 0), [("/", 0, 0)], True, [("/", 0, 0)], [], [("/", 0, 0)]))
    namespaces.capability_structs()
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with a, b:
        unix_guard.hand_over(os.dup(b.fileno()), os.dup(a.fileno()), False)


def _command(template: _Template, ctl: int, view: mounts.View | None, guard_end: int, join_fds: list[int]) -> None:
    """Get ready, wait for the spec, apply the policy and exec."""
    os.set_inheritable(ctl, False)  # gone at exec: background jobs must not hold it
    # Into the sandbox's cgroups first: everything the command starts is then inside.
    # (Done while warm: joining a cgroup can wait on the kernel's cgroup lock.)
    if join_fds:
        _limits().join(join_fds)
    # The slow parts, done while warm: Landlock's ruleset, and (in a restricted sandbox,
    # the only kind with a view) the bounding set, 41 prctl calls; the caps still in force
    # go right before exec.
    prepared = landlock.prepare_ruleset()
    if view is not None:
        namespaces.drop_bounding(template.cap_last)
        _rehearse()
    # A session of its own (no terminal can signal it), made now: with the scheduler's
    # autogroups on, setsid() costs a few hundred microseconds.
    os.setsid()
    stage = "set-up"
    sock = socket.socket(fileno=ctl)
    try:
        # Peek at the spec's size first: a buffer of the largest size would cost more
        # (zeroing megabytes) than the whole rest of the start.
        size, _, _, _ = sock.recvmsg_into([bytearray(1)], 0, socket.MSG_PEEK | socket.MSG_TRUNC)
        buf = bytearray(size)
        size, ancdata, _, _ = sock.recvmsg_into([buf], socket.CMSG_SPACE(_MAX_FDS * 4))
    except OSError:
        os._exit(1)
    if not size:
        os._exit(0)  # discarded unused
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += memoryview(data).cast("i")
    (argv, cwd, env, policy_json, plan_spec, (stdin_mode, null_out, null_err), rlimits, shm_size,
     builtin) = marshal.loads(memoryview(buf)[:size])
    try:
        policy = SandboxPolicy.from_json(policy_json)
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        sent = iter(fds)
        stdout = os.open("/dev/null", os.O_WRONLY) if null_out else next(sent)
        stderr = os.open("/dev/null", os.O_WRONLY) if null_err else next(sent)
        stdin = next(sent) if stdin_mode != STDIN_NULL else os.open("/dev/null", os.O_RDONLY)
        for target, fd in ((0, stdin), (1, stdout), (2, stderr)):
            if fd != target:
                os.dup2(fd, target)
        if stdin_mode == STDIN_TTY:
            stage = "terminal"
            # Our session (setsid above) has no terminal yet: this one becomes it.
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        ruleset = None
        restricted = not policy.unrestricted
        if restricted:
            stage = "sandbox"
            if view is None or plan_spec is None:
                raise SandboxError("a restricted command reached a sandbox with the host's view")
            cwd_fd, root_fds = mounts.apply(view, mounts.Plan.from_spec(plan_spec))
            if shm_size:
                mounts.bound_shm(shm_size)
            ruleset = landlock.finish_ruleset(prepared, policy, root_fds)
            stage = "chdir"
            os.fchdir(cwd_fd)
        else:
            stage = "chdir"
            os.chdir(cwd)
        _close_fds_except({ctl, ruleset, guard_end} - {None})
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        stage = "limits"
        if rlimits:
            _limits().apply_rlimits(rlimits)
        if restricted:
            stage = "sandbox"
            # As root this is what keeps uid 0 from meaning "everything"; in a user
            # namespace it keeps the command from using the caps it holds there.
            namespaces.drop_capabilities(template.cap_last, bounding=view is None)
            _libc.prctl(_libc.PR_SET_NO_NEW_PRIVS, 1)
            landlock.restrict_self(ruleset)
            # Last before exec: the filter, its listener to the init (unix_guard), no copy kept.
            unix_guard.hand_over(seccomp.install(template.seccomp_progs[policy.network]), guard_end,
                                 policy.network)
        if builtin is not None:
            stage = "builtin"
            code = sys.modules[BUILTINS[builtin]].serve()
            os._exit(code)
        stage = "exec"
        os.execvpe(argv[0], login_shell.keep_path(argv, env), env)
    except OSError as e:
        if stage == "exec":
            code = 126 if e.errno in (errno.EACCES, errno.ENOEXEC, errno.EISDIR) else 127
            what = "command not found" if e.errno == errno.ENOENT else e.strerror
            msg = f"E {code} {what}: {argv[0]}"
        else:
            msg = f"E 126 sandbox {stage} failed: {_describe(e)}"
        os.write(ctl, msg.encode())
    except BaseException as e:  # noqa: BLE001
        os.write(ctl, f"E 126 sandbox {stage} failed: {_describe(e)}".encode())
    os._exit(127)
