"""The processes a sandbox is made of, after fork: supervisor, init and command.

Each is forked (never exec'd), so nothing is re-imported:

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
    the command exits reports its wait status and exits. It also performs every
    ``connect`` of the command, through the seccomp listener the command hands it before
    exec, refusing unix peers outside the sandbox (:mod:`landlock_helper.unix_guard`).
    The kernel then SIGKILLs whatever is left in the namespace (background jobs, setsid
    or double-forked escapees), and the init's pidfd turns readable only after all of
    them are gone.
``command``
    Joins the sandbox's cgroups, prepares its Landlock ruleset, then waits for the
    command's spec, whose rlimits (and the caller's niceness for commands, if it set one) it
    sets before exec. On receipt it
    binds the writable roots read-write and their ``.git``/``.sluice`` read-only, each
    checked against what the caller pinned (:func:`landlock_helper.mounts.apply`), drops
    capabilities, sets NO_NEW_PRIVS, restricts itself with Landlock and seccomp (handing
    the filter's listener to the init), and execs. A danger-full-access command gets a
    sandbox with the host's view instead.

A process that makes one sandbox and then exits (``sluice sandbox``) can be the
supervisor itself (:func:`become_supervisor`): one Python process fewer to fork and end.
It unshares the PID and IPC (and network) namespaces (and enters the user namespace) for
good, and its init unshares the mount namespace as it starts, so the caller keeps the
host's view; the init dies with the caller as it would with a supervisor.

What runs in the caller (or its zygote) stands above the line that says so: the forks
that start a sandbox, which return the caller what it holds of it (see
:mod:`landlock_helper.spawn`), and helpers of both sides. Everything below runs in a
forked child.
"""

from __future__ import annotations

import _signal
import ctypes
import errno
import fcntl
import marshal
import os
import resource
import select
import signal
import socket
import sys
import termios
from typing import TYPE_CHECKING

from landlock_helper import _libc, landlock, login_shell, mounts, namespaces, seccomp, unix_guard
from landlock_helper.outcome import PASSABLE_SIGNALS, SandboxError
from landlock_helper.policy import SandboxPolicy

if TYPE_CHECKING:
    from landlock_helper.spawn import _Template

# Largest spec (argv + env + policy) a caller may send; SEQPACKET needs it in one piece.
MAX_SPEC = 4 * 1024 * 1024
# Fds sent with it: stdout, stderr and stdin.
MAX_FDS = 3
# How the command's stdin is given in its spec: /dev/null, the third fd sent, or the
# third fd as a terminal that becomes the command's controlling terminal (its stdout and
# stderr are then the same terminal).
STDIN_NULL, STDIN_FD, STDIN_TTY = 0, 1, 2
# How long a supervisor keeps trying to remove its sandbox's cgroups (busy for a moment
# after the tree is gone).
CGROUP_REMOVE_S = 5.0

# sluice's own programs a sandbox can run in place of exec'ing a command: the command
# process, sandboxed exactly as for a command, calls the module's ``serve()`` over its
# stdin and stdout, then exits with what it returns. The module is imported before any
# sandbox is forked (:func:`landlock_helper.spawn._load_builtin`), so nothing of sluice,
# nor an interpreter, needs to be visible inside the sandbox.
BUILTINS = {"fileops": "landlock_helper.fileops"}

_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# Queued to the init with a signal number as its value
# (:meth:`landlock_helper.process.SandboxedProcess.signal_command`):
# "send this to the command's process group", as a terminal sends Ctrl-C.
PASS = signal.SIGRTMIN + 3
_INIT_WAITED = {signal.SIGCHLD, PASS, *_FORWARDED}
_SIG_DFL = int(signal.SIG_DFL)

# What ``ps`` shows for the sandbox's init (its pid 1): a short name, not the command line
# of the process it was forked from (an executor's, with its token file's path).
INIT_NAME = b"sluice-init"
PR_SET_NAME = 15
# Where this process's command line lies in its memory: (start, end), read once, before
# the forks, and the same in every child forked from us.
_argv_area: tuple[int, int] | None = None


