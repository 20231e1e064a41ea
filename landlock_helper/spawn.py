"""Spawn one command inside the sandbox, as a tree that can be killed whole: the caller's side.

A sandbox is three processes (supervisor, init, command), each forked from the caller:
what they do is in :mod:`landlock_helper.sandbox_tree`. This module and
:mod:`landlock_helper.process` (the handles on a sandbox) run in the caller.

All of a sandbox's set-up up to "waits for the spec" happens before anyone asks for a
command, so a sandbox can be *warm*: :class:`Spawner` keeps a few warm sandboxes per
executor, made by a small zygote process (:mod:`landlock_helper.zygote`) forked before
the executor loads anything big (forking a small process is several times cheaper).
Starting a command in a warm sandbox costs one message and an exec (and, with limits,
writing them into the sandbox's cgroups: the caller never makes, joins or removes a
cgroup, which can wait on the kernel's cgroup lock). :func:`spawn` makes a sandbox on
the spot and starts it; a process that makes one sandbox and then exits (``sluice
sandbox``) can be its supervisor itself (``one_shot=True``).
"""

from __future__ import annotations

import importlib
import marshal
import os
import socket
import sys
import time
from typing import TYPE_CHECKING, NamedTuple

from landlock_helper import _libc, landlock, mounts, namespaces, seccomp, zygote
from landlock_helper.outcome import SandboxError
from landlock_helper.policy import SandboxPolicy
from landlock_helper.process import SandboxedProcess, Warm, wait_pid
from landlock_helper.sandbox_tree import (BUILTINS, CGROUP_REMOVE_S, MAX_SPEC, STDIN_FD, STDIN_NULL, STDIN_TTY,
                                          become_supervisor, describe, kill_quietly, load_limits, reap,
                                          start_supervisor)

if TYPE_CHECKING:
    from landlock_helper import limits

# After a fork the system refused, the pool is topped up again after this long, doubling.
FORK_BACKOFF_FIRST_S = 0.1
FORK_BACKOFF_MAX_S = 5.0


class _Template(NamedTuple):
    """What every sandbox of one caller shares, fixed before any is made (and read by its
    processes after they fork). A named tuple, not a dataclass: see
    :class:`landlock_helper.outcome.Outcome` for why."""

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
    # The niceness every command is set to before exec; None: the caller's.
    nice: int | None = None

    @classmethod
    def make(cls, hidden_paths, *, restricted: bool = True, network: bool = False, cgroups: bool = False,
             nice: int | None = None) -> _Template:
        progs = {}
        if _libc.ARCH is not None:
            progs = {net: seccomp.compile_program(seccomp.build(net)) for net in (False, True)}
        mounts.prime()
        try:
            scratch = mounts.scratch_dir() if restricted else None
        except (OSError, mounts.PinError) as e:
            raise SandboxError(f"cannot make the sandbox's /tmp: {describe(e)}") from None
        return cls(
            hidden_paths=tuple(os.path.abspath(p) for p in hidden_paths), scratch=scratch,
            netns=restricted and not network, as_root=os.geteuid() == 0, uid=os.geteuid(), gid=os.getegid(),
            cap_last=namespaces.last_cap(), seccomp_progs=progs,
            cgroups=load_limits().mechanism().hierarchies if cgroups else (), nice=nice,
        )


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
            raise SandboxError(describe(e)) from None
    return None


def _stdio_mode(stdin: int | None, stdout: int | None, stderr: int | None, tty: bool) -> tuple[int, bool, bool]:
    """The spec's stdio: how stdin is given, and whether stdout and stderr are the
    sandbox's own /dev/null (None) rather than fds sent with it."""
    if tty and None in (stdin, stdout, stderr):
        raise SandboxError("a terminal needs its fd as stdin, stdout and stderr")
    return STDIN_TTY if tty else STDIN_NULL if stdin is None else STDIN_FD, stdout is None, stderr is None


