"""Over the network on loopback: keys, a daemon listening with CurveZMQ and ZAP, frontends
and ``sluice executor`` connecting over tcp, and what is refused (and logged) on the way.

Real processes and sockets throughout; two hosts joined by a link that fails are in
``test_netns.py``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time

import psutil
import pytest
import zmq

from broker.client import Client
from broker.net.keys import Remote, load_public_key
from broker.wire import frames as wire
from tests.support.harness import at_niceness, daemons, short_tempdir, subprocess_env, wait_for
from tests.support.remote_helpers import (
    connect_args,
    free_port,
    kill_tree,
    listen_args,
    log_events,
    make_keys,
    marker,
    one_line,
    run_sluice,
    sleepers,
    start_executor,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox")


@pytest.fixture(scope="module")
def base():
    path = short_tempdir("sl-net-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def keys(base):
    return make_keys(base)


@pytest.fixture(scope="module")
def net(keys):
    """One daemon (one local executor) listening on a loopback port, for the module."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with daemons() as factory:
        yield factory.start(executors=1, args=listen_args(keys, endpoint)), endpoint






# -- keys ------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_keys_new_writes_a_pair_and_refuses_to_overwrite(sluice, base):
    home = os.path.join(base, "home")
    env = subprocess_env(SLUICE_HOME=home)
    r = run_sluice(["keys", "new", "laptop"], env)
    assert r.returncode == 0, r.stderr
    public_path = os.path.join(home, "keys", "laptop.key")
    secret_path = public_path + "_secret"
    assert stat.S_IMODE(os.stat(public_path).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(secret_path).st_mode) == 0o600
    assert public_path in r.stdout and secret_path in r.stdout
    assert load_public_key(public_path).decode() in r.stdout
    with open(secret_path) as f:
        before = f.read()

    again = run_sluice(["keys", "new", "laptop"], env)
    assert again.returncode == 2
    assert "exists already" in one_line(again.stderr)
    with open(secret_path) as f:
        assert f.read() == before

    elsewhere = os.path.join(base, "elsewhere")
    r = run_sluice(["keys", "new", "ci", "--dir", elsewhere], env)
    assert r.returncode == 0 and os.path.exists(os.path.join(elsewhere, "ci.key_secret"))

    for bad in ("../escape", ".hidden", ""):
        r = run_sluice(["keys", "new", bad], env)
        assert r.returncode == 2
        assert "bad key name" in one_line(r.stderr)
    assert not os.path.exists(os.path.join(base, "escape.key"))


@pytest.mark.timeout(30)
def test_daemon_listen_mistakes_are_one_line(sluice, keys, base):
    env = subprocess_env(SLUICE_RUNTIME_DIR=short_tempdir())
    secret = os.path.join(keys.dir, "daemon.key_secret")
    loose = os.path.join(base, "loose.key_secret")
    shutil.copy(secret, loose)
    os.chmod(loose, 0o644)
    cases = [
        (["--listen", "tcp://127.0.0.1:1"], 2, "never listens unauthenticated"),
        (["--key", secret, "--allow", keys.allow], 2, "go with --listen"),
        (["--listen", "127.0.0.1:5", "--key", secret, "--allow", keys.allow], 2, "tcp://HOST:PORT"),
        (["--listen", "tcp://127.0.0.1:1", "--key", os.path.join(keys.dir, "daemon.key"), "--allow", keys.allow], 2,
         "holds no secret key"),
        (["--listen", "tcp://127.0.0.1:1", "--key", loose, "--allow", keys.allow], 2, "chmod 600"),
        (["--listen", "tcp://127.0.0.1:1", "--key", secret, "--allow", os.path.join(base, "none")], 2, "does not exist"),
    ]
    for args, code, words in cases:
        r = run_sluice(["daemon", "--executors", "0", *args], env)
        assert r.returncode == code, (args, r.stderr)
        assert words in one_line(r.stderr), r.stderr

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = run_sluice(["daemon", "--executors", "0", *listen_args(keys, f"tcp://127.0.0.1:{port}")], env)
    assert r.returncode == 1
    assert "Address already in use" in next(line for line in r.stderr.splitlines() if line.startswith("sluice:"))


# -- frontends over tcp ----------------------------------------------------------------


