"""The caller's terminal for ``sluice run -t`` and ``sluice sandbox -t``: raw mode, always
restored, and its window size and changes; and the keys that are sluice's rather than the
command's (``-i``'s Ctrl-C, ``-t``'s ``~.`` escapes).

In raw mode every key is a byte for the program on the other side (Ctrl-C is ``\\x03``,
Ctrl-Z ``\\x1a``): the pty in the sandbox, with its own line discipline, turns them into
signals for the program's foreground job, as any terminal does. Our terminal must then
be given back as it was on every way out; :class:`RawTerminal` restores it when its
``with`` block ends, however it ends (the callers turn SIGTERM and SIGHUP into an
orderly end of that block), and says nothing while it is raw except through
:meth:`RawTerminal.say`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import termios
import time
import tty

# When a terminal's size cannot be read (0x0, or not a terminal): what terminals start with.
DEFAULT_ROWS, DEFAULT_COLS = 24, 80


def is_terminal(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def window_size(*fds: int) -> tuple[int, int]:
    """(rows, columns) of the first of ``fds`` that is a terminal with a size, else 24x80."""
    for fd in fds:
        try:
            size = os.get_terminal_size(fd)
        except OSError:
            continue
        if size.lines > 0 and size.columns > 0:
            return min(size.lines, 65535), min(size.columns, 65535)
    return DEFAULT_ROWS, DEFAULT_COLS


class RawTerminal:
    """``with RawTerminal(fd) as term:`` ``fd``'s terminal in raw mode, and SIGWINCH noted
    (:meth:`resized` says whether it came since last asked; the signal also wakes a
    poller on Python's wakeup fd, which the callers have set). On the way out the
    terminal gets back the attributes it had, and SIGWINCH its previous handler."""

    def __init__(self, fd: int = 0) -> None:
        self.fd = fd
        self.active = False
        self._saved: list | None = None
        self._winch = False
        self._old_winch = None
        self._old_cont = None

    def __enter__(self) -> RawTerminal:
        self._saved = termios.tcgetattr(self.fd)
        self._old_winch = signal.signal(signal.SIGWINCH, self._on_winch)
        self._old_cont = signal.signal(signal.SIGCONT, self._on_cont)
        try:
            # TCSANOW: keys typed ahead of the program are kept for it, not flushed.
            tty.setraw(self.fd, termios.TCSANOW)
        except BaseException:
            self._handlers_back()
            raise
        self.active = True
        return self

    def _handlers_back(self) -> None:
        signal.signal(signal.SIGWINCH, self._old_winch if self._old_winch is not None else signal.SIG_DFL)
        signal.signal(signal.SIGCONT, self._old_cont if self._old_cont is not None else signal.SIG_DFL)

    def __exit__(self, *exc) -> None:
        self.restore()

    def restore(self) -> None:
        """Give the terminal back as it was (idempotent)."""
        if self._saved is None:
            return
        saved, self._saved = self._saved, None
        self.active = False
        self._handlers_back()
        # A process of a background job that sets its terminal's attributes is stopped
        # with SIGTTOU; being given back the terminal must not stop us.
        old_ttou = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            with contextlib.suppress(OSError, termios.error):
                termios.tcsetattr(self.fd, termios.TCSADRAIN, saved)
        finally:
            signal.signal(signal.SIGTTOU, old_ttou)

    def _on_winch(self, signum, frame) -> None:
        self._winch = True

    def _on_cont(self, signum, frame) -> None:
        # Stopped from outside (kill -STOP) and continued: the shell gave the terminal its
        # own modes meanwhile, and the window may have changed.
        if self.active:
            with contextlib.suppress(OSError, termios.error):
                tty.setraw(self.fd, termios.TCSANOW)
        self._winch = True

    def resized(self) -> bool:
        """True once per SIGWINCH (or burst of them) since the last call."""
        changed, self._winch = self._winch, False
        return changed

    def size(self) -> tuple[int, int]:
        return window_size(self.fd, 1, 2)

    def say(self, line: str) -> None:
        """One line on stderr, as ``sluice: ...``, legible in raw mode too (CR LF)."""
        end = "\r\n" if self.active else "\n"
        try:
            sys.stderr.write(f"sluice: {line}{end}")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


NOT_A_TERMINAL = "the input device is not a terminal: -t needs stdin to be one (use -i to forward a pipe or file)"


# -- keys that are ours, not the command's ---------------------------------------------------

# ``-i``: Ctrl-C pressed this many times within this many seconds cancels the command (one
# that ignores SIGINT); fewer are passed to it.
CTRL_C_TO_CANCEL = 3
CTRL_C_WINDOW_S = 2.0


class CtrlC:
    """``-i``'s Ctrl-C, as ``docker run -i`` has it: SIGINT goes to the command's process
    group (the command decides: Python raises KeyboardInterrupt, a shell's trap runs), and
    the third within :data:`CTRL_C_WINDOW_S` cancels the command, tree and all. Before the
    command has started there is nothing to pass it to: the first cancels."""

    def __init__(self) -> None:
        self._presses: list[float] = []

    def passes(self, started: bool) -> bool:
        """Whether this press goes to the command (else it cancels the command)."""
        now = time.monotonic()
        self._presses = [t for t in self._presses if now - t < CTRL_C_WINDOW_S] + [now]
        return started and len(self._presses) < CTRL_C_TO_CANCEL


DEFAULT_ESCAPE = "~"


def escape_char(value: str) -> str | None:
    """``--escape``'s value: one printable ASCII character, or ``none`` (no escapes: every
    key goes to the command). Raises ValueError with a sentence for a person."""
    if value == "none":
        return None
    if len(value) != 1 or not value.isascii() or not value.isprintable() or value.isspace():
        raise ValueError(f"--escape-char must be one printable character or 'none', got {value!r}")
    return value


class EscapeKeys:
    """ssh's escapes, for the keys of a raw terminal (``-t``): right after Enter (or as
    the first key), the escape character (``~``) and then ``.`` ends the command (as if
    its terminal hung up), ``?`` lists the escapes and ``~`` types one ``~``. Anything
    else after it goes to the command as typed, the ``~`` included, so a ``~`` typed in
    the middle of a line, or one not followed by an escape, is never lost."""

    END = "end"
    HELP = "help"

    def __init__(self, char: str | None = DEFAULT_ESCAPE) -> None:
        self.char = None if char is None else ord(char)
        self._line_start = True
        self._pending = False

    def help(self) -> str:
        c = chr(self.char) if self.char is not None else ""
        return (f"escapes (after Enter): {c}. end the command  {c}? this list  {c}{c} type one {c}  "
                "(--escape none: no escapes)")

    def ending(self) -> str:
        return f"{chr(self.char)}. typed: ending the command and its processes"

    def feed(self, keys: bytes) -> tuple[bytes, str | None]:
        """The keys that go to the command, and what the person asked of us (``END``,
        ``HELP`` or None). After ``END`` the rest of ``keys`` is dropped."""
        if self.char is None:
            return keys, None
        out = bytearray()
        asked = None
        for b in keys:
            if self._pending:
                self._pending = False
                if b == ord("."):
                    return bytes(out), self.END
                if b == ord("?"):
                    asked = self.HELP
                    continue
                if b != self.char:
                    out.append(self.char)  # not an escape: the ~ was the command's
            elif self._line_start and b == self.char:
                self._pending = True
                continue
            out.append(b)
            self._line_start = b in (0x0D, 0x0A)
        return bytes(out), asked
