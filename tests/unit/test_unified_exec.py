"""agent.unified_exec and the interactive tools' pieces that need no process: the output
buffer, the timeout clamp, Codex's output text, argument parsing, the config keys, and
the manager's bookkeeping over a fake runner."""

from __future__ import annotations

import asyncio
import json

import pytest

from broker.cli.config import ConfigError, load_config
from agent.exec_runner import CommandRunner, ExecResult, InteractiveProcess
from agent.tools import (
    ArgumentError,
    approx_token_count,
    clamp_yield_time,
    format_exec_command_output,
    format_unified_exec_output,
    parse_exec_command_arguments,
    parse_unified_exec_arguments,
    parse_write_stdin_arguments,
    tools_for,
    truncate_to_tokens,
)
from agent.unified_exec import (
    NotTypable,
    DEFAULT_TIMEOUT_MS,
    MAX_TIMEOUT_MS,
    OUTPUT_MAX_BYTES,
    OutputBuffer,
    UnifiedExecManager,
    UnknownSessionId,
    clamp_timeout,
)
from broker.wire.protocol import AskForApproval, ExecOutputStream, UnifiedExecSettings
from landlock_helper.policy import SandboxPolicy

# -- the buffer and the clamp (the seed's) --------------------------------------------


def test_push_chunk_trims_only_excess_bytes() -> None:
    buffer = OutputBuffer()
    buffer.push_chunk(b"a" * OUTPUT_MAX_BYTES)
    buffer.push_chunk(b"b")
    buffer.push_chunk(b"c")
    assert buffer.total_bytes == OUTPUT_MAX_BYTES
    snapshot = buffer.snapshot()
    assert len(snapshot) == 3
    assert len(snapshot[0]) == OUTPUT_MAX_BYTES - 2
    assert snapshot[1:] == [b"b", b"c"]


def test_a_chunk_bigger_than_the_cap_keeps_its_newest_bytes() -> None:
    buffer = OutputBuffer(10)
    buffer.push_chunk(b"old")
    buffer.push_chunk(b"0123456789abcdef")
    assert buffer.snapshot() == [b"6789abcdef"] and buffer.total_bytes == 10
    assert buffer.drain() == b"6789abcdef" and buffer.total_bytes == 0 and buffer.snapshot() == []
    buffer.push_chunk(b"")
    assert buffer.snapshot() == []


def test_timeouts_default_and_clamp_with_the_seeds_warning() -> None:
    assert clamp_timeout(None) == (DEFAULT_TIMEOUT_MS, None) == (1000, None)
    assert clamp_timeout(2500) == (2500, None)
    assert clamp_timeout(MAX_TIMEOUT_MS) == (60_000, None)
    assert clamp_timeout(120_000) == (
        60_000, "Warning: requested timeout 120000ms exceeds maximum of 60000ms; clamping to 60000ms.\n")
    assert clamp_timeout(-5) == (0, None)


def test_codex_yield_times_are_clamped() -> None:
    assert clamp_yield_time(10) == 250
    assert clamp_yield_time(1000) == 1000
    assert clamp_yield_time(10**9) == 30_000


# -- what the model reads -------------------------------------------------------------


def test_the_seed_tools_answer_is_its_json() -> None:
    assert json.loads(format_unified_exec_output(1000, "hi\n")) == {"session_id": "1000", "output": "hi\n"}
    assert json.loads(format_unified_exec_output(None, "")) == {"session_id": None, "output": ""}


def test_codex_text_says_running_or_exited_and_cuts_to_the_token_budget() -> None:
    running = format_exec_command_output("hi\n", chunk_id="0a1b2c", wall_time_s=0.25, exit_code=None,
                                         session_id=1001, max_output_tokens=None)
    assert running == ("Chunk ID: 0a1b2c\nWall time: 0.2500 seconds\nProcess running with session ID 1001\n"
                       "Original token count: 1\nOutput:\nhi\n")
    exited = format_exec_command_output("x" * 400, chunk_id="c", wall_time_s=1.0, exit_code=2,
                                        session_id=None, max_output_tokens=10)
    assert "Process exited with code 2\nOriginal token count: 100\n" in exited
    body = exited.split("Output:\n", 1)[1]
    assert body == "x" * 20 + "…90 tokens truncated…" + "x" * 20


