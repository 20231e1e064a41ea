"""The daemon under faults: descriptor floods, sessions by the thousand, suspended and
vanished frontends, a runtime dir deleted under it, executors killed in a loop.

Every test starts its own daemon with small limits (a low ``RLIMIT_NOFILE`` and few
executors), so that the fault is reached in seconds and bounded.
"""

from __future__ import annotations

import contextlib
import resource
import socket
import subprocess

import pytest

from broker.client import SessionError
from tests.support.harness import wait_for
from tests.support.sessions import collect, configure_op

pytestmark = pytest.mark.timeout(240)

FLOOD = 2_000
SESSIONS = 1_500
# The daemon's descriptor limit, soft and hard: room for the flood below, but not for a
# flood many times larger. (A flood that outruns the gate at a limit this low can still
# exhaust it: libzmq accepts on its own thread; the README says so.)
DAEMON_NOFILE = 4_096


def _own_fd_limit(at_least: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < at_least:
        pytest.skip(f"this test opens {at_least} descriptors; the hard limit here is {hard}")
    if soft < at_least:
        resource.setrlimit(resource.RLIMIT_NOFILE, (at_least, hard))


def _flood(path: str, n: int) -> tuple[list[socket.socket], int]:
    """``n`` raw connections to the daemon's socket that never say hello; (open ones, refused)."""
    held, refused = [], 0
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:  # blocking: waits while the daemon's listen backlog is full
            s.connect(path)
            held.append(s)
        except OSError:
            refused += 1
            s.close()
    return held, refused


def _cut(held: list[socket.socket]) -> int:
    """How many of ``held`` the daemon has closed (end of file or reset on read)."""
    n = 0
    for s in held:
        s.setblocking(False)
        try:
            if s.recv(4096) == b"":
                n += 1
        except BlockingIOError:
            pass  # still open
        except OSError:
            n += 1
    return n


def test_a_connection_flood_neither_aborts_the_daemon_nor_locks_out_new_clients(daemon_factory, sluice, tmp_path):
    _own_fd_limit(FLOOD + 200)
    d = daemon_factory.start(executors=1, nofile=DAEMON_NOFILE)
    peer = d.client()  # connected before the flood: it must be served throughout
    held: list[socket.socket] = []
    try:
        held, refused = _flood(d.runtime.socket_path, FLOOD)
        assert d.proc.poll() is None, d.log()[-3000:]
        assert len(held) == FLOOD, refused
        assert peer.run(["echo", "still served"]).stdout == b"still served\n"
        # A new client gets in while the flood's connections are still held.
        r = subprocess.run([*sluice, "run", "--cwd", str(tmp_path), "--", "echo", "new client"], env=d.env_for_children(),
                           capture_output=True, timeout=60)
        assert (r.returncode, r.stdout) == (0, b"new client\n"), r.stderr.decode()
        # Strangers that never say hello are cut once their time is up.
        wait_for(lambda: _cut(held) == len(held), timeout=30, what="every silent connection to be cut")
        assert d.proc.poll() is None and "connections cut" in d.log()
        assert peer.run(["true"]).returncode == 0
    finally:
        for s in held:
            s.close()


def test_sessions_beyond_what_the_daemon_can_hold_are_refused_politely(daemon_factory, server, sluice, tmp_path):
    d = daemon_factory.start(executors=1, nofile=DAEMON_NOFILE, env={"SLUICE_HOME": str(tmp_path / "home")})
    client = d.client()
    opened, refused = [], []
    for _ in range(SESSIONS):
        try:
            opened.append(client.open_session(configure_op(server, str(tmp_path)), timeout=30))
        except SessionError as e:
            refused.append(str(e))
    assert d.proc.poll() is None, d.log()[-3000:]
    assert opened and refused, (len(opened), refused[:1])
    assert len(opened) + len(refused) == SESSIONS
    assert all("sessions already" in why for why in refused), refused[:3]
    # Those opened work (the newest one is configured), the daemon is not out of descriptors.
    collect(opened[-1], "session_configured", timeout=60)
    listed = client.list_sessions(timeout=30).sessions
    assert len(listed) == len(opened)
    r = subprocess.run([*sluice, "run", "--cwd", str(tmp_path), "--", "echo", "served"], env=d.env_for_children(),
                       capture_output=True, timeout=60)
    assert (r.returncode, r.stdout) == (0, b"served\n"), r.stderr.decode()
    with contextlib.suppress(Exception):
        client.close()


def test_a_session_the_agent_refuses_is_answered_and_gone(daemon_factory, server, tmp_path):
    d = daemon_factory.start(executors=1, env={"SLUICE_HOME": str(tmp_path / "home")})
    client = d.client()
    for _ in range(3):
        session = client.open_session(configure_op(server, "relative/dir"))
        (error,) = collect(session, "error")
        assert "cwd is not absolute" in error.msg.message
    wait_for(lambda: not client.list_sessions().sessions, timeout=10, what="the refused sessions to be forgotten")
    good = client.open_session(configure_op(server, str(tmp_path)))
    collect(good, "session_configured")
    assert [s.id for s in client.list_sessions().sessions] == [good.id]
