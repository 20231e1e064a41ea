"""Terminals without processes: the client's checks of ``tty`` and ``interactive``, and the
CLI's raw mode on a pty (restored however its block ends, SIGWINCH noted)."""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import termios

import pytest

from broker.cli.terminal import RawTerminal, window_size
from broker.client import UsageError, make_request
from broker.wire import frames as wire


def test_tty_is_a_window_size():
    r = make_request(["vi"], cwd="/tmp", tty=(30, 100), interactive=True, stdin=True)
    assert (r.tty, r.interactive, r.stdin) == (wire.Winsize(30, 100), True, True)
    assert make_request(["vi"], cwd="/tmp", tty=wire.Winsize(24, 80)).tty == wire.Winsize(24, 80)
    plain = make_request(["ls"], cwd="/tmp")
    assert (plain.tty, plain.interactive) == (None, False)


@pytest.mark.parametrize("tty, words", [
    ((0, 80), "rows must be a whole number from 1 to 65535, got 0"),
    ((24, 65536), "columns must be a whole number from 1 to 65535, got 65536"),
    ((24.0, 80), "rows must be a whole number"),
    ((True, 80), "rows must be a whole number"),
    ("24x80", "tty must be (rows, columns) or a Winsize"),
    (True, "tty must be (rows, columns) or a Winsize"),
    ((24, 80, 0), "tty must be (rows, columns) or a Winsize"),
])
def test_a_bad_tty_is_one_clear_line(tty, words):
    with pytest.raises(UsageError) as e:
        make_request(["vi"], cwd="/tmp", tty=tty)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_interactive_is_a_bool():
    with pytest.raises(UsageError, match="interactive must be True or False"):
        make_request(["sh"], cwd="/tmp", interactive="yes")


@pytest.fixture
def pty_pair():
    master, slave = os.openpty()
    yield master, slave
    os.close(master)
    os.close(slave)


def test_raw_mode_is_given_back_even_after_an_exception(pty_pair):
    _, slave = pty_pair
    before = termios.tcgetattr(slave)
    with pytest.raises(RuntimeError):
        with RawTerminal(slave) as term:
            lflag = termios.tcgetattr(slave)[3]
            assert term.active and not lflag & (termios.ICANON | termios.ECHO | termios.ISIG)
            raise RuntimeError("boom")
    assert termios.tcgetattr(slave) == before
    assert signal.getsignal(signal.SIGWINCH) in (signal.SIG_DFL, None)


def test_sigwinch_is_noted_once(pty_pair):
    _, slave = pty_pair
    with RawTerminal(slave) as term:
        assert not term.resized()
        os.kill(os.getpid(), signal.SIGWINCH)
        assert term.resized()
        assert not term.resized()


def test_window_size_falls_back_to_24x80(pty_pair):
    master, slave = pty_pair
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        assert window_size(devnull) == (24, 80)
    finally:
        os.close(devnull)
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 132, 0, 0))
    assert window_size(slave) == (50, 132)