def _builtin_module(name: str) -> str:
    if name not in BUILTINS:
        raise SandboxError(f"no builtin {name!r} (known: {', '.join(sorted(BUILTINS))})")
    return BUILTINS[name]


def _load_builtin(name: str | None) -> None:
    """Import a builtin (:data:`landlock_helper.sandbox_tree.BUILTINS`) before any
    sandbox that runs it is forked."""
    if name is not None:
        importlib.import_module(_builtin_module(name)).rehearse()


def _encode_spec(argv, cwd, env, policy: SandboxPolicy, plan: mounts.Plan | None,
                 stdio: tuple[int, bool, bool] = (STDIN_NULL, False, False),
                 limited: _Limited | None = None, builtin: str | None = None) -> bytes:
    """One command's spec, as the command process reads it (:mod:`landlock_helper.sandbox_tree`)."""
    env = dict(env)
    env["PWD"] = cwd
    rlimits, shm_size = (tuple(limited.rlimits), limited.limits.memory) if limited else ((), 0)
    spec = marshal.dumps(([str(a) for a in argv], cwd, env, policy.to_json(),
                          None if plan is None else plan.to_spec(), stdio, rlimits, shm_size, builtin))
    if len(spec) > MAX_SPEC:
        raise SandboxError(f"command and environment too large ({len(spec)} bytes, at most {MAX_SPEC})")
    return spec


class _Limited:
    """The limits of one command on the trusted side: resolved, the rlimits its command
    process sets before exec, and what goes into its sandbox's cgroups."""

    def __init__(self, asked: limits.Limits, template: _Template) -> None:
        limits = load_limits()
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
            load_limits().CommandCgroup(self.cgroups, cgroup_name).set_limits(self.limits)
        except OSError as e:
            raise SandboxError(f"cannot set the command's limits: {describe(e)}") from None

    def what_hit(self, counters: dict[str, int] | None, sig: int | None) -> str | None:
        return load_limits().what_hit(self.limits, counters, sig)


def _limited(asked: limits.Limits | None, template: _Template) -> _Limited | None:
    return None if asked is None else _Limited(asked, template)


def _make_warm(template: _Template, *, reap: bool) -> Warm:
    """Fork a supervisor (and through it init and command) from this process."""
    return Warm(*start_supervisor(template), reap=reap)


def spawn(argv, *, cwd, env, policy: SandboxPolicy, stdout: int | None, stderr: int | None, stdin: int | None = None,
          hidden_paths=(), sandbox_cwd: str | None = None, limits: limits.Limits | None = None,
          tty: bool = False, one_shot: bool = False, builtin: str | None = None, readable=(),
          nice: int | None = None) -> SandboxedProcess:
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
    command's resource limits; None: none of ours. ``nice``: the command's niceness
    (None: ours).

    ``one_shot=True`` (without ``limits``) is for a process that makes this one sandbox and
    forks nothing else afterwards: it becomes the sandbox's supervisor itself, so its
    PID and IPC namespaces (and, when not root, its user namespace) are the sandbox's
    from now on; its mount namespace stays the host's (see :mod:`landlock_helper.sandbox_tree`).
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
                              stdin=stdin, hidden_paths=hidden_paths, sandbox_cwd=sandbox_cwd, tty=tty, nice=nice)
    mode = _stdio_mode(stdin, stdout, stderr, tty)
    plan = _check(argv, cwd, policy, sandbox_cwd, env, readable=readable, sandbox_hidden=hidden_paths)
    _load_builtin(builtin)
    template = _Template.make(hidden_paths, restricted=plan is not None, network=policy.network,
                              cgroups=limits is not None, nice=nice)
    limited = _limited(limits, template)
    spec = _encode_spec(argv, cwd, env, policy, plan, mode, limited, builtin)
    if one_shot and limited is None:
        init, ctl = become_supervisor(template)  # no supervisor: the init is ours
        return Warm(init, ctl, reap=True, init_pid=init).start(spec, stdin, stdout, stderr, plan)
    return _make_warm(template, reap=True).start(spec, stdin, stdout, stderr, plan, limited)


