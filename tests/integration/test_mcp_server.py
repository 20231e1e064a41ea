"""``sluice mcp``: sluice as an MCP server, driven by clients we did not write.

The official MCP Python SDK's client (``mcp`` on PyPI) starts ``sluice mcp`` on pipes and
calls its tools against a real daemon, sandbox and processes; the raw protocol tests
write JSON-RPC lines by hand (garbage, unknown methods, bad params, cancellation) and
check each gets its one answer while the server goes on.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import time
import uuid

import psutil
import pytest

from tests.support.harness import short_tempdir, wait_for

anyio = pytest.importorskip("anyio")

pytestmark = pytest.mark.timeout(90)

TOOLS = {"run", "session_start", "session_write", "session_read", "session_close"}


@pytest.fixture
def workspace() -> str:
    path = short_tempdir("sl-mcp-ws-")
    os.mkdir(os.path.join(path, "sub"))
    return path


def sdk():
    """The MCP SDK, imported by the tests that drive its client, not as the module is
    collected (it takes a second and a half, on every worker of a parallel run); skips
    without it."""
    pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install '.[test]')")
    import mcp.client.stdio

    return mcp


def _params(sluice, daemon, workspace, flags=()):
    return sdk().StdioServerParameters(command=sluice[0], args=[*sluice[1:], "mcp", "--cwd", workspace, *flags],
                                       env=daemon.env_for_children(), cwd=workspace)


@contextlib.asynccontextmanager
async def connected(sluice, daemon, workspace, flags=()):
    mcp = sdk()
    async with mcp.client.stdio.stdio_client(_params(sluice, daemon, workspace, flags)) as (read, write):
        async with mcp.ClientSession(read, write) as session:
            await session.initialize()
            yield session


def _marked(marker: str) -> list[psutil.Process]:
    """Live processes whose command line mentions ``marker``."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        with contextlib.suppress(psutil.Error):
            if any(marker in a for a in (p.info["cmdline"] or ())) and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(p)
    return found


def _text(result) -> str:
    return "".join(c.text for c in result.content if c.type == "text")


# -- through the SDK's client ---------------------------------------------------------


def test_initialize_and_tools_list_with_valid_schemas(sluice, module_daemon, workspace) -> None:
    from jsonschema.validators import validator_for

    async def main():
        async with connected(sluice, module_daemon, workspace) as session:
            info = session.initialize_result
            assert info.server_info.name == "sluice"
            assert info.protocol_version == "2025-11-25"
            assert info.capabilities.tools is not None
            assert workspace in info.instructions
            tools = (await session.list_tools()).tools
            assert {t.name for t in tools} == TOOLS
            for tool in tools:
                for schema in (tool.input_schema, tool.output_schema):
                    assert schema and schema["type"] == "object"
                    validator_for(schema).check_schema(schema)
                assert tool.description
            await session.send_ping()

    anyio.run(main)


def test_run_echo_a_shell_line_and_a_failing_command(sluice, module_daemon, workspace) -> None:
    async def main():
        async with connected(sluice, module_daemon, workspace) as session:
            r = await session.call_tool("run", {"argv": ["echo", "hello", "world"]})
            assert not r.is_error, _text(r)
            assert r.structured_content["exit_code"] == 0
            assert r.structured_content["stdout"] == "hello world\n"
            assert r.structured_content["stdout_truncated"] is False
            assert "exit code 0" in _text(r) and "hello world" in _text(r)

            r = await session.call_tool("run", {"command": "echo $((6 * 7)); pwd", "cwd": "sub"})
            assert r.structured_content["stdout"] == f"42\n{workspace}/sub\n"

            r = await session.call_tool("run", {"command": "echo oops >&2; exit 3"})
            assert not r.is_error  # it ran: the exit code is the answer
            assert r.structured_content["exit_code"] == 3
            assert r.structured_content["stderr"].endswith("oops\n")

            r = await session.call_tool("run", {"argv": ["sh", "-c", "kill -9 $$"]})
            assert r.structured_content["signal"] == 9 and r.structured_content["exit_code"] is None

            r = await session.call_tool("run", {"argv": ["sleep", "5"], "timeout_s": 0.3})
            assert r.structured_content["timed_out"] is True and "timed out" in _text(r)

            r = await session.call_tool("run", {"command": "head -c 200000 /dev/zero | tr '\\0' x"})
            out = r.structured_content
            assert out["stdout_bytes"] == 200000 and out["stdout_truncated"] is True
            assert "bytes left out" in out["stdout"] and len(out["stdout"]) < 40000

    anyio.run(main)


