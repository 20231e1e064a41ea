"""What the client library raises: everything derives from :class:`SluiceError`."""

from __future__ import annotations


class SluiceError(Exception):
    """Base of the errors this module raises; ``str(e)`` is one line for a person."""


class UsageError(SluiceError, ValueError):
    """A bad argument (unknown mode, missing cwd, relative writable path, ...)."""


class DaemonError(SluiceError):
    """The daemon cannot be started or reached, refused us, or went away."""


class SessionError(SluiceError):
    """The daemon refused to create or reach a session."""


class Interrupted(SluiceError):
    """A signal caught by :meth:`Client.catch_signals` arrived while waiting: not a failure,
    but raised out of the wait like one, so it shares the root."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum
