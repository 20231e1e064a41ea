"""The keys that are sluice's rather than the command's: ``-t``'s ssh-style escapes
(:class:`broker.cli.terminal.EscapeKeys`), ``--escape-char``'s values, and ``-i``'s
Ctrl-C counting (:class:`broker.cli.terminal.CtrlC`)."""

from __future__ import annotations

import pytest

from broker.cli import terminal
from broker.cli.terminal import CtrlC, EscapeKeys, escape_char

END, HELP = EscapeKeys.END, EscapeKeys.HELP


def feed_all(keys: EscapeKeys, *chunks: bytes) -> tuple[bytes, list]:
    sent, asked = b"", []
    for chunk in chunks:
        out, what = keys.feed(chunk)
        sent += out
        asked.append(what)
    return sent, asked


def test_tilde_dot_as_the_first_keys_or_after_enter_ends():
    assert EscapeKeys().feed(b"~.") == (b"", END)
    assert EscapeKeys().feed(b"ls\r~.rest") == (b"ls\r", END)
    assert EscapeKeys().feed(b"ls\n~.") == (b"ls\n", END)


def test_a_tilde_inside_a_line_is_the_commands():
    assert EscapeKeys().feed(b"cd ~/src\r") == (b"cd ~/src\r", None)
    assert EscapeKeys().feed(b"a~.") == (b"a~.", None)


def test_escape_split_over_reads_is_still_seen():
    assert feed_all(EscapeKeys(), b"x\r", b"~", b".") == (b"x\r", [None, None, END])


def test_double_escape_types_one_and_anything_else_goes_through_with_it():
    assert EscapeKeys().feed(b"~~x") == (b"~x", None)
    assert EscapeKeys().feed(b"~x~.") == (b"~x~.", None)  # after ~x the line has begun
    assert EscapeKeys().feed(b"~\r~.") == (b"~\r", END)  # ~ then Enter: both typed, a new line


def test_help_is_asked_and_nothing_typed():
    keys = EscapeKeys()
    assert keys.feed(b"~?") == (b"", HELP)
    assert keys.feed(b"~.") == (b"", END)  # still at the start of a line
    assert "~. end the command" in keys.help() and "~~ type one ~" in keys.help()


def test_another_escape_character_and_none():
    assert EscapeKeys("%").feed(b"~.%%\r%.") == (b"~.%%\r", END)  # %% mid-line is typed as is
    assert EscapeKeys(None).feed(b"~.\r~.") == (b"~.\r~.", None)


@pytest.mark.parametrize("value, char", [("~", "~"), ("%", "%"), ("none", None)])
def test_escape_char_values(value, char):
    assert escape_char(value) == char


@pytest.mark.parametrize("value", ["", "ab", " ", "\t", "\u00e9", "\x1d"])
def test_bad_escape_chars_are_one_sentence(value):
    with pytest.raises(ValueError, match="--escape-char must be one printable character or 'none'"):
        escape_char(value)


def test_ctrl_c_is_passed_until_the_third_within_the_window(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(terminal.time, "monotonic", lambda: now[0])
    c = CtrlC()
    assert c.passes(True) and c.passes(True)
    assert not c.passes(True)  # the third within 2 s cancels
    now[0] += terminal.CTRL_C_WINDOW_S + 0.1
    assert c.passes(True)  # the earlier ones are forgotten


def test_ctrl_c_before_the_command_started_cancels():
    assert not CtrlC().passes(False)
