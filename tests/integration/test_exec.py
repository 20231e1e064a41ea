"""``sluice exec`` as a person runs it: a subprocess against the real daemon and a scripted model.

The frontend reads its provider from a ``config.toml`` in its own SLUICE_HOME (pointing at
the scripted server on loopback, key in ``$FAKE_KEY``); the daemon's agent writes rollouts
and history under the daemon's SLUICE_HOME. One daemon serves the module; the tests that
kill its agent or let ``sluice exec`` start a daemon have their own.
"""

from __future__ import annotations

import json
import os
import pty
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.support.fake_model import (
    FakeModelServer,
    assistant,
    call,
    chat_chunk,
    conversation,
    gated,
    outputs_of,
    response,
    sse,
    sse_frame,
    status,
    tag,
    user_item,
)
from tests.support.frontends import Frontends, json_events
from tests.support.harness import daemons, live_processes, reap, short_tempdir, sluice_argv, subprocess_env, wait_for

pytestmark = pytest.mark.timeout(60)

KEY = "sk-exec-test-3b8f61c2a9"


@pytest.fixture(scope="module")
def agent_home():
    path = Path(short_tempdir("sl-agent-home-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def dmn(agent_home):
    with daemons() as factory:
        yield factory.start(executors=2, env={"SLUICE_HOME": str(agent_home)})


@pytest.fixture
def work(tmp_path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    (path / "a.txt").write_text("a\n")
    (path / "b.txt").write_text("b\n")
    return path


class Frontend(Frontends):
    """``sluice exec`` as these tests run it: this module's key, stdin empty."""

    def __init__(self, runtime, server: FakeModelServer, home: Path, **config: str) -> None:
        super().__init__(runtime, server, home, key=KEY, **config)

    def argv(self, *args: str) -> list[str]:
        return super().argv("exec", *args)

    def popen(self, *args: str) -> subprocess.Popen:
        return super().popen(*args, stdin=subprocess.DEVNULL)


@pytest.fixture
def fe(dmn, server, tmp_path) -> Frontend:
    return Frontend(dmn.runtime, server, tmp_path / "fe-home")


def session_id_of(stderr: str) -> str:
    return stderr.split("session ", 1)[1].split(",", 1)[0]


def read_until(fd: int, needle: bytes, timeout: float = 20.0, seen: bytearray | None = None,
               count: int = 1) -> bytes:
    """Read ``fd`` until ``needle`` has shown up ``count`` times; everything read so far."""
    buf = seen if seen is not None else bytearray()
    deadline = time.monotonic() + timeout
    while buf.count(needle) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise AssertionError(f"no {needle!r} in {bytes(buf)[-2000:]!r}")
        try:
            data = os.read(fd, 65536)
        except OSError:  # a pty whose other side closed
            data = b""
        if not data:
            raise AssertionError(f"EOF before {needle!r} in {bytes(buf)[-2000:]!r}")
        buf += data
    return bytes(buf)


# -- a task end to end ------------------------------------------------------------------


def test_tool_call_runs_sandboxed_and_the_model_gets_its_output(fe, server, work, tmp_path) -> None:
    # Outside the workspace, /tmp and $TMPDIR: the sandbox refuses the write.
    escaped = f"/var/tmp/sluice-escaped-{random.randint(0, 1 << 30)}"
    script = f"ls; echo err >&2; touch {escaped}"
    server.script(
        response(call("shell", {"command": ["bash", "-c", script]}, "c1")),
        response(assistant("There are two files."), deltas=["There are ", "two files."]),
    )
    last = tmp_path / "last.txt"
    p = fe.run("--sandbox", "workspace-write", "--approval-policy", "never", "--cd", str(work),
               "--output-last-message", str(last), "list the files here and count them")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "There are two files.\n"
    assert f"\n$ {script}\n" in p.stderr  # the script, not `bash -c '...'`
    assert "a.txt\nb.txt\n" in p.stderr and "err\n" in p.stderr and "[exit 1, " in p.stderr
    # Token counts once, at the end of the turn: both requests' summed.
    assert p.stderr.count("tokens: ") == 1
    assert p.stderr.endswith("tokens: 24 in (8 cached), 14 out (4 reasoning), 38 total\n")
    assert "user: list the files" not in p.stderr  # what the person just typed is not echoed
    assert last.read_text() == "There are two files."
    assert not os.path.exists(escaped)

    first, second = (r["json"] for r in server.requests)
    assert first["input"][-1] == user_item("list the files here and count them")
    assert server.requests[0]["headers"]["authorization"] == f"Bearer {KEY}"
    # The sandbox refused the write: under `never` the model reads the seed's denial text,
    # with the command's output in it.
    output = outputs_of(second)["c1"]
    assert output.startswith("failed in sandbox LinuxSeccomp with execution error: sandbox denied exec error, "
                             "exit code: 1, stdout: a.txt\nb.txt\n, stderr: err\n"), output


def test_json_lines_are_codex_events_with_seq_over_chat_completions(dmn, server, work, tmp_path) -> None:
    fe = Frontend(dmn.runtime, server, tmp_path / "fe-home", wire_api="chat")
    plan = {"plan": [{"step": "look", "status": "completed"}, {"step": "answer", "status": "in_progress"}]}
    server.script(
        sse([chat_chunk({"role": "assistant", "content": ""}),
             chat_chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                         "function": {"name": "shell", "arguments": '{"command":'}}]}),
             chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '["echo","hi"]}'}}]}),
             chat_chunk({"tool_calls": [{"index": 1, "id": "call_p", "type": "function",
                                         "function": {"name": "update_plan", "arguments": json.dumps(plan)}}]}),
             chat_chunk({}, "tool_calls"), b"data: [DONE]\n\n"]),
        sse([chat_chunk({"role": "assistant", "content": "Said "}), chat_chunk({"content": "hi."}),
             chat_chunk({}, "stop"),
             sse_frame({"id": "x", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2,
                                                            "total_tokens": 7}}),
             b"data: [DONE]\n\n"]),
    )
    p = fe.run("--json", "--sandbox", "read-only", "--approval-policy", "never", "-C", str(work), "say hi")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert list(json.loads(lines[0])) == ["id", "msg", "seq"]
    assert json.loads(lines[0])["msg"]["type"] == "session_configured"
    events = json_events(p.stdout)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    tags = [tag(e) for e in events]
    assert tags[0] == "session_configured" and tags[-2:] == ["task_complete", "shutdown_complete"]
    for expected in ("task_started", "exec_command_begin", "exec_command_output_delta", "exec_command_end",
                     "plan_update", "agent_message_delta", "agent_message", "token_count"):
        assert expected in tags
    (delta,) = [e for e in events if tag(e) == "exec_command_output_delta"]
    assert delta.msg.chunk == b"hi\n" and json.loads(lines[tags.index("exec_command_output_delta")])["msg"]["chunk"] == "aGkK"
    (update,) = [e.msg for e in events if tag(e) == "plan_update"]
    assert [(i.step, str(i.status)) for i in update.plan] == [("look", "completed"), ("answer", "in_progress")]
    assert events[-2].msg.last_agent_message == "Said hi."
    messages = server.requests[1]["json"]["messages"]
    tool = [m for m in messages if m["role"] == "tool" and m["tool_call_id"] == "call_a"][0]
    assert json.loads(tool["content"])["output"] == "hi\n"


