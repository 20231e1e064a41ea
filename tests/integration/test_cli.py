"""The ``sluice`` command line as a person uses it: real subprocesses, a real daemon."""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from tests.support.harness import live_processes, short_tempdir, subprocess_env


def _sleep_marker() -> tuple[str, list[str]]:
    arg = f"{random.randint(1000, 9999)}.{random.randint(100, 999)}"
    return f"sleep {arg}", ["sleep", arg]


@pytest.fixture
def run(module_daemon, sluice):
    """run(*args, **popen_kw) -> CompletedProcess of ``sluice ARGS`` against the module's daemon."""

    def run_(*args, env=None, timeout=30, **kw):
        full_env = dict(module_daemon.env)
        full_env.update(env or {})
        kw.setdefault("capture_output", True)
        return subprocess.run([*sluice, *args], env=full_env, timeout=timeout, **kw)

    return run_


def _one_line_error(p: subprocess.CompletedProcess) -> str:
    err = p.stderr.decode()
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("sluice: "), err
    return lines[0]


# -- sluice run -------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_echo_hello(run):
    p = run("run", "--", "echo", "hello")
    assert (p.returncode, p.stdout, p.stderr) == (0, b"hello\n", b"")


@pytest.mark.timeout(30)
def test_python_dash_m_broker_is_the_same_command(module_daemon, tmp_path):
    p = subprocess.run([sys.executable, "-m", "broker", "run", "--", "echo", "hello"], env=module_daemon.env,
                       capture_output=True, timeout=30, cwd=tmp_path)
    assert (p.returncode, p.stdout) == (0, b"hello\n")


# What a plain `sluice run` must not load: its start-up is most of a short command's time.
NOT_FOR_RUN = (
    "broker.cli.keys", "broker.cli.exec", "broker.cli.attach", "broker.cli.bridge", "broker.cli.mcp",
    "broker.cli.sandbox", "broker.cli.daemon", "broker.cli.render", "broker.cli.turns", "broker.cli.session_loop",
    "broker.cli.config",
    "broker.daemon", "agent", "executor", "broker.wire.protocol", "broker.net.keys", "broker.net.logging",
    "landlock_helper.spawn", "landlock_helper._libc", "ctypes", "secrets", "asyncio", "psutil", "structlog",
    "httpx", "tomllib",
)


@pytest.mark.timeout(30)
def test_run_imports_only_what_it_needs(module_daemon, tmp_path):
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "broker", "run", "--", "true"],
                       env=module_daemon.env, capture_output=True, timeout=30, cwd=tmp_path)
    assert p.returncode == 0, p.stderr.decode()
    loaded = {line.rpartition("|")[2].strip() for line in p.stderr.decode().splitlines()
              if line.startswith("import time:")}
    assert "broker.cli.run" in loaded
    assert sorted(m for m in loaded if m.startswith(tuple(f"{name}." for name in NOT_FOR_RUN)) or m in NOT_FOR_RUN) == []


@pytest.mark.timeout(30)
def test_run_says_bye_before_it_leaves(daemon, sluice):
    # sluice run leaves without the interpreter's teardown; its bye still reaches the
    # daemon, which then counts none of them among its frontends (only the status command).
    for _ in range(3):
        assert subprocess.run([*sluice, "run", "--", "true"], env=daemon.env, timeout=30).returncode == 0
    status = subprocess.run([*sluice, "daemon", "status", "--json"], env=daemon.env, capture_output=True, timeout=30)
    assert json.loads(status.stdout)["frontends"] == 1, status.stdout


@pytest.mark.timeout(30)
def test_without_double_dash(run):
    p = run("run", "echo", "-n", "hi")
    assert (p.returncode, p.stdout) == (0, b"hi")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("code", [1, 2, 7, 255])
def test_exit_code_is_the_commands(run, code):
    assert run("run", "--", "sh", "-c", f"exit {code}").returncode == code