def test_truncation_keeps_characters_whole() -> None:
    text = "é" * 100  # two bytes each
    cut = truncate_to_tokens(text, 5)
    assert "tokens truncated" in cut and set(cut.split("…")[0]) == {"é"} and set(cut.split("…")[-1]) == {"é"}
    assert truncate_to_tokens("short", 10) == "short"
    assert approx_token_count("") == 0 and approx_token_count("abcde") == 2


# -- arguments ------------------------------------------------------------------------


def test_seed_arguments() -> None:
    params, session_id = parse_unified_exec_arguments('{"input": ["bash", "-i"]}')
    assert params.input == ["bash", "-i"] and session_id is None and params.timeout_ms is None
    assert parse_unified_exec_arguments('{"input": ["ls\\n"], "session_id": "1003"}')[1] == 1003
    assert parse_unified_exec_arguments('{"input": [], "session_id": 7, "timeout_ms": 5}')[1] == 7
    with pytest.raises(ArgumentError, match="missing command line"):
        parse_unified_exec_arguments('{"input": []}')
    with pytest.raises(ArgumentError, match="invalid session_id"):
        parse_unified_exec_arguments('{"input": ["x"], "session_id": "abc"}')
    with pytest.raises(ArgumentError, match="failed to parse function arguments"):
        parse_unified_exec_arguments('{"session_id": "1"}')


def test_codex_arguments_and_their_defaults() -> None:
    params = parse_exec_command_arguments('{"cmd": "ls"}')
    assert (params.tty, params.login, params.yield_time_ms, params.max_output_tokens) == (False, None, 10_000, None)
    with pytest.raises(ArgumentError):
        parse_exec_command_arguments('{"cmd": "  "}')
    stdin = parse_write_stdin_arguments('{"session_id": 1000}')
    assert (stdin.chars, stdin.yield_time_ms) == ("", 250)
    with pytest.raises(ArgumentError):
        parse_write_stdin_arguments('{"chars": "x"}')


def test_the_tool_sets() -> None:
    policy = SandboxPolicy.from_mode("workspace-write")
    names = lambda mode: [t["name"] for t in tools_for(AskForApproval.ON_REQUEST, policy, mode)]  # noqa: E731
    assert names("off") == ["shell", "apply_patch", "update_plan"]
    assert names("seed") == ["shell", "unified_exec", "apply_patch", "update_plan"]
    assert names("codex") == ["exec_command", "write_stdin", "apply_patch", "update_plan"]
    # Each tool offers escalation in its origin's spelling: exec_command in Codex's.
    codex = tools_for(AskForApproval.ON_REQUEST, policy, "codex")[0]["parameters"]["properties"]
    assert codex["sandbox_permissions"]["enum"] == ["use_default", "require_escalated"]
    assert "justification" in codex and "tty" in codex and "with_escalated_permissions" not in codex
    never = tools_for(AskForApproval.NEVER, policy, "codex")[0]["parameters"]["properties"]
    assert not {"sandbox_permissions", "justification", "with_escalated_permissions"} & set(never)


# -- configuration --------------------------------------------------------------------


def test_the_config_keys(tmp_path) -> None:
    env = {"SLUICE_HOME": str(tmp_path)}
    assert load_config(env=env).unified_exec_settings() == UnifiedExecSettings() == UnifiedExecSettings(
        tools="seed", max_sessions=64, idle_timeout_ms=1_800_000)
    config = load_config(overrides=["unified_exec=codex", "unified_exec_max_sessions=3",
                                    "unified_exec_idle_timeout_ms=0"], env=env)
    assert config.unified_exec_settings() == UnifiedExecSettings(tools="codex", max_sessions=3, idle_timeout_ms=0)
    (tmp_path / "config.toml").write_text('unified_exec = "off"\n')
    assert load_config(env=env).unified_exec == "off"