def test_exec_continues_an_open_session(dmn, fe, server, work) -> None:
    from broker.wire.protocol import AskForApproval, ConfigureSession, ModelProviderInfo, Shutdown, WireApi
    from landlock_helper.policy import SandboxPolicy

    server.script(response(assistant("First.")), response(assistant("Second.")))
    client = dmn.client()
    session = client.open_session(ConfigureSession(
        provider=ModelProviderInfo(name="fake", base_url=server.base_url, wire_api=WireApi.RESPONSES),
        model="test-model", approval_policy=AskForApproval.NEVER,
        sandbox_policy=SandboxPolicy.from_mode("read-only"), cwd=str(work)))
    assert tag(session.next_event(20)) == "session_configured"
    for prompt, answer in (("one", "First.\n"), ("two", "Second.\n")):
        p = fe.run("--session", session.id, prompt)
        assert p.returncode == 0 and p.stdout == answer, p.stderr
    # The session stays open, and the frontend that opened it saw both turns.
    seen = []
    while (event := session.next_event(5)) is not None:
        seen.append(tag(event))
        if seen.count("task_complete") == 2:
            break
    assert seen.count("task_complete") == 2 and "shutdown_complete" not in seen
    assert server.requests[1]["json"]["input"][-1] == user_item("two")
    session.submit(Shutdown())
    while tag(session.next_event(5)) != "shutdown_complete":
        pass
    p = fe.run("--session", session.id, "three")
    assert p.returncode == 2 and p.stderr == f"sluice: error: no session '{session.id}' (the daemon hosts no sessions)\n"