class Spawner:
    """Keeps warm sandboxes for one caller (an executor), made by a small zygote process.

    Create it *early*, before the caller imports anything large: the zygote is a fork of
    the caller as it is then, and every sandbox is a fork of the zygote. The caller calls
    :meth:`refill` when :attr:`fileno` is readable (or just before it needs sandboxes).
    """

    def __init__(self, hidden_paths=(), *, pool: int = 4, cgroups: bool = True, nice: int | None = None) -> None:
        """``cgroups``: every sandbox gets cgroups of its own (where this process may make
        them, see :func:`landlock_helper.limits.mechanism`), for its command's limits.
        ``nice``: every command's niceness (None: ours); below ours needs the privilege."""
        if not sys.platform.startswith("linux"):
            raise SandboxError("the warm-sandbox pool needs Linux")
        self.pool = pool
        for name in BUILTINS:  # before the zygote: every sandbox is a fork of it
            _load_builtin(name)
        # Warm sandboxes in the host's network namespace, for commands with network: none
        # until the first such command comes, then this many.
        self.network_pool = 0
        self.template = _Template.make(hidden_paths, cgroups=cgroups, nice=nice)
        self._ready: list[Warm] = []
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
        self.zygote_pid, self._sock = zygote.start(self.template)
        self._sock.setblocking(False)
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
        with their parent): start over, from us as we are now. If that fork is refused
        (or forks were refused a moment ago), there is no zygote until a later
        :meth:`spawn` or :meth:`refill` makes one."""
        self._stop_zygote()
        self._ensure_zygote(now=False)

    def _stop_zygote(self) -> None:
        """Discard the ready sandboxes, and end the zygote and reap it."""
        for warm in self._ready:
            warm.discard()
        self._ready.clear()
        self._asked = []
        if self._sock is None:
            return
        self._sock.close()
        self._sock = None
        if self.template.cgroups:
            # The zygote, told by the EOF, waits for its sandboxes' supervisors, which remove
            # their cgroups as they end (killing it would kill them first: pdeathsig).
            wait_pid(self.zygote_pid, CGROUP_REMOVE_S + 1.0)
        kill_quietly(self.zygote_pid)
        reap(self.zygote_pid)

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
                msg, fds, flags, _ = socket.recv_fds(self._sock, 64, 2, 0 if block else socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except ConnectionResetError:
                msg = b""
            if not msg:
                self._restart_zygote()
                return
            kind = self._asked.pop(0)
            if msg.startswith(b"F ") or flags & socket.MSG_CTRUNC or not fds:
                # Without its descriptors (the kernel drops them when we are at our limit
                # of open files) the sandbox is lost: it ends as its control socket closes.
                for fd in fds:
                    os.close(fd)
                self._failed(msg[2:].decode(errors="replace") if msg.startswith(b"F ")
                             else "cannot take a sandbox from the zygote: too many open files")
                if block and network not in self._asked and not self._ready_of(network):
                    raise SandboxError(self.failure)
                continue
            ctl = socket.socket(fileno=fds[0])
            ctl.setblocking(True)
            self._ready.append(Warm(int(msg[2:]), ctl, fds[1] if len(fds) > 1 else None, reap=False,
                                    network=kind))
            self._recovered()
            block = False
        if self.failure is not None and time.monotonic() < self._retry_at:
            return  # backing off: a command that needs a sandbox asks for one itself
        self._top_up()

    def _ready_of(self, network: bool) -> list[Warm]:
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
        if builtin is not None:
            _builtin_module(builtin)  # loaded before the zygote forked; is it one?
        limited = _limited(limits, self.template)
        spec = _encode_spec(argv, cwd, env, policy, plan, mode, limited, builtin)
        if plan is None:
            template = self.template._replace(scratch=None, netns=False)
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

    def _pick(self, network: bool) -> Warm:
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
        self._stop_zygote()