def test_tool_errors_are_results_with_one_line(sluice, module_daemon, workspace, outside) -> None:
    os.symlink(outside, os.path.join(workspace, "link"))

    async def main():
        async with connected(sluice, module_daemon, workspace) as session:
            cases = [
                ({"argv": ["no-such-command-sluice-mcp"]}, "command not found: no-such-command-sluice-mcp"),
                ({"argv": "echo hi"}, "`argv` must be a non-empty list of strings"),
                ({}, "give exactly one of `command`"),
                ({"command": "true", "argv": ["true"]}, "give exactly one of `command`"),
                ({"command": "true", "cwd": outside}, f"cwd {outside} is outside the workspace {workspace}"),
                ({"command": "true", "cwd": "../"}, "is outside the workspace"),
                ({"command": "true", "cwd": "missing"}, "cwd missing is not a directory in the workspace"),
                ({"command": "true", "cwd": "link"}, f"cwd link is outside the workspace {workspace}"),
                ({"command": "true", "timeout_s": -1}, "`timeout_s` must be a number"),
            ]
            for arguments, expected in cases:
                r = await session.call_tool("run", arguments)
                assert r.is_error, arguments
                text = _text(r)
                assert expected in text and "\n" not in text, (arguments, text)
            r = await session.call_tool("session_read", {"session_id": "nope"})
            assert r.is_error and "no session nope" in _text(r)

    anyio.run(main)


def test_the_sandbox_holds_whatever_the_arguments_say(sluice, module_daemon, workspace, outside) -> None:
    victim = os.path.join(outside, "victim")

    async def main():
        async with connected(sluice, module_daemon, workspace) as session:
            r = await session.call_tool("run", {"command": "echo made > inside.txt && cat inside.txt"})
            assert r.structured_content["exit_code"] == 0, _text(r)
            with open(os.path.join(workspace, "inside.txt")) as f:
                assert f.read() == "made\n"
            # Arguments the tool does not know are no way to a wider sandbox.
            r = await session.call_tool("run", {"argv": ["sh", "-c", f"echo pwned > {victim}"],
                                                "sandbox": "danger-full-access", "writable": [outside],
                                                "sandbox_permissions": "require_escalated"})
            assert r.structured_content["exit_code"] != 0
            assert "Read-only file system" in r.structured_content["stderr"] or \
                "Permission denied" in r.structured_content["stderr"]
            r = await session.call_tool("session_start", {"argv": ["sh", "-c", f"echo pwned > {victim}; echo rc=$?"],
                                                          "yield_ms": 5000})
            assert "rc=" in _text(r) and "rc=0" not in _text(r)

    anyio.run(main)
    with open(victim) as f:
        assert f.read() == "original\n"


def test_read_only_flag_is_the_policy(sluice, module_daemon, workspace) -> None:
    async def main():
        async with connected(sluice, module_daemon, workspace, ["--sandbox", "read-only"]) as session:
            assert "read-only" in session.initialize_result.instructions
            r = await session.call_tool("run", {"command": "echo x > file.txt"})
            assert r.structured_content["exit_code"] != 0

    anyio.run(main)
    assert not os.path.exists(os.path.join(workspace, "file.txt"))


