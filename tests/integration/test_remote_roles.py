"""Remote roles and the control plane's key material, on loopback.

A key is allowed as a frontend (``--allow DIR``) or as an executor (``--allow-executors
DIR``), and the daemon holds each connection to the role its key was allowed: a frontend's
key cannot join as an executor (and receive other people's commands), an executor's key
cannot run commands. And what controls the daemon (sluice's home with its keys, the
daemon's ``--key`` file, its allow-list directories) is out of every sandboxed command's
sight, whenever it was created.

Every test has its own keys, allow dirs, runtime dir and SLUICE_HOME.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time

import pytest

from broker.net.keys import new_key_pair
from tests.support.harness import ROOT, daemons, short_tempdir, sluice_argv, subprocess_env, wait_for
from tests.support.remote_helpers import (
    connect_args,
    free_port,
    kill_tree,
    listen_args,
    log_events,
    make_keys,
    one_line,
    run_sluice,
    start_executor,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox")

REFUSED_IN_ROLE = "remote peer refused: its key is not allowed in that role"


@pytest.fixture
def base():
    path = short_tempdir("sl-roles-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def keys(base):
    return make_keys(base)


@pytest.fixture
def factory():
    with daemons() as f:
        yield f


def _home_env(base: str, name: str = "home") -> dict[str, str]:
    return {"SLUICE_HOME": os.path.join(base, name)}


def _listening(factory, keys, base, *, executors: int = 0, allow_executors: bool = True):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    daemon = factory.start(executors=executors, args=listen_args(keys, endpoint, executors=allow_executors),
                           env=_home_env(base))
    return daemon, endpoint






def _executor_once(keys, endpoint: str, name: str, env=None) -> subprocess.CompletedProcess:
    """``sluice executor`` with ``name``'s key pair, expected to give up by itself."""
    return run_sluice(["executor", *connect_args(keys, endpoint, name), "--name", name], env=env, timeout=20)


def _refusals(daemon, key: str) -> list[dict]:
    return [e for e in log_events(daemon.log(), REFUSED_IN_ROLE) if e.get("key") == key]


def _joined(daemon, name: str) -> list[dict]:
    return [e for e in log_events(daemon.log(), "peer joined") if e.get("name") == name]


# -- roles ------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_frontend_key_cannot_join_as_an_executor(factory, keys, base):
    daemon, endpoint = _listening(factory, keys, base)
    t0 = time.monotonic()
    r = _executor_once(keys, endpoint, "client")
    assert time.monotonic() - t0 < 15, "a refusal must not be retried"
    assert r.returncode == 2
    line = one_line(r.stderr)
    assert line.startswith("sluice: error: the broker refused this executor: ")
    assert "allowed to join the daemon as frontend only, not as 'executor'" in line
    assert "--allow-executors" in line
    key = keys.public("client")
    refusal = wait_for(lambda: _refusals(daemon, key), 5, "the refusal in the daemon log")
    assert len(refusal) == 1
    assert refusal[0]["address"] == "127.0.0.1" and refusal[0]["role"] == "executor"
    assert refusal[0]["allowed"] == ["frontend"] and refusal[0]["level"] == "warning"
    assert not [e for e in log_events(daemon.log(), "peer joined") if e.get("key") == key]


@pytest.mark.timeout(60)
def test_an_executor_key_cannot_run_commands(factory, keys, base):
    daemon, endpoint = _listening(factory, keys, base)
    r = run_sluice(["run", *connect_args(keys, endpoint, "worker"), "--", "touch", os.path.join(base, "ran")])
    assert r.returncode == 125 and r.stdout == ""
    line = one_line(r.stderr)
    assert line.startswith(f"sluice: error: the daemon at {endpoint} refused the connection: ")
    assert "allowed to join the daemon as executor only, not as 'frontend'" in line
    assert "--allow directory" in line
    refusal = wait_for(lambda: _refusals(daemon, keys.public("worker")), 5, "the refusal in the daemon log")
    assert refusal[0]["role"] == "frontend" and refusal[0]["allowed"] == ["executor"]
    assert not os.path.exists(os.path.join(base, "ran"))


