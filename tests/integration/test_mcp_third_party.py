"""Part A against servers no one here wrote, through ``sluice exec``, the daemon and a
scripted model: the reference ``server-everything`` (npm) and ``mcp-server-time`` (PyPI).
Both run in the sandbox like any server. Skipped, with the reason, only when a server
cannot be installed (no node or npm, or the registry unreachable) or is installed where
the sandbox cannot see it (a cache under a ``HOME`` in /tmp); CI installs both."""

from __future__ import annotations

import contextlib
import json
import shutil
import time

import psutil
import pytest

from tests.integration.test_exec import Frontend
from tests.support.fake_model import assistant, call, outputs_of, response
from tests.support.frontends import json_events
from tests.support.harness import daemons, reap, wait_for
from tests.support.mcp_servers import everything_entry, everything_table, time_server, time_table, unseen_in_sandbox

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def dmn():
    with daemons() as factory:
        yield factory.start(executors=1)


@pytest.fixture(scope="module")
def everything():
    entry, why = everything_entry()
    why = why or unseen_in_sandbox([shutil.which("node"), entry])
    if why:
        pytest.skip(why)
    return entry


def ends(stdout: str) -> dict:
    return {e.msg.call_id: e.msg for e in json_events(stdout) if type(e.msg).__name__ == "McpToolCallEndEvent"}


def test_server_everything_tools_text_structured_and_image_content(dmn, server, work, tmp_path, everything):
    server.script(
        response(call("everything__echo", {"message": "hello from sluice"}, "m1"),
                 call("everything__get-sum", {"a": 2, "b": 40}, "m2")),
        response(call("everything__get-structured-content", {"location": "New York"}, "m3"),
                 call("everything__get-tiny-image", {}, "m4")),
        response(call("everything__get-env", {}, "m5")),
        response(assistant("done")),
    )
    fe = Frontend(dmn.runtime, server, tmp_path / "home", extra_config=everything_table())
    p = fe.run("--json", "--cd", str(work), "use the tools", timeout=120)
    assert p.returncode == 0, p.stderr
    tools = {t["name"]: t for t in server.requests[0]["json"]["tools"]}
    assert {"everything__echo", "everything__get-sum", "everything__trigger-long-running-operation"} <= set(tools), \
        p.stdout[-2000:]
    assert tools["everything__get-sum"]["parameters"]["type"] == "object"
    out = {**outputs_of(server.requests[1]["json"]), **outputs_of(server.requests[2]["json"]),
           **outputs_of(server.requests[3]["json"])}
    # What the model gets is what Codex 0.169 gives it: the content array's JSON, the
    # structured content when there is one, an image as input items.
    assert "hello from sluice" in json.loads(out["m1"])[0]["text"]
    assert "42" in json.loads(out["m2"])[0]["text"]
    events = ends(p.stdout)
    assert events["m3"].result.structured_content is not None
    assert json.loads(out["m3"]) == events["m3"].result.structured_content
    assert any(item["type"] == "input_image" and item["image_url"].startswith("data:image/") for item in out["m4"]), \
        out["m4"]
    # Its environment is the session's commands', secrets filtered: the model's key is not in it.
    assert "FAKE_KEY" not in out["m5"] and "sk-exec-test" not in out["m5"]
    assert all(events[c].success for c in ("m1", "m2", "m3", "m4")), events


def test_server_everything_a_timeout_a_kill_and_the_restart(dmn, server, work, tmp_path, everything):
    server.script(
        response(call("everything__trigger-long-running-operation", {"duration": 30, "steps": 3}, "m1")),
        response(call("everything__echo", {"message": "after the timeout"}, "m2")),
        response(assistant("done")),
    )
    fe = Frontend(dmn.runtime, server, tmp_path / "home", extra_config=everything_table(tool_timeout_sec="1"))
    started = time.monotonic()
    p = fe.run("--json", "--cd", str(work), "take long", timeout=120)
    assert p.returncode == 0, p.stderr
    assert time.monotonic() - started < 30
    timed_out = outputs_of(server.requests[1]["json"])["m1"]
    assert "did not answer tools/call within 1 s" in timed_out, timed_out
    assert "after the timeout" in outputs_of(server.requests[2]["json"])["m2"]  # the same server serves on

    # Killed mid-call: that call fails, the next one starts it again.
    server.requests.clear()
    server.script(
        response(call("everything__trigger-long-running-operation", {"duration": 60, "steps": 3}, "k1")),
        response(call("everything__echo", {"message": "restarted"}, "k2")),
        response(assistant("done")),
    )
    fe = Frontend(dmn.runtime, server, tmp_path / "home2", extra_config=everything_table())
    proc = fe.popen("--json", "--cd", str(work), "kill it")
    try:
        for line in proc.stdout:  # the call is on its way once its begin event is out
            if b"mcp_tool_call_begin" in line:
                break
        for victim in _servers(dmn, everything):  # the fault: the server dies under the call
            victim.kill()
        out, err = proc.communicate(timeout=120)
    finally:
        reap(proc)
    assert proc.returncode == 0, err
    killed = outputs_of(server.requests[1]["json"])["k1"]
    assert 'err: "tool call error: MCP server everything' in killed and "signal 9" in killed, killed
    assert "restarted" in outputs_of(server.requests[2]["json"])["k2"]
    wait_for(lambda: not _servers(dmn, everything), timeout=20, what="the servers to be stopped")


def test_mcp_server_time(dmn, server, work, tmp_path):
    found, why = time_server()
    why = why or unseen_in_sandbox([found[0], found[2]["PYTHONPATH"]])
    if why:
        pytest.skip(why)
    server.script(
        response(call("time__convert_time", {"source_timezone": "Europe/Paris", "time": "12:00",
                                             "target_timezone": "Asia/Tokyo"}, "t1")),
        response(assistant("done")),
    )
    fe = Frontend(dmn.runtime, server, tmp_path / "home", extra_config=time_table())
    p = fe.run("--json", "--cd", str(work), "what time", timeout=120)
    assert p.returncode == 0, p.stderr
    names = {t["name"] for t in server.requests[0]["json"]["tools"]}
    assert {"time__get_current_time", "time__convert_time"} <= names, p.stdout[-2000:]
    # Its structured content, when its version gives one, else its content array, as JSON.
    told = json.loads(outputs_of(server.requests[1]["json"])["t1"])
    text = json.dumps(told) if isinstance(told, dict) else told[0]["text"]
    assert "+09:00" in text and "Asia/Tokyo" in text


def _servers(dmn, entry: str) -> list[psutil.Process]:
    """The servers running ``entry`` for ``dmn``: its descendants alone (a parallel run's other
    workers run the same cached server for their own daemons)."""
    found = []
    for p in dmn.descendants():
        with contextlib.suppress(psutil.Error):
            if entry in p.cmdline() and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
    return found