@pytest.mark.parametrize("override, message", [
    ("unified_exec=pty", "-c unified_exec: unified_exec must be one of off, seed, codex, got 'pty'"),
    ("unified_exec=true", "-c unified_exec: unified_exec must be a string, got True"),
    ("unified_exec_max_sessions=0", "-c unified_exec_max_sessions: unified_exec_max_sessions must be a whole "
                                    "number of at least 1, got 0"),
    ("unified_exec_idle_timeout_ms=-1", "-c unified_exec_idle_timeout_ms: unified_exec_idle_timeout_ms must be a "
                                        "number of milliseconds >= 0 (0: never), got -1"),
])
def test_bad_config_values_are_one_line_errors(tmp_path, override, message) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[override], env={"SLUICE_HOME": str(tmp_path)})
    assert str(err.value) == message


# -- the manager over a fake runner ---------------------------------------------------


class _FakeProcess(InteractiveProcess):
    def __init__(self, call_id: str, on_output, on_exit) -> None:
        self.call_id = call_id
        self.pid = 1
        self.tty = True
        self.on_output = on_output
        self.on_exit = on_exit
        self.future: asyncio.Future[ExecResult] = asyncio.get_running_loop().create_future()
        self.written = bytearray()

    @property
    def done(self) -> bool:
        return self.future.done()

    @property
    def result(self) -> ExecResult | None:
        return self.future.result() if self.future.done() else None

    async def write(self, data: bytes) -> bool:
        self.written += data
        self.on_output(ExecOutputStream.STDOUT, b"echo:" + data)
        return True

    def close_stdin(self) -> None:
        pass

    def hold_output(self, held: bool) -> None:
        pass

    def resize(self, rows: int, cols: int) -> None:
        pass

    def end(self, result: ExecResult) -> None:
        if not self.future.done():
            self.future.set_result(result)
            self.on_exit(result)

    async def cancel(self) -> None:
        asyncio.get_running_loop().call_soon(self.end, ExecResult(aborted=True))

    async def wait(self) -> ExecResult:
        return await self.future


class _FakeRunner(CommandRunner):
    def __init__(self) -> None:
        self.processes: list[_FakeProcess] = []

    async def run(self, *args, **kwargs) -> ExecResult:
        raise NotImplementedError

    async def cancel(self, call_id: str) -> None:
        pass

    async def start_interactive(self, argv, cwd, sandbox_policy, on_output=None, *, tty=None, stdin=True,
                                on_exit=None, **kwargs) -> InteractiveProcess:
        process = _FakeProcess(f"run-{len(self.processes)}", on_output, on_exit)
        self.processes.append(process)
        return process


def test_the_manager_caps_reaps_forgets_and_closes() -> None:
    async def main() -> None:
        runner = _FakeRunner()
        events = []
        manager = UnifiedExecManager(runner, lambda sub, msg: events.append((sub, msg)), max_sessions=2,
                                     idle_timeout_s=0)
        policy = SandboxPolicy.from_mode("read-only")

        async def open_one(call_id: str):
            return await manager.open(["sh"], "/", policy, call_id=call_id, sub_id="s1", sandboxed=True)

        a, notes = await open_one("a")
        b, _ = await open_one("b")
        assert (a.id, b.id, notes) == (1000, 1001, [])
        await manager.write(a, b"x\n")
        collected = await manager.collect(a, 0.01)
        assert collected.output == b"echo:x\n" and collected.result is None
        c, notes = await open_one("c")  # b has been idle longest
        assert notes == ["Note: closed session 1001 (sh), the one idle longest: at most 2 sessions run at once."]
        assert sorted(manager.sessions) == [1000, 1002]
        with pytest.raises(UnknownSessionId, match="Unknown session id 1001"):
            manager.get(1001)
        # An exit is seen by the next collect, which forgets the session.
        runner.processes[0].end(ExecResult(exit_code=0))
        assert (await manager.collect(a, 5)).result.exit_code == 0
        assert sorted(manager.sessions) == [1002]
        # Idle reaping.
        manager.configure(max_sessions=2, idle_timeout_s=0.05)
        d, _ = await open_one("d")
        for _ in range(200):
            if not manager.sessions and c.exited and d.exited:
                break
            await asyncio.sleep(0.01)
        assert not manager.sessions and c.exited and d.exited
        await manager.close_all()
        with pytest.raises(RuntimeError):
            await open_one("e")
        tags = [type(m).__name__ for _, m in events]
        assert tags.count("ExecCommandBeginEvent") == 4 and tags.count("ExecCommandEndEvent") == 4

    asyncio.run(main())