def test_config_toml_sets_the_policy_and_the_flags_override_it(sluice, module_daemon, workspace) -> None:
    home, extra = short_tempdir("sl-mcp-home-"), short_tempdir("sl-mcp-extra-")
    config = os.path.join(home, "config.toml")

    async def write_both(flags=()):
        params = _params(sluice, module_daemon, workspace, flags)
        params.env["SLUICE_HOME"] = home
        mcp = sdk()
        async with mcp.client.stdio.stdio_client(params) as (read, write), mcp.ClientSession(read, write) as session:
            await session.initialize()
            r = await session.call_tool("run", {"command": f"echo a > {workspace}/w.txt; echo b > {extra}/x.txt"})
            return session.initialize_result.instructions, r.structured_content

    def outcome(flags=()):
        for path in (f"{workspace}/w.txt", f"{extra}/x.txt"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        instructions, _ = anyio.run(write_both, flags)
        return instructions, os.path.exists(f"{workspace}/w.txt"), os.path.exists(f"{extra}/x.txt")

    with open(config, "w") as f:
        f.write(f'[sandbox_workspace_write]\nwritable_roots = ["{extra}"]\n')
    instructions, ws, ex = outcome()
    assert (ws, ex) == (True, True) and extra in instructions
    with open(config, "w") as f:
        f.write(f'sandbox_mode = "read-only"\n[sandbox_workspace_write]\nwritable_roots = ["{extra}"]\n')
    instructions, ws, ex = outcome()
    assert (ws, ex) == (False, False) and "read-only" in instructions
    assert outcome(["--sandbox", "workspace-write"])[1:] == (True, True)


def test_progress_notifications_carry_output_while_it_runs(sluice, module_daemon, workspace) -> None:
    async def main():
        seen: list[tuple[float, str]] = []
        done: list[float] = []

        async def progress(value, total, message):
            seen.append((value, message or ""))

        async with connected(sluice, module_daemon, workspace) as session:
            script = "for i in 1 2 3 4; do echo line$i; sleep 0.3; done"
            r = await session.call_tool("run", {"argv": ["sh", "-c", script]}, progress_callback=progress)
            done.append(len(seen))
            assert r.structured_content["stdout"] == "line1\nline2\nline3\nline4\n"
        assert done[0] >= 3, seen
        text = "".join(m for _, m in seen)
        assert text == "line1\nline2\nline3\nline4\n"
        values = [v for v, _ in seen]
        assert values == sorted(set(values))  # strictly increasing, as the spec wants

    anyio.run(main)


def test_cancellation_kills_the_whole_tree(sluice, module_daemon, workspace) -> None:
    marker = f"7{uuid.uuid4().int % 10**6}.5"
    script = f"sleep {marker} & sh -c 'sleep {marker}' & echo started; wait"

    async def main():
        async with connected(sluice, module_daemon, workspace) as session:
            started = anyio.Event()

            async def progress(value, total, message):
                if "started" in (message or ""):
                    started.set()

            outcome = []
            async with anyio.create_task_group() as tg:
                async def call():
                    with anyio.CancelScope() as scope:
                        tg_scope.append(scope)
                        outcome.append(await session.call_tool("run", {"argv": ["sh", "-c", script]},
                                                               progress_callback=progress))
                tg_scope: list = []
                tg.start_soon(call)
                with anyio.fail_after(20):
                    await started.wait()
                await anyio.to_thread.run_sync(lambda: wait_for(lambda: len(_marked(marker)) >= 2, 10, "the sleeps"))
                tg_scope[0].cancel()  # the SDK sends notifications/cancelled
            assert outcome == []
            await anyio.to_thread.run_sync(lambda: wait_for(lambda: not _marked(marker), 10, "the tree to die"))
            # The server goes on.
            r = await session.call_tool("run", {"argv": ["echo", "after"]})
            assert r.structured_content["stdout"] == "after\n"

    anyio.run(main)


def test_a_long_run_blocks_neither_ping_nor_list_nor_another_run(sluice, module_daemon, workspace) -> None:
    async def main():
        async with connected(sluice, module_daemon, workspace) as session:
            finished = anyio.Event()

            async with anyio.create_task_group() as tg:
                async def slow():
                    await session.call_tool("run", {"argv": ["sleep", "3"]})
                    finished.set()

                tg.start_soon(slow)
                with anyio.fail_after(2.5):
                    await session.send_ping()
                    await session.list_tools()
                    r = await session.call_tool("run", {"argv": ["echo", "quick"]})
                assert r.structured_content["stdout"] == "quick\n"
                assert not finished.is_set()

    anyio.run(main)


def test_a_session_over_several_writes(sluice, module_daemon, workspace) -> None:
    marker = f"mcp-session-{uuid.uuid4().hex[:8]}"

    async def main():
        async with connected(sluice, module_daemon, workspace) as session:
            r = await session.call_tool("session_start", {"argv": ["python3", "-i", "-u", "-q", "-c", f"m = '{marker}'"]})
            assert not r.is_error, _text(r)
            sid = r.structured_content["session_id"]
            assert r.structured_content["running"] is True
            r = await session.call_tool("session_write", {"session_id": sid, "text": "x = 41\n"})
            assert not r.is_error
            r = await session.call_tool("session_write", {"session_id": sid, "text": "print(x + 1, m)\n",
                                                          "yield_ms": 10000})
            assert f"42 {marker}" in r.structured_content["output"], r.structured_content
            assert _marked(marker)
            r = await session.call_tool("session_write", {"session_id": sid, "text": "import sys; sys.exit(7)\n",
                                                          "yield_ms": 10000})
            out = r.structured_content
            if out["running"]:
                out = (await session.call_tool("session_read", {"session_id": sid, "yield_ms": 10000})).structured_content
            assert out["running"] is False and out["exit_code"] == 7

            # A shell keeps its variables between writes; session_close kills it.
            r = await session.call_tool("session_start", {"argv": ["bash", "--norc", "--noprofile", "-i"],
                                                          "yield_ms": 0})
            sid = r.structured_content["session_id"]
            await session.call_tool("session_write", {"session_id": sid, "text": "V=carried; sleep 0.2\n"})
            r = await session.call_tool("session_write", {"session_id": sid, "text": "echo $V-over\n",
                                                          "yield_ms": 10000})
            assert "carried-over" in r.structured_content["output"], r.structured_content
            r = await session.call_tool("session_close", {"session_id": sid})
            assert r.structured_content["running"] is False
            r = await session.call_tool("session_read", {"session_id": sid})
            assert r.is_error

    anyio.run(main)
    wait_for(lambda: not _marked(marker), 10, "the session's process to be gone")


def test_a_session_keeps_its_last_output_and_says_what_it_lost(sluice, module_daemon, workspace) -> None:
    marker = f"mcp-lost-{uuid.uuid4().hex[:8]}"
    size = 300_000
    script = f"cat >/dev/null; head -c {size} /dev/zero | tr '\\0' x; echo; echo END # {marker}"

    async def main():
        async with connected(sluice, module_daemon, workspace) as session:
            r = await session.call_tool("session_start", {"argv": ["sh", "-c", script], "yield_ms": 0})
            sid = r.structured_content["session_id"]
            outputs, dropped, notes = [], 0, []
            r = await session.call_tool("session_write", {"session_id": sid, "text": "", "close_stdin": True,
                                                          "yield_ms": 10000})
            await anyio.to_thread.run_sync(lambda: wait_for(lambda: not _marked(marker), 10, "the command's end"))
            while True:
                out = r.structured_content
                outputs.append(out["output"])
                dropped += out["dropped_bytes"]
                if out["dropped_bytes"]:
                    notes.append(_text(r).splitlines()[0])
                if not out["running"] and not out["more"]:
                    break
                r = await session.call_tool("session_read", {"session_id": sid, "yield_ms": 10000})
            text = "".join(outputs)
            assert text.endswith("\nEND\n") and out["exit_code"] == 0
            assert dropped > 0 and dropped + len(text) == size + len("\nEND\n")
            assert notes and all("bytes of output were lost before they were read" in n for n in notes)

    anyio.run(main)


def test_sessions_are_capped_and_die_with_the_server(sluice, module_daemon, workspace) -> None:
    marker = f"mcp-eof-{uuid.uuid4().hex[:8]}"

    async def main():
        async with connected(sluice, module_daemon, workspace) as session:
            for i in range(16):
                r = await session.call_tool("session_start", {"argv": ["sh", "-c", f"cat # {marker} {i}"],
                                                              "yield_ms": 0})
                assert not r.is_error, _text(r)
            r = await session.call_tool("session_start", {"argv": ["cat"], "yield_ms": 0})
            assert r.is_error and "too many sessions (16)" in _text(r)
            await anyio.to_thread.run_sync(lambda: wait_for(lambda: len(_marked(marker)) >= 16, 20, "16 sessions"))
        # Leaving closes the server's stdin: it kills every session and exits.

    anyio.run(main)
    wait_for(lambda: not _marked(marker), 10, "every session's process to be gone")


# -- the raw protocol -----------------------------------------------------------------


class Raw:
    """``sluice mcp`` on pipes, spoken to line by line."""

    def __init__(self, sluice, daemon, workspace) -> None:
        self.proc = subprocess.Popen([*sluice, "mcp", "--cwd", workspace], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=daemon.env_for_children(),
                                     cwd=workspace)
        self.buf = b""

    def send(self, line) -> None:
        if not isinstance(line, bytes):
            line = json.dumps(line).encode()
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()

    def recv(self, timeout: float = 20.0) -> dict:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                raise AssertionError(f"no message within {timeout} s")
            data = os.read(self.proc.stdout.fileno(), 65536)
            if not data:
                raise AssertionError(f"sluice mcp closed its stdout: {self.proc.stderr.read().decode()}")
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> tuple[int, str]:
        self.proc.stdin.close()
        code = self.proc.wait(15)
        return code, self.proc.stderr.read().decode()


@pytest.fixture
def raw(sluice, module_daemon, workspace):
    r = Raw(sluice, module_daemon, workspace)
    yield r
    if r.proc.poll() is None:
        r.proc.kill()
        r.proc.wait()


def _req(i, method, params=None) -> dict:
    m = {"jsonrpc": "2.0", "id": i, "method": method}
    if params is not None:
        m["params"] = params
    return m


def test_garbage_unknown_methods_and_bad_params_get_one_error_each(raw) -> None:
    cases = [
        (b"this is not json", None, -32700),
        (b"\xff\xfe{}", None, -32700),
        (b"[" * 100000, None, -32700),
        (b"42", None, -32600),
        (b"[]", None, -32600),
        (json.dumps({"id": 1, "method": "ping"}).encode(), 1, -32600),
        (json.dumps({"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}).encode(), None, -32600),
        (json.dumps(_req(2, "no/such/method")).encode(), 2, -32601),
        (json.dumps(_req(3, "tools/call", [1, 2])).encode(), 3, -32602),
        (json.dumps(_req(4, "tools/call", {"name": "warp"})).encode(), 4, -32602),
        (json.dumps(_req(5, "tools/call", {"arguments": {}})).encode(), 5, -32602),
        (json.dumps(_req(6, "tools/call", {"name": "run", "arguments": "echo"})).encode(), 6, -32602),
        (b"x" * (17 * 1024 * 1024), None, -32700),
    ]
    for line, want_id, code in cases:
        raw.send(line)
        # Notifications are never answered, not even an unknown one.
        raw.send({"jsonrpc": "2.0", "method": "notifications/whatever"})
        answer = raw.recv()
        assert answer["jsonrpc"] == "2.0" and answer["id"] == want_id, (line[:40], answer)
        assert answer["error"]["code"] == code, (line[:40], answer)
        assert "\n" not in answer["error"]["message"]
    raw.send(_req("last", "ping"))
    assert raw.recv() == {"jsonrpc": "2.0", "id": "last", "result": {}}
    code, stderr = raw.close()
    assert code == 0 and "Traceback" not in stderr


def test_json_that_is_no_request_gets_invalid_request(raw) -> None:
    """``{}`` and its kin: JSON, but neither a request nor a notification. Each gets
    -32600 (under its id when it has a usable one, else null), never silence."""
    cases = [
        ({}, None),
        ({"jsonrpc": "2.0"}, None),
        ({"jsonrpc": "1.0", "method": "ping"}, None),
        ({"method": "ping"}, None),
        ({"jsonrpc": "2.0", "method": 5}, None),
        ({"jsonrpc": "2.0", "id": 7}, 7),
        ({"jsonrpc": "2.0", "id": "x", "method": None}, "x"),
        ("ping", None),
        (None, None),
    ]
    for message, want_id in cases:
        raw.send(message)
        answer = raw.recv()
        assert answer == {"jsonrpc": "2.0", "id": want_id, "error": answer["error"]}, (message, answer)
        assert answer["error"]["code"] == -32600, (message, answer)
    # In a batch: one error per bad member, in the batch's one array.
    raw.send([{}, {"jsonrpc": "2.0", "method": 1}, _req("p", "ping")])
    answer = raw.recv()
    assert isinstance(answer, list) and len(answer) == 3, answer
    assert sorted(str(m["id"]) for m in answer) == ["None", "None", "p"]
    assert all(m["error"]["code"] == -32600 for m in answer if m["id"] is None)
    raw.send(_req("last", "ping"))
    assert raw.recv() == {"jsonrpc": "2.0", "id": "last", "result": {}}


@pytest.mark.parametrize("asked, answered", [("2025-06-18", "2025-06-18"), ("2025-03-26", "2025-03-26"),
                                             ("2024-11-05", "2024-11-05"), ("2025-11-25", "2025-11-25"),
                                             ("1999-01-01", "2025-11-25")])
def test_protocol_version_negotiation(raw, asked, answered) -> None:
    raw.send(_req(1, "initialize", {"protocolVersion": asked, "capabilities": {},
                                    "clientInfo": {"name": "raw", "version": "0"}}))
    assert raw.recv()["result"]["protocolVersion"] == answered
    raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    raw.send(_req(2, "tools/list"))
    tools = raw.recv()["result"]["tools"]
    structured = answered >= "2025-06-18"
    assert all(("outputSchema" in t) == structured for t in tools)
    raw.send(_req(3, "tools/call", {"name": "run", "arguments": {"argv": ["echo", "hi"]}}))
    result = raw.recv()["result"]
    assert ("structuredContent" in result) == structured and "hi" in result["content"][0]["text"]


def test_a_batch_gets_one_array_of_its_responses(raw) -> None:
    marker = f"4{uuid.uuid4().int % 10**6}.5"
    batch = [
        _req("a", "ping"),
        _req("b", "tools/call", {"name": "run", "arguments": {"argv": ["echo", "in a batch"]}}),
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        42,
        _req("c", "no/such/method"),
        _req("d", "tools/call", {"name": "run", "arguments": {"argv": ["sleep", marker]}}),
    ]
    raw.send(json.dumps(batch).encode())
    wait_for(lambda: _marked(marker), 10, "the batch's sleep")
    raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "d"}})
    answer = raw.recv()  # after d's cancel: nothing waits for d any more
    assert isinstance(answer, list) and len(answer) == 4, answer
    by_id = {m["id"]: m for m in answer}
    assert by_id["a"]["result"] == {} and by_id["c"]["error"]["code"] == -32601
    assert by_id["b"]["result"]["structuredContent"]["stdout"] == "in a batch\n"
    assert by_id[None]["error"]["code"] == -32600
    raw.send(json.dumps([{"jsonrpc": "2.0", "method": "notifications/initialized"}]).encode())
    raw.send(_req("e", "ping"))
    assert raw.recv() == {"jsonrpc": "2.0", "id": "e", "result": {}}  # a batch of notifications: no answer


def test_a_cancelled_request_gets_no_response(raw) -> None:
    raw.send(_req(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "raw", "version": "0"}}))
    raw.recv()
    marker = f"8{uuid.uuid4().int % 10**6}.5"
    raw.send(_req(2, "tools/call", {"name": "run", "arguments": {"argv": ["sh", "-c", f"echo go; sleep {marker}"]},
                                    "_meta": {"progressToken": "p"}}))
    note = raw.recv()
    assert note["method"] == "notifications/progress" and note["params"]["progressToken"] == "p"
    wait_for(lambda: _marked(marker), 10, "the command")
    raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2, "reason": "test"}})
    wait_for(lambda: not _marked(marker), 10, "the cancelled command to die")
    raw.send(_req(3, "tools/call", {"name": "run", "arguments": {"argv": ["echo", "next"]}}))
    answer = raw.recv()
    assert answer["id"] == 3 and answer["result"]["structuredContent"]["stdout"] == "next\n"
    code, _ = raw.close()
    assert code == 0
    assert raw.buf == b""  # nothing more came: no response for 2


