"""macOS: run a command under ``sandbox-exec`` with the Seatbelt profile of its policy.

macOS has no PID namespaces, so the tree is tracked the classic way: the command leads
a new session and process group, signals go to the group, and "the tree is dead" is
observed through a pipe whose write end every process of the tree inherits (it reads
EOF once the last holder is gone). A process that closes all its descriptors and
leaves the group escapes that tracking; on Linux the PID namespace has no such gap.
"""

from __future__ import annotations

import fcntl
import os
import signal
import termios

from landlock_helper.login_shell import keep_path
from landlock_helper.outcome import PASSABLE_SIGNALS, Outcome, SandboxError, readable, wait
from landlock_helper.seatbelt import seatbelt_argv


class SeatbeltProcess:
    def __init__(self, pid: int, tree_fd: int) -> None:
        self.pid = self.init_pid = pid
        self._tree_fd = tree_fd
        self._status: int | None = None
        self._outcome: Outcome | None = None

    @property
    def done_fds(self) -> tuple[int, ...]:
        return (self._tree_fd,)

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def terminate(self) -> None:
        self._signal_group(signal.SIGTERM)

    def signal_command(self, sig: int) -> None:
        if sig not in PASSABLE_SIGNALS:
            raise ValueError(f"signal {sig} cannot be passed to a command")
        self._signal_group(sig)

    def kill(self) -> None:
        self._signal_group(signal.SIGKILL)

    def poll(self) -> Outcome | None:
        if self._outcome is not None:
            return self._outcome
        if self._status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == 0:
                return None
            self._status = status
            self._signal_group(signal.SIGKILL)  # what the command left behind dies with it
        if not readable(self._tree_fd):
            return None
        if os.WIFSIGNALED(self._status):
            self._outcome = Outcome(signal=os.WTERMSIG(self._status))
        else:
            self._outcome = Outcome(exit_code=os.waitstatus_to_exitcode(self._status))
        return self._outcome

    def wait(self, timeout: float | None = None) -> Outcome | None:
        # Looking again now and then: the tree's pipe stays open while what the command left
        # runs on, and only poll() sees the command end (and ends what it left).
        return wait(self, timeout, tick=0.05)

    def close(self) -> None:
        if self._tree_fd is not None:
            os.close(self._tree_fd)
            self._tree_fd = None  # type: ignore[assignment]


def spawn_seatbelt(argv, *, cwd, env, policy, stdout, stderr, stdin=None, hidden_paths=(),
                   sandbox_cwd=None, tty=False, nice=None) -> SeatbeltProcess:
    if not argv:
        raise SandboxError("no command given")
    if not os.path.isdir(cwd):
        raise SandboxError(f"cwd does not exist or is not a directory: {cwd}")
    # The profile's writable cwd is the session's (sandbox_cwd), never where the command runs.
    full = seatbelt_argv(keep_path(list(argv), env), policy, sandbox_cwd or cwd, env, tuple(hidden_paths))
    tree_r, tree_w = os.pipe()  # both close-on-exec; the child re-enables tree_w
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            if nice is not None:
                os.setpriority(os.PRIO_PROCESS, 0, nice)
            os.set_inheritable(tree_w, True)  # every process of the tree holds it
            if stdin is None:
                stdin = os.open("/dev/null", os.O_RDONLY)
            if stdout is None:
                stdout = os.open("/dev/null", os.O_WRONLY)
            if stderr is None:
                stderr = os.open("/dev/null", os.O_WRONLY)
            for target, fd in ((0, stdin), (1, stdout), (2, stderr)):
                if fd != target:
                    os.dup2(fd, target)
            if tty:
                fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # the session's controlling terminal
            os.chdir(cwd)
            os.execve(full[0], full, env) if os.path.isabs(full[0]) else os.execvpe(full[0], full, env)
        except OSError:
            os._exit(127)
    os.close(tree_w)
    return SeatbeltProcess(pid, tree_r)
