"""Signals that wake a poller: the one way a process of sluice catches a signal while it
waits on descriptors (stdlib only, for ``sluice run``'s fast path)."""

from __future__ import annotations

import contextlib
import os
import signal

# What ends a command of ours (a person's Ctrl-C, a kill, a closed terminal).
ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def caught_signals(handler, signums=ENDING_SIGNALS, *, wake_w: int | None = None):
    """``handler(signum, frame)`` for ``signums`` inside the block, which gets a file
    descriptor that turns readable at every signal (Python's wakeup fd), to select or
    poll on; the old handlers and wakeup fd come back after it. Main thread only.
    ``wake_w``: the write end of a non-blocking pipe of the caller's, which its other
    wake-ups share, to use instead (the block then gets None)."""
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC) if wake_w is None else (None, wake_w)
    old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    old = {}
    try:
        for s in signums:
            old[s] = signal.signal(s, handler)
        yield r
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        signal.set_wakeup_fd(old_fd)
        if r is not None:
            os.close(r)
            os.close(w)
