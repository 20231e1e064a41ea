"""What a sandboxed process comes to: how it ended, or why the sandbox could not be made;
and the signals its handle passes on to the command.

Shared by the Linux sandbox (:mod:`landlock_helper.spawn`) and the macOS one
(:mod:`landlock_helper.darwin`)."""

from __future__ import annotations

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