@pytest.mark.timeout(60)
def test_each_role_with_its_own_key_works_and_keys_added_later_count_for_their_role_only(factory, keys, base):
    daemon, endpoint = _listening(factory, keys, base)
    log_path = os.path.join(base, "executors.log")
    started = []
    try:
        # The executor's key joins as an executor; the frontend's key runs a command on it.
        started.append(start_executor([], [*connect_args(keys, endpoint, "worker"), "--name", "worker"],
                                      subprocess_env(), log_path))
        wait_for(lambda: _joined(daemon, "worker"), 15, "the executor to join")
        r = run_sluice(["run", *connect_args(keys, endpoint, "client"), "--", "echo", "through worker"])
        assert (r.returncode, r.stdout) == (0, "through worker\n"), r.stderr

        # Keys copied in while the daemon runs: each lets its key in as its role only.
        late_exec, _ = keys.pair("late-exec", allowed=True, role="executor")
        late_front, _ = keys.pair("late-front", allowed=True, role="frontend")
        r = run_sluice(["run", *connect_args(keys, endpoint, "late-exec"), "--", "true"])
        assert r.returncode == 125 and "not as 'frontend'" in one_line(r.stderr)
        r = _executor_once(keys, endpoint, "late-front")
        assert r.returncode == 2 and "not as 'executor'" in one_line(r.stderr)
        r = run_sluice(["run", *connect_args(keys, endpoint, "late-front"), "--", "echo", "late front"])
        assert (r.returncode, r.stdout) == (0, "late front\n"), r.stderr
        started.append(start_executor([], [*connect_args(keys, endpoint, "late-exec"), "--name", "late-exec"],
                                      subprocess_env(), log_path))
        joined = wait_for(lambda: _joined(daemon, "late-exec"), 15, "the late executor to join")
        assert joined[0]["role"] == "executor" and joined[0]["key"] == keys.public("late-exec")

        # A key in both directories may do both.
        both, _ = keys.pair("both", allowed=True, role="frontend")
        keys.allow_key(both, "executor")
        started.append(start_executor([], [*connect_args(keys, endpoint, "both"), "--name", "both"],
                                      subprocess_env(), log_path))
        wait_for(lambda: _joined(daemon, "both"), 15, "the executor with a key in both lists to join")
        r = run_sluice(["run", *connect_args(keys, endpoint, "both"), "--", "echo", "both"])
        assert (r.returncode, r.stdout) == (0, "both\n"), r.stderr
        accepted = [e for e in log_events(daemon.log(), "connection accepted") if e["key"] == keys.public("both")]
        assert accepted and accepted[0]["roles"] == ["frontend", "executor"]
    finally:
        for proc in started:
            kill_tree(proc)


@pytest.mark.timeout(60)
def test_without_allow_executors_no_remote_executor_can_join(factory, keys, base):
    daemon, endpoint = _listening(factory, keys, base, executors=1, allow_executors=False)
    r = _executor_once(keys, endpoint, "client")
    assert r.returncode == 2 and "allowed to join the daemon as frontend only" in one_line(r.stderr)
    r = _executor_once(keys, endpoint, "worker")
    assert r.returncode == 2
    assert one_line(r.stderr) == f"sluice: error: the daemon at {endpoint} refused our key (it is not in its allow-list)"
    r = run_sluice(["run", *connect_args(keys, endpoint, "client"), "--", "echo", "local executor"])
    assert (r.returncode, r.stdout) == (0, "local executor\n"), r.stderr
    assert [e["role"] for e in log_events(daemon.log(), "allow-list loaded")] == ["frontend"]


