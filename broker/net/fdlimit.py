"""The descriptor limit of a long-lived sluice process.

Linux starts most processes with a soft ``RLIMIT_NOFILE`` of 1,024 and a hard limit far
above it (often 524,288 or more). A daemon that serves many peers, sessions and
commands uses descriptors for each; at the soft limit libzmq aborts the process (an
``accept`` on the unix socket failing with ``EMFILE`` is an assertion in libzmq, not an
error it returns). So the daemon, the agent and the executors raise their soft limit to
the hard one at start, and size what they accept by the result.
"""

from __future__ import annotations

import resource


def raise_fd_limit() -> int:
    """Raise the soft descriptor limit to the hard one; returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # e.g. an infinite hard limit above the kernel's nr_open: keep what we have
    return soft
