"""Terminals in the sandbox: a command given a pty (made outside the sandbox) has it as
its controlling terminal, is its foreground job, sees its window size, and gets the
signals its line discipline sends (Ctrl-C)."""

from __future__ import annotations

import fcntl
import os
import select
import struct
import termios
import time

import pytest

from landlock_helper.policy import SandboxPolicy
from landlock_helper.spawn import spawn

pytestmark = pytest.mark.timeout(60)

PYTHON = "/usr/bin/python3"
ENV = {"PATH": "/usr/bin:/bin", "TERM": "xterm"}

PROBE = """
import os, signal, sys, time
print("tty", os.isatty(0), os.isatty(1), os.isatty(2), os.get_terminal_size(), os.tcgetpgrp(0) == os.getpgrp(), flush=True)
signal.signal(signal.SIGWINCH, lambda *_: print("winch", os.get_terminal_size(), flush=True))
try:
    time.sleep(30)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def _read_until(fd: int, needle: bytes, out: bytearray, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while needle not in out:
        left = deadline - time.monotonic()
        assert left > 0, f"{needle!r} not seen in {bytes(out)!r}"
        if select.select([fd], [], [], left)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: every end of the terminal is closed
                chunk = b""
            assert chunk, f"the terminal closed before {needle!r}: {bytes(out)!r}"
            out += chunk


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
def test_a_sandboxed_command_owns_its_terminal(tmp_path, mode):
    master, slave = os.openpty()
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    try:
        proc = spawn([PYTHON, "-c", PROBE], cwd=str(tmp_path), env=ENV, policy=SandboxPolicy.from_mode(mode),
                     stdin=slave, stdout=slave, stderr=slave, tty=True)
    finally:
        os.close(slave)
    out = bytearray()
    try:
        _read_until(master, b"tty True True True os.terminal_size(columns=120, lines=40) True", out)
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 132, 0, 0))
        _read_until(master, b"winch os.terminal_size(columns=132, lines=50)", out)
        os.write(master, b"\x03")  # Ctrl-C, as a person types it
        _read_until(master, b"interrupted", out)
        assert proc.wait().exit_code == 0
    finally:
        proc.kill()
        os.close(master)