@pytest.mark.timeout(60)
def test_executors_only_daemon_refuses_frontends_over_tcp(factory, keys, base):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    args = ["--listen", endpoint, "--key", os.path.join(keys.dir, "daemon.key_secret"), "--allow-executors",
            keys.executors]
    daemon = factory.start(executors=0, args=args, env=_home_env(base))
    r = run_sluice(["run", *connect_args(keys, endpoint, "client"), "--", "true"])
    assert r.returncode == 125 and "refused our key" in one_line(r.stderr)
    ex = start_executor([], [*connect_args(keys, endpoint, "worker"), "--name", "worker"], subprocess_env(),
                        os.path.join(base, "executor.log"))
    try:
        wait_for(lambda: _joined(daemon, "worker"), 15, "the executor to join")
        assert daemon.client().run(["echo", "via ipc"], cwd="/tmp").stdout == b"via ipc\n"
    finally:
        kill_tree(ex)


# -- the flags ---------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_allow_dir_mistakes_are_refused_in_one_line(keys, base):
    env = subprocess_env(SLUICE_RUNTIME_DIR=short_tempdir(), **_home_env(base))
    secret = os.path.join(keys.dir, "daemon.key_secret")
    listen = ["daemon", "--executors", "0", "--listen", "tcp://127.0.0.1:1", "--key", secret]
    loose = os.path.join(base, "loose")
    os.makedirs(loose)
    cases = [
        (["--allow", keys.allow, "--allow-executors", keys.allow], "name the same directory"),
        (["--allow", keys.allow, "--allow-executors", keys.allow + "/."], "name the same directory"),
        (["--allow-executors", os.path.join(base, "none")], "--allow-executors directory"),
        (["--allow", loose, "--allow-executors", keys.executors], "writable by group and others (mode 0777)"),
        (["--allow", keys.allow, "--allow-executors", loose], "writable by group (mode 0770)"),
        (["--allow", keys.allow, "--allow-executors", loose], "writable by others (mode 0702)"),
        (["--allow-executors", keys.executors], "go with --listen"),
    ]
    modes = {"0777": 0o777, "0770": 0o770, "0702": 0o702}
    for args, words in cases:
        for text, mode in modes.items():
            if text in words:
                os.chmod(loose, mode)
        argv = listen + args if words != "go with --listen" else ["daemon", "--executors", "0", *args]
        for action in ([], ["start"]):
            r = subprocess.run([sys.executable, "-m", "broker", *argv[:1], *action, *argv[1:]], capture_output=True,
                               text=True, timeout=30, env=env, stdin=subprocess.DEVNULL, cwd="/tmp")
            assert r.returncode == 2, (args, action, r.stderr)
            assert words in one_line(r.stderr), r.stderr
    if os.geteuid() == 0:
        os.chmod(loose, 0o700)
        os.chown(loose, 65534, 65534)
        r = run_sluice([*listen, "--allow", loose], env)
        assert r.returncode == 2
        assert "belongs to uid 65534, not to the daemon's user (uid 0)" in one_line(r.stderr)


@pytest.mark.timeout(60)
def test_an_allow_dir_or_key_file_others_could_write_lets_nobody_in(factory, keys, base):
    daemon, endpoint = _listening(factory, keys, base, executors=1)

    def run_as(name: str) -> subprocess.CompletedProcess:
        return run_sluice(["run", *connect_args(keys, endpoint, name), "--", "echo", "in"])

    assert run_as("client").returncode == 0
    os.chmod(keys.allow, 0o770)
    r = run_as("client")
    assert r.returncode == 125 and "refused our key" in one_line(r.stderr)
    unusable = [e for e in log_events(daemon.log(), "allow-list directory unusable; refusing every key")]
    assert unusable and "writable by group (mode 0770)" in unusable[-1]["why"] and unusable[-1]["role"] == "frontend"
    os.chmod(keys.allow, 0o700)
    assert run_as("client").returncode == 0
    # A key file someone else could have written is skipped; the others still count.
    public, _ = keys.pair("loose", allowed=True)
    os.chmod(os.path.join(keys.allow, "loose.key"), 0o666)
    assert run_as("loose").returncode == 125
    skipped = [e for e in log_events(daemon.log(), "allow-list file skipped") if e["file"].endswith("loose.key")]
    assert skipped and "writable by group and others" in skipped[-1]["why"]
    assert run_as("client").returncode == 0
    os.chmod(os.path.join(keys.allow, "loose.key"), 0o644)
    assert run_as("loose").returncode == 0


