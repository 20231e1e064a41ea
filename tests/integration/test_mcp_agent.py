"""MCP servers as the agent's tools, through ``sluice exec``, the real daemon and a scripted
model: servers start in the sandbox with the session, their tools are offered under
qualified names, calls emit ``mcp_tool_call_begin``/``_end`` and the model gets the result;
a server that cannot start is an error and the task goes on; a server cannot write outside
its roots; a crash fails one call and the next starts it again; an interrupt cancels the
call at the server; nothing is left running after the session.

The server is tests/support/fake_mcp_server.py, run by ``SANDBOX_PYTHON`` with its
source given in ``-c`` (a test checkout may live where the sandbox does not show it).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.integration.test_exec import Frontend
from tests.support.fake_model import assistant, call, outputs_of, response
from tests.support.frontends import json_events
from tests.support.harness import SANDBOX_PYTHON, daemons, reap, wait_for

pytestmark = pytest.mark.timeout(90)

SOURCE = (Path(__file__).resolve().parents[1] / "support" / "fake_mcp_server.py").read_text()
# On the servers' command lines, so that they can be found: this process's alone (the
# workers of a parallel run each have their own).
MARKER = f"sluice-fake-mcp-marker-{os.getpid()}"


def server_table(name: str = "fake", command: str = SANDBOX_PYTHON, **extra: str) -> str:
    lines = [f"[mcp_servers.{name}]", f'command = "{command}"',
             f"args = ['-c', '''{SOURCE}''', '{MARKER}']"]
    lines += [f"{key} = {value}" for key, value in extra.items()]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def dmn():
    with daemons() as factory:
        yield factory.start(executors=1)


def frontend(dmn, server, tmp_path, tables: str) -> Frontend:
    return Frontend(dmn.runtime, server, tmp_path / "fe-home", extra_config=tables)


def servers_running() -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if MARKER in (p.info["cmdline"] or []):
            found.append(p)
    return found


def kinds(stdout: str) -> list[str]:
    return [type(e.msg).__name__ for e in json_events(stdout)]


def test_tools_are_offered_and_called_and_the_model_gets_the_result(dmn, server, work, tmp_path):
    server.script(
        response(call("fake__add", {"a": 2, "b": 40}, "m1")),
        response(call("fake__fail", {}, "m2")),
        response(call("fake__echo", {"text": "hi"}, "m3")),
        response(call("fake__picture", {}, "m4")),
        response(assistant("done")),
    )
    fe = frontend(dmn, server, tmp_path, server_table())
    p = fe.run("--json", "--cd", str(work), "add them")
    assert p.returncode == 0, p.stderr
    tools = {t["name"]: t for t in server.requests[0]["json"]["tools"]}
    assert {"fake__echo", "fake__add", "fake__sleep", "fake__crash", "fake__write", "fake__fail"} <= set(tools)
    assert tools["fake__echo"]["parameters"]["required"] == ["text"]
    events = [e.msg for e in json_events(p.stdout)]
    begins = [e for e in events if type(e).__name__ == "McpToolCallBeginEvent"]
    ends = [e for e in events if type(e).__name__ == "McpToolCallEndEvent"]
    assert [(b.call_id, b.server, b.tool, b.arguments) for b in begins] == [
        ("m1", "fake", "add", {"a": 2, "b": 40}), ("m2", "fake", "fail", {}), ("m3", "fake", "echo", {"text": "hi"}),
        ("m4", "fake", "picture", {})]
    assert ends[0].success and ends[0].result.structured_content == {"sum": 42}
    assert not ends[1].success and ends[1].result.is_error
    # The model gets what Codex 0.169 gives it: the structured content when there is one,
    # else the JSON of the content array (the seed's shape), an error flag or not; an image
    # as input items.
    assert outputs_of(server.requests[1]["json"])["m1"] == '{"sum":42}'
    assert outputs_of(server.requests[2]["json"])["m2"] == '[{"type":"text","text":"it failed"}]'
    assert outputs_of(server.requests[3]["json"])["m3"] == '[{"type":"text","text":"hi"}]'
    text, image = outputs_of(server.requests[4]["json"])["m4"]
    assert text == {"type": "input_text", "text": "a dot"}
    assert image["type"] == "input_image" and image["image_url"].startswith("data:image/png;base64,iVBORw0KGgo")
    wait_for(lambda: not servers_running(), timeout=20, what="the session's MCP server to be stopped")


def test_a_server_that_cannot_start_is_reported_and_the_task_completes(dmn, server, work, tmp_path):
    server.script(response(call("fake__echo", {"text": "still here"}, "m1")), response(assistant("done")))
    tables = server_table() + server_table("broken", command="/nonexistent/mcp-server")
    p = frontend(dmn, server, tmp_path, tables).run("--cd", str(work), "go")
    assert p.returncode == 0, p.stderr
    assert "MCP client for `broken` failed to start" in p.stderr
    assert "still here" in outputs_of(server.requests[1]["json"])["m1"]
    assert not any(t["name"].startswith("broken__") for t in server.requests[0]["json"]["tools"])


def test_a_server_cannot_write_outside_its_roots_and_is_shown_what_it_was_granted(dmn, server, work, tmp_path):
    escaped = f"/var/tmp/sluice-mcp-escaped-{random.randint(0, 1 << 30)}"
    inside = work / "written.txt"
    server.script(
        response(call("fake__write", {"path": escaped, "text": "x"}, "m1")),
        response(call("fake__write", {"path": str(inside), "text": "ok"}, "m2")),
        response(assistant("done")),
    )
    granted = tmp_path / "granted"
    granted.mkdir()
    fe = frontend(dmn, server, tmp_path, server_table(writable_roots=f'["{granted}"]'))
    p = fe.run("--sandbox", "workspace-write", "--cd", str(work), "write")
    assert p.returncode == 0, p.stderr
    assert not Path(escaped).exists()
    assert "cannot write" in outputs_of(server.requests[1]["json"])["m1"]
    assert inside.read_text() == "ok"  # the session's workspace is the server's too
    assert f"MCP server fake runs with write access to {granted}" in p.stderr


def test_a_crash_fails_that_call_and_the_next_call_starts_the_server_again(dmn, server, work, tmp_path):
    server.script(
        response(call("fake__crash", {}, "m1")),
        response(call("fake__echo", {"text": "back again"}, "m2")),
        response(assistant("done")),
    )
    p = frontend(dmn, server, tmp_path, server_table()).run("--cd", str(work), "crash it")
    assert p.returncode == 0, p.stderr
    crashed = outputs_of(server.requests[1]["json"])["m1"]
    assert crashed.startswith('err: "tool call error: MCP server fake exited with status 3'), crashed
    assert "back again" in outputs_of(server.requests[2]["json"])["m2"]


def test_an_interrupt_cancels_the_call_at_the_server(dmn, server, work, tmp_path):
    server.script(response(call("fake__sleep", {"seconds": 60}, "m1")))
    fe = frontend(dmn, server, tmp_path, server_table())
    # The daemon's log is the module's: what earlier tests' servers said is in it too.
    calls, cancels = dmn.log().count("call 6"), dmn.log().count("cancelled 6")
    proc = subprocess.Popen(fe.argv("--json", "--cd", str(work), "sleep"), env=fe.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "mcp_tool_call_begin" in line:
                break
        else:
            raise AssertionError(f"no mcp_tool_call_begin: {seen} {proc.stderr.read()}")
        wait_for(lambda: dmn.log().count("call 6") > calls, timeout=20, what="the call to reach the server")
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        reap(proc)
    assert time.monotonic() - started < 10
    assert "McpToolCallEndEvent" in kinds("".join(seen) + out)
    wait_for(lambda: dmn.log().count("cancelled 6") > cancels, timeout=20, what="the server to be told the call is cancelled")
    wait_for(lambda: not servers_running(), timeout=20, what="the session's MCP server to be stopped")