@pytest.mark.timeout(30)
def test_killed_by_signal_is_128_plus_n(run):
    assert run("run", "--", "sh", "-c", "kill -TERM $$").returncode == 143
    assert run("run", "--", "sh", "-c", "kill -KILL $$").returncode == 137


@pytest.mark.timeout(30)
def test_timeout_is_124(run):
    t0 = time.monotonic()
    p = run("run", "--timeout-ms", "300", "--", "sleep", "30")
    assert p.returncode == 124
    assert time.monotonic() - t0 < 15


@pytest.mark.timeout(30)
def test_stdout_and_stderr_stay_apart(run):
    p = run("run", "--", "sh", "-c", "echo out1; echo err1 >&2; echo out2; echo err2 >&2")
    assert p.returncode == 0
    assert p.stdout == b"out1\nout2\n"
    assert p.stderr == b"err1\nerr2\n"


@pytest.mark.timeout(30)
def test_binary_output_is_passed_through_exactly(run):
    p = run("run", "--", "sh", "-c", "printf '\\000\\377\\200abc'")
    assert p.stdout == b"\x00\xff\x80abc"


@pytest.mark.timeout(30)
def test_cwd_defaults_to_the_current_directory(run, tmp_path):
    assert run("run", "--", "pwd", cwd=str(tmp_path)).stdout == f"{tmp_path}\n".encode()
    assert run("run", "--cwd", str(tmp_path), "--", "pwd", cwd="/").stdout == f"{tmp_path}\n".encode()


@pytest.mark.timeout(30)
def test_sandbox_modes(run, tmp_path):
    target = tmp_path / "f"
    p = run("run", "--", "sh", "-c", f"echo x > {target}", cwd=str(tmp_path))
    assert p.returncode == 0 and target.read_text() == "x\n"
    p = run("run", "--sandbox", "read-only", "--", "sh", "-c", f"echo y > {target}", cwd=str(tmp_path))
    assert p.returncode != 0 and target.read_text() == "x\n"
    other = short_tempdir("sl-w-")
    try:
        p = run("run", "--writable", other, "--", "sh", "-c", f"echo z > {other}/g", cwd=str(tmp_path))
        assert p.returncode == 0
        with open(os.path.join(other, "g")) as f:
            assert f.read() == "z\n"
    finally:
        import shutil

        shutil.rmtree(other, ignore_errors=True)


@pytest.mark.timeout(30)
def test_secret_env_is_dropped_unless_passed(run):
    env = {"MY_SECRET_TOKEN": "s3cret"}
    assert run("run", "--", "sh", "-c", "echo ${MY_SECRET_TOKEN:-none}", env=env).stdout == b"none\n"
    assert run("run", "--env", "MY_SECRET_TOKEN", "--", "sh", "-c", "echo $MY_SECRET_TOKEN", env=env).stdout == b"s3cret\n"