@pytest.mark.timeout(60)
def test_an_allow_dir_swapped_under_the_daemon_is_not_trusted(factory, keys, base):
    # The allow dir lies under a directory commands may write (/tmp): one renames the
    # parent away and puts a directory of its own, with its key, in the allow dir's place.
    ws = os.path.join(base, "ws")
    allow = os.path.join(ws, "allow")
    os.makedirs(allow, mode=0o700)
    keys.allow, original = allow, keys.allow
    keys.allow_key(os.path.join(keys.dir, "client.key"))
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    daemon = factory.start(executors=1, args=listen_args(keys, endpoint), env=_home_env(base))
    stranger = os.path.join(keys.dir, "stranger.key")
    swap = f"mv {ws} {ws}-old && mkdir -p {allow} && cp {stranger} {allow}/ && echo swapped"
    # A sandboxed command cannot even see it: the host's /tmp is not in its view.
    r = daemon.client().run(["sh", "-c", swap], cwd="/tmp")
    assert r.stdout == b"" and os.listdir(allow) == ["client.key"], r
    # Whoever else can write there swaps it; the daemon keeps the one it checked.
    subprocess.run(["sh", "-c", swap], check=True, capture_output=True)
    assert os.listdir(allow) == ["stranger.key"]
    r = run_sluice(["run", *connect_args(keys, endpoint, "stranger"), "--", "echo", "in"])
    assert r.returncode == 125 and "refused our key" in one_line(r.stderr)
    wait_for(lambda: log_events(daemon.log(), "the allow-list directory was moved or replaced; still reading the one "
                                              "opened at start (restart the daemon to use another)"), 5, "the warning")
    # The directory checked at start still decides.
    r = run_sluice(["run", *connect_args(keys, endpoint, "client"), "--", "echo", "in"])
    assert (r.returncode, r.stdout) == (0, "in\n"), r.stderr
    keys.allow = original


@pytest.mark.timeout(90)
def test_daemon_start_takes_allow_executors(keys, base, runtime_dir):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    env = subprocess_env(runtime_dir, **_home_env(base))
    r = subprocess.run([sys.executable, "-m", "broker", "daemon", "start", "--executors", "0",
                        *listen_args(keys, endpoint)], capture_output=True, text=True, timeout=60, env=env,
                       stdin=subprocess.DEVNULL, cwd="/tmp")
    assert r.returncode == 0, r.stderr
    ex = start_executor([], [*connect_args(keys, endpoint, "worker"), "--name", "worker"], subprocess_env(),
                        os.path.join(base, "executor.log"))
    try:
        r = run_sluice(["run", *connect_args(keys, endpoint, "client"), "--", "echo", "started"], env=env)
        assert (r.returncode, r.stdout) == (0, "started\n"), r.stderr
        r = _executor_once(keys, endpoint, "client")
        assert r.returncode == 2 and "not as 'executor'" in one_line(r.stderr)
    finally:
        kill_tree(ex)


# -- what sandboxed commands cannot see -------------------------------------------------


def _probe(paths: list[str]) -> str:
    """A script that lists each directory and reads each file of ``paths``: its output is
    only what it found (no error messages, which would name the paths)."""
    return "; ".join(f"ls -A {p} 2>/dev/null; cat {p} {p}/* 2>/dev/null; echo" for p in paths)


