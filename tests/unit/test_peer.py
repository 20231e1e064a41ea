"""broker.net.peer: the rules every peer of the daemon follows, without a socket."""

from __future__ import annotations

import pytest
import zmq

from broker.net import peer
from broker.wire import frames as wire


@pytest.fixture
def clock(monkeypatch):
    """peer's monotonic clock, moved by hand."""
    now = [1000.0]
    monkeypatch.setattr(peer.time, "monotonic", lambda: now[0])
    return now


def test_liveness_pings_a_quiet_daemon_once_per_heartbeat_and_gives_it_up_after_its_patience(clock):
    live = peer.Liveness()
    assert live.check(1.0) is None  # heard just now
    clock[0] += 1.0
    assert live.check(1.0) == peer.PING
    clock[0] += 0.5
    assert live.check(1.0) is None  # a ping is out; the next one a heartbeat later
    clock[0] += 0.5
    assert live.check(1.0) == peer.PING
    clock[0] += peer.PATIENCE_HEARTBEATS - 1.0  # the patience, counted from the first unanswered ping
    assert live.check(1.0) == peer.PING
    clock[0] += 0.01
    assert live.check(1.0) == f"the daemon stopped answering (nothing for {peer.PATIENCE_HEARTBEATS + 1}.0 s)"


def test_peers_wait_for_the_daemon_longer_than_it_waits_for_them():
    # The ordering the timeouts exist for: a stall of the daemon ends with every peer still there.
    assert peer.WAITING_SAID_AFTER < peer.DEAD_AFTER_HEARTBEATS < peer.PATIENCE_HEARTBEATS
    assert peer.PATIENCE_HEARTBEATS * peer.HEARTBEAT_S > 30


def test_liveness_says_it_waits_for_a_quiet_daemon_at_every_doubling_of_the_wait(clock):
    live = peer.Liveness()
    said = []
    for _ in range(20):
        clock[0] += 1.0
        live.check(1.0)
        if live.waiting(1.0):
            said.append(live.silence())
    assert said == [3.0, 6.0, 12.0]
    clock[0] += 4.0
    assert "has not answered for 24 s; waiting" in live.waiting(1.0)
    live.heard()
    assert live.waiting(1.0) is None


def test_liveness_does_not_take_its_own_pause_for_a_wait(clock):
    live = peer.Liveness()
    clock[0] += 30.0  # we were stopped: no ping went out, nothing was waited for
    assert live.waiting(1.0) is None
    assert live.check(1.0) == peer.PING
    assert live.waiting(1.0) is None


def test_liveness_gives_up_a_local_daemon_whose_socket_is_gone(clock, tmp_path):
    live = peer.Liveness()
    sock = tmp_path / "broker.sock"
    sock.touch()
    clock[0] += 1.0
    assert live.check(1.0, str(sock)) == peer.PING
    sock.unlink()
    clock[0] += 1.0
    assert live.check(1.0, str(sock)) == "the daemon's socket is gone (the daemon exited)"


def test_a_peer_that_was_paused_itself_pings_before_it_gives_up(clock):
    live = peer.Liveness()
    clock[0] += 30.0  # SIGSTOP, a suspended laptop: the silence was ours
    assert live.check(1.0) == peer.PING
    live.heard()  # the daemon answers
    assert live.check(1.0) is None and live.silence() == 0.0


def test_the_hello_and_its_answers():
    frames = peer.hello(wire.ROLE_EXECUTOR, "t0k", "exec-1", slots=4)
    assert wire.decode_header(frames[0]).kind == wire.HELLO
    hello = wire.decode(wire.HELLO, frames[1])
    assert (hello.role, hello.token, hello.name, hello.slots, hello.version) == (
        wire.ROLE_EXECUTOR, "t0k", "exec-1", 4, wire.PROTOCOL_VERSION)
    welcome = wire.encode(wire.Welcome(peer_id="executor-1", heartbeat_s=0.5))
    assert peer.reply_to_hello(wire.WELCOME, welcome).peer_id == "executor-1"
    assert peer.reply_to_hello(wire.ERROR, wire.encode(wire.ErrorMsg("bad token"))) == "bad token"
    assert peer.reply_to_hello(wire.ERROR, None) == "refused"
    assert peer.reply_to_hello(wire.WELCOME, b"\xc1") is None  # does not decode: not an answer
    assert peer.reply_to_hello(wire.PING, None) is None


def test_curve_refusals_read_as_one_line():
    for event in (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                  zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
        text = peer.handshake_refusal(event, "tcp://h:1")
        assert text and "tcp://h:1" in text and "\n" not in text
    assert peer.handshake_refusal(zmq.EVENT_CONNECTED, "tcp://h:1") is None
