"""A program run on a terminal of its own, as a person runs it: :class:`OnTerminal`.

A pty is made here; the program gets its slave as stdin, stdout and stderr and as the
controlling terminal of a new session (so it is the foreground job: the line discipline
sends it SIGWINCH, and in cooked mode SIGINT for Ctrl-C). The test plays the person at
the master: :meth:`OnTerminal.type` keys, :meth:`OnTerminal.expect` output with a
deadline, :meth:`OnTerminal.resize` the window. The slave stays open here too, so the
terminal's attributes can be compared before and after the program ran
(:meth:`OnTerminal.attrs`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import struct
import subprocess
import termios
import time


class OnTerminal:
    def __init__(self, argv, *, env=None, cwd=None, rows: int = 24, cols: int = 80) -> None:
        self.master, self.slave = os.openpty()
        self.resize(rows, cols)
        self.initial_attrs = self.attrs()
        self.output = bytearray()
        self.proc = subprocess.Popen(
            argv, stdin=self.slave, stdout=self.slave, stderr=self.slave, env=env, cwd=cwd,
            start_new_session=True, preexec_fn=_take_terminal, close_fds=True)

    def attrs(self) -> list:
        return termios.tcgetattr(self.slave)

    def is_raw(self) -> bool:
        lflag = self.attrs()[3]
        return not lflag & (termios.ICANON | termios.ECHO | termios.ISIG)

    def resize(self, rows: int, cols: int) -> None:
        # The kernel sends SIGWINCH to the terminal's foreground job: the program.
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def _read(self, timeout: float) -> bool:
        if select.select([self.master], [], [], max(0.0, timeout))[0]:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                chunk = b""
            self.output += chunk
            return bool(chunk)
        return False

    def expect(self, needle: bytes, timeout: float = 20.0, *, since: int = 0) -> int:
        """Wait until ``needle`` appears in the output after offset ``since``; returns the
        offset just past it. Fails with what was seen after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            at = self.output.find(needle, since)
            if at >= 0:
                return at + len(needle)
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{needle!r} not seen within {timeout:g} s; the terminal shows "
                                     f"{bytes(self.output[since:])[-2000:]!r}")
            self._read(min(left, 0.5))

    def wait(self, timeout: float = 20.0) -> int:
        """The program's exit status, reading its output meanwhile (a full pty would block it)."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"still running after {timeout:g} s; the terminal shows "
                                     f"{bytes(self.output)[-2000:]!r}")
            self._read(0.05)
        while self._read(0):
            pass
        return self.proc.returncode

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        for fd in (self.master, self.slave):
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> OnTerminal:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _take_terminal() -> None:
    # After the new session's setsid: stdin, the slave, becomes its controlling terminal.
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