def _secrets_in(text: str, *paths: str) -> list[str]:
    """The secret keys of the ``.key_secret`` files under ``paths`` that appear in ``text``."""
    found = []
    for path in paths:
        files = [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
        for name in files:
            with open(name, encoding="ascii") as f:
                for line in f:
                    if "secret-key" in line or "public-key" in line:
                        value = line.split("=", 1)[1].strip().strip('"')
                        if value in text:
                            found.append(f"{name}: {value}")
    return found


@pytest.mark.timeout(90)
def test_sandboxed_commands_see_no_key_material_of_the_daemon(factory, keys, base):
    home = os.path.join(base, "home")
    assert not os.path.exists(home)
    daemon, endpoint = _listening(factory, keys, base, executors=1)
    # The daemon made sluice's home, private, before its executors started.
    assert stat.S_IMODE(os.stat(home).st_mode) == 0o700
    # A keys directory made after the daemon (and its executors) started.
    r = run_sluice(["keys", "new", "late"], env=subprocess_env(SLUICE_HOME=home))
    assert r.returncode == 0, r.stderr
    with open(os.path.join(home, "config.toml"), "w") as f:
        f.write("# sluice config\n")
    secret = os.path.join(keys.dir, "daemon.key_secret")
    paths = [home, os.path.join(home, "keys"), os.path.join(home, "keys", "late.key_secret"),
             os.path.join(home, "config.toml"), keys.allow, keys.executors, secret]
    client = daemon.client()
    for sandbox in ("workspace-write", "read-only", "danger-full-access"):
        # cwd is the directory that holds the allow dirs: a writable root.
        r = client.run(["sh", "-c", _probe(paths) + f"; touch {keys.allow}/mine.key 2>/dev/null; echo touched=$?; "
                        f"mkdir {home}/keys2 2>/dev/null; echo mkdir=$?"], cwd=base, sandbox=sandbox)
        out = r.stdout.decode() + r.stderr.decode()
        assert not _secrets_in(out, home, keys.allow, keys.executors, secret), (sandbox, out)
        for name in ("late.key", "client.key", "worker.key", "config.toml", "sluice config"):
            assert name not in out, (sandbox, name, out)
        assert "touched=0" not in out and "mkdir=0" not in out, (sandbox, out)
    assert sorted(os.listdir(keys.allow)) == ["client.key"]
    assert not os.path.exists(os.path.join(home, "keys2"))


@pytest.mark.timeout(90)
def test_an_allow_dir_deep_in_a_workspace_can_be_neither_written_nor_moved(factory, base):
    """The allow dir lies two levels down in the command's directory. Hidden by path, its
    parent could be renamed (the daemon keeps reading the directory it opened, now
    elsewhere and no longer hidden) for a second command to plant a key there; every
    directory on the way to it is a mount point in the sandbox, so none can be renamed."""
    keys = make_keys(os.path.join(base, "cfg"))
    attacker, _ = keys.pair("attacker", allowed=False)
    shutil.copy(attacker, base)
    plant = (f"mv {base}/cfg {base}/moved; echo moved=$?; cp {base}/attacker.key {base}/moved/allow/ 2>/dev/null "
             f"|| cp {base}/attacker.key {base}/cfg/allow/ 2>/dev/null; echo planted=$?; touch {base}/cfg/ok; "
             "echo wrote=$?")
    # Where it should, it works: the same script, unsandboxed, on a copy of the layout.
    copy = os.path.join(base, "copy")
    shutil.copytree(os.path.join(base, "cfg"), os.path.join(copy, "cfg"))
    shutil.copy(attacker, copy)
    r = subprocess.run(["sh", "-c", plant.replace(base, copy)], capture_output=True, text=True, timeout=30)
    assert "moved=0" in r.stdout and "planted=0" in r.stdout, r.stdout + r.stderr
    assert "attacker.key" in os.listdir(os.path.join(copy, "moved", "allow"))
    daemon, endpoint = _listening(factory, keys, base, executors=1)
    client = daemon.client()
    for _ in range(2):  # the second command would find the first one's rename
        r = client.run(["sh", "-c", plant], cwd=base)
        out = r.stdout.decode()
        assert "moved=0" not in out and "planted=0" not in out and "wrote=0" in out, out + r.stderr.decode()
    assert os.listdir(keys.allow) == ["client.key"] and not os.path.exists(os.path.join(base, "moved"))
    r = run_sluice(["run", *connect_args(keys, endpoint, "attacker"), "--", "true"], env=subprocess_env())
    assert r.returncode != 0 and "refused our key" in one_line(r.stderr), r.stderr


@pytest.mark.timeout(90)
def test_a_daemon_started_later_has_its_allow_dir_hidden_by_sandboxes_already_there(factory, base):
    """Daemon A runs (its executor and warm sandboxes made) before daemon B starts with an
    allow dir in A's commands' workspace. B publishes it in sluice's home: A's next
    command, and ``sluice sandbox``, hide it too; once B stops, it is visible again."""
    keys = make_keys(os.path.join(base, "cfg"))
    attack = (f"ls -A {keys.allow} 2>/dev/null; cp {keys.dir}/stranger.key {keys.allow}/ 2>/dev/null; "
              f"echo planted=$?; mv {base}/cfg {base}/moved 2>/dev/null; echo moved=$?")
    first = factory.start(executors=1, env=_home_env(base))
    client = first.client()
    # Where it should, it works: before B, the dir is a directory of the workspace like any.
    r = client.run(["sh", "-c", f"ls -A {keys.allow}; touch {keys.allow}/probe && rm {keys.allow}/probe; "
                    "echo wrote=$?"], cwd=base)
    assert r.stdout.decode().split() == ["client.key", "wrote=0"], r.stderr
    second, _ = _listening(factory, keys, base)
    for r in (client.run(["sh", "-c", attack], cwd=base),
              subprocess.run([*sluice_argv(), "sandbox", "--", "sh", "-c", attack], cwd=base, capture_output=True,
                             env=subprocess_env(**_home_env(base)), timeout=30)):
        out = r.stdout.decode()
        assert out.split() == ["planted=1", "moved=1"], out + r.stderr.decode()
    assert os.listdir(keys.allow) == ["client.key"]
    second.stop()
    wait_for(lambda: not os.listdir(os.path.join(base, "home", "hidden")), 10, "B to withdraw what it published")
    r = client.run(["ls", "-A", keys.allow], cwd=base)
    assert r.stdout == b"client.key\n", r.stderr


@pytest.mark.timeout(60)
def test_sluice_sandbox_hides_sluice_home_and_makes_it_first(base):
    home = os.path.join(base, "home")
    env = subprocess_env(**_home_env(base))
    # Missing at first: made (0700) before the command runs, so it cannot plant one.
    r = run_sluice(["sandbox", "--writable", base, "--", "sh", "-c",
                 f"mkdir -p {home}/keys 2>/dev/null; echo planted > {home}/config.toml; echo wrote=$?"], env=env)
    assert "wrote=0" not in r.stdout
    assert stat.S_IMODE(os.stat(home).st_mode) == 0o700 and os.listdir(home) == []
    new_key_pair(os.path.join(home, "keys"), "mine")
    r = run_sluice(["sandbox", "--writable", base, "--", "sh", "-c", _probe([home, os.path.join(home, "keys")])],
                env=env)
    assert not _secrets_in(r.stdout + r.stderr, home) and "mine.key" not in r.stdout, r.stdout


@pytest.mark.timeout(60)
def test_a_remote_executor_hides_its_hosts_sluice_home(factory, keys, base):
    daemon, endpoint = _listening(factory, keys, base)
    # The executor's host has a sluice home of its own (another than the daemon's).
    ex_home = os.path.join(base, "executor-home")
    assert not os.path.exists(ex_home)
    ex = start_executor([], [*connect_args(keys, endpoint, "worker"), "--name", "worker"],
                        subprocess_env(SLUICE_HOME=ex_home, SLUICE_RUNTIME_DIR=os.path.join(base, "ex-rt")),
                        os.path.join(base, "executor.log"))
    try:
        wait_for(lambda: _joined(daemon, "worker"), 15, "the executor to join")
        assert stat.S_IMODE(os.stat(ex_home).st_mode) == 0o700
        new_key_pair(os.path.join(ex_home, "keys"), "host")
        r = daemon.client().run(["sh", "-c", _probe([ex_home, os.path.join(ex_home, "keys"),
                                                     os.path.join(keys.dir, "worker.key_secret")])], cwd=ROOT)
        out = r.stdout.decode() + r.stderr.decode()
        assert not _secrets_in(out, ex_home, os.path.join(keys.dir, "worker.key_secret")), out
        assert "host.key" not in out
    finally:
        kill_tree(ex)