@pytest.mark.timeout(30)
def test_run_over_tcp_with_an_allowed_key(sluice, keys, net):
    daemon, endpoint = net
    r = run_sluice(["run", *connect_args(keys, endpoint), "--", "echo", "hi"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == "hi\n"
    key = keys.public("client")
    joined = wait_for(lambda: [e for e in log_events(daemon.log(), "peer joined") if e.get("key") == key], 5,
                      "the frontend's join, with its key, in the log")
    assert joined[0]["role"] == "frontend" and joined[0]["name"] == "sluice run"
    accepted = [e for e in log_events(daemon.log(), "connection accepted") if e["key"] == key]
    assert accepted and accepted[0]["name"] == "client" and accepted[0]["address"] == "127.0.0.1"


@pytest.mark.timeout(30)
def test_unknown_key_is_refused_at_once_and_logged(sluice, keys, net):
    daemon, endpoint = net
    t0 = time.monotonic()
    r = run_sluice(["run", *connect_args(keys, endpoint, "stranger"), "--", "echo", "hi"])
    elapsed = time.monotonic() - t0
    assert r.returncode == 125 and r.stdout == ""
    assert one_line(r.stderr) == f"sluice: error: the daemon at {endpoint} refused our key (it is not in its allow-list)"
    assert elapsed < 5, f"took {elapsed:.1f} s: the refusal should not wait for a timeout"
    key = keys.public("stranger")
    refusal = wait_for(lambda: [e for e in log_events(daemon.log(), "connection refused") if e.get("key") == key], 5,
                       "the refusal in the daemon log")[0]
    assert refusal["why"] == "key not in the allow-list" and refusal["address"] == "127.0.0.1"
    assert refusal["level"] == "warning"


@pytest.mark.timeout(30)
def test_wrong_server_key_fails_the_handshake_with_one_line(sluice, keys, net):
    _, endpoint = net
    args = ["--connect", endpoint, "--server-key", os.path.join(keys.dir, "client.key"),
            "--key", os.path.join(keys.dir, "client.key_secret")]
    r = run_sluice(["run", *args, "--", "true"])
    assert r.returncode == 125
    assert "is --server-key that daemon's public key?" in one_line(r.stderr)


@pytest.mark.timeout(30)
def test_a_plain_zmq_peer_gets_nothing_and_reaches_nothing(keys, net):
    daemon, endpoint = net
    joined_before = len(log_events(daemon.log(), "peer joined"))
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        # Even with the daemon's real token: without CurveZMQ nothing gets through.
        hello = wire.Hello(role=wire.ROLE_FRONTEND, token=daemon.runtime.read_token(), pid=os.getpid(), name="plain")
        sock.send_multipart(wire.message(wire.HELLO, body=hello))
        sock.send_multipart([wire.header(wire.PING)])
        assert sock.poll(1500) == 0
    finally:
        ctx.destroy(linger=0)
    wait_for(lambda: log_events(daemon.log(), "connection refused before authentication"), 5,
             "the failed handshake in the log")
    log = daemon.log()
    assert len(log_events(log, "peer joined")) == joined_before
    assert '"plain"' not in log
    assert not log_events(log, "message before hello dropped")


@pytest.mark.timeout(30)
def test_a_key_added_to_the_allow_dir_is_accepted_without_restart(keys, net):
    daemon, endpoint = net
    public, secret = keys.pair("newcomer", allowed=False)
    remote = Remote.from_files(endpoint, os.path.join(keys.dir, "daemon.key"), secret)
    with pytest.raises(Exception, match="refused our key"):
        Client.connect(remote=remote, timeout=5)
    keys.allow_key(public)
    with Client.connect(remote=remote, name="newcomer", timeout=5) as client:
        assert client.run(["echo", "welcome"], cwd="/tmp").stdout == b"welcome\n"
    loaded = [e for e in log_events(daemon.log(), "allow-list loaded") if e["role"] == "frontend"]
    assert loaded[-1]["keys"] == ["client", "newcomer"]


@pytest.mark.timeout(30)
def test_the_agent_role_is_refused_over_tcp(keys, net):
    _, endpoint = net
    remote = Remote.from_files(endpoint, os.path.join(keys.dir, "daemon.key"), os.path.join(keys.dir, "client.key_secret"))
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        remote.apply(sock)
        sock.connect(endpoint)
        sock.send_multipart(wire.message(wire.HELLO, body=wire.Hello(role=wire.ROLE_AGENT, token="", pid=1)))
        assert sock.poll(5000)
        head, body = sock.recv_multipart()
        assert wire.decode_header(head).kind == wire.ERROR
        assert "agent role is not available over the network" in wire.decode(wire.ERROR, body).message
    finally:
        ctx.destroy(linger=0)


@pytest.mark.timeout(30)
def test_a_local_peer_cannot_pose_as_a_network_peer(net):
    daemon, _ = net
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        # The byte the daemon puts in front of network peers' identities.
        sock.setsockopt(zmq.ROUTING_ID, b"\x01posing")
        sock.connect(daemon.runtime.endpoint)
        sock.send_multipart(wire.message(wire.HELLO, body=wire.Hello(role=wire.ROLE_FRONTEND, token="", pid=1)))
        assert sock.poll(1500) == 0
    finally:
        ctx.destroy(linger=0)
    wait_for(lambda: "local peer with a reserved routing id ignored" in daemon.log(), 5, "the refusal in the log")


# -- sluice executor over tcp ----------------------------------------------------------


@pytest.fixture
def pool(keys):
    """A daemon with no executors of its own, listening on loopback."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with daemons() as factory:
        yield factory, factory.start(executors=0, args=listen_args(keys, endpoint)), endpoint


def _executor_args(keys, endpoint: str, name: str) -> list[str]:
    args = connect_args(keys, endpoint, "worker")
    return [*args, "--slots", "4", "--name", name]


@pytest.mark.timeout(40)
def test_sluice_executor_runs_commands_sandboxed_and_drains_on_sigterm(keys, pool, base):
    _, daemon, endpoint = pool
    log_path = os.path.join(base, "executor-drain.log")
    ex = start_executor([], _executor_args(keys, endpoint, "remote-1"), subprocess_env(), log_path)
    try:
        client = daemon.client()
        started = []
        r = client.run(["sh", "-c", "echo hi; touch /etc/sluice-remote-probe; echo touch=$?"], cwd="/tmp",
                       on_started=started.append)
        assert r.stdout.startswith(b"hi\n") and b"touch=1" in r.stdout, r
        assert started[0].executor == "remote-1"
        assert not os.path.exists("/etc/sluice-remote-probe")
        # The executor's secret key is out of the command's reach (it reads as empty).
        r = client.run(["cat", os.path.join(keys.dir, "worker.key_secret")], cwd="/tmp")
        assert r.stdout == b"", r

        mark = marker()
        call = client.submit(["sh", "-c", f"sleep {mark}"], cwd="/tmp")
        wait_for(lambda: sleepers(mark), 10, "the command to start")
        ex.send_signal(signal.SIGTERM)
        result = client.wait(call, 10)
        assert result.aborted and "executor shutting down" in result.error
        assert ex.wait(10) == 0
        assert sleepers(mark) == []
        wait_for(lambda: [e for e in log_events(daemon.log(), "executor left") if e["name"] == "remote-1"], 5,
                 "the executor's bye")
    finally:
        kill_tree(ex)


@pytest.mark.timeout(30)
def test_sluice_executor_with_a_refused_key_exits_2_at_once(keys, net, base):
    _, endpoint = net
    args = connect_args(keys, endpoint, "stranger")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "broker", "executor", *args], capture_output=True, text=True,
                       env=subprocess_env(), timeout=20, stdin=subprocess.DEVNULL)
    assert r.returncode == 2
    assert one_line(r.stderr) == f"sluice: error: the daemon at {endpoint} refused our key (it is not in its allow-list)"
    assert time.monotonic() - t0 < 10
    missing = subprocess.run([sys.executable, "-m", "broker", "executor", "--connect", endpoint, "--key", "/nonexistent"],
                             capture_output=True, text=True, env=subprocess_env(), timeout=20)
    assert missing.returncode == 2 and "--server-key" in one_line(missing.stderr)


@pytest.mark.timeout(40)
def test_sluice_executor_nice_puts_its_commands_there_and_not_itself(keys, pool, base):
    """The executor stays at its niceness (it answers the daemon's heartbeats); its
    commands, plain and on a terminal, run at ``--nice``."""
    _, daemon, endpoint = pool
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    if ours > 12:
        pytest.skip(f"this process already runs at niceness {ours}")
    log_path = os.path.join(base, "executor-nice.log")
    ex = start_executor([], [*_executor_args(keys, endpoint, "remote-nice"), "--nice", str(ours + 7)],
                        subprocess_env(), log_path)
    try:
        client = daemon.client()
        argv = ["cut", "-d", " ", "-f", "19", "/proc/self/stat"]
        assert client.run(argv, cwd="/tmp").stdout == f"{ours + 7}\n".encode()
        assert client.run(argv, cwd="/tmp", tty=(24, 80)).stdout == f"{ours + 7}\r\n".encode()
        assert psutil.Process(ex.pid).nice() == ours
        with open(log_path, encoding="utf-8") as f:
            assert [e["command_nice"] for e in log_events(f.read(), "executor ready")] == [ours + 7]
    finally:
        kill_tree(ex)


@pytest.mark.timeout(30)
def test_sluice_executor_nice_mistakes_are_one_line(keys, base):
    """Out of range, and below the executor's own without the privilege to go there
    (CAP_SYS_NICE dropped, RLIMIT_NICE 0): exit 2 and one line, before anything starts."""
    args = connect_args(keys, "tcp://127.0.0.1:9", "worker")
    r = subprocess.run([sys.executable, "-m", "broker", "executor", *args, "--nice", "20"], capture_output=True,
                       text=True, env=subprocess_env(), timeout=20, stdin=subprocess.DEVNULL, check=False)
    assert r.returncode == 2 and "--nice must be a whole number from -20 to 19, got '20'" in one_line(r.stderr)
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    prefix, preexec = at_niceness(ours + 1, privileged=False)
    r = subprocess.run([*prefix, sys.executable, "-m", "broker", "executor", *args, "--nice", str(ours)],
                       capture_output=True, text=True, env=subprocess_env(), timeout=20, stdin=subprocess.DEVNULL,
                       check=False, preexec_fn=preexec)
    assert r.returncode == 2
    assert one_line(r.stderr) == (f"sluice: error: --nice {ours}: this executor runs at niceness {ours + 1}, and going "
                                  f"below it needs CAP_SYS_NICE or RLIMIT_NICE (Permission denied)")


@pytest.mark.timeout(60)
def test_sluice_executor_rejoins_a_daemon_that_restarted(keys, base):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    log_path = os.path.join(base, "executor-rejoin.log")
    ex = None
    try:
        with daemons() as factory:
            first = factory.start(executors=0, args=listen_args(keys, endpoint))
            ex = start_executor([], _executor_args(keys, endpoint, "remote-2"), subprocess_env(), log_path)
            assert first.client().run(["echo", "one"], cwd="/tmp").stdout == b"one\n"
            assert first.stop() == []
            t0 = time.monotonic()
            # A new daemon on the same endpoint and key knows nothing of the executor.
            second = factory.start(executors=0, args=listen_args(keys, endpoint))
            started = time.monotonic()
            r = second.client().run(["echo", "two"], cwd="/tmp", wait_timeout=20)
            print(f"\nrejoined a restarted daemon {time.monotonic() - started:.2f} s after it was up "
                  f"({time.monotonic() - t0:.2f} s after the restart began)")
            assert r.stdout == b"two\n"
        assert ex.poll() is None  # the executor outlived both daemons
        with open(log_path, encoding="utf-8") as f:
            rejoins = log_events(f.read(), "lost the broker; cancelling its commands and joining again")
        # It pinged the quiet broker, and the new one answered "send hello first".
        assert [e["why"] for e in rejoins] == ["the broker no longer knows this executor"]
    finally:
        if ex is not None:
            kill_tree(ex)


@pytest.mark.timeout(40)
def test_daemon_status_shows_remote_executors_and_the_listen_address(sluice, keys, pool, base):
    _, daemon, endpoint = pool
    ex = start_executor([], _executor_args(keys, endpoint, "remote-st"), subprocess_env(), os.path.join(base, "st.log"))
    try:
        client = daemon.client()

        def remote_executors():
            return [e for e in client.daemon_info().executors if e.remote]

        wait_for(remote_executors, 15, "the remote executor to join")
        [remote] = remote_executors()
        assert (remote.name, remote.slots, remote.busy) == ("remote-st", 4, 0)
        p = subprocess.run([*sluice, "daemon", "status"], env=daemon.env_for_children(), capture_output=True,
                           timeout=30)
        text = p.stdout.decode()
        assert p.returncode == 0, p.stderr
        assert f"listening:  {endpoint}" in text
        assert "executors:  0 local, 1 remote (0 of 4 slots busy, 0 interactive: remote-st)" in text, text
    finally:
        kill_tree(ex)
