"""Terminals in the sandbox: a command given a pty (made outside the sandbox) has it as
its controlling terminal, is its foreground job, sees its window size, and gets the
signals its line discipline sends (Ctrl-C); through the daemon, a run with ``tty`` gets
such a terminal, its stdin, resizes and cancel; interactive runs take no slot."""

from __future__ import annotations

import fcntl
import os
import select
import signal
import struct
import termios
import time

import psutil
import pytest

from broker.client import make_request
from landlock_helper.policy import SandboxPolicy
from landlock_helper.spawn import spawn
from tests.support.harness import SANDBOX_PYTHON, wait_for

pytestmark = pytest.mark.timeout(60)

PYTHON = SANDBOX_PYTHON
ENV = {"PATH": "/usr/bin:/bin", "TERM": "xterm"}

# It waits in short sleeps: a signal that lands after Python's last check for one and before
# a long sleep has begun runs its handler only when that sleep ends (seen as a lost SIGWINCH).
PROBE = """
import os, signal, sys, time
def pause():
    for _ in range(600):
        time.sleep(0.05)
signal.signal(signal.SIGWINCH, lambda *_: os.write(1, f"winch {os.get_terminal_size()}\\n".encode()))
try:
    print("tty", os.isatty(0), os.isatty(1), os.isatty(2), os.get_terminal_size(), os.tcgetpgrp(0) == os.getpgrp(), flush=True)
    pause()
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


# -- through the daemon --------------------------------------------------------------------

def _tty_request(argv, cwd, rows=24, cols=80, *, interactive=True):
    return make_request(argv, cwd=str(cwd), sandbox="workspace-write", stdin=True, tty=(rows, cols),
                        interactive=interactive)


def _until(client, call, output: bytearray, needle: bytes, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while needle not in output:
        assert time.monotonic() < deadline, f"{needle!r} not seen in {bytes(output)!r}"
        assert not call.done or needle in output, f"the command ended: {call.result}; output {bytes(output)!r}"
        client.poll(0.1)


def _type(client, call, data: bytes) -> None:
    """Write ``data`` to the command's terminal once it has started (and has room)."""
    while data:
        wait_for(lambda: client.poll(0.05) >= 0 and client.stdin_room(call) > 0, timeout=20, what="room for stdin")
        data = data[client.write_stdin(call, data):]


def test_a_command_run_with_a_terminal_through_the_daemon(daemon, tmp_path):
    client = daemon.client()
    output = bytearray()
    probe = PROBE.replace("    pause()", "    print('read', input(), flush=True)\n    pause()")
    call = client.submit_request(_tty_request([PYTHON, "-c", probe], tmp_path, 30, 100),
                                 on_output=lambda call, stream, chunk: output.extend(chunk))
    _until(client, call, output, b"tty True True True os.terminal_size(columns=100, lines=30) True")
    _type(client, call, b"hello\r")  # as typed: Enter is a carriage return
    _until(client, call, output, b"read hello")
    client.resize(call, 45, 140)
    _until(client, call, output, b"winch os.terminal_size(columns=140, lines=45)")
    _type(client, call, b"\x03")
    _until(client, call, output, b"interrupted")
    result = client.wait(call, timeout=20)
    assert result.exit_code == 0 and result.stderr == b"", result
    assert b"hello\r\n" in result.stdout  # the terminal's echo and its line endings


def test_cancelling_a_terminal_command_kills_its_whole_tree(daemon, tmp_path):
    client = daemon.client()
    output = bytearray()
    call = client.submit_request(_tty_request(["bash", "--norc", "-i"], tmp_path),
                                 on_output=lambda call, stream, chunk: output.extend(chunk))
    _type(client, call, b"sleep 300 & echo started-$((6*7))\r")
    _until(client, call, output, b"started-42")
    sandbox = psutil.Process(call.pid)

    def names() -> list[str]:
        found = []
        for p in [sandbox, *sandbox.children(recursive=True)]:
            try:
                found.append(p.name())
            except psutil.NoSuchProcess:
                pass
        return found

    # The background job may not have exec'd sleep yet when the echo comes.
    wait_for(lambda: "sleep" in names(), timeout=10, what="the background sleep to start")
    tree = [sandbox, *sandbox.children(recursive=True)]
    client.cancel(call)
    result = client.wait(call, timeout=20)
    assert result.aborted
    assert wait_for(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in tree),
                    timeout=10, what="the terminal command's tree to die")


def test_interactive_commands_take_no_slot(daemon_factory, tmp_path):
    d = daemon_factory.start(executors=1)
    client = d.client()
    waiting = [client.submit_request(_tty_request(["cat"], tmp_path)) for _ in range(6)]
    plain = make_request(["cat"], cwd=str(tmp_path), stdin=True, interactive=True)
    piped = client.submit_request(plain)
    wait_for(lambda: client.poll(0.05) >= 0 and all(c.started for c in [*waiting, piped]), timeout=20,
             what="the interactive commands to start")
    assert client.run(["echo", "ok"], cwd=str(tmp_path), wait_timeout=30).stdout == b"ok\n"
    _type(client, piped, b"piped\n")
    client.close_stdin(piped)
    assert client.wait(piped, timeout=20).stdout == b"piped\n"
    for call in waiting:
        client.cancel(call)
    assert all(r.aborted for r in client.wait_all(waiting, timeout=20))


def test_an_interactive_command_whose_executor_dies_ends_with_a_clear_error(daemon_factory, tmp_path):
    d = daemon_factory.start(executors=1)
    client = d.client()
    output = bytearray()
    call = client.submit_request(_tty_request(["bash", "--norc", "-i"], tmp_path),
                                 on_output=lambda call, stream, chunk: output.extend(chunk))
    _type(client, call, b"echo ready-$((6*7))\r")
    _until(client, call, output, b"ready-42")
    (executor,) = d.executor_pids()
    os.kill(executor, signal.SIGKILL)
    result = client.wait(call, timeout=20)
    assert result.error and "executor" in result.error, result
    # Its replacement serves the next one.
    assert client.run(["echo", "ok"], cwd=str(tmp_path), wait_timeout=60).stdout == b"ok\n"