def load_limits():
    """:mod:`landlock_helper.limits`, loaded when a sandbox has limits or cgroups: a
    one-shot sandbox without them (``sluice sandbox``) does not pay for its import. (An
    executor has it loaded before it forks anything.)"""
    from landlock_helper import limits

    return limits


def describe(e: BaseException) -> str:
    """What went wrong making a sandbox, for a person."""
    if isinstance(e, (mounts.PinError, SandboxError)):
        return str(e)
    if isinstance(e, OSError) and e.strerror:
        return e.strerror if e.filename is None else f"{e.strerror}: {e.filename}"
    return f"{type(e).__name__}: {e}"


def kill_quietly(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def reap(pid: int) -> None:
    """Wait for our child ``pid`` to exit, if it has not been waited for yet."""
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def fork_with_socket(sndbuf: int = 0) -> tuple[int, socket.socket, socket.socket]:
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


def start_supervisor(template: _Template) -> tuple[int, socket.socket, int | None]:
    """Fork a supervisor (and through it init and command) from this process: its pid,
    the sandbox's control socket, and with cgroups the read end of the pipe it closes
    once it has reported them."""
    _find_argv_area()
    reported_r, reported_w = os.pipe2(os.O_CLOEXEC) if template.cgroups else (None, None)
    parent = os.getpid()
    try:
        pid, mine, theirs = fork_with_socket(MAX_SPEC + 65536)
    except SandboxError:
        if reported_r is not None:
            os.close(reported_r)
            os.close(reported_w)
        raise
    if pid == 0:
        mine.close()
        if reported_r is not None:
            os.close(reported_r)
        child_main(_supervisor, theirs.fileno(), template, parent, theirs.fileno(), reported_w)
    theirs.close()
    if reported_w is not None:
        os.close(reported_w)
    return pid, mine, reported_r


def become_supervisor(template: _Template) -> tuple[int, socket.socket]:
    """Unshare here and fork the init from this process (``spawn(one_shot=True)``): the
    init's pid and the sandbox's control socket."""
    _find_argv_area()
    try:
        namespaces.enter(template.uid, template.gid, template.as_root, mount=False, net=template.netns)
    except OSError as e:
        raise SandboxError(f"cannot make the sandbox: {describe(e).lower()}") from None
    init, mine, theirs = fork_with_socket(MAX_SPEC + 65536)
    if init == 0:
        mine.close()
        child_main(_init_here, theirs.fileno(), template, theirs.fileno())
    theirs.close()
    return init, mine


# --- everything below runs in forked children --------------------------------------


def child_main(fn, report_fd: int | None, *args) -> None:
    """Run ``fn`` in a forked child and never return into the caller's code."""
    try:
        _reset_signals()
        fn(*args)
    except BaseException as e:  # noqa: BLE001 - the child must report, then die
        if report_fd is not None:
            _tell(report_fd, f"X sandbox set-up failed: {describe(e)}")
    finally:
        os._exit(1)


def _tell(ctl: int, line: str) -> None:
    """Say ``line`` to the caller on the control socket; it may be gone."""
    try:
        os.write(ctl, line.encode())
    except OSError:
        pass


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


def die_with_parent(parent: int | None, sig: int = signal.SIGKILL) -> None:
    """SIGKILL (or ``sig``) us when our parent dies; ``parent`` None when it is outside our
    PID namespace.

    (The init cannot see its parent: getppid() is 0 there. The supervisor waits for the
    init before it can exit on its own, so only a SIGKILL can race with this prctl.)
    """
    _libc.prctl(_libc.PR_SET_PDEATHSIG, sig)
    if parent is not None and os.getppid() != parent:  # died before the prctl took effect
        os._exit(1)


def close_fds_except(keep: set[int]) -> None:
    low = 3
    for fd in sorted(k for k in keep if k >= 3):
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)


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
                kill_quietly(init_pid[0])

        signal.signal(signal.SIGTERM, end_sandbox)
        die_with_parent(parent, signal.SIGTERM)
    else:
        die_with_parent(parent)
    close_fds_except({ctl} if reported is None else {ctl, reported})
    # Our words may find the caller gone (a sandbox discarded early): EPIPE, not death.
    # (The init and the command get the default back, as every child does.)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    cgroup = None
    join_fds: list[int] = []
    if template.cgroups:
        # The sandbox's own cgroups, made here (off the caller's path: making and removing
        # cgroups can wait seconds on the kernel's cgroup lock); its command joins them.
        cgroup = load_limits().CommandCgroup.make(template.cgroups)
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
            child_main(_init, ctl, template, ctl, join_fds)
        init_pid.append(init)
        if told:
            kill_quietly(init)
    except BaseException:
        if cgroup is not None:
            cgroup.remove()
        raise
    for fd in join_fds:
        os.close(fd)
    _tell(ctl, f"P {init}")  # (discarded already: the sandbox ends as it sees the EOF)
    if cgroup is None:
        os.close(ctl)
    reap(init)
    if cgroup is not None:
        # The whole tree is dead (the kernel waited for the namespace before the init
        # could be reaped): say which limits it hit, then remove the cgroups.
        counters = cgroup.counters()
        _tell(ctl, f"L {counters['oom_kill']} {counters['pids_max']}")
        os.close(ctl)
        if reported is not None:
            os.close(reported)  # the caller is done waiting; the rest is ours
        cgroup.remove(CGROUP_REMOVE_S)
    os._exit(0)