def test_a_cancelled_session_start_ends_the_session(raw) -> None:
    marker = f"5{uuid.uuid4().int % 10**6}.5"
    raw.send(_req(1, "tools/call", {"name": "session_start",
                                    "arguments": {"argv": ["sleep", marker], "yield_ms": 30000}}))
    wait_for(lambda: _marked(marker), 10, "the session's command")
    raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}})
    wait_for(lambda: not _marked(marker), 10, "the session's command to die")
    raw.send(_req(2, "ping"))
    assert raw.recv() == {"jsonrpc": "2.0", "id": 2, "result": {}}


def test_an_unreachable_daemon_is_a_tool_error_and_ping_goes_on(sluice, module_daemon, workspace) -> None:
    bad = short_tempdir("sl-mcp-bad-")
    os.chmod(bad, 0o755)  # a runtime dir others could have written to: refused, never used

    class Elsewhere:
        def env_for_children(self):
            return {**module_daemon.env_for_children(), "SLUICE_RUNTIME_DIR": bad}

    raw = Raw(sluice, Elsewhere(), workspace)
    try:
        raw.send(_req(1, "tools/call", {"name": "run", "arguments": {"argv": ["true"]}}))
        raw.send(_req(2, "ping"))
        answers = {m["id"]: m for m in (raw.recv(), raw.recv())}
        assert answers[2]["result"] == {}
        result = answers[1]["result"]
        assert result["isError"] is True
        text = result["content"][0]["text"]
        assert text.startswith("cannot reach the sluice daemon: runtime dir") and "\n" not in text
        code, stderr = raw.close()
        assert code == 0 and "Traceback" not in stderr
    finally:
        if raw.proc.poll() is None:
            raw.proc.kill()
            raw.proc.wait()


