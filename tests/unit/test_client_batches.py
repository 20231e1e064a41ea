"""The client library's side of ``events`` batches (broker.client.sessions), without a
daemon: unpacked in order with their seqs, handed out one by one, acked every
SESSION_ACK_EVERY_EVENTS with a batch's bytes counted in proportion, bad events reported
in place."""

from __future__ import annotations

import msgspec
import pytest

from broker.client.sessions import ClientSession, SessionTable
from broker.wire import frames as wire
from broker.wire.protocol import AgentMessageDeltaEvent, Event, SessionConfiguredEvent, encode_msgpack

pytestmark = pytest.mark.timeout(30)


class FakeClient:
    """What a ClientSession needs of its Client: sends are recorded, the table is ours."""

    peer_id = "frontend-1"

    def __init__(self) -> None:
        self.sent: list[wire.Header] = []
        self.table = SessionTable()

    def session_table(self) -> SessionTable:
        return self.table

    def send_frames(self, parts, *, block: bool) -> bool:
        self.sent.append(wire.decode_header(parts[0]))
        return True

    def next_session_event(self, session, timeout, fds, interruptible):
        return None  # nothing more arrives


def body(text: str) -> bytes:
    return encode_msgpack(Event("t1", AgentMessageDeltaEvent(text)))


def attached(client: FakeClient, session_id: str = "s1", seq: int = 0) -> ClientSession:
    session = ClientSession(client, session_id)
    client.table.by_id[session_id] = session
    client.table.on_attached(wire.Header(wire.ATTACHED, session=session_id, seq=seq), None)
    return session


def batch(first: int, bodies: list[bytes], session_id: str = "s1") -> tuple[wire.Header, bytes]:
    return wire.Header(wire.EVENTS, session=session_id, seq=first, n=len(bodies)), wire.events_body(len(bodies), bodies)


def test_a_batch_is_handed_out_event_by_event_and_acked_in_proportion(monkeypatch) -> None:
    client = FakeClient()
    session = attached(client)
    bodies = [body("x" * (i % 7)) for i in range(600)]
    client.table.on_events(*batch(1, bodies))
    client.table.on_event(wire.Header(wire.EVENT, session="s1", seq=601), body("single"))
    taken = [session.next_event(0) for _ in range(601)]
    assert [e.seq for e in taken] == list(range(1, 602))
    assert [e.msg.delta for e in taken] == ["x" * (i % 7) for i in range(600)] + ["single"]
    assert session.next_event(0) is None
    acks = [(h.seq, h.n) for h in client.sent if h.kind == wire.ACK]
    total = sum(map(len, bodies))
    # Every 256 events taken; the batch's bytes in proportion to what was taken of it
    # (rounded down event by event), and all of them once it is all taken.
    assert [seq for seq, _ in acks] == [256, 512]
    assert all(abs(n - total * 256 // 600) <= 256 for _, n in acks)
    session._ack()
    assert sum(h.n for h in client.sent if h.kind == wire.ACK) == total + len(body("single"))


def test_bad_events_are_reported_in_place_and_the_numbering_goes_on() -> None:
    client = FakeClient()
    session = attached(client)
    bad = msgspec.msgpack.encode({"id": 5})
    client.table.on_events(*batch(1, [body("a"), bad, msgspec.msgpack.encode(b"\x92"), body("d")]))
    events = [session.next_event(0) for _ in range(4)]
    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert [type(e.msg).__name__ for e in events] == ["AgentMessageDeltaEvent", "ErrorEvent", "ErrorEvent",
                                                      "AgentMessageDeltaEvent"]
    assert events[1].msg.message.startswith("unreadable event from the daemon: ")
    # A body that is not an array at all: one error per event it stood for.
    client.table.on_events(wire.Header(wire.EVENTS, session="s1", seq=5, n=2), b"\x01")
    events = [session.next_event(0) for _ in range(2)]
    assert [e.seq for e in events] == [5, 6] and all(e.msg.message.startswith("unreadable events") for e in events)


def test_a_batch_that_renames_the_session_is_followed_under_the_new_id() -> None:
    client = FakeClient()
    session = attached(client)
    configured = SessionConfiguredEvent(session_id="11111111-2222-3333-4444-555555555555", model="m",
                                        history_log_id=0, history_entry_count=0)
    client.table.on_events(*batch(1, [encode_msgpack(Event("0", configured)), body("a")]))
    assert session.id == "11111111-2222-3333-4444-555555555555"
    client.table.on_events(*batch(3, [body("b")], session_id=session.id))
    assert [session.next_event(0).seq for _ in range(3)] == [1, 2, 3]


def test_a_batch_for_another_position_is_dropped_on_attach() -> None:
    client = FakeClient()
    session = attached(client)
    client.table.on_events(*batch(1, [body("old")] * 3))
    client.table.attaching["c"] = session
    client.table.on_attached(wire.Header(wire.ATTACHED, "c", session="s1", seq=10), None)
    client.table.on_events(*batch(11, [body("new")]))
    event = session.next_event(0)
    assert (event.seq, event.msg.delta) == (11, "new") and session.next_event(0) is None
