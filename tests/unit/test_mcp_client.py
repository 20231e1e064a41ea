"""The MCP client against what a bad server sends (agent/mcp/client.py), with a transport
of our own: junk gets the server stopped with one line naming it, a line over the limit
is dropped and the stream goes on, and reading a flood yields to the loop, within its
budget, holding the server's output while lines wait."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

import agent.mcp.client as mcp_client
from agent.mcp.client import ENDLESS_LINE_BYTES, MAX_BAD_LINES, McpClient, McpError
from broker.wire.mcp import MAX_LINE_BYTES

pytestmark = pytest.mark.timeout(60)

NOTE = (json.dumps({"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "x" * 100}}) + "\n").encode()


class Transport:
    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.holds: list[bool] = []

    async def write(self, data: bytes) -> None:
        self.sent.append(json.loads(data))

    def hold_output(self, held: bool) -> None:
        self.holds.append(held)


def answer(request_id: int, result: object) -> bytes:
    return (json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}) + "\n").encode()


async def drained(client: McpClient) -> None:
    while client._lines_end:  # noqa: SLF001 - what is left to read
        await asyncio.sleep(0)


def test_junk_from_the_first_byte_stops_the_server_with_one_line_naming_it() -> None:
    async def main():
        transport = Transport()
        client = McpClient("junk", transport)
        faults: list[str] = []
        client.on_fault = faults.append
        request = asyncio.ensure_future(client.request("initialize", {}, timeout=30))
        await asyncio.sleep(0)
        client.feed(b"not json\n" * (MAX_BAD_LINES - 1))
        await drained(client)
        assert client.gone is None  # 99 bad lines: still given a chance
        client.feed(b"[1]\n" + b"more junk\n" * 10_000)
        with pytest.raises(McpError) as caught:
            await request
        why = (f"sent {MAX_BAD_LINES} lines in a row that are not MCP messages (the last: a message that is "
               "not an object); it was stopped")
        assert str(caught.value) == f"MCP server junk {why}"
        assert faults == [why] and client.gone == why
        client.feed(b"junk\n" * 1000)  # ignored from now on

    asyncio.run(main())


def test_a_good_message_between_bad_lines_keeps_the_server() -> None:
    async def main():
        client = McpClient("sloppy", Transport())
        for _ in range(5):
            client.feed(b"banner\n" * (MAX_BAD_LINES - 1) + NOTE)
        await drained(client)
        assert client.gone is None

    asyncio.run(main())


def test_a_line_over_the_limit_is_dropped_and_the_stream_goes_on() -> None:
    async def main():
        client = McpClient("big", Transport())
        request = asyncio.ensure_future(client.request("tools/list", {}, timeout=30))
        await asyncio.sleep(0)
        piece = b"y" * (1 << 20)
        for _ in range((MAX_LINE_BYTES >> 20) + 2):  # an endless line, in pieces
            client.feed(piece)
        assert len(client._buffer) <= MAX_LINE_BYTES  # noqa: SLF001 - not kept past the limit
        client.feed(piece + b"\n" + answer(1, {"tools": []}))
        assert await request == {"tools": []}
        assert client.gone is None

    asyncio.run(main())


def test_a_line_that_never_ends_stops_the_server() -> None:
    async def main():
        client = McpClient("endless", Transport())
        faults: list[str] = []
        client.on_fault = faults.append
        piece = b"z" * (1 << 20)
        fed = 0
        while client.gone is None:
            client.feed(piece)
            fed += len(piece)
        assert fed == ENDLESS_LINE_BYTES + (1 << 20)  # the first piece past 64 MiB
        assert faults == ["sent a line that does not end (over 64 MiB); it was stopped"]

    asyncio.run(main())


def test_a_flood_is_read_in_slices_that_yield_to_the_loop_and_hold_the_server() -> None:
    async def main():
        transport = Transport()
        client = McpClient("chatty", transport)
        request = asyncio.ensure_future(client.request("tools/list", {}, timeout=60))
        await asyncio.sleep(0)
        flood = NOTE * (4 * mcp_client.BACKLOG_BYTES // len(NOTE))
        client.feed(flood + answer(1, {"tools": []}))  # kept, not read here
        assert client._lines_end == len(flood) + len(answer(1, {"tools": []}))  # noqa: SLF001
        assert transport.holds == [True]  # past the backlog: the server's output is held
        ticks = 0
        while not request.done():
            ticks += 1  # another session's work, between the slices
            await asyncio.sleep(0)
        assert await request == {"tools": []}
        assert transport.holds == [True, False]
        # A slice reads for at most 2 ms: 4 MiB of notifications take many.
        assert ticks > 10

    asyncio.run(main())


@pytest.mark.alone  # each line "costs 1 ms" by sleeping: beside a loaded run a sleep took 10 ms more
def test_reading_stays_within_its_budget_per_second(monkeypatch) -> None:
    monkeypatch.setattr(mcp_client, "BUDGET_S", 0.01)

    async def main():
        client = McpClient("chatty", Transport())
        client.on_notification = lambda method, params: time.sleep(0.001)  # each line costs 1 ms
        loop = asyncio.get_running_loop()
        client.feed(NOTE * 15)
        started = loop.time()
        while client._lines_end:  # noqa: SLF001
            await asyncio.sleep(0)
            # Over by the line that crossed it, at most.
            assert client._second_spent < mcp_client.BUDGET_S + 0.01  # noqa: SLF001
        return loop.time() - started

    # 15 ms of reading at 10 ms a second: it goes on into the next second.
    assert asyncio.run(main()) >= 0.9
