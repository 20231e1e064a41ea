"""The caller's handles on its sandboxes: a warm one waiting for its command, and a
running command; both read what the sandbox says on its control socket.

The caller sends a warm sandbox the spec and the command's stdio fds on that socket
(``SOCK_SEQPACKET``), and reads back tagged lines: ``C <cgroup name>`` and ``P <init
pid>`` from the supervisor, ``E <code> <message>`` if the command could not start, ``S
<wait status>`` from the init, ``L <oom kills> <refused forks>`` from the supervisor once
the tree is dead (with cgroups), ``X <message>`` if set-up failed (the processes that
say them: :mod:`landlock_helper.sandbox_tree`). The caller watches
:attr:`SandboxedProcess.done_fds` (the init's pidfd and, with cgroups, a pipe the
supervisor closes once it has sent ``L``): when all are readable the whole tree is dead
and :meth:`~SandboxedProcess.poll` has the outcome. (The supervisor then removes the
cgroups and exits; nobody waits for that.)
"""

from __future__ import annotations

import os
import signal
import socket
from typing import TYPE_CHECKING

from landlock_helper import _libc, mounts
from landlock_helper.outcome import PASSABLE_SIGNALS, Outcome, SandboxError, readable, wait
from landlock_helper.sandbox_tree import PASS, kill_quietly, reap

if TYPE_CHECKING:
    from landlock_helper.spawn import _Limited


class SandboxedProcess:
    """A running sandboxed command (its processes: :mod:`landlock_helper.sandbox_tree`)."""

    def __init__(self, sup_pid: int, init_pid: int, ctl: socket.socket, early: list[bytes], *,
                 reap: bool, plan: mounts.Plan | None = None, limited: _Limited | None = None,
                 reported: int | None = None) -> None:
        self.pid = sup_pid
        self.init_pid = init_pid
        self._ctl = ctl
        self._lines = early
        self._reap = reap  # the supervisor is our child (not a zygote's), not waited for yet
        self._sup_fd: int | None = _pidfd(sup_pid)
        self._init_fd: int | None = _pidfd(init_pid)
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
                _libc.pidfd_queue_signal(self._init_fd, PASS, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL the init, which makes the kernel kill every process in its namespace."""
        if self._outcome is not None:
            return
        self._killed = True
        # One with cgroups ends by itself once the init is gone, after removing them.
        for fd in (self._init_fd,) if self._cgroup else (self._init_fd, self._sup_fd):
            if fd is not None:
                _pidfd_signal(fd, signal.SIGKILL)

    def poll(self) -> Outcome | None:
        """The outcome once the whole tree is dead, else None. Never blocks."""
        if self._outcome is not None:
            return self._outcome
        if not all(readable(fd) for fd in self.done_fds):
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
        return wait(self, timeout)

    def close(self) -> None:
        for fd in (self._sup_fd, self._init_fd, self._reported):
            if fd is not None:
                os.close(fd)
        self._sup_fd = self._init_fd = self._reported = None
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None  # type: ignore[assignment]
        if self._reap:
            # Never leave a zombie. Once the tree is dead the supervisor exits at once.
            if self._outcome is None:
                _end_supervisor(self.pid, self._cgroup)
            else:
                reap(self.pid)
            self._reap = False

    def __del__(self) -> None:
        if getattr(self, "_ctl", None) is not None:
            self.close()


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


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None  # already gone: nothing of it is left to wait for


def wait_pid(pid: int, timeout: float) -> None:
    """Wait up to ``timeout`` seconds for ``pid`` to end (not reaping it)."""
    fd = _pidfd(pid)
    if fd is not None:
        try:
            readable(fd, timeout)
        finally:
            os.close(fd)


def _end_supervisor(pid: int, cgroups: bool) -> None:
    """End a sandbox's supervisor that is our child, and reap it: killing one takes its
    tree with it (pdeathsig); one with cgroups ends the tree on SIGTERM and removes them
    before it exits."""
    kill_quietly(pid, signal.SIGTERM if cgroups else signal.SIGKILL)
    reap(pid)


def _pidfd_signal(fd: int, sig: int) -> None:
    try:
        signal.pidfd_send_signal(fd, sig)
    except ProcessLookupError:
        pass


def _drain(sock: socket.socket) -> list[bytes]:
    lines = []
    while True:
        try:
            data = sock.recv(65536, socket.MSG_DONTWAIT)
        except OSError:  # nothing more now (EAGAIN), or the socket is gone
            return lines
        if not data:
            return lines
        lines.append(data)


class Warm:
    """A sandbox whose command process is waiting for its spec."""

    def __init__(self, sup_pid: int, ctl: socket.socket, reported: int | None = None, *, reap: bool,
                 network: bool = False, init_pid: int | None = None) -> None:
        self.sup_pid = sup_pid
        self.network = network  # in the host's network namespace, for a command with network
        self.ctl = ctl
        self.reap = reap
        # With cgroups (its supervisor makes them, and ends on SIGTERM): a pipe's read end,
        # at EOF once the supervisor has reported them.
        self.reported = reported
        self.cgroups = reported is not None
        self.init_pid = init_pid  # known at once when we forked it ourselves
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
            _end_supervisor(self.sup_pid, self.cgroups)
