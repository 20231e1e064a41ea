"""One daemon attachment per session, shared by every browser tab that shows it.

A tab costs the daemon nothing more than the first one: the web process attaches once
per session (a :class:`broker.web.link.Follower`) and fans the batches out. A :class:`Hub`
keeps the last :data:`KEEP_EVENTS` events it has handed out, so a tab that joins (or
reconnects by ``Last-Event-ID``) from within them starts at once; what it asks for from
before them is read from the daemon's journal first (:func:`broker.web.link.event_range`),
then the kept events, then the live ones, in seq order.

Bounded per tab: each tab has a queue of :data:`TAB_BATCHES` batches. A tab that falls
that far behind is dropped (its stream ends); the browser reconnects by
``Last-Event-ID`` and catches up from the journal, while the other tabs and the session
never wait for it.
"""

from __future__ import annotations

import asyncio
import collections

from broker.net.runtime import RuntimeDir
from broker.web.link import Follower, Refused, Unavailable, event_range

KEEP_EVENTS = 4096
TAB_BATCHES = 64
# The most events one journal read asks for (the app's range limit).
RANGE_STEP = 5000


class Tab:
    """One browser stream of a hub: :meth:`next` returns the hub's items from its start on."""

    def __init__(self, hub: Hub, since: int) -> None:
        self.hub = hub
        self.since = since
        self.queue: asyncio.Queue = asyncio.Queue(TAB_BATCHES)
        self.dropped = False

    def offer(self, item) -> None:
        if self.dropped:
            return
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            # Too far behind: end this stream; the browser resumes from the journal.
            self.dropped = True
            self.queue = asyncio.Queue(1)
            self.queue.put_nowait(("unavailable", "this tab fell behind; resuming"))

    async def next(self):
        return await self.queue.get()

    def close(self) -> None:
        self.hub.leave(self)


class Hub:
    """One session's live events, attached once; see the module."""

    def __init__(self, runtime: RuntimeDir, session_id: str, since: int, hubs: dict) -> None:
        self.runtime = runtime
        self.session_id = session_id
        self.hubs = hubs
        self.start = since  # the first seq this hub's stream asked for
        self.kept: collections.deque = collections.deque()  # (first, last, data) batches
        self.kept_events = 0
        self.tabs: set[Tab] = set()
        self.info = None
        self.ready = asyncio.Event()
        self.ended = None  # the final ("gone" | "unavailable", reason) item
        self.follower = Follower(runtime, session_id, since)
        self.follower.start()
        self.task = asyncio.get_running_loop().create_task(self._pump())

    async def _pump(self) -> None:
        try:
            while True:
                item = await self.follower.next()
                kind = item[0]
                if kind == "attached":
                    self.info = item[1]
                    self.ready.set()
                elif kind == "events":
                    self.kept.append(item[1:])
                    self.kept_events += item[2] - item[1] + 1
                    while self.kept_events > KEEP_EVENTS and len(self.kept) > 1:
                        first, last, _ = self.kept.popleft()
                        self.kept_events -= last - first + 1
                    for tab in list(self.tabs):
                        tab.offer(item)
                else:
                    self.ended = item
                    self.ready.set()
                    for tab in list(self.tabs):
                        tab.offer(item)
                    return
        finally:
            self.follower.stop()
            if self.hubs.get(self.session_id) is self:
                del self.hubs[self.session_id]

    def join(self, since: int) -> tuple[Tab, list, int]:
        """A new tab from ``since`` on: (the tab, the kept batches it gets first, the first
        seq they or the live stream hold: what comes before it is read from the journal)."""
        tab = Tab(self, since)
        self.tabs.add(tab)
        kept = [batch for batch in self.kept if batch[1] >= since]
        covered = kept[0][0] if kept else (self.kept[-1][1] + 1 if self.kept else self.start)
        return tab, kept, covered

    def leave(self, tab: Tab) -> None:
        self.tabs.discard(tab)
        if not self.tabs and self.ended is None:
            self.follower.stop()
            self.task.cancel()
            if self.hubs.get(self.session_id) is self:
                del self.hubs[self.session_id]


async def follow(runtime: RuntimeDir, hubs: dict, session_id: str, since: int, idle: float):
    """The items a tab following ``session_id`` from ``since`` gets, in order: ``("attached",
    info)``, then ``("events", first, last, data)`` batches, and an ending item, as
    :class:`broker.web.link.Follower` gives them, from one attachment per session;
    ``("idle",)`` after ``idle`` seconds without any (for a keep-alive)."""
    hub = hubs.get(session_id)
    if hub is None or hub.ended is not None:
        hub = hubs[session_id] = Hub(runtime, session_id, since, hubs)
    await hub.ready.wait()
    if hub.info is None:
        yield hub.ended
        return
    tab, kept, covered = hub.join(since)
    try:
        yield ("attached", hub.info)
        first = max(1, since)
        while first < covered:  # from the journal: what the hub no longer keeps
            last = min(covered - 1, first + RANGE_STEP - 1)
            try:
                data = await asyncio.to_thread(event_range, runtime, session_id, first, last)
            except (Refused, Unavailable) as e:
                yield ("unavailable", str(e))
                return
            yield ("events", first, last, data)
            first = last + 1
        for batch in kept:
            yield ("events", *batch)
        while True:
            try:
                item = await asyncio.wait_for(tab.next(), idle)
            except TimeoutError:
                yield ("idle",)
                continue
            yield item
            if item[0] != "events":
                return
    finally:
        tab.close()
