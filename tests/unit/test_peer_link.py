"""broker.net.calls and broker.net.link: the caller's table of calls and the link's rules,
sans-io (no socket, no loop): what each message from the daemon makes them send or decide."""

from __future__ import annotations

import pytest

from broker.net import peer
from broker.net.calls import CallTable, PeerCall
from broker.net.link import Link
from broker.wire import frames as wire


class Frame:
    def __init__(self, data: bytes) -> None:
        self.bytes = data
        self.buffer = memoryview(data)


def frames(kind: str, corr: str = "", body=None, **fields) -> list[Frame]:
    return [Frame(part) for part in wire.message(kind, corr, body, **fields)]


class Outbox:
    """A ``send`` that takes what it is given unless ``full``."""

    def __init__(self) -> None:
        self.sent: list[wire.Header] = []
        self.full = False

    def __call__(self, parts) -> bool:
        if self.full:
            return False
        self.sent.append(wire.decode_header(parts[0]))
        return True


class Recorded(PeerCall):
    __slots__ = ("news",)

    def __init__(self, call_id: str, **request) -> None:
        super().__init__(call_id, wire.RunRequest(argv=["true"], cwd="/", sandbox=None, **request))
        self.news: list = []

    def output(self, stream, chunk) -> None:
        self.news.append(("out", stream, bytes(chunk)))

    def began(self) -> None:
        self.news.append(("started", self.pid))

    def noted(self, note) -> None:
        self.news.append(("note", note))

    def ended(self, status) -> None:
        self.news.append(("ended", status.exit_code, status.error))


def receive(table: CallTable, kind: str, corr: str, body=None, **fields) -> bool:
    parts = frames(kind, corr, body, **fields)
    return table.receive(wire.decode_header(parts[0].bytes), parts)


def out(table: CallTable, corr: str, chunk: bytes) -> None:
    parts = [Frame(wire.header(wire.OUT, corr, stream=wire.STDOUT)), Frame(chunk)]
    table.receive(wire.decode_header(parts[0].bytes), parts)


def test_output_is_acked_in_increments_never_while_held_and_again_when_the_queue_was_full() -> None:
    box = Outbox()
    table = CallTable(box)
    call = Recorded("c1")
    assert wire.decode_header(table.run(call)[0]).kind == wire.RUN
    for _ in range(wire.ACK_EVERY_CHUNKS):
        out(table, "c1", b"")  # empty chunks: counted, not shown
    assert [(h.kind, h.n, h.seq) for h in box.sent] == [(wire.ACK, 0, wire.ACK_EVERY_CHUNKS)]
    chunk = b"x" * wire.ACK_EVERY_BYTES
    box.full = True
    out(table, "c1", chunk)  # its ack does not go: it goes with the next chunk's
    box.full = False
    out(table, "c1", b"y")
    assert [(h.n, h.seq) for h in box.sent[1:]] == [(len(chunk) + 1, 2)]
    call.output_held = True
    out(table, "c1", chunk)
    assert len(box.sent) == 2  # held: nothing acked
    ack = wire.decode_header(table.release(call)[0])
    assert (ack.n, ack.seq) == (len(chunk), 1) and table.release(call) is None
    assert call.news == [("out", wire.STDOUT, chunk), ("out", wire.STDOUT, b"y"), ("out", wire.STDOUT, chunk)]


def test_a_call_starts_takes_stdin_in_a_window_hears_notes_and_ends_once() -> None:
    out = Outbox()
    table = CallTable(out)
    call = Recorded("c2", stdin=True, tty=wire.Winsize(24, 80))
    table.run(call)
    assert table.resize(call, wire.Winsize(30, 100)) is None  # not started: sent once it has
    receive(table, wire.STARTED, "c2", wire.Started(pid=42, executor="exec-1"))
    assert [h.kind for h in out.sent] == [wire.RESIZE] and call.executor == "exec-1"
    assert table.stdin_room(call) == wire.STDIN_WINDOW_BYTES
    table.stdin(call, b"x" * wire.STDIN_WINDOW_BYTES)
    assert table.stdin_room(call) == 0
    receive(table, wire.ACK, "c2", n=10)
    assert table.stdin_room(call) == 10
    receive(table, wire.NOTICE, "c2", wire.ErrorMsg("waits for an executor"))
    assert wire.decode_header(table.close_stdin(call)[0]).kind == wire.IN and table.close_stdin(call) is None
    receive(table, wire.EXIT, "c2", wire.ExitStatus(exit_code=3))
    assert not receive(table, wire.ERROR, "c2", wire.ErrorMsg("too late"))  # no longer ours
    assert call.news == [("started", 42), ("note", "waits for an executor"), ("ended", 3, None)]
    assert table.stdin_room(call) == 0 and table.resize(call, wire.Winsize(1, 1)) is None


def test_an_error_naming_a_call_ends_it_and_one_about_none_is_not_the_tables() -> None:
    table = CallTable(Outbox())
    call = Recorded("c3")
    table.run(call)
    assert not receive(table, wire.ERROR, "", wire.ErrorMsg("about no call"))
    assert receive(table, wire.ERROR, "c3", wire.ErrorMsg("daemon busy"))
    assert call.news == [("ended", None, "daemon busy")] and not table.calls


@pytest.fixture
def link():
    out = Outbox()
    link = Link(out, role=wire.ROLE_AGENT, name="t")
    link.welcomed(wire.Welcome(peer_id="agent-1", heartbeat_s=0.5))
    link.out = out
    broken = []
    link.on_broken.append(lambda error: broken.append(str(error)))
    link.broken_said = broken
    return link


def test_the_link_answers_pings_hands_on_the_rest_and_breaks_on_an_error_about_no_call(link) -> None:
    seen = []
    link.on(wire.EXIT, lambda head, frames: seen.append(head.corr))
    link.receive(frames(wire.PING, "nonce", seq=7))
    link.receive(frames(wire.EXIT, "c1", wire.ExitStatus(exit_code=0)))
    link.receive([Frame(b"\xc1")])  # does not decode: dropped
    assert [(h.kind, h.corr, h.seq) for h in link.out.sent] == [(wire.PONG, "nonce", 7)] and seen == ["c1"]
    assert link.heartbeat_s == 0.5 and link.peer_id == "agent-1"
    link.receive(frames(wire.ERROR, "", wire.ErrorMsg(peer.HELLO_FIRST)))
    assert link.broken_said == [f"the daemon reported: {peer.HELLO_FIRST}"]


def test_a_link_that_rejoins_takes_send_hello_first_as_lost_whatever_it_answered(link) -> None:
    lost = []
    link.rejoin = True
    link.lost = lost.append
    link.receive(frames(wire.ERROR, "c9", wire.ErrorMsg(peer.HELLO_FIRST)))
    assert lost == ["the broker no longer knows this agent"] and not link.broken_said


def test_the_link_refuses_in_the_daemons_words_before_it_is_welcomed() -> None:
    link = Link(Outbox(), role=wire.ROLE_EXECUTOR, name="t")
    errors = []
    link.on_broken.append(errors.append)
    link.receive(frames(wire.ERROR, "", wire.ErrorMsg("authentication failed")))
    assert [(str(e), e.refused) for e in errors] == [
        ("the daemon refused the connection: authentication failed", "authentication failed")]
