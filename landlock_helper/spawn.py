"""Spawn one command inside the sandbox, as a tree that can be killed whole.

Three processes, each forked (never exec'd) from the caller so nothing is re-imported:

``supervisor`` (our child)
    Unshares the PID, mount and IPC namespaces (and a user namespace when not root),
    forks the init, reports the init's pid, and waits. It dies with the caller
    (``PR_SET_PDEATHSIG``), and the init dies with it the same way, so a crashed
    executor never leaves a sandbox behind.
``init`` (pid 1 of the new PID namespace)
    Sets up the mounts (fresh /proc, hidden paths, read-only ``.git``), forks the
    command, reaps everything, turns SIGTERM into "SIGTERM to every process in the
    namespace", and when the command exits reports its wait status and exits. The
    kernel then SIGKILLs whatever is left in the namespace (background jobs, setsid or
    double-forked escapees) and the init's pidfd turns readable only after all of them
    are gone.
``command``
    Drops capabilities (as root), sets NO_NEW_PRIVS, applies Landlock and seccomp, and
    execs. An exec failure travels back on a close-on-exec pipe.

The caller watches :attr:`SandboxedProcess.done_fds` (pidfds of the supervisor and the
init): when both are readable the whole tree is dead and :meth:`~SandboxedProcess.poll`
returns the :class:`Outcome`. Everything that can be computed before fork is (rules,
the BPF program, paths), so the children only make syscalls.
"""

from __future__ import annotations

import errno
import os
import resource
import select
import signal
import sys
from dataclasses import dataclass

from landlock_helper import _libc, landlock, namespaces, seccomp
from landlock_helper.policy import SandboxPolicy


class SandboxError(RuntimeError):
    """The sandbox cannot be set up (kernel too old, bad cwd, ...); message for a person."""


@dataclass(frozen=True)
class Outcome:
    """How a sandboxed command ended: an exit code, a killing signal, or an error."""

    exit_code: int | None = None
    signal: int | None = None
    error: str | None = None


_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_INIT_WAITED = {signal.SIGCHLD, *_FORWARDED}
_seccomp_cache: dict[bool, object] = {}
_cap_last: int | None = None


