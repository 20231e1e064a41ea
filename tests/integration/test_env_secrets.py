"""Secrets do not travel: real processes, a real daemon, the real command line.

What an executor receives is recorded by an executor of our own (it joins the daemon as
any executor does, records every RunRequest and answers it), so the tests see exactly
what would reach another host. The environment of the agent's commands under
``shell_environment_policy`` is checked with ``sluice exec`` against the scripted model
and the real executors and sandbox.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from broker.wire.protocol import decode_event_json
from landlock_helper.env import is_secret
from tests.support.fake_model import FakeModelServer, assistant, call, response
from tests.support.harness import daemons, short_tempdir, sluice_argv, subprocess_env, wait_for

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox"),
]

KEY = "sk-env-test-7d1e02f4b6"
# Secrets the caller has, each with a value found nowhere else.
SECRETS = {
    "GH_PAT": "ghpat-value-1f2e3d",
    "MY_SERVICE_API_KEY": "apikey-value-4c5b6a",
    "DATABASE_URL": "postgres://app:dbpw-value-7a8b9c@db.internal:5432/app",
    "MYSQL_PWD": "mysqlpwd-value-0d1e2f",
    "DB_PASS": "dbpass-value-3a4b5c",
    "SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T0/B0/webhook-value-6d7e8f",
    "CI_JOB_JWT": "jwt-value-9a0b1c",
    "SENTRY_DSN": "https://dsnkey-value-2d3e4f@o0.ingest.sentry.io/1",
    "HTTPS_PROXY": "http://proxyuser:proxypw-value-5a6b7c@127.0.0.1:9",
}
HARMLESS = {
    "GIT_AUTHOR_NAME": "Ada Lovelace",
    "GIT_COMMITTER_EMAIL": "ada@example.com",
    "TOKENIZERS_PARALLELISM": "false",
    "XDG_SESSION_TYPE": "wayland",
    "FRONTEND_ONLY": "from-the-frontend",
}

# Joins the daemon as an executor, records each RunRequest (one JSON line) and answers it.
RECORDER = textwrap.dedent(
    """
    import os, signal, sys
    import msgspec, zmq
    from broker.wire import frames as wire
    from broker.net.runtime import RuntimeDir

    runtime, record, ready = RuntimeDir(sys.argv[1]), sys.argv[2], sys.argv[3]
    stopping = False
    def on_term(*_):
        global stopping
        stopping = True
    signal.signal(signal.SIGTERM, on_term)
    sock = zmq.Context().socket(zmq.DEALER)
    sock.linger = 1000
    sock.connect(runtime.endpoint)
    def send(kind, corr="", body=None):
        sock.send_multipart(wire.message(kind, corr, body))
    send(wire.HELLO, body=wire.Hello(role="executor", token=runtime.read_token(), pid=os.getpid(),
                                     name="recorder", slots=1))
    while not stopping:
        if not sock.poll(50):
            continue
        frames = sock.recv_multipart()
        head = wire.decode_header(frames[0])
        if head.kind == wire.WELCOME:
            open(ready, "w").close()
        elif head.kind == wire.PING:
            send(wire.PONG, head.corr)
        elif head.kind == wire.RUN:
            with open(record, "ab") as f:
                f.write(msgspec.json.encode(wire.decode(wire.RUN, frames[1])) + b"\\n")
            send(wire.STARTED, head.corr, wire.Started(pid=os.getpid(), executor="recorder"))
            sock.send_multipart([wire.header(wire.OUT, head.corr, stream=1), b"recorded\\n"])
            send(wire.EXIT, head.corr, wire.ExitStatus(exit_code=0, stdout=b"recorded\\n"))
    send(wire.BYE)
    sock.close()
    """
)


class Recorder:
    def __init__(self, runtime, base: Path) -> None:
        self.record = base / "requests.jsonl"
        ready = base / "ready"
        self.proc = subprocess.Popen([sys.executable, "-c", RECORDER, runtime.path, str(self.record), str(ready)],
                                     env=subprocess_env(runtime), stdin=subprocess.DEVNULL)
        wait_for(lambda: ready.exists() or self.proc.poll() is not None, 20, "the recording executor to join")
        assert self.proc.poll() is None, "the recording executor died"

    def raw(self) -> bytes:
        return self.record.read_bytes() if self.record.exists() else b""

    def requests(self) -> list[dict]:
        """The commands' run requests (a session's start also reads AGENTS.md through a
        sandboxed file batch, a run of its own: :meth:`raw` has those too)."""
        runs = [json.loads(line) for line in self.raw().splitlines()]
        return [run for run in runs if run.get("fileops") is None]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def recorded(daemon_factory, tmp_path):
    handle = daemon_factory.start(executors=0)
    recorder = Recorder(handle.runtime, tmp_path)
    try:
        yield handle, recorder
    finally:
        recorder.stop()


def _caller_env(runtime, **extra: str) -> dict[str, str]:
    env = subprocess_env(runtime, **{**SECRETS, **HARMLESS, **extra})
    env.pop("OPENAI_API_KEY", None)
    return env


def _assert_no_secret(data: bytes | str) -> None:
    text = data.decode() if isinstance(data, bytes) else data
    for name, value in SECRETS.items():
        # The distinctive part of each value (the password of a URL, say), not just the whole.
        secret = re.search(r"[a-z]+-value-[0-9a-f]+", value).group()
        assert secret not in text, f"{name}'s value travelled"


# -- sluice run and the client library ---------------------------------------------------


def test_sluice_run_sends_no_secret_to_the_executor(recorded, sluice) -> None:
    handle, recorder = recorded
    env = _caller_env(handle.runtime, DB_PASS="passed-on-purpose")
    r = subprocess.run([*sluice, "run", "--env", "DB_PASS", "--env-report", "--", "env"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "recorded\n"
    (request,) = recorder.requests()
    _assert_no_secret(recorder.raw())
    sent = request["env"]
    for name, value in HARMLESS.items():
        assert sent[name] == value
    assert sent["DB_PASS"] == "passed-on-purpose" and request["env_passthrough"] == ["DB_PASS"]
    assert not set(SECRETS) - {"DB_PASS"} & set(sent)
    # --env-report names what stayed behind, never the values.
    report = [line for line in r.stderr.splitlines() if line.startswith("sluice: environment: ")]
    assert len(report) == 1, r.stderr
    for name in set(SECRETS) - {"DB_PASS"}:
        assert name in report[0]
    assert "DB_PASS" not in report[0] and "GIT_AUTHOR_NAME" not in report[0]
    _assert_no_secret(r.stderr)


def test_client_library_sends_no_secret_to_the_executor(recorded) -> None:
    handle, recorder = recorded
    client = handle.client()
    result = client.run(["env"], cwd="/tmp", env={"PATH": "/usr/bin:/bin", **SECRETS, **HARMLESS},
                        env_passthrough=["MYSQL_PWD"])
    assert result.returncode == 0 and result.stdout == b"recorded\n"
    (request,) = recorder.requests()
    assert request["env"] == {"PATH": "/usr/bin:/bin", "MYSQL_PWD": SECRETS["MYSQL_PWD"], **HARMLESS}


def test_autostarted_daemon_and_executors_hold_no_secret(runtime_dir, sluice) -> None:
    env = _caller_env(runtime_dir)
    r = subprocess.run([*sluice, "run", "--", "sh", "-c", "env; cat /proc/self/environ >/dev/null"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for name, value in HARMLESS.items():
        assert f"{name}={value}\n" in r.stdout
    _assert_no_secret(r.stdout)
    pid = int(open(runtime_dir.pid_path).read().split()[0])
    daemon = psutil.Process(pid)
    for p in [daemon, *daemon.children(recursive=True)]:
        try:
            environ = p.environ()
        except psutil.NoSuchProcess:
            continue  # a warm sandbox's helper that came and went meanwhile
        _assert_no_secret("\n".join(f"{k}={v}" for k, v in environ.items()))


# -- sluice exec and shell_environment_policy ------------------------------------------


@pytest.fixture(scope="module")
def exec_daemon():
    home = short_tempdir("sl-env-home-")
    with daemons() as factory:
        yield factory.start(executors=1, env={"SLUICE_HOME": home})


class Exec:
    """``sluice exec`` in a subprocess: its own SLUICE_HOME, a config.toml for the scripted
    model plus ``policy`` (the body of a [shell_environment_policy] table)."""

    def __init__(self, runtime, server: FakeModelServer, home: Path, policy: str = "") -> None:
        home.mkdir(parents=True, exist_ok=True)
        table = f"[shell_environment_policy]\n{policy}\n" if policy else ""
        (home / "config.toml").write_text(
            f'model = "test-model"\nmodel_provider = "fake"\n'
            f'[model_providers.fake]\nname = "scripted"\nbase_url = "{server.base_url}"\n'
            f'env_key = "FAKE_KEY"\nwire_api = "responses"\n{table}')
        self.env = _caller_env(runtime, SLUICE_HOME=str(home), FAKE_KEY=KEY)
        self.server = server

    def run(self, *args: str, command: list[str] | None = None) -> subprocess.CompletedProcess:
        self.server.script(
            response(call("shell", {"command": command or ["env"]}, "c1")),
            response(assistant("Done.")),
        )
        return subprocess.run([*sluice_argv(), "exec", "--json", "--approval-policy", "never", "--sandbox",
                               "workspace-write", "--cd", "/tmp", *args, "show the environment"],
                              env=self.env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)

    def command_env(self, *args: str) -> dict[str, str]:
        """The environment the command saw (``env``'s output), by name; without ``PWD``,
        which the sandbox sets to the working directory."""
        r = self.run(*args)
        assert r.returncode == 0, r.stderr
        ends = [e.msg for e in map(decode_event_json, r.stdout.splitlines())
                if type(e.msg).__struct_config__.tag == "exec_command_end"]
        assert len(ends) == 1 and ends[0].exit_code == 0, ends
        _assert_no_secret(r.stdout)
        seen = dict(line.split("=", 1) for line in ends[0].stdout.splitlines() if "=" in line)
        assert seen.pop("PWD") == "/tmp"
        return seen


def test_exec_commands_get_the_callers_environment_without_secrets(exec_daemon, server, tmp_path) -> None:
    fe = Exec(exec_daemon.runtime, server, tmp_path / "home")
    seen = fe.command_env()
    for name, value in HARMLESS.items():
        assert seen.get(name) == value, name
    assert not set(SECRETS) & set(seen)
    assert "FAKE_KEY" not in seen and "SLUICE_HOME" not in seen
    # What went to the model is the same output: no secret in any request to it either.
    _assert_no_secret(json.dumps([req["json"] for req in server.requests]))


def test_exec_inherit_core_with_set(exec_daemon, server, tmp_path) -> None:
    policy = 'inherit = "core"\nset = { GIT_AUTHOR_NAME = "Set Name", DEPLOY_TOKEN = "deploy-set" }'
    fe = Exec(exec_daemon.runtime, server, tmp_path / "home", policy)
    seen = fe.command_env()
    core = {"HOME", "LOGNAME", "PATH", "SHELL", "USER", "USERNAME", "TMPDIR", "TEMP", "TMP"}
    assert set(seen) - core == {"GIT_AUTHOR_NAME", "DEPLOY_TOKEN"}, seen
    assert seen["PATH"] == fe.env["PATH"]
    # set on purpose: the executor lets the secret-looking name through.
    assert seen["GIT_AUTHOR_NAME"] == "Set Name" and seen["DEPLOY_TOKEN"] == "deploy-set"


def test_exec_overrides_inherit_none_and_include_only(exec_daemon, server, tmp_path) -> None:
    fe = Exec(exec_daemon.runtime, server, tmp_path / "home", 'inherit = "all"')
    seen = fe.command_env("-c", "shell_environment_policy.inherit=none",
                          "-c", 'shell_environment_policy.set={ONLY = "1", DROPPED = "2"}',
                          "-c", 'shell_environment_policy.include_only=["only"]')
    assert seen == {"ONLY": "1"}


def test_exec_exclude_and_ignore_default_excludes(exec_daemon, server, tmp_path) -> None:
    policy = 'ignore_default_excludes = true\nexclude = ["*_PWD", "db_*", "*URL", "*DSN", "*PROXY", "ci_*", "my_*"]'
    fe = Exec(exec_daemon.runtime, server, tmp_path / "home", policy)
    fe.env["AWS_REGION"] = "eu-west-1"
    r = fe.run("--env-report")
    assert r.returncode == 0, r.stderr
    (end,) = [e.msg for e in map(decode_event_json, r.stdout.splitlines())
              if type(e.msg).__struct_config__.tag == "exec_command_end"]
    seen = dict(line.split("=", 1) for line in end.stdout.splitlines() if "=" in line)
    # The user asked for the secrets, except the ones excluded: GH_PAT goes, the rest stays.
    assert seen["GH_PAT"] == SECRETS["GH_PAT"] and seen["AWS_REGION"] == "eu-west-1"
    for name in ("MYSQL_PWD", "DB_PASS", "DATABASE_URL", "SLACK_WEBHOOK_URL", "SENTRY_DSN", "HTTPS_PROXY", "CI_JOB_JWT",
                 "MY_SERVICE_API_KEY"):
        assert name not in seen, name
    assert "sluice: environment: no variable dropped as secret; left out by shell_environment_policy: " in r.stderr
    assert "DB_PASS" in r.stderr and SECRETS["DB_PASS"] not in r.stderr


def test_exec_env_report_and_bad_policy(exec_daemon, server, tmp_path) -> None:
    fe = Exec(exec_daemon.runtime, server, tmp_path / "home")
    r = fe.run("--env-report")
    assert r.returncode == 0, r.stderr
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("sluice: environment: ")]
    for name in SECRETS:
        assert name in line
    assert "FAKE_KEY" in line and "GIT_AUTHOR_NAME" not in line
    _assert_no_secret(r.stderr)

    bad = Exec(exec_daemon.runtime, server, tmp_path / "bad", 'inherit = "most"')
    r = subprocess.run([*sluice_argv(), "exec", "hello"], env=bad.env, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert r.stderr.strip().endswith("shell_environment_policy.inherit must be one of all, core, none, got 'most'")
    assert len(r.stderr.strip().splitlines()) == 1


def test_exec_sends_no_secret_to_the_executor(recorded, server, tmp_path) -> None:
    handle, recorder = recorded
    fe = Exec(handle.runtime, server, tmp_path / "home")
    r = fe.run()
    assert r.returncode == 0, r.stderr
    (request,) = recorder.requests()
    _assert_no_secret(recorder.raw())
    assert KEY not in recorder.raw().decode()
    for name, value in HARMLESS.items():
        assert request["env"][name] == value
    # And the daemon's agent process never had them either.
    for p in handle.descendants():
        _assert_no_secret("\n".join(f"{k}={v}" for k, v in p.environ().items()))


def test_bridge_drops_the_secrets_of_the_env_a_program_sends(recorded, server, sluice) -> None:
    handle, recorder = recorded
    server.script(response(call("shell", {"command": ["env"]}, "c1")), response(assistant("Done.")))
    configure = {"id": "1", "op": {
        "type": "configure_session", "model": "test-model", "approval_policy": "never", "cwd": "/tmp",
        "provider": {"name": "scripted", "base_url": server.base_url, "wire_api": "responses"},
        "sandbox_policy": {"permissions": ["disk-full-read-access"]},
        "env": {"PATH": "/usr/bin:/bin", **SECRETS, **HARMLESS, "DB_PASS": "kept-on-purpose"},
        "env_passthrough": ["DB_PASS"],
    }}
    task = {"id": "2", "op": {"type": "user_input", "items": [{"type": "text", "text": "show the environment"}]}}
    r = subprocess.run([*sluice, "bridge"], input=f"{json.dumps(configure)}\n{json.dumps(task)}\n",
                       env=subprocess_env(handle.runtime), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    (request,) = recorder.requests()
    _assert_no_secret(recorder.raw())
    assert request["env"] == {"PATH": "/usr/bin:/bin", **HARMLESS, "DB_PASS": "kept-on-purpose"}
    assert request["env_passthrough"] == ["DB_PASS"]

    # A session opened without an environment: the agent's own, filtered before it is sent.
    server.script(response(call("shell", {"command": ["env"]}, "c1")), response(assistant("Done.")))
    del configure["op"]["env"], configure["op"]["env_passthrough"]
    r = subprocess.run([*sluice, "bridge"], input=f"{json.dumps(configure)}\n{json.dumps(task)}\n",
                       env=subprocess_env(handle.runtime), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    _, request = recorder.requests()
    assert "PATH" in request["env"] and request["env_passthrough"] == []
    assert not [name for name, value in request["env"].items() if is_secret(name, value)]