def test_stdin_eof_ends_running_commands_and_the_server(raw) -> None:
    marker = f"9{uuid.uuid4().int % 10**6}.5"
    raw.send(_req(1, "tools/call", {"name": "run", "arguments": {"argv": ["sleep", marker]}}))
    raw.send(_req(2, "tools/call", {"name": "session_start", "arguments": {"argv": ["sleep", marker]}}))
    wait_for(lambda: len(_marked(marker)) == 2, 15, "both commands")
    code, stderr = raw.close()
    assert code == 0, stderr
    wait_for(lambda: not _marked(marker), 10, "every command to be gone")


def test_sigterm_ends_running_commands_and_the_server(raw) -> None:
    marker = f"6{uuid.uuid4().int % 10**6}.5"
    raw.send(_req(1, "tools/call", {"name": "session_start", "arguments": {"argv": ["sleep", marker]}}))
    raw.send(_req(2, "tools/call", {"name": "run", "arguments": {"argv": ["sleep", marker]}}))
    wait_for(lambda: len(_marked(marker)) == 2, 15, "both commands")
    raw.proc.terminate()
    assert raw.proc.wait(15) == 0
    assert "stopping on signal 15" in raw.proc.stderr.read().decode()
    wait_for(lambda: not _marked(marker), 10, "every command to be gone")


