"""broker.daemon.gate: which connections are cut, checked on real sockets (no daemon)."""

from __future__ import annotations

import socket

import pytest
import zmq

from broker.daemon.gate import ConnectionGate, reserve


class Frame:
    """Stands in for the zmq.Frame a hello came in: it knows its descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def get(self, option):
        assert option == zmq.SRCFD
        return self.fd


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def socketpairs():
    """``socketpairs(n)``: n connected pairs (ours, theirs), all closed after the test."""
    made: list[tuple[socket.socket, socket.socket]] = []

    def make(n: int) -> list[tuple[socket.socket, socket.socket]]:
        made.extend(socket.socketpair() for _ in range(n))
        return made[-n:]

    yield make
    for a, b in made:
        a.close()
        b.close()


def _was_cut(theirs: socket.socket) -> bool:
    theirs.setblocking(False)
    try:
        return theirs.recv(1) == b""
    except BlockingIOError:
        return False


def test_reserve_scales_with_the_limit():
    assert reserve(1024) == 256 and reserve(4096) == 1024 and reserve(1 << 20) == 4096


def test_strangers_are_cut_after_their_time_and_peers_never(socketpairs):
    clock = Clock()
    gate = ConnectionGate(4096, stranger_s=10, clock=clock)
    pairs = socketpairs(6)
    for ours, _ in pairs:
        gate.accepted(ours.fileno())
    for ours, _ in pairs[:2]:
        assert gate.peer_joined(Frame(ours.fileno())) is not None
    clock.now += 9
    gate.sweep()
    assert not any(_was_cut(theirs) for _, theirs in pairs)
    clock.now += 2
    gate.sweep()
    assert [_was_cut(theirs) for _, theirs in pairs] == [False, False, True, True, True, True]
    assert gate.cut == 4 and len(gate.connections) == 2


def test_a_peer_that_left_gets_a_strangers_whole_time_to_say_hello_again(socketpairs):
    clock = Clock()
    gate = ConnectionGate(4096, stranger_s=10, clock=clock)
    (ours, theirs), = socketpairs(1)
    gate.accepted(ours.fileno())
    inode = gate.peer_joined(Frame(ours.fileno()))
    clock.now += 60  # a peer for a minute, then given up (silent) by the router
    gate.peer_left(inode)
    clock.now += 9
    gate.sweep()
    assert not _was_cut(theirs)  # the router's "send hello first" on it can still be read
    clock.now += 2
    gate.sweep()
    assert _was_cut(theirs) and gate.cut == 1


def test_over_the_limit_the_oldest_strangers_go_first(socketpairs):
    clock = Clock()
    gate = ConnectionGate(64, clock=clock)  # the floor: 16 connections
    assert gate.max_connections == 16
    pairs = socketpairs(17)
    peer = pairs[0][0]
    gate.accepted(peer.fileno())
    gate.peer_joined(Frame(peer.fileno()))
    for ours, _ in pairs[1:]:
        clock.now += 1
        gate.accepted(ours.fileno())
    # 17 > 16: one over, plus a tenth of the room, cut at once; the oldest strangers, never the peer.
    cut = [_was_cut(theirs) for _, theirs in pairs]
    assert cut[0] is False and cut[1:3] == [True, True] and not any(cut[3:])


def test_a_descriptor_reused_by_another_socket_is_not_cut_for_the_old_one():
    clock = Clock()
    gate = ConnectionGate(4096, stranger_s=10, clock=clock)
    a, b = socket.socketpair()
    fd = a.fileno()
    gate.accepted(fd)
    clock.now += 20
    a.close()
    b.close()
    c, d = socket.socketpair()  # takes the lowest free descriptor: most likely ``fd`` again
    try:
        gate.sweep()  # a newer socket at the descriptor: its clock starts now
        assert not _was_cut(d) and not _was_cut(c)
    finally:
        c.close()
        d.close()


def test_without_srcfd_nothing_is_cut():
    clock = Clock()
    gate = ConnectionGate(4096, stranger_s=1, clock=clock)
    a, b = socket.socketpair()
    try:
        gate.accepted(a.fileno())
        assert gate.peer_joined(Frame(-1)) is None
        clock.now += 5
        gate.sweep()
        assert not _was_cut(b)
    finally:
        a.close()
        b.close()