@pytest.mark.timeout(30)
def test_command_not_found(run):
    p = run("run", "--", "no-such-command-xyz")
    assert p.returncode == 127
    assert _one_line_error(p) == "sluice: command not found: no-such-command-xyz"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_interrupt_cancels_the_tree(module_daemon, sluice, signum, code):
    shell_sleep, marker = _sleep_marker()
    p = subprocess.Popen(
        [*sluice, "run", "--", "sh", "-c", f"{shell_sleep} & setsid {shell_sleep} & wait"],
        env=module_daemon.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while len(live_processes(marker)) < 2:
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline, "the sleeps never started"
            time.sleep(0.02)
        t0 = time.monotonic()
        p.send_signal(signum)
        _, err = p.communicate(timeout=20)
        latency = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == code, err
    assert b"Traceback" not in err
    assert live_processes(marker) == [], "a sleep survived the interrupt"
    print(f"signal {signum} -> exit in {latency * 1000:.1f} ms")


@pytest.mark.timeout(60)
def test_second_ctrl_c_still_waits_for_the_end(module_daemon, sluice):
    # The command ignores SIGTERM, so the cancel takes the executor's grace period.
    shell_sleep, marker = _sleep_marker()
    p = subprocess.Popen(
        [*sluice, "run", "--", "sh", "-c", f"trap '' TERM INT; {shell_sleep} & wait; wait"],
        env=module_daemon.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while not live_processes(marker):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        p.send_signal(signal.SIGINT)
        time.sleep(0.05)  # the scenario: a second Ctrl-C while the first is being handled
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    assert b"Traceback" not in err
    assert live_processes(marker) == []


@pytest.mark.timeout(30)
def test_closed_stdout_stops_the_command(module_daemon, sluice):
    p = subprocess.Popen([*sluice, "run", "--", "yes"], env=module_daemon.env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    assert p.stdout.readline() == b"y\n"
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(20) == 141
    assert b"Traceback" not in err


# -- --json -------------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_json_events_have_the_codex_shapes(run, tmp_path):
    p = run("run", "--json", "--", "sh", "-c", "echo out; echo err >&2; exit 3", cwd=str(tmp_path))
    assert p.returncode == 3
    events = [json.loads(line) for line in p.stdout.decode().splitlines()]
    assert all(set(e) == {"id", "msg"} for e in events), events
    types = [e["msg"]["type"] for e in events]
    assert types[0] == "exec_command_begin" and types[-1] == "exec_command_end"
    assert set(types[1:-1]) <= {"exec_command_output_delta"}
    call_id = events[0]["msg"]["call_id"]
    assert all(e["msg"]["call_id"] == call_id for e in events)

    begin = events[0]["msg"]
    assert begin["command"] == ["sh", "-c", "echo out; echo err >&2; exit 3"]
    assert begin["cwd"] == str(tmp_path)

    streamed = {"stdout": b"", "stderr": b""}
    for e in events[1:-1]:
        streamed[e["msg"]["stream"]] += base64.b64decode(e["msg"]["chunk"])
    assert streamed == {"stdout": b"out\n", "stderr": b"err\n"}

    end = events[-1]["msg"]
    assert end["exit_code"] == 3
    assert end["stdout"] == "out\n" and end["stderr"] == "err\n"
    assert end["aggregated_output"] == "out\nerr\n"
    assert end["formatted_output"] == end["aggregated_output"]
    assert set(end["duration"]) == {"secs", "nanos"}
    assert isinstance(end["duration"]["secs"], int) and 0 <= end["duration"]["nanos"] < 1_000_000_000


@pytest.mark.timeout(30)
def test_json_error_event(run):
    p = run("run", "--json", "--", "no-such-command-xyz")
    assert p.returncode == 127
    events = [json.loads(line) for line in p.stdout.decode().splitlines()]
    types = [e["msg"]["type"] for e in events]
    assert "error" in types and types[-1] == "exec_command_end"
    assert events[-1]["msg"]["exit_code"] == 127


# -- bad input: one line, no traceback ------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "args,needle",
    [
        (["run"], "missing command"),
        (["run", "--"], "missing command"),
        (["run", "--json", "--"], "missing command"),
        (["run", "--cwd", "/no/such/dir", "--", "true"], "/no/such/dir"),
        (["run", "--sandbox", "bogus", "--", "true"], "bogus"),
        (["run", "--writable", "relative/dir", "--", "true"], "absolute"),
        (["run", "--writable", "/no/such/dir", "--", "true"], "does not exist"),
        (["run", "--timeout-ms", "soon", "--", "true"], "timeout-ms"),
        (["run", "--bogus-flag", "--", "true"], "bogus-flag"),
        (["sandbox", "--"], "missing command"),
        (["sandbox", "--sandbox", "bogus", "--", "true"], "bogus"),
        (["daemon", "restart"], "restart"),
    ],
)
def test_bad_input_is_one_line(run, args, needle):
    p = run(*args)
    assert p.returncode == 2
    line = _one_line_error(p)
    assert line.startswith("sluice: error: ") and needle in line


@pytest.mark.timeout(30)
def test_daemon_that_cannot_start(sluice):
    path = short_tempdir()
    try:
        blocker = os.path.join(path, "not-a-dir")
        with open(blocker, "w") as f:
            f.write("x")
        p = subprocess.run([*sluice, "run", "--", "true"], env=subprocess_env(SLUICE_RUNTIME_DIR=blocker),
                           capture_output=True, timeout=30)
    finally:
        import shutil

        shutil.rmtree(path, ignore_errors=True)
    assert p.returncode == 125
    assert "not-a-dir" in _one_line_error(p)


# -- sluice sandbox -----------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_sandbox_runs_without_a_daemon(sluice, runtime_dir):
    env = subprocess_env(runtime_dir)
    p = subprocess.run([*sluice, "sandbox", "--", "sh", "-c", "echo hi; exit 4"], env=env, capture_output=True, timeout=30)
    assert (p.returncode, p.stdout) == (4, b"hi\n")
    p = subprocess.run([*sluice, "sandbox", "--", "no-such-command-xyz"], env=env, capture_output=True, timeout=30)
    assert p.returncode == 127
    assert "Traceback" not in p.stderr.decode()
    from broker.client import daemon_status

    assert not daemon_status(runtime_dir).running


# -- sluice daemon ------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_daemon_status_and_stop(daemon, sluice):
    p = subprocess.run([*sluice, "daemon", "status"], env=daemon.env, capture_output=True, timeout=30)
    assert p.returncode == 0
    assert str(daemon.pid) in p.stdout.decode() and daemon.runtime.socket_path in p.stdout.decode()
    assert p.stdout.decode().splitlines()[0].startswith("sluice daemon ")
    p = subprocess.run([*sluice, "daemon", "stop"], env=daemon.env, capture_output=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert daemon.proc.wait(10) is not None
    p = subprocess.run([*sluice, "daemon", "status"], env=daemon.env, capture_output=True, timeout=30)
    assert p.returncode == 3
    assert "not running" in p.stdout.decode()


@pytest.mark.timeout(60)
def test_daemon_start_in_the_background(sluice, runtime_dir):
    env = subprocess_env(runtime_dir)
    p = subprocess.run([*sluice, "daemon", "status"], env=env, capture_output=True, timeout=30)
    assert p.returncode == 3
    p = subprocess.run([*sluice, "daemon", "start", "--executors", "1"], env=env, capture_output=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert "started" in p.stdout.decode()
    p = subprocess.run([*sluice, "daemon", "start"], env=env, capture_output=True, timeout=30)
    assert p.returncode == 0 and "running" in p.stdout.decode()
    p = subprocess.run([*sluice, "run", "--", "echo", "via-background"], env=env, capture_output=True, timeout=30)
    assert p.stdout == b"via-background\n"
    p = subprocess.run([*sluice, "daemon", "stop"], env=env, capture_output=True, timeout=30)
    assert p.returncode == 0 and "stopped" in p.stdout.decode()
    p = subprocess.run([*sluice, "daemon", "status"], env=env, capture_output=True, timeout=30)
    assert p.returncode == 3


@pytest.mark.timeout(60)
def test_second_foreground_daemon_refuses(daemon, sluice):
    p = subprocess.run([*sluice, "daemon"], env=daemon.env, capture_output=True, timeout=30)
    assert p.returncode != 0
    line = _one_line_error(p)
    assert "already running" in line
    assert daemon.proc.poll() is None


@pytest.mark.timeout(60)
def test_run_autostarts_a_daemon(sluice, runtime_dir):
    env = subprocess_env(runtime_dir)
    p = subprocess.run([*sluice, "run", "--", "echo", "auto"], env=env, capture_output=True, timeout=40)
    assert (p.returncode, p.stdout) == (0, b"auto\n"), p.stderr
    from broker.client import daemon_status

    assert daemon_status(runtime_dir).running
