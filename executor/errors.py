"""Errors of the executor that a person reads (kept light: imported before anything big)."""


class StartupError(Exception):
    """The worker cannot join the broker; the message is for a person (exit 2)."""
