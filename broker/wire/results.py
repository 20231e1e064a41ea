"""How a command ended, as one shell-style number, and the ids calls go by.

Shared by everything that reports a command's end: the client library, the CLI and the
agent (which tells the model the same numbers a shell would)."""

from __future__ import annotations

import os
import signal

# Exit codes, one set for every command sluice has and every outcome it reports.
EXIT_OK = 0
EXIT_FAILED = 1  # the task failed (sluice exec, attach --until-idle)
EXIT_USAGE = 2  # bad arguments
EXIT_NOT_RUNNING = 3  # no daemon (and none was to be started)
EXIT_TIMED_OUT = 124
EXIT_SLUICE = 125  # sluice itself failed: executor, daemon, sandbox set-up
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127
EXIT_SIGNAL_BASE = 128  # + N: killed by signal N
EXIT_INTERRUPTED = 128 + signal.SIGINT  # cancelled, interrupted, aborted
# The daemon shut down (`sluice daemon stop`) before the command finished: sysexits.h's
# EX_TEMPFAIL, a temporary failure, the command may be run again.
EXIT_DAEMON_STOPPED = 75

# A command's ``error`` when the daemon's shutdown ended it (or it never ran for that),
# and what the daemon answers a run or a submission, and tells a session, while it stops.
DAEMON_STOPPED = "the sluice daemon shut down before this command finished"
DAEMON_SHUTTING_DOWN = "the sluice daemon is shutting down"


def error_returncode(error: str) -> int:
    """127 / 126 / 125 for a spawn error message, 75 for the daemon's shutdown (see
    :func:`shell_returncode`)."""
    if error in (DAEMON_STOPPED, DAEMON_SHUTTING_DOWN):
        return EXIT_DAEMON_STOPPED
    low = error.lower()
    if "not found" in low:
        return EXIT_NOT_FOUND
    if "permission denied" in low or "exec format" in low:
        return EXIT_CANNOT_EXECUTE
    return EXIT_SLUICE


def shell_returncode(r) -> int:
    """How a finished call (anything with exit_code, signal, timed_out, aborted, error)
    reads as one shell-style number: 124 timed out, 130 aborted, 128+N killed by signal
    N, the sandbox's code or 125-127 when it never ran, 75 when the daemon's shutdown
    ended it, else the exit code."""
    if r.timed_out:
        return EXIT_TIMED_OUT
    if r.aborted:
        return EXIT_INTERRUPTED
    if r.error is not None:
        # The sandbox reports 127 (not found) / 126 (cannot execute) itself.
        return r.exit_code if r.exit_code is not None else error_returncode(r.error)
    if r.signal is not None:
        return EXIT_SIGNAL_BASE + r.signal
    if r.exit_code is not None:
        return r.exit_code
    return EXIT_SLUICE


def new_call_id() -> str:
    """A uuid4 in hex, without importing uuid (start-up time of ``sluice run``)."""
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    return b.hex()
