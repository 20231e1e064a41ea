"""A tab of ``sluice web`` that stops reading (broker/web/hub.py): it holds at most
TAB_BATCHES batches, then is dropped with one last item saying so, and the hub and the
other tabs go on without waiting for it."""

from __future__ import annotations

import asyncio

from broker.web.hub import TAB_BATCHES, Tab


class FakeHub:
    def __init__(self) -> None:
        self.left: list[Tab] = []

    def leave(self, tab: Tab) -> None:
        self.left.append(tab)


def test_a_tab_that_stops_reading_is_dropped_not_waited_for() -> None:
    async def body() -> None:
        hub = FakeHub()
        slow, fast = Tab(hub, 1), Tab(hub, 1)
        got = []
        for n in range(TAB_BATCHES * 3):
            item = ("events", n, n, b"[]")
            slow.offer(item)  # never blocks, whoever reads or not
            fast.offer(item)
            got.append(await fast.next())
        assert [item[1] for item in got] == list(range(TAB_BATCHES * 3))
        assert slow.dropped and slow.queue.qsize() == 1
        assert (await slow.next())[0] == "unavailable"
        # Kept only what fit before it fell behind: nothing more is held for it.
        slow.offer(("events", 0, 0, b"[]"))
        assert slow.queue.qsize() == 0
        slow.close()
        assert hub.left == [slow]

    asyncio.run(body())


def test_a_tab_that_reads_keeps_every_batch_in_order() -> None:
    async def body() -> None:
        tab = Tab(FakeHub(), 1)
        for n in range(TAB_BATCHES):
            tab.offer(("events", n, n, b"[]"))
        assert not tab.dropped
        assert [(await tab.next())[1] for _ in range(TAB_BATCHES)] == list(range(TAB_BATCHES))

    asyncio.run(body())
