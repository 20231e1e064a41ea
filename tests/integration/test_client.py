"""broker.client.connection against a real daemon, real executors and the real sandbox."""

from __future__ import annotations

import os
import random
import signal
import time

import psutil
import pytest

from broker.client import Client, DaemonError, Interrupted, Result, UsageError, daemon_status, make_request, stop_daemon
from broker.net import peer
from broker.wire import frames as wire
from tests.support.harness import live_processes, wait_for


def _marker_sleep() -> list[str]:
    """A sleep nobody else runs, so it can be found (and must be gone) afterwards."""
    return ["sleep", f"{random.randint(1000, 9999)}.{random.randint(100, 999)}"]


@pytest.fixture
def client(module_daemon):
    c = module_daemon.client()
    yield c
    c.close()


# -- connecting -----------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_autostart_from_nothing(runtime_dir):
    assert not daemon_status(runtime_dir).running
    with Client.connect(runtime_dir, timeout=30) as c:
        status = daemon_status(runtime_dir)
        assert status.running and status.pid
        r = c.run(["echo", "hello"])
        assert r.stdout == b"hello\n" and r.returncode == 0
    # A second client finds the running daemon instead of starting another.
    with Client.connect(runtime_dir, timeout=30) as c:
        assert daemon_status(runtime_dir).pid == status.pid
        assert c.run(["true"]).returncode == 0
    assert stop_daemon(runtime_dir) == status.pid
    assert not daemon_status(runtime_dir).running
    assert not psutil.pid_exists(status.pid) or psutil.Process(status.pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.timeout(30)
def test_no_autostart_is_a_clear_error(runtime_dir):
    with pytest.raises(DaemonError, match="no daemon is running"):
        Client.connect(runtime_dir, autostart=False)
    assert not daemon_status(runtime_dir).running


@pytest.mark.timeout(30)
def test_daemon_that_cannot_start_is_reported(runtime_dir):
    # The runtime dir path is a file: the daemon cannot use it.
    blocker = os.path.join(runtime_dir.path, "file")
    with open(blocker, "w") as f:
        f.write("x")
    from broker.net.runtime import RuntimeDir

    with pytest.raises(DaemonError) as e:
        Client.connect(RuntimeDir(blocker), timeout=20)
    assert "\n" not in str(e.value)


@pytest.mark.timeout(30)
def test_wrong_token_is_refused(daemon):
    real = daemon.runtime.read_token()
    with open(daemon.runtime.token_path, "w") as f:
        f.write("0" * 64)
    try:
        with pytest.raises(DaemonError) as e:
            Client.connect(daemon.runtime, autostart=False, timeout=3)
        assert "\n" not in str(e.value)
        assert "refused" in str(e.value) or "answer" in str(e.value)
    finally:
        with open(daemon.runtime.token_path, "w") as f:
            f.write(real)
    with daemon.client() as c:
        assert c.run(["true"]).returncode == 0


# -- running ----------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_run_echo(client):
    r = client.run(["echo", "hello", "world"])
    assert isinstance(r, Result)
    assert r.stdout == b"hello world\n"
    assert r.stderr == b""
    assert (r.exit_code, r.signal, r.timed_out, r.aborted, r.error) == (0, None, False, False, None)
    assert r.returncode == 0 and r.ok
    assert r.argv == ["echo", "hello", "world"]
    assert r.duration_s > 0


@pytest.mark.timeout(30)
def test_cwd_and_env(client, tmp_path):
    r = client.run(["sh", "-c", "pwd; echo $GREETING; echo ${MY_API_TOKEN:-hidden}"], cwd=str(tmp_path),
                   env={"PATH": os.environ["PATH"], "GREETING": "hi", "MY_API_TOKEN": "s3cret"})
    assert r.stdout.decode().splitlines() == [str(tmp_path), "hi", "hidden"]
    r = client.run(["sh", "-c", "echo $MY_API_TOKEN"], env={"PATH": os.environ["PATH"], "MY_API_TOKEN": "s3cret"},
                   env_passthrough=["MY_API_TOKEN"])
    assert r.stdout == b"s3cret\n"


@pytest.mark.timeout(30)
def test_streaming_callback_order(client):
    seen = []
    started = []

    def on_output(call, stream, chunk):
        assert call.started, "output before started"
        seen.append((stream, bytes(chunk)))

    r = client.run(
        ["sh", "-c", "echo a; sleep 0.2; echo b >&2; sleep 0.2; echo c; sleep 0.2; echo d >&2"],
        on_output=on_output,
        on_started=lambda call: started.append(call.pid),
    )
    assert r.returncode == 0
    assert len(started) == 1 and started[0] > 0
    assert seen == [(1, b"a\n"), (2, b"b\n"), (1, b"c\n"), (2, b"d\n")]
    assert r.stdout == b"a\nc\n" and r.stderr == b"b\nd\n"


@pytest.mark.timeout(30)
def test_output_streams_while_the_command_runs(client):
    chunks = []
    call = client.submit(["sh", "-c", "echo first; exec sleep 60"], on_output=lambda c, s, b: chunks.append(bytes(b)))
    deadline = time.monotonic() + 10
    while not chunks:
        assert time.monotonic() < deadline, "no output while the command was running"
        client.poll(0.5)
    assert chunks == [b"first\n"] and not call.done
    client.cancel(call)
    r = client.wait(call, 10)
    assert r.aborted and r.returncode == 130


@pytest.mark.timeout(30)
@pytest.mark.parametrize("code", [0, 1, 3, 42, 255])
def test_exit_codes(client, code):
    r = client.run(["sh", "-c", f"exit {code}"])
    assert r.exit_code == code and r.returncode == code and r.signal is None


@pytest.mark.timeout(30)
def test_killed_by_signal(client):
    r = client.run(["sh", "-c", "kill -KILL $$"])
    assert r.signal == signal.SIGKILL and r.exit_code is None
    assert r.returncode == 128 + 9
    r = client.run(["sh", "-c", "kill -TERM $$"])
    assert r.returncode == 128 + 15


@pytest.mark.timeout(30)
def test_timeout_is_124(client):
    marker = _marker_sleep()
    t0 = time.monotonic()
    r = client.run(marker, timeout_ms=300)
    assert r.timed_out and r.returncode == 124
    assert time.monotonic() - t0 < 10
    assert not live_processes(marker)


@pytest.mark.timeout(30)
def test_command_not_found_is_127(client):
    r = client.run(["no-such-command-xyz"])
    assert r.returncode == 127
    assert r.error and "not found" in r.error


@pytest.mark.timeout(30)
def test_cancel_kills_the_whole_tree(client):
    marker = _marker_sleep()
    m = " ".join(marker)
    call = client.submit(["sh", "-c", f"{m} & setsid {m} & (trap '' TERM; {m}) & wait"])
    wait_for(lambda: client.poll(0.05) is not None and len(live_processes(marker)) == 3, what="the sleeps")
    assert call.started and not call.done
    client.cancel(call)
    r = client.wait(call, 15)
    assert r.aborted and r.returncode == 130
    # The call ends only once its tree is dead: nothing may be left, not even briefly.
    assert live_processes(marker) == []
    client.cancel(call)  # a no-op once done


@pytest.mark.timeout(60)
def test_64_concurrent_runs(client):
    calls = [client.submit(["sh", "-c", f"echo out-{i}; echo err-{i} >&2; exit {i % 7}"]) for i in range(64)]
    results = client.wait_all(calls)
    for i, r in enumerate(results):
        assert r.stdout == f"out-{i}\n".encode(), r
        assert r.stderr == f"err-{i}\n".encode(), r
        assert r.returncode == i % 7
    assert client.in_flight == []


@pytest.mark.timeout(120)
def test_100_mb_exact_byte_count(client):
    total = 100_000_000
    got = [0, 0]

    def count(call, stream, chunk):
        got[stream - 1] += len(chunk)

    r = client.run(["head", "-c", str(total), "/dev/zero"], on_output=count)
    assert r.returncode == 0
    assert got == [total, 0]
    assert len(r.stdout) == wire.DEFAULT_CAPTURE_LIMIT
    assert r.stdout_dropped == total - wire.DEFAULT_CAPTURE_LIMIT
    assert r.stdout == b"\0" * wire.DEFAULT_CAPTURE_LIMIT


@pytest.mark.timeout(30)
def test_capture_limit_and_dropped(client):
    r = client.run(["sh", "-c", "head -c 5000 /dev/zero | tr '\\0' o; head -c 300 /dev/zero | tr '\\0' e >&2"],
                   capture_limit=1000)
    assert r.stdout == b"o" * 1000 and r.stdout_dropped == 4000
    assert r.stderr == b"e" * 300 and r.stderr_dropped == 0


@pytest.mark.timeout(30)
def test_quiet_command_outlives_heartbeats(client):
    # Several heartbeats without any output: the client must keep answering pings.
    r = client.run(["sleep", str(client.heartbeat_s * 6)])
    assert r.returncode == 0


@pytest.mark.timeout(30)
def test_wait_timeout_leaves_the_call_running(client):
    call = client.submit(["sleep", "30"])
    with pytest.raises(TimeoutError):
        client.wait(call, 0.3)
    assert not call.done
    client.cancel(call)
    assert client.wait(call, 10).aborted


@pytest.mark.alone
@pytest.mark.timeout(30)
def test_signal_interrupts_a_wait_at_once(client):
    call = client.submit(["sleep", "30"])
    with client.catch_signals([signal.SIGUSR1]):
        wait_for(lambda: client.poll(0.05) is not None and call.started, what="start")
        os.kill(os.getpid(), signal.SIGUSR1)
        t0 = time.monotonic()
        with pytest.raises(Interrupted) as e:
            client.wait(call)
        assert e.value.signum == signal.SIGUSR1
        assert time.monotonic() - t0 < 0.5
        client.cancel(call)
        assert client.wait(call, 10).aborted


@pytest.mark.timeout(60)
def test_signal_command_goes_to_the_command_which_decides(client):
    """Unlike cancel, which kills the tree: the command's trap runs and it exits as it likes."""
    chunks = []
    call = client.submit(["sh", "-c", "trap 'echo got-INT; exit 5' INT; echo ready; while :; do sleep 0.1; done"],
                         on_output=lambda call, stream, data: chunks.append(bytes(data)))
    wait_for(lambda: client.poll(0.05) is not None and b"ready" in b"".join(chunks), what="ready")
    client.signal_command(call, signal.SIGINT)
    result = client.wait(call, 30)
    assert (result.returncode, result.aborted) == (5, False) and b"got-INT" in b"".join(chunks)
    client.signal_command(call, signal.SIGINT)  # ended: nothing is sent
    with pytest.raises(UsageError, match="signal 9 cannot be sent to a command .these can: SIGHUP, SIGINT"):
        client.signal_command(call, signal.SIGKILL)


@pytest.mark.timeout(30)
def test_usage_errors_are_one_line():
    cases = [
        dict(argv=[]),
        dict(argv="echo hi"),
        dict(argv=["true"], sandbox="bogus"),
        dict(argv=["true"], cwd="/no/such/dir"),
        dict(argv=["true"], writable=["relative/path"]),
        dict(argv=["true"], writable=["/no/such/dir"]),
        dict(argv=["true"], timeout_ms=0),
        dict(argv=["true"], capture_limit=-1),
    ]
    for kw in cases:
        argv = kw.pop("argv")
        with pytest.raises(UsageError) as e:
            make_request(argv, **kw)
        assert str(e.value) and "\n" not in str(e.value), kw


@pytest.mark.timeout(30)
def test_policy_goes_on_the_wire(tmp_path):
    req = make_request(["true"], cwd=str(tmp_path), sandbox="read-only", writable=[str(tmp_path)], network=True)
    assert req.sandbox.permissions == [
        "disk-full-read-access",
        {"disk-write-folder": {"folder": str(tmp_path)}},
        "network-full-access",
    ]
    assert req.cwd == str(tmp_path)


# -- the daemon going away ------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_daemon_killed_mid_call_fails_the_call(daemon):
    c = daemon.client()
    call = c.submit(["sleep", "30"])
    wait_for(lambda: c.poll(0.05) is not None and call.started, what="start")
    os.kill(daemon.pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(DaemonError) as e:
        c.wait(call, 30)
    assert "daemon" in str(e.value) and "\n" not in str(e.value)
    assert time.monotonic() - t0 < 15
    with pytest.raises(DaemonError):
        c.submit(["true"])
    c.close()


@pytest.mark.timeout(60)
def test_a_hung_daemon_is_waited_for_then_given_up(daemon, monkeypatch):
    # A shorter patience than the real one (a minute), still longer than the daemon's own check.
    patience = peer.DEAD_AFTER_HEARTBEATS + 2
    monkeypatch.setattr(peer, "PATIENCE_HEARTBEATS", patience)
    c = daemon.client()
    call = c.submit(["sleep", "60"])
    notes = []
    call.on_notice = lambda call, note: notes.append(note)
    wait_for(lambda: c.poll(0.05) is not None and call.started, what="start")
    os.kill(daemon.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(DaemonError, match="stopped answering"):
            c.wait(call, 30)
        assert time.monotonic() - t0 > patience
        assert any("has not answered for" in note and "waiting for it" in note for note in notes), notes
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
    c.close()


@pytest.mark.timeout(60)
def test_daemon_stopped_mid_call_ends_the_call(daemon):
    c = daemon.client()
    call = c.submit(["sleep", "30"])
    wait_for(lambda: c.poll(0.05) is not None and call.started, what="start")
    os.kill(daemon.pid, signal.SIGTERM)
    try:
        r = c.wait(call, 30)
    except DaemonError:
        pass  # the connection went before the daemon's farewell arrived: also fine
    else:
        assert r.returncode != 0 and (r.error or r.aborted or r.signal)
    c.close()


def test_paths_for_another_host_are_not_checked_here():
    with pytest.raises(UsageError, match="does not exist"):
        make_request(["true"], cwd="/no/such/dir/here")
    req = make_request(["true"], cwd="/no/such/dir/here", writable=["/elsewhere"], check_paths=False)
    assert req.cwd == "/no/such/dir/here"
    with pytest.raises(UsageError, match="absolute"):
        make_request(["true"], cwd="/", writable=["relative"], check_paths=False)