@dataclass(frozen=True)
class _Prepared:
    """Everything the children need, computed in the parent."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    restricted: bool
    as_root: bool
    uid: int
    gid: int
    hidden_paths: tuple[str, ...]
    read_only_paths: tuple[str, ...]
    landlock_plan: landlock.LandlockPlan | None
    seccomp_prog: object | None
    cap_last: int


def _prepare(argv, cwd, env, policy: SandboxPolicy, hidden_paths) -> _Prepared:
    global _cap_last
    if not argv:
        raise SandboxError("no command given")
    if not os.path.isabs(cwd):
        raise SandboxError(f"cwd must be an absolute path: {cwd}")
    if not os.path.isdir(cwd):
        raise SandboxError(f"cwd does not exist or is not a directory: {cwd}")
    restricted = not policy.unrestricted
    plan = None
    prog = None
    read_only: list[str] = []
    if restricted:
        roots = policy.writable_roots(cwd, env)
        try:
            plan = landlock.plan(policy, [r for r in roots if os.path.exists(r)])
        except landlock.LandlockUnavailable as e:
            raise SandboxError(str(e)) from None
        if not policy.full_write:
            read_only = policy.read_only_subpaths(cwd, env)
        prog = _seccomp_cache.get(policy.network)
        if prog is None:
            prog = _seccomp_cache[policy.network] = seccomp.compile_program(seccomp.build(policy.network))
    if _cap_last is None:
        _cap_last = namespaces.last_cap()
    env = dict(env)
    env["PWD"] = cwd
    hidden = tuple(os.path.abspath(p) for p in hidden_paths if os.path.lexists(p))
    return _Prepared(
        argv=[str(a) for a in argv], cwd=cwd, env=env, restricted=restricted,
        as_root=os.geteuid() == 0, uid=os.geteuid(), gid=os.getegid(),
        hidden_paths=hidden, read_only_paths=tuple(read_only),
        landlock_plan=plan, seccomp_prog=prog, cap_last=_cap_last,
    )


class SandboxedProcess:
    """A running sandboxed command; see the module docstring for the process layout."""

    def __init__(self, pid: int, init_pid: int | None, status_fd: int, early: bytes = b"") -> None:
        self.pid = pid
        self._early = early
        self.init_pid = init_pid
        self._status_fd = status_fd
        self._sup_fd = os.pidfd_open(pid)
        self._init_fd: int | None = None
        if init_pid is not None:
            try:
                self._init_fd = os.pidfd_open(init_pid)
            except ProcessLookupError:
                pass  # already gone: nothing of the tree is left to wait for
        self._sup_status: int | None = None
        self._killed = False
        self._outcome: Outcome | None = None

    @property
    def done_fds(self) -> tuple[int, ...]:
        """Readable once the supervisor and the init (hence the whole tree) are dead."""
        return tuple(fd for fd in (self._sup_fd, self._init_fd) if fd is not None)

    def terminate(self) -> None:
        """SIGTERM to every process of the command's tree (the init forwards it)."""
        if self._outcome is None and self._init_fd is not None:
            _pidfd_signal(self._init_fd, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the init, which makes the kernel kill every process in its namespace."""
        if self._outcome is not None:
            return
        self._killed = True
        if self._init_fd is not None:
            _pidfd_signal(self._init_fd, signal.SIGKILL)
        _pidfd_signal(self._sup_fd, signal.SIGKILL)

    def poll(self) -> Outcome | None:
        """The outcome once the whole tree is dead, else None. Never blocks."""
        if self._outcome is not None:
            return self._outcome
        if self._sup_status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == 0:
                return None
            self._sup_status = status
        if self._init_fd is not None and not _readable(self._init_fd):
            return None
        self._outcome = self._read_outcome()
        return self._outcome

    def wait(self, timeout: float | None = None) -> Outcome | None:
        """Block until :meth:`poll` has an outcome (or ``timeout`` seconds pass)."""
        fds = self.done_fds
        while True:
            outcome = self.poll()
            if outcome is not None:
                return outcome
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            ready = poller.poll(None if timeout is None else timeout * 1000)
            if not ready and timeout is not None:
                return self.poll()

    def _read_outcome(self) -> Outcome:
        data = self._early
        while True:
            try:
                chunk = os.read(self._status_fd, 4096)
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
        exit_code = sig = error = None
        for line in data.decode(errors="replace").splitlines():
            tag, _, rest = line.partition(" ")
            if tag == "S":
                status = int(rest)
                if os.WIFSIGNALED(status):
                    sig = os.WTERMSIG(status)
                else:
                    exit_code = os.waitstatus_to_exitcode(status)
            elif tag == "E":
                code, _, error = rest.partition(" ")
                exit_code = int(code)
            elif tag == "X":
                error = rest
        if exit_code is None and sig is None and error is None:
            # The supervisor died before the init reported: we (or someone) killed it.
            if self._killed or os.WIFSIGNALED(self._sup_status or 0):
                sig = signal.SIGKILL
            else:
                error = "sandbox supervisor exited without a status"
        return Outcome(exit_code, sig, error)

    def close(self) -> None:
        for fd in (self._sup_fd, self._init_fd, self._status_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._sup_fd = self._init_fd = self._status_fd = None  # type: ignore[assignment]
        if self._sup_status is None:
            # Never leave a zombie: the tree is being torn down by pdeathsig anyway.
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self._sup_status = 0

    def __del__(self) -> None:
        if getattr(self, "_status_fd", None) is not None:
            self.close()


def _pidfd_signal(fd: int, sig: int) -> None:
    try:
        signal.pidfd_send_signal(fd, sig)
    except ProcessLookupError:
        pass


def _readable(fd: int) -> bool:
    poller = select.poll()  # not select(): a busy executor has fds above FD_SETSIZE
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def spawn(argv, *, cwd, env, policy: SandboxPolicy, stdout: int, stderr: int, stdin: int | None = None,
          hidden_paths=()) -> SandboxedProcess:
    """Start ``argv`` under ``policy``; see the module docstring. Raises SandboxError."""
    if sys.platform == "darwin":  # pragma: no cover - exercised on macOS only
        from landlock_helper.darwin import spawn_seatbelt

        return spawn_seatbelt(argv, cwd=cwd, env=env, policy=policy, stdout=stdout, stderr=stderr,
                              stdin=stdin, hidden_paths=hidden_paths)
    if not sys.platform.startswith("linux"):
        raise SandboxError(f"no sandbox for platform {sys.platform!r}; refusing to run unsandboxed")
    prep = _prepare(argv, cwd, env, policy, hidden_paths)
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        _child_main(_supervisor, prep, parent, status_w, stdin, stdout, stderr)
    os.close(status_w)
    # The supervisor reports the init's pid (or why it could not make one). The init
    # writes to the same pipe and may already have finished, so its line can come first.
    early, init_pid, failure = _read_until_pid(status_r)
    if init_pid is None:
        _, status = os.waitpid(pid, 0)
        os.close(status_r)
        if failure:
            raise SandboxError(failure)
        how = (f"killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
               else f"exit status {os.waitstatus_to_exitcode(status)}")
        raise SandboxError(f"sandbox supervisor died during set-up ({how})")
    os.set_blocking(status_r, False)
    return SandboxedProcess(pid, init_pid, status_r, early)


def _read_until_pid(fd: int) -> tuple[bytes, int | None, str | None]:
    """Read status lines up to the ``P <pid>`` line: (the other lines, pid, failure)."""
    data = b""
    while True:
        *complete, partial = data.split(b"\n")
        for i, line in enumerate(complete):
            if line.startswith(b"P "):
                others = b"".join(other + b"\n" for j, other in enumerate(complete) if j != i)
                return others + partial, int(line[2:]), None
        chunk = os.read(fd, 4096)
        if not chunk:
            failures = [line[2:] for line in data.decode(errors="replace").splitlines() if line.startswith("X ")]
            return data, None, failures[-1] if failures else None
        data += chunk


# --- children: everything below runs between fork and exec ------------------------


def _child_main(fn, *args) -> None:
    """Run ``fn`` in a forked child and never return into the caller's code."""
    code = 1
    try:
        _reset_signals()
        fn(*args)
    except BaseException as e:  # noqa: BLE001 - the child must report, then die
        try:
            os.write(args[2], f"X sandbox set-up failed: {_describe(e)}\n".encode())
        except Exception:
            pass
    finally:
        os._exit(code)


def _describe(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror if e.filename is None else f"{e.strerror}: {e.filename}"
    return f"{type(e).__name__}: {e}"


def _reset_signals() -> None:
    # The caller's Python-level handlers and wakeup fd must not run in our children.
    signal.set_wakeup_fd(-1)
    for sig in (*_FORWARDED, signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGQUIT, signal.SIGUSR1,
                signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)


def _die_with_parent(parent: int | None) -> None:
    """SIGKILL us when our parent dies; ``parent`` None when it is outside our PID namespace.

    (The init cannot see its parent: getppid() is 0 there. The supervisor waits for the
    init before it can exit on its own, so only a SIGKILL can race with this prctl.)
    """
    _libc.prctl(_libc.PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent is not None and os.getppid() != parent:  # died before the prctl took effect
        os._exit(1)


def _close_fds_except(keep: set[int]) -> None:
    low = 3
    for fd in sorted(k for k in keep if k >= 3):
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)


def _supervisor(prep: _Prepared, parent: int, status_w: int, stdin, stdout, stderr) -> None:
    _die_with_parent(parent)
    stdio = {fd for fd in (stdin, stdout, stderr) if fd is not None}
    _close_fds_except({status_w, *stdio})
    namespaces.enter(prep.uid, prep.gid, prep.as_root)
    init = os.fork()
    if init == 0:
        _child_main(_init, prep, None, status_w, stdin, stdout, stderr)
    os.write(status_w, f"P {init}\n".encode())
    for fd in stdio:
        os.close(fd)
    os.close(status_w)
    while True:
        try:
            os.waitpid(init, 0)
            break
        except ChildProcessError:
            break
    os._exit(0)


def _init(prep: _Prepared, parent: int, status_w: int, stdin, stdout, stderr) -> None:
    _die_with_parent(parent)
    signal.pthread_sigmask(signal.SIG_BLOCK, _INIT_WAITED)
    namespaces.setup_mounts(prep.hidden_paths, prep.read_only_paths)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    child = os.fork()
    if child == 0:
        _exec_command(prep, err_w, stdin, stdout, stderr)
    os.close(err_w)
    for fd in {stdin, stdout, stderr} - {None}:
        os.close(fd)
    report = b""
    while chunk := os.read(err_r, 4096):
        report += chunk
    os.close(err_r)
    status = _reap_until(child)
    if report:
        os.write(status_w, b"E " + report + b"\n")
    else:
        os.write(status_w, f"S {status}\n".encode())
    os._exit(0)


def _reap_until(main_child: int) -> int:
    """Reap every process that ends up with us; return the main child's wait status."""
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
        info = signal.sigwaitinfo(_INIT_WAITED)
        if info.si_signo != signal.SIGCHLD:
            try:
                os.kill(-1, signal.SIGTERM)  # everyone in this namespace except us
            except ProcessLookupError:
                pass


def _exec_command(prep: _Prepared, err_w: int, stdin, stdout, stderr) -> None:
    stage = "set-up"
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        os.setsid()
        if stdin is None:
            stdin = os.open("/dev/null", os.O_RDONLY)
        for target, fd in ((0, stdin), (1, stdout), (2, stderr)):
            if fd != target:
                os.dup2(fd, target)
        _close_fds_except({err_w})
        stage = "chdir"
        os.chdir(prep.cwd)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if prep.restricted:
            stage = "sandbox"
            # As root this is what keeps uid 0 from meaning "everything"; in a user
            # namespace it keeps the command from using the caps it holds there.
            namespaces.drop_capabilities(prep.cap_last)
            _libc.prctl(_libc.PR_SET_NO_NEW_PRIVS, 1)
            landlock.apply(prep.landlock_plan)
            seccomp.install(prep.seccomp_prog)
        stage = "exec"
        os.execvpe(prep.argv[0], prep.argv, prep.env)
    except OSError as e:
        if stage == "exec":
            code = 126 if e.errno in (errno.EACCES, errno.ENOEXEC, errno.EISDIR) else 127
            what = "command not found" if e.errno == errno.ENOENT else e.strerror
            msg = f"{code} {what}: {prep.argv[0]}"
        else:
            msg = f"126 sandbox {stage} failed: {_describe(e)}"
        os.write(err_w, msg.encode())
    except BaseException as e:  # noqa: BLE001
        os.write(err_w, f"126 sandbox {stage} failed: {_describe(e)}".encode())
    os._exit(127)