# -- the MCP Inspector's CLI ----------------------------------------------------------

INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"


def _inspector(sluice, daemon, workspace, *args) -> dict:
    env = daemon.env_for_children()
    argv = ["npx", "-y", INSPECTOR, "--cli", *sluice, "mcp", "--cwd", workspace]
    for name in ("PYTHONPATH", "SLUICE_RUNTIME_DIR", "SLUICE_HOME"):
        argv += ["-e", f"{name}={env[name]}"]
    p = subprocess.run([*argv, *args], capture_output=True, text=True, env=env, cwd=workspace, timeout=150)
    if p.returncode != 0 and ("npm ERR" in p.stderr or "npm error" in p.stderr):
        pytest.skip(f"npx could not fetch {INSPECTOR}: {p.stderr.strip().splitlines()[-1]}")
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout)


@pytest.mark.timeout(300)
@pytest.mark.skipif(not shutil.which("npx"), reason="npx (Node.js) is not installed: the MCP Inspector's CLI needs it")
def test_the_mcp_inspector_cli_lists_and_calls(sluice, module_daemon, workspace) -> None:
    tools = _inspector(sluice, module_daemon, workspace, "--method", "tools/list")["tools"]
    assert {t["name"] for t in tools} == TOOLS
    result = _inspector(sluice, module_daemon, workspace, "--method", "tools/call", "--tool-name", "run",
                        "--tool-arg", 'argv=["echo","from the inspector"]')
    assert result["isError"] is False and result["structuredContent"]["stdout"] == "from the inspector\n"
    result = _inspector(sluice, module_daemon, workspace, "--method", "tools/call", "--tool-name", "run",
                        "--tool-arg", "command=exit 5")
    assert result["structuredContent"]["exit_code"] == 5