def _init_here(template: _Template, ctl: int) -> None:
    """The init of a one-shot sandbox (its caller is its supervisor): first what the
    supervisor would have done for it: none of the caller's fds, a mount namespace of its own."""
    die_with_parent(None)
    close_fds_except({ctl})
    _libc.unshare(_libc.CLONE_NEWNS)
    _init(template, ctl, [])


def _init(template: _Template, ctl: int, join_fds: list[int]) -> None:
    die_with_parent(None)
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
        child_main(_command, ctl, template, ctl, view, guard_end, join_fds)
    os.close(guard_end)
    for fd in join_fds:
        os.close(fd)
    # Not dumpable: nothing in the sandbox may read our memory or take our fds (the listener).
    _libc.prctl(_libc.PR_SET_DUMPABLE, 0)
    status = _reap_until(child, guard)
    _tell(ctl, f"S {status}")
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
                if signo == PASS:
                    _pass_on(main_child, infos, i)
                elif signo != signal.SIGCHLD:
                    ending = True
            if ending:
                kill_quietly(-1, signal.SIGTERM)  # everyone in this namespace except us


def _pass_on(main_child: int, infos: bytes, at: int) -> None:
    """A signal the executor queued for the command's process group (its value)."""
    sig = int.from_bytes(infos[at + _libc.SIGNALFD_SSI_INT:at + _libc.SIGNALFD_SSI_INT + 4], sys.byteorder,
                         signed=True)
    if sig in PASSABLE_SIGNALS:
        kill_quietly(-main_child, sig)  # the command's own session and group (it called setsid)


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
        load_limits().join(join_fds)
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
        size, ancdata, _, _ = sock.recvmsg_into([buf], socket.CMSG_SPACE(MAX_FDS * 4))
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
        close_fds_except({ctl, ruleset, guard_end} - {None})
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        stage = "limits"
        if rlimits:
            load_limits().apply_rlimits(rlimits)
        if template.nice is not None:
            os.setpriority(os.PRIO_PROCESS, 0, template.nice)
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
            msg = f"E 126 sandbox {stage} failed: {describe(e)}"
        _tell(ctl, msg)
    except BaseException as e:  # noqa: BLE001
        _tell(ctl, f"E 126 sandbox {stage} failed: {describe(e)}")
    os._exit(127)
