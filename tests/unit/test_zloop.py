"""broker.net.zloop: a message past the bounds is refused unread, a bounded number of parts a turn."""

from __future__ import annotations

import asyncio

import zmq

from broker.net import zloop


def test_a_message_past_its_bounds_is_refused_and_read_through_over_several_turns():
    async def scenario() -> tuple[list, list, list]:
        ctx = zmq.Context()
        a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
        a.setsockopt(zmq.SNDHWM, 0)
        b.setsockopt(zmq.RCVHWM, 0)
        a.bind("inproc://zloop-test")
        b.connect("inproc://zloop-test")
        got, refused, behind = [], [], []
        zs = zloop.ZSocket(b, lambda frames: got.append([f.bytes for f in frames]), max_parts=4, max_bytes=100,
                           on_refused=lambda first, parts: refused.append((first.bytes, parts)))
        a.send_multipart([b"big", *[b""] * (5 * zloop.PARTS_PER_TURN)])
        a.send_multipart([b"x" * 60, b"y" * 60])  # few parts, too many bytes
        a.send_multipart([b"small", b"ok"])
        while len(got) < 1:
            behind.append(zs.behind)
            await asyncio.sleep(0)
        zs.close()
        a.close(linger=0)
        ctx.term()
        return got, refused, behind

    got, refused, behind = asyncio.run(scenario())
    assert got == [[b"small", b"ok"]]
    assert refused == [(b"big", True), (b"x" * 60, False)]
    assert behind.count(True) >= 4  # the refused message took turns of its own, the loop ran between
