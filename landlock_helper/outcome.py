"""What a sandboxed process comes to: how it ended, or why the sandbox could not be made;
the signals its handle passes on to the command, and how its handle waits for the end.

Shared by the Linux sandbox (:mod:`landlock_helper.spawn`) and the macOS one
(:mod:`landlock_helper.darwin`)."""

from __future__ import annotations

import os
import select
import signal
from collections import namedtuple

# What a process handle's ``signal_command`` passes to the command's process group: the
# signals a person sends a foreground program (Ctrl-C, Ctrl-\, a hang-up, ``kill``).
PASSABLE_SIGNALS = frozenset({signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1,
                              signal.SIGUSR2})


class SandboxError(RuntimeError):
    """The sandbox cannot be set up (kernel too old, bad cwd, ...); message for a person."""


class Outcome(namedtuple("Outcome", "exit_code signal error notes limit", defaults=(None, None, None, (), None))):
    """How a sandboxed command ended: an exit code, a killing signal, or an error.

    ``exit_code``, ``signal``, ``error`` (None when not so); ``notes``: lines for a person
    about what the command left that sluice undid (a planted .git); ``limit``: the
    resource limit the command ran into, for a person ("killed: memory limit 512 MiB
    reached", see :func:`landlock_helper.limits.what_hit`).

    A named tuple, not a dataclass (like :class:`landlock_helper.mounts.Pin` and
    :class:`landlock_helper.landlock.LandlockPlan`): making a dataclass costs about half
    a millisecond at import, and every ``sluice sandbox`` imports these."""

    __slots__ = ()


def alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user's counts; a zombie too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def readable(fd: int, timeout: float | None = 0.0) -> bool:
    """Whether ``fd`` is readable, waiting up to ``timeout`` seconds (None: until it is)."""
    poller = select.poll()  # not select(): a busy executor has fds above FD_SETSIZE
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else timeout * 1000))


def wait(handle, timeout: float | None, tick: float | None = None) -> Outcome | None:
    """A process handle's ``wait``: block until its ``poll()`` has an outcome (or
    ``timeout`` seconds pass), woken as its ``done_fds`` turn readable (and every
    ``tick`` seconds, for a handle that must look again without that)."""
    while True:
        outcome = handle.poll()
        if outcome is not None:
            return outcome
        poller = select.poll()
        for fd in handle.done_fds:
            poller.register(fd, select.POLLIN)
        wait_s = tick if timeout is None else timeout
        if not poller.poll(None if wait_s is None else wait_s * 1000) and timeout is not None:
            return handle.poll()