def test_a_person_types_by_call_id_in_order_and_is_told_when_it_cannot() -> None:
    async def main() -> None:
        runner = _FakeRunner()
        manager = UnifiedExecManager(runner, lambda sub, msg: None, idle_timeout_s=0)
        policy = SandboxPolicy.from_mode("read-only")
        repl, _ = await manager.open(["python3", "-i"], "/", policy, call_id="call_7", sub_id="s1", sandboxed=True)
        piped, _ = await manager.open(["cat"], "/", policy, call_id="call_8", sub_id="s1", sandboxed=True)
        runner.processes[1].tty = False  # exec_command without tty: its stdin is closed

        assert manager.typing_target("call_7") is repl
        lost = []
        for line in (b"a = 6\n", b"print(a * 7)\n", b"\x03"):
            manager.type(repl, line, lambda: lost.append(line))
        for _ in range(100):
            if runner.processes[0].written == b"a = 6\nprint(a * 7)\n\x03":
                break
            await asyncio.sleep(0.01)
        assert runner.processes[0].written == b"a = 6\nprint(a * 7)\n\x03" and not lost
        # It is the session's output like any other: the model's next call reads it.
        assert (await manager.collect(repl, 0)).output == b"echo:a = 6\necho:print(a * 7)\necho:\x03"

        with pytest.raises(NotTypable, match="call_8 has no stdin"):
            manager.typing_target("call_8")
        with pytest.raises(NotTypable, match="no interactive command of this session has call id 'call_9'"):
            manager.typing_target("call_9")
        runner.processes[0].end(ExecResult(exit_code=0))
        with pytest.raises(NotTypable, match="command call_7 has ended"):
            manager.typing_target("call_7")
        await manager.collect(repl, 0)  # the model saw it exit: forgotten, and still said to have ended
        assert 1000 not in manager.sessions
        with pytest.raises(NotTypable, match="command call_7 has ended"):
            manager.typing_target("call_7")
        await manager.close_all()

    asyncio.run(main())


def test_typing_never_waits_for_a_command_that_stopped_reading_and_keeps_its_order() -> None:
    async def main() -> None:
        runner = _FakeRunner()
        manager = UnifiedExecManager(runner, lambda sub, msg: None, idle_timeout_s=0)
        session, _ = await manager.open(["cat"], "/", SandboxPolicy.from_mode("read-only"), call_id="c", sub_id="s",
                                        sandboxed=True)
        process = runner.processes[0]
        reading = asyncio.Event()

        async def stalled_write(data: bytes) -> bool:
            await reading.wait()  # the command's stdin is full until it reads again
            # Then it goes in a window at a time, as the runner sends it.
            half = len(data) // 2
            process.written += data[:half]
            await asyncio.sleep(0)
            process.written += data[half:]
            return True

        process.write = stalled_write
        manager.type(session, b"first\n", lambda: None)  # returns at once: no submission waits on it
        model = asyncio.ensure_future(manager.write(session, b"model\n"))
        manager.type(session, b"second\n", lambda: None)
        for _ in range(10):  # loop turns enough for each writer to reach the stalled stdin
            await asyncio.sleep(0)
        assert process.written == b"" and not model.done()
        reading.set()
        assert await model
        for _ in range(100):
            if len(process.written) == len(b"first\nmodel\nsecond\n"):
                break
            await asyncio.sleep(0.01)
        # Each writer's input whole, in the order written.
        assert process.written == b"first\nmodel\nsecond\n"
        await manager.close_all()

    asyncio.run(main())
