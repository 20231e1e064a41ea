"""A command's stdin through the daemon: ``sluice run`` forwards a piped or redirected
stdin (end of file included, byte for byte, with flow control), the client library feeds
one with ``write_stdin``/``close_stdin``, and a terminal is not forwarded."""

from __future__ import annotations

import hashlib
import os
import pty
import subprocess
import time

import psutil
import pytest

from tests.support.harness import wait_for

pytestmark = pytest.mark.timeout(120)


def _run(d, sluice, tmp_path, *argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*sluice, "run", "--cwd", str(tmp_path), "--", *argv], env=d.env_for_children(),
                          capture_output=True, timeout=90, **kw)


def test_piped_stdin_reaches_the_command_with_its_end_of_file(module_daemon, sluice, tmp_path):
    r = _run(module_daemon, sluice, tmp_path, "cat", input=b"hello\n")
    assert (r.returncode, r.stdout) == (0, b"hello\n"), r.stderr


def test_100_mb_of_redirected_stdin_arrive_byte_for_byte(module_daemon, sluice, tmp_path):
    data = os.urandom(1 << 20) * 100
    path = tmp_path / "in.bin"
    path.write_bytes(data)
    with open(path, "rb") as f:
        r = _run(module_daemon, sluice, tmp_path, "sha256sum", stdin=f)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()


def test_a_big_stdin_waits_in_its_pipe_not_in_the_daemon(module_daemon, sluice, tmp_path):
    """256 MiB for a command that reads nothing for 3 s: the daemon's memory stays flat."""
    daemon = psutil.Process(module_daemon.pid)
    before = daemon.memory_info().rss
    feeder = subprocess.Popen(["head", "-c", str(256 << 20), "/dev/zero"], stdout=subprocess.PIPE)
    run = subprocess.Popen([*sluice, "run", "--cwd", str(tmp_path), "--", "sh", "-c", "sleep 3; wc -c"],
                           env=module_daemon.env_for_children(), stdin=feeder.stdout, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    feeder.stdout.close()
    peak = before
    while run.poll() is None:
        peak = max(peak, daemon.memory_info().rss)
        time.sleep(0.05)
    out, err = run.communicate()
    feeder.wait()
    assert (run.returncode, out.strip()) == (0, str(256 << 20).encode()), err
    assert peak - before < 32 << 20, f"the daemon grew by {(peak - before) >> 20} MiB"


def test_a_command_that_stops_reading_ends_the_feed(module_daemon, sluice, tmp_path):
    yes = subprocess.Popen(["yes"], stdout=subprocess.PIPE)
    try:
        r = _run(module_daemon, sluice, tmp_path, "head", "-n", "2", stdin=yes.stdout)
    finally:
        yes.kill()
        yes.wait()
    assert (r.returncode, r.stdout) == (0, b"y\ny\n"), r.stderr


def test_the_client_library_feeds_stdin(module_daemon, tmp_path):
    client = module_daemon.client()
    call = client.submit(["sh", "-c", "tr a-z A-Z; echo done"], cwd=str(tmp_path), stdin=True)
    wait_for(lambda: client.poll(0.05) >= 0 and call.started, what="the command to start")
    chunks = [b"first line\n", b"second ", b"line\n"]
    for chunk in chunks:
        sent = 0
        while sent < len(chunk):
            sent += client.write_stdin(call, chunk[sent:])
            if sent < len(chunk):
                client.poll(0.05)
    client.close_stdin(call)
    assert client.wait(call).stdout == b"FIRST LINE\nSECOND LINE\ndone\n"


def test_a_terminal_is_not_forwarded(module_daemon, sluice, tmp_path):
    """Without a terminal of its own (``-t``), a command reads /dev/null, even when sluice
    runs on one: ``cat`` ends at once rather than waiting for keys it would not echo."""
    leader, follower = pty.openpty()
    try:
        r = subprocess.run([*sluice, "run", "--cwd", str(tmp_path), "--", "sh", "-c", "cat; echo eof"],
                           env=module_daemon.env_for_children(), stdin=follower, capture_output=True, timeout=60)
    finally:
        os.close(leader)
        os.close(follower)
    assert (r.returncode, r.stdout) == (0, b"eof\n"), r.stderr