# -- approvals --------------------------------------------------------------------------


def test_without_a_terminal_approvals_are_denied_with_a_note(fe, server, work) -> None:
    server.script(
        response(call("shell", {"command": ["touch", "made.txt"]}, "c1")),
        response(assistant("Could not.")),
    )
    p = fe.run("--sandbox", "workspace-write", "--approval-policy", "untrusted", "-C", str(work), "make a file")
    assert p.returncode == 0, p.stderr
    assert "sluice: denied: the agent asked to run `touch made.txt`" in p.stderr
    assert "no terminal to ask" in p.stderr
    assert not (work / "made.txt").exists()
    assert outputs_of(server.requests[1]["json"])["c1"] == "exec command rejected by user"


def test_approvals_on_a_terminal_escalate_or_deny(fe, server, work) -> None:
    server.script(
        response(call("shell", {"command": ["bash", "-c", "echo hi > yes.txt"]}, "c1")),
        response(call("shell", {"command": ["bash", "-c", "echo no > no.txt"]}, "c2")),
        response(assistant("One of two.")),
    )
    master, slave = pty.openpty()
    proc = subprocess.Popen(fe.argv("--sandbox", "read-only", "--approval-policy", "on-failure", "-C", str(work),
                                    "write two files"),
                            env=fe.env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    try:
        seen = bytearray()
        read_until(master, b"Allow? [y]es", seen=seen)
        assert b"failed in the sandbox the way sandbox denials fail" in seen and not (work / "yes.txt").exists()
        os.write(master, b"y\n")
        read_until(master, b"[exit 0, ", seen=seen)
        read_until(master, b"Allow? [y]es", seen=seen, count=2)
        assert b"echo no > no.txt" in seen
        os.write(master, b"n\n")
        assert proc.wait(30) == 0
    finally:
        reap(proc)
        os.close(master)
    assert (work / "yes.txt").read_text() == "hi\n" and not (work / "no.txt").exists()
    assert json.loads(outputs_of(server.requests[1]["json"])["c1"])["metadata"]["exit_code"] == 0
    assert json.loads(outputs_of(server.requests[2]["json"])["c2"])["metadata"]["exit_code"] != 0


# -- interrupt, rollout and resume ----------------------------------------------------


def test_ctrl_c_kills_the_command_and_resume_answers_the_dangling_call_aborted(fe, server, work, agent_home) -> None:
    sleeper = ["sleep", f"{random.randint(1000, 9999)}.{random.randint(100, 999)}"]
    server.script(
        response(call("shell", {"command": ["bash", "-c", f"echo go; {' '.join(sleeper)}"]}, "c1")),
        response(assistant("Picking up where we left off.")),
    )
    proc = fe.popen("--sandbox", "workspace-write", "--approval-policy", "never", "-C", str(work), "wait a while")
    try:
        seen = read_until(proc.stderr.fileno(), b"go\n")
        for _ in range(500):
            if live_processes(sleeper):
                break
            time.sleep(0.01)
        assert live_processes(sleeper)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 130
        stderr = seen + proc.stderr.read()
    finally:
        reap(proc)
    text = stderr.decode()
    # One line for the interrupt.
    assert text.count("interrupting") == 1 and "Turn interrupted" not in text and "turn aborted" not in text
    for _ in range(500):
        if not live_processes(sleeper):
            break
        time.sleep(0.01)
    assert not live_processes(sleeper), "the interrupted command's tree survived"

    session_id = session_id_of(text)
    (rollout,) = (agent_home / "sessions").rglob(f"rollout-*-{session_id}.jsonl")
    recorded = [json.loads(line) for line in rollout.read_text().splitlines()]
    assert recorded[0]["id"] == session_id
    assert any(item.get("type") == "function_call" and item.get("call_id") == "c1" for item in recorded)
    assert KEY not in rollout.read_text()

    rollouts = len(list((agent_home / "sessions").rglob("rollout-*.jsonl")))
    p = fe.run("-c", f'experimental_resume="{rollout}"', "--approval-policy", "never", "-C", str(work), "go on")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "Picking up where we left off.\n"
    # The session is the rollout's again, as in Codex (the daemon calls it that too);
    # the conversation goes on in the resumed rollout file.
    assert session_id_of(p.stderr) == session_id
    assert len(list((agent_home / "sessions").rglob("rollout-*.jsonl"))) == rollouts
    body = server.requests[-1]["json"]
    assert outputs_of(body)["c1"] == "aborted"
    said = conversation(body["input"])
    assert said[0] == user_item("wait a while") and said[-1] == user_item("go on")


def test_second_ctrl_c_leaves_at_once(dmn, fe, server, work) -> None:
    release = threading.Event()
    server.script(gated(response(assistant("late")), release))
    proc = fe.popen("--approval-policy", "never", "-C", str(work), "take your time")
    pid = None
    try:
        wait_for(lambda: server.requests, what="the model's first request")
        (pid,) = dmn.agent_pids()
        os.kill(pid, signal.SIGSTOP)  # an agent that does not answer the interrupt
        proc.send_signal(signal.SIGINT)
        read_until(proc.stderr.fileno(), b"Ctrl-C again to leave")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 130
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
        release.set()
        reap(proc)


# -- the model misbehaving ------------------------------------------------------------


def test_retries_after_429_500_and_a_dropped_stream_are_shown(fe, server, work) -> None:
    server.script(
        status(429, {"error": {"message": "Rate limit reached"}}, headers={"retry-after-ms": "20"}),
        status(500, {"error": {"message": "boom"}}),
        response(assistant("cut"), complete=False),
        response(assistant("Made it.")),
    )
    p = fe.run("--json", "--approval-policy", "never", "-C", str(work), "hello")
    assert p.returncode == 0, p.stderr
    events = json_events(p.stdout)
    retries = [e.msg.message for e in events if tag(e) == "background_event"]
    assert len(retries) == 3 and all(m.startswith("stream error: ") and "retrying" in m for m in retries), retries
    assert events[-2].msg.last_agent_message == "Made it." and len(server.requests) == 4


def test_model_error_after_the_retry_budget_fails_the_exec(dmn, server, work, tmp_path) -> None:
    fe = Frontend(dmn.runtime, server, tmp_path / "fe-home", extra_config="")
    server.script(*[status(400, {"error": {"message": "bad model name"}})])
    p = fe.run("--approval-policy", "never", "-C", str(work), "hello")
    assert p.returncode == 1
    assert "error: " in p.stderr and "bad model name" in p.stderr


def test_an_unreachable_model_server_says_to_check_base_url(dmn, work, tmp_path) -> None:
    """A provider whose server is not running (a port nothing listens on): the error
    names the provider and the URL tried, and says to check base_url."""
    with socket.socket() as probe:  # a free port; closed again before the exec
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    home = tmp_path / "fe-home"
    home.mkdir()
    (home / "config.toml").write_text(
        'model = "test-model"\nmodel_provider = "local"\n'
        f'[model_providers.local]\nname = "local"\nbase_url = "http://127.0.0.1:{port}/v1"\n'
        'wire_api = "chat"\nrequest_max_retries = 1\n')
    env = subprocess_env(dmn.runtime, SLUICE_HOME=str(home))
    p = subprocess.run([*sluice_argv(), "exec", "--approval-policy", "never", "-C", str(work), "hello"],
                       env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == 1, p.stderr
    (line,) = [line for line in p.stderr.splitlines() if line.startswith("error: ")]
    assert f"url (http://127.0.0.1:{port}/v1/chat/completions)" in line, line
    assert line.endswith(f"check base_url of model provider 'local' (http://127.0.0.1:{port}/v1) "
                         "and that its server is running"), line


# -- patches ----------------------------------------------------------------------------


def test_patch_applied_in_the_workspace_and_refused_outside_it(fe, server, work) -> None:
    patch = "*** Begin Patch\n*** Add File: hello.txt\n+Hello\n*** End Patch"
    server.script(
        response(call("apply_patch", {"input": patch}, "p1")),
        response(assistant("Added.")),
        response(call("apply_patch", {"input": patch.replace("hello.txt", "nope.txt")}, "p2")),
        response(assistant("Refused.")),
    )
    p = fe.run("--sandbox", "workspace-write", "--approval-policy", "on-request", "-C", str(work), "add hello")
    assert p.returncode == 0, p.stderr
    assert (work / "hello.txt").read_text() == "Hello\n"
    assert "patch:\nA hello.txt (new file, +1)\n--- /dev/null\n+++ b/hello.txt\n@@ -0,0 +1,1 @@\n+Hello\n" in p.stderr
    assert "[patch applied: 1 file changed, +1 -0 (A hello.txt)]" in p.stderr

    p = fe.run("--sandbox", "read-only", "--approval-policy", "on-request", "-C", str(work), "add nope")
    assert p.returncode == 0, p.stderr
    (denied,) = [line for line in p.stderr.splitlines() if "denied: the agent asked to apply a patch to " in line]
    assert denied.count(str(work)) == 1, denied  # the grant it asked for, said once
    assert not (work / "nope.txt").exists()
    assert outputs_of(server.requests[3]["json"])["p2"] == "patch rejected by user"


# -- notify -----------------------------------------------------------------------------


def test_notify_program_gets_the_turn(dmn, server, work, tmp_path) -> None:
    out = tmp_path / "notified.json"
    script = tmp_path / "notify.py"
    script.write_text(f"import sys, pathlib\npathlib.Path({str(out)!r}).write_text(sys.argv[1])\n")
    fe = Frontend(dmn.runtime, server, tmp_path / "fe-home",
                  extra_config=f'notify = [{json.dumps(sys.executable)}, {json.dumps(str(script))}]')
    server.script(response(assistant("Noted.")))
    p = fe.run("--approval-policy", "never", "-C", str(work), "ping me")
    assert p.returncode == 0, p.stderr
    for _ in range(500):
        if out.exists() and out.read_text():
            break
        time.sleep(0.01)
    payload = json.loads(out.read_text())
    assert payload["type"] == "agent-turn-complete" and payload["input-messages"] == ["ping me"]
    assert payload["last-assistant-message"] == "Noted."


# -- mistakes and accidents ------------------------------------------------------------


def test_missing_api_key_is_one_line_naming_the_variable(runtime_dir, tmp_path) -> None:
    env = subprocess_env(runtime_dir, SLUICE_HOME=str(tmp_path / "empty-home"))
    env.pop("OPENAI_API_KEY", None)
    p = subprocess.run([*sluice_argv(), "exec", "hello"], env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == 2
    assert p.stderr == "sluice: error: missing API key: set OPENAI_API_KEY\n" and p.stdout == ""
    assert not os.path.exists(runtime_dir.pid_path)  # nothing was started for it
    p = subprocess.run([*sluice_argv(), "exec", "--provider", "nope", "hello"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "--provider nope: no such model provider" in p.stderr and p.stderr.count("\n") == 1
    p = subprocess.run([*sluice_argv(), "exec"], env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "missing PROMPT" in p.stderr


def test_agent_killed_mid_turn_is_an_error_and_the_next_exec_works(daemon_factory, work, tmp_path) -> None:
    handle = daemon_factory.start(executors=1, env={"SLUICE_HOME": str(tmp_path / "agent-home")})
    release = threading.Event()
    with FakeModelServer() as server:
        server.script(gated(response(assistant("never seen")), release), response(assistant("Back again.")))
        fe = Frontend(handle.runtime, server, tmp_path / "fe-home")
        proc = fe.popen("--approval-policy", "never", "-C", str(work), "hang on")
        try:
            wait_for(lambda: server.requests, what="the model's first request")
            (pid,) = handle.agent_pids()
            os.kill(pid, signal.SIGKILL)
            assert proc.wait(20) == 1
            stderr = proc.stderr.read().decode()
        finally:
            release.set()
            reap(proc)
        assert "error: the agent process died (killed by signal 9)" in stderr
        p = fe.run("--approval-policy", "never", "-C", str(work), "hello again")
        assert p.returncode == 0, p.stderr
        assert p.stdout == "Back again.\n"


def test_autostarted_daemon_and_its_children_never_hold_the_key(runtime_dir, server, work, tmp_path) -> None:
    home = tmp_path / "home"
    fe = Frontend(runtime_dir, server, home)
    server.script(response(call("shell", {"command": ["bash", "-c", "env; echo $FAKE_KEY"]}, "c1")),
                  response(assistant("Done.")))
    p = fe.run("--sandbox", "workspace-write", "--approval-policy", "never", "-C", str(work), "show env")
    assert p.returncode == 0, p.stderr
    assert KEY not in p.stderr  # the command's output: the key never reached it
    assert KEY not in outputs_of(server.requests[1]["json"])["c1"]
    pid = runtime_dir.read_pid()
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    assert any(p.cmdline()[1:3] == ["-m", "agent"] for p in procs)
    for proc in procs:
        try:
            assert KEY not in " ".join(proc.cmdline())
            assert all(KEY not in value for value in proc.environ().values())
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    logs = Path(runtime_dir.log_path).read_text()
    assert "session configured" in logs and KEY not in logs
    rollouts = list((home / "sessions").rglob("rollout-*.jsonl"))
    assert rollouts and all(KEY not in r.read_text() for r in rollouts)


# -- reasoning settings ------------------------------------------------------------------


def _reasoning_stream():
    item = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Plan: look first"}],
            "content": [{"type": "reasoning_text", "text": "raw thoughts"}]}
    return sse([sse_frame({"type": "response.created", "response": {"id": "r1"}}),
                sse_frame({"type": "response.reasoning_summary_text.delta", "delta": "Plan: look first"}),
                sse_frame({"type": "response.reasoning_text.delta", "delta": "raw thoughts"}),
                sse_frame({"type": "response.output_item.done", "item": item}),
                sse_frame({"type": "response.output_item.done", "item": assistant("Done.")}),
                sse_frame({"type": "response.completed", "response": {"id": "r1"}})])


@pytest.mark.parametrize("hide", [False, True])
def test_reasoning_settings_reach_the_model_and_the_screen(dmn, server, work, tmp_path, hide) -> None:
    fe = Frontend(dmn.runtime, server, tmp_path / "fe-home", extra_config=(
        'model_reasoning_effort = "high"\nmodel_reasoning_summary = "detailed"\nshow_raw_agent_reasoning = true\n'
        f"hide_agent_reasoning = {'true' if hide else 'false'}\n"))
    server.script(_reasoning_stream())
    p = fe.run("-m", "o4-mini", "--approval-policy", "never", "--cd", str(work), "think, then answer")
    assert p.returncode == 0, p.stderr
    assert server.requests[-1]["json"]["reasoning"] == {"effort": "high", "summary": "detailed"}
    assert p.stdout == "Done.\n"
    shown = "thinking: Plan: look first" in p.stderr, "reasoning: raw thoughts" in p.stderr
    assert shown == ((False, False) if hide else (True, True)), p.stderr

    server.script(_reasoning_stream())
    p = fe.run("-m", "o4-mini", "--json", "--approval-policy", "never", "--cd", str(work), "again")
    tags = [tag(e) for e in json_events(p.stdout)]
    # JSON lines carry every event, whatever a person's screen hides.
    assert "agent_reasoning" in tags and "agent_reasoning_raw_content" in tags, tags


def test_the_unified_exec_setting_chooses_the_tools_the_model_is_offered(fe, server, work) -> None:
    for setting, expected in [(None, {"shell", "unified_exec"}), ("codex", {"exec_command", "write_stdin"}),
                              ("off", {"shell"})]:
        server.requests.clear()
        server.script(response(assistant("ok")))
        p = fe.run(*(["-c", f"unified_exec={setting}"] if setting else []), "--cd", str(work), "hello")
        assert p.returncode == 0, p.stderr
        names = {tool["name"] for tool in server.requests[0]["json"]["tools"]}
        assert names & {"shell", "unified_exec", "exec_command", "write_stdin"} == expected, names


def test_the_final_message_starts_on_its_own_line_after_a_programs_prompt(fe, server, work) -> None:
    """A Python REPL left at its ``>>> `` prompt (output with no newline at its end),
    then the agent's answer: on one screen (stdout and stderr together, as on a
    terminal) the answer starts a line of its own."""
    server.script(
        response(call("exec_command", {"cmd": "/usr/bin/python3 -i -q", "tty": True, "yield_time_ms": 1500}, "c1")),
        response(assistant("Done.")),
    )
    p = subprocess.run(fe.argv("-c", "unified_exec=codex", "--approval-policy", "never", "--sandbox",
                               "workspace-write", "--cd", str(work), "start python"),
                       env=fe.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stdout
    assert ">>> " in p.stdout and "\nDone.\n" in p.stdout, p.stdout
    assert ">>> Done." not in p.stdout
