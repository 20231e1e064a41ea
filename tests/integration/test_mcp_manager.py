"""The MCP client and manager against a real server process (tests/support/fake_mcp_server.py),
started by a plain local launcher: the handshake, paginated tools, calls, timeouts,
cancellation, a crash mid-call and the restart after it, servers that fail to start, the
start-up budget counted from the server's start (a slow launch is not the server's)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path

import pytest

from agent.mcp import manager as manager_module
from agent.mcp.manager import McpManager
from broker.wire.protocol import McpServerConfig
from tests.support.harness import await_for
from tests.support.mcp_servers import LocalProcess
from tests.support.mcp_servers import local_launcher as launcher

pytestmark = pytest.mark.timeout(60)

SERVER = str(Path(__file__).resolve().parents[1] / "support" / "fake_mcp_server.py")


def server(name: str = "fake", **kw) -> McpServerConfig:
    return McpServerConfig(name=name, command=sys.executable, args=[SERVER], **kw)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 50))


def test_tools_are_listed_across_pages_and_called():
    async def main():
        started: list[LocalProcess] = []
        manager = McpManager([server()], launcher(started))
        assert await manager.start() == []
        assert sorted(manager.tools) == ["fake__add", "fake__crash", "fake__echo", "fake__fail", "fake__junk",
                                         "fake__picture", "fake__sleep", "fake__write"]
        assert manager.tools["fake__write"].parameters["type"] == "object"  # inferred from its properties
        assert manager.tools["fake__fail"].parameters == {"type": "object", "properties": {}}  # `true` as a schema
        # The model gets what Codex gives it: the structured content when there is one,
        # else the content array's JSON (the seed's shape), images as input items.
        outcome = await manager.call("fake__add", {"a": 2, "b": 40})
        assert outcome.success and outcome.result["structuredContent"] == {"sum": 42}
        assert outcome.output == '{"sum":42}'
        outcome = await manager.call("fake__echo", {"text": "hi"})
        assert outcome.success and outcome.output == '[{"type":"text","text":"hi"}]'
        outcome = await manager.call("fake__fail", {})
        assert not outcome.success and outcome.output == '[{"type":"text","text":"it failed"}]'
        outcome = await manager.call("fake__picture", {})
        assert outcome.success and outcome.output == [
            {"type": "input_text", "text": "a dot"},
            {"type": "input_image", "image_url": "data:image/png;base64," + outcome.result["content"][1]["data"]}]
        await manager.aclose()
        assert all(p.proc.returncode is not None for p in started)
    run(main())


def test_closing_cancels_a_call_in_flight_and_the_server_reads_it_and_exits_by_itself():
    """As the MCP spec has a client end a stdio server: its stdin closed first (after the
    cancellation), killed only if it is still there a second later."""
    async def main():
        started: list[LocalProcess] = []
        manager = McpManager([server()], launcher(started))
        assert await manager.start() == []
        call = asyncio.ensure_future(manager.call("fake__sleep", {"seconds": 30}))
        await await_for(lambda: b"call 6" in started[0].stderr)
        call.cancel()  # an interrupt: the server is sent the cancellation
        with contextlib.suppress(asyncio.CancelledError):
            await call
        await manager.aclose()  # at once: the session ends
        assert b"cancelled 6" in started[0].stderr
        assert started[0].proc.returncode == 0  # it exited at end of file; nothing killed it
    run(main())


def test_a_timeout_cancels_the_request_and_so_does_cancelling_the_call():
    async def main():
        started: list[LocalProcess] = []
        manager = McpManager([server(tool_timeout_s=0.3)], launcher(started))
        assert await manager.start() == []
        outcome = await manager.call("fake__sleep", {"seconds": 30})
        assert not outcome.success and outcome.output == (
            'err: "tool call error: MCP server fake did not answer tools/call within 0.3 s"')
        await await_for(lambda: b"cancelled 6" in started[0].stderr)  # initialize 1, four pages 2-5, the call 6
        # The server goes on serving.
        assert (await manager.call("fake__echo", {"text": "again"})).success and len(started) == 1
        task = asyncio.ensure_future(manager.call("fake__sleep", {"seconds": 30}))
        await await_for(lambda: b"call 8" in started[0].stderr)  # in flight at the server
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await await_for(lambda: b"cancelled 8" in started[0].stderr)
        await manager.aclose()
    run(main())


def test_a_server_that_crashes_mid_call_fails_that_call_and_is_restarted():
    async def main():
        started: list[LocalProcess] = []
        manager = McpManager([server()], launcher(started))
        assert await manager.start() == []
        outcome = await manager.call("fake__crash", {})
        assert not outcome.success and "MCP server fake exited with status 3" in outcome.output
        outcome = await manager.call("fake__echo", {"text": "back"})
        assert outcome.success and '"text":"back"' in outcome.output
        assert len(started) == 2
        await manager.aclose()
    run(main())


def test_a_server_that_turns_to_junk_mid_call_is_stopped_at_once_and_started_again_for_the_next():
    async def main():
        started: list[LocalProcess] = []
        manager = McpManager([server()], launcher(started))
        assert await manager.start() == []
        outcome = await manager.call("fake__junk", {})
        assert not outcome.success
        assert outcome.output == ('err: "tool call error: MCP server fake sent 100 lines in a row that are not MCP '
                                  'messages (the last: a line that is not JSON); it was stopped"')
        await await_for(lambda: started[0].proc.returncode is not None)  # stopped now, not at the next call
        outcome = await manager.call("fake__echo", {"text": "back"})
        assert outcome.success and len(started) == 2
        await manager.aclose()
    run(main())


def test_servers_that_cannot_start_are_reported_and_the_others_serve():
    async def main():
        started: list[LocalProcess] = []
        servers = [
            server("good"),
            McpServerConfig(name="missing", command="/nonexistent/mcp-server"),
            server("silent", env={"FAKE_MCP_SILENT": "1"}, startup_timeout_s=0.5),
            server("old", env={"FAKE_MCP_VERSION": "1999-01-01"}),
        ]
        manager = McpManager(servers, launcher(started))
        errors = await manager.start()
        assert len(errors) == 3, errors
        assert any(e.startswith("MCP client for `missing` failed to start:") for e in errors)
        assert any("`silent`" in e and "did not finish starting within 0.5 s" in e for e in errors)
        assert any("`old`" in e and "protocol version '1999-01-01'" in e for e in errors)
        assert {t.server for t in manager.tools.values()} == {"good"}
        await manager.aclose()
        assert all(p.proc.returncode is not None for p in started)
    run(main())


def test_the_start_up_budget_counts_from_the_servers_start_not_its_launch():
    # Under load, an executor taking the server and its sandbox being set up can take
    # longer than the whole budget: that is the launch's, and the server keeps its budget.
    budget = 5.0

    async def main():
        started: list[LocalProcess] = []
        first = launcher(started)

        async def slow_launch(config, streams):
            await asyncio.sleep(budget + 1)  # the deliberately slow launch
            return await first(config, streams)

        manager = McpManager([server(startup_timeout_s=budget)], slow_launch)
        assert await manager.start() == []
        assert (await manager.call("fake__echo", {"text": "up"})).output == '[{"type":"text","text":"up"}]'
        await manager.aclose()
    run(main())


def test_a_launch_that_never_ends_is_given_up(monkeypatch):
    monkeypatch.setattr(manager_module, "LAUNCH_TIMEOUT_S", 0.2)

    async def main():
        async def stuck(config, streams):
            await asyncio.Event().wait()

        manager = McpManager([server()], stuck)
        assert await manager.start() == ["MCP client for `fake` failed to start: MCP server fake could not be "
                                         "launched within 0.2 s"]
        assert manager.tools == {}
        await manager.aclose()
    run(main())


def test_a_server_that_cannot_be_started_again_fails_the_call_not_the_turn():
    async def main():
        started: list[LocalProcess] = []
        first = launcher(started)

        async def once_then_broken(config, streams):
            if started:
                raise RuntimeError("no executor can take it")
            return await first(config, streams)

        manager = McpManager([server()], once_then_broken)
        assert await manager.start() == []
        assert not (await manager.call("fake__crash", {})).success
        outcome = await manager.call("fake__echo", {"text": "x"})
        assert not outcome.success and "could not be started again: no executor can take it" in outcome.output
        await manager.aclose()
    run(main())
