"""How ``sluice run`` tells a person the way a command ended (broker/cli/run.py)."""

from __future__ import annotations

import signal
from types import SimpleNamespace

from broker.cli.run import describe_ending


def _result(**kw):
    return SimpleNamespace(**{"error": None, "aborted": False, "timed_out": False, "signal": None, **kw})


def test_a_timeout_and_a_killing_signal_are_said():
    assert "timed out after 300 ms" in describe_ending(_result(timed_out=True), 300)
    assert "SIGKILL (signal 9, exit 137)" in describe_ending(_result(signal=signal.SIGKILL), None)


def test_sigpipe_is_not_news():
    """``sluice run -- yes | head -1``: the reader left; a shell says nothing either."""
    assert describe_ending(_result(signal=signal.SIGPIPE), None) is None


def test_a_plain_exit_or_an_error_says_nothing_here():
    assert describe_ending(_result(), None) is None
    assert describe_ending(_result(error="boom", signal=9), None) is None
