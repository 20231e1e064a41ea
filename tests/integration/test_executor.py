"""The executor worker as a real process, against a ROUTER this test binds and drives.

The test plays the broker: it checks the hello, answers welcome, sends run / ack /
cancel / ping, and reads started / out / exit exactly as the broker would. Commands run
in the real kernel sandbox.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import msgspec
import psutil
import pytest
import zmq

from broker.wire import frames as wire
from executor.call import PACE_S
from landlock_helper.policy import SandboxPolicy
from tests.support.harness import SANDBOX_PYTHON

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
READ_ONLY = ["disk-full-read-access"]


class Peer:
    """What the test broker knows about the executor that connected."""

    def __init__(self, identity: bytes, hello: wire.Hello) -> None:
        self.identity = identity
        self.hello = hello


class Result:
    def __init__(self) -> None:
        self.started: wire.Started | None = None
        self.out: dict[int, bytearray] = {wire.STDOUT: bytearray(), wire.STDERR: bytearray()}
        self.chunks: list[tuple[float, int, int]] = []  # (arrival, stream, size)
        self.exit: wire.ExitStatus | None = None
        self.exit_at = 0.0

    @property
    def stdout(self) -> bytes:
        return bytes(self.out[wire.STDOUT])

    @property
    def stderr(self) -> bytes:
        return bytes(self.out[wire.STDERR])


class Broker:
    def __init__(self) -> None:
        # ipc:// paths must be short, so not under pytest's tmp_path.
        self.dir = tempfile.mkdtemp(prefix="sx-", dir="/tmp")
        self.endpoint = f"ipc://{self.dir}/b.sock"
        self.token = uuid.uuid4().hex
        self.token_file = os.path.join(self.dir, "token")
        fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, self.token.encode() + b"\n")
        os.close(fd)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.bind(self.endpoint)
        self.proc: subprocess.Popen | None = None
        self.log_path = os.path.join(self.dir, "executor.log")
        self.peer: Peer | None = None
        self.results: dict[str, Result] = {}
        self.other: list[tuple[wire.Header, list[bytes]]] = []

    # -- process --------------------------------------------------------------------

    def start(self, *extra: str, name: str = "ex-test") -> subprocess.Popen:
        env = dict(os.environ)
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        argv = [sys.executable, "-m", "executor", "--connect", self.endpoint, "--token-file", self.token_file]
        if name:
            argv += ["--name", name]
        argv += list(extra)
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        return self.proc

    def logs(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def join(self, heartbeat_s: float = 5.0, extra: tuple[str, ...] = (), **start_kw) -> Peer:
        """Start an executor, check its hello, welcome it."""
        self.start(*extra, **start_kw)
        ident, h, frames = self.recv(timeout=10)
        assert h.kind == wire.HELLO, h
        hello = wire.decode(wire.HELLO, frames[0])
        self.peer = Peer(ident, hello)
        self.send(wire.WELCOME, body=wire.Welcome(peer_id="p1", heartbeat_s=heartbeat_s))
        return self.peer

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.sock.close(linger=0)
        self.ctx.term()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- messages -------------------------------------------------------------------

    def send(self, kind: str, corr: str = "", body=None, **fields) -> None:
        self.sock.send_multipart([self.peer.identity, *wire.message(kind, corr, body, **fields)])

    def send_raw(self, *frames: bytes) -> None:
        self.sock.send_multipart([self.peer.identity, *frames])

    def recv(self, timeout: float = 10.0):
        if not self.sock.poll(int(timeout * 1000)):
            raise TimeoutError(f"nothing from the executor in {timeout} s; its log:\n{self.logs()}")
        ident, hdr, *frames = self.sock.recv_multipart()
        return ident, wire.decode_header(hdr), frames

    def run(self, argv: list[str], cwd: str = "/", permissions=READ_ONLY, **kw) -> str:
        corr = uuid.uuid4().hex
        # The policy goes as raw permissions, unchecked here: the executor is the one to refuse.
        req = msgspec.to_builtins(wire.RunRequest(argv=argv, cwd=cwd, sandbox=SandboxPolicy(), **kw))
        req["sandbox"] = {"permissions": list(permissions)}
        self.results[corr] = Result()
        self.send_raw(wire.header(wire.RUN, corr), msgspec.msgpack.encode(req))
        return corr

    def pump(self, timeout: float = 10.0, ack: bool = True) -> tuple[wire.Header, list[bytes]]:
        """Receive one message; file call messages under their call, acking output."""
        _, h, frames = self.recv(timeout)
        r = self.results.get(h.corr)
        if r is not None and h.kind == wire.OUT:
            r.out[h.stream] += frames[0]
            r.chunks.append((time.monotonic(), h.stream, len(frames[0])))
            if ack:
                self.send(wire.ACK, h.corr, n=len(frames[0]), seq=1)
        elif r is not None and h.kind == wire.STARTED:
            r.started = wire.decode(wire.STARTED, frames[0])
        elif r is not None and h.kind == wire.EXIT:
            r.exit = wire.decode(wire.EXIT, frames[0])
            r.exit_at = time.monotonic()
        else:
            self.other.append((h, frames))
        return h, frames

    def wait_started(self, corr: str, timeout: float = 10.0) -> Result:
        r = self.results[corr]
        deadline = time.monotonic() + timeout
        while r.started is None and r.exit is None:
            self.pump(max(0.01, deadline - time.monotonic()))
        assert r.started is not None, r.exit
        return r

    def wait_exit(self, corr: str, timeout: float = 20.0, ack: bool = True) -> Result:
        r = self.results[corr]
        deadline = time.monotonic() + timeout
        while r.exit is None:
            self.pump(max(0.01, deadline - time.monotonic()), ack=ack)
        return r

    def execute(self, argv: list[str], **kw) -> Result:
        return self.wait_exit(self.run(argv, **kw))


@pytest.fixture
def broker():
    b = Broker()
    yield b
    b.close()


@pytest.fixture
def joined(broker):
    broker.join()
    return broker


def marker() -> str:
    """A unique sleep duration: its text finds every process of one test's tree."""
    return f"{random.randint(500, 999)}.{random.randint(100000, 999999)}"


def sleepers(mark: str, want: int, timeout: float = 5.0) -> None:
    """Wait until ``want`` sleeps of the marker are running (the shell forks them async)."""
    deadline = time.monotonic() + timeout
    while sum(p.name() == "sleep" for p in survivors(mark)) < want:
        assert time.monotonic() < deadline, survivors(mark)
        time.sleep(0.02)


def survivors(mark: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and any(mark in a for a in p.info["cmdline"] or ()):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


# -- joining -------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_hello_carries_token_role_pid_and_slots(broker):
    peer = broker.join(name="ex-1")
    hello = peer.hello
    assert hello.role == wire.ROLE_EXECUTOR
    assert hello.token == broker.token
    assert hello.pid == broker.proc.pid
    assert hello.name == "ex-1"
    assert hello.slots == 256
    assert hello.version == wire.PROTOCOL_VERSION
    # The token never shows in the executor's command line or environment.
    proc = psutil.Process(broker.proc.pid)
    assert broker.token not in " ".join(proc.cmdline())
    assert broker.token not in " ".join(f"{k}={v}" for k, v in proc.environ().items())


@pytest.mark.timeout(30)
def test_slots_flag_is_reported(broker):
    broker.start("--slots", "3", name="")
    _, h, frames = broker.recv()
    assert h.kind == wire.HELLO
    hello = wire.decode(wire.HELLO, frames[0])
    assert hello.slots == 3
    assert hello.name  # a default name is chosen


@pytest.mark.timeout(30)
def test_error_instead_of_welcome_exits_2_with_one_line(broker):
    broker.start()
    ident, h, _ = broker.recv()
    assert h.kind == wire.HELLO
    broker.sock.send_multipart([ident, *wire.message(wire.ERROR, body=wire.ErrorMsg(message="bad token"))])
    assert broker.proc.wait(10) == 2
    err = broker.logs().strip()
    assert "bad token" in err
    assert len(err.splitlines()) == 1
    assert "Traceback" not in err


@pytest.mark.timeout(30)
def test_no_welcome_exits_2_after_10s(broker):
    broker.start()
    _, h, _ = broker.recv()
    assert h.kind == wire.HELLO
    t0 = time.monotonic()
    assert broker.proc.wait(20) == 2
    assert 9 <= time.monotonic() - t0 <= 15
    err = broker.logs().strip()
    assert len(err.splitlines()) == 1 and "broker" in err


@pytest.mark.timeout(30)
def test_unreadable_token_file_exits_2(broker):
    broker.token_file = os.path.join(broker.dir, "missing")
    broker.start()
    assert broker.proc.wait(10) == 2
    err = broker.logs().strip()
    assert len(err.splitlines()) == 1 and "token" in err


# -- running -------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_echo_streams_out_then_exit_0(joined):
    corr = joined.run(["echo", "hello world"])
    r = joined.wait_exit(corr)
    assert r.started is not None and r.started.pid > 0
    assert r.started.executor == "ex-test"
    assert r.stdout == b"hello world\n"
    assert r.chunks and r.chunks[-1][0] <= r.exit_at
    assert r.exit.exit_code == 0 and r.exit.signal is None and r.exit.error is None
    assert r.exit.stdout == b"hello world\n"
    assert not r.exit.timed_out and not r.exit.aborted
    assert 0 < r.exit.duration_s < 10
    # started came first, then output, then exit, and nothing else for this call.
    kinds = [h.kind for h, _ in joined.other]
    assert wire.OUT not in kinds and wire.EXIT not in kinds


@pytest.mark.timeout(30)
def test_stdout_and_stderr_are_separate(joined):
    r = joined.execute(["sh", "-c", "echo to-out; echo to-err >&2; echo more-out"])
    assert r.stdout == b"to-out\nmore-out\n"
    assert r.stderr == b"to-err\n"
    assert r.exit.stdout == b"to-out\nmore-out\n"
    assert r.exit.stderr == b"to-err\n"
    assert {s for _, s, _ in r.chunks} == {wire.STDOUT, wire.STDERR}


@pytest.mark.alone
@pytest.mark.timeout(30)
def test_first_chunk_arrives_before_a_slow_command_exits(joined):
    t0 = time.monotonic()
    corr = joined.run(["sh", "-c", "echo first; sleep 2; echo second"])
    r = joined.wait_exit(corr)
    first_at = r.chunks[0][0]
    assert first_at - t0 < 1.5, "the first line waited for the command"
    assert r.exit_at - first_at >= 1.5
    assert r.stdout == b"first\nsecond\n"
    assert r.exit.exit_code == 0
    assert r.exit.duration_s >= 2


CHATTY = """
import os, sys, time
n, pause = int(sys.argv[1]), float(sys.argv[2])
for i in range(n):
    os.write(1, b"%d" % (i % 10))
    if pause:
        time.sleep(pause)
os.write(2, b"E")
os.write(1, b"!")
"""


@pytest.mark.timeout(30)
def test_chatty_output_is_coalesced_keeping_every_byte_in_order(joined):
    # One-byte writes every 0.2 ms: after a small chunk a stream is read again no sooner
    # than PACE_S later, so at most one chunk per pace (plus the first) goes out.
    writes = 2000
    r = joined.execute([SANDBOX_PYTHON, "-c", CHATTY, str(writes), "0.0002"])
    assert r.exit.exit_code == 0
    assert r.stdout == bytes(b"0123456789"[i % 10] for i in range(writes)) + b"!"
    assert r.stderr == b"E"
    out_chunks = sum(stream == wire.STDOUT for _, stream, _ in r.chunks)
    assert out_chunks <= r.exit.duration_s / PACE_S + 3, (out_chunks, r.exit.duration_s)
    assert out_chunks < writes / 2


@pytest.mark.timeout(30)
def test_chatty_stdout_held_back_still_goes_before_a_later_stderr_write(joined):
    # The stdout bytes waiting for their pace were written before the stderr byte:
    # they go first, as they would unpaced.
    for _ in range(5):
        r = joined.execute([SANDBOX_PYTHON, "-c", CHATTY, "500", "0"])
        assert r.exit.exit_code == 0
        err_at = next(i for i, (_, stream, _) in enumerate(r.chunks) if stream == wire.STDERR)
        # (The "!" written after it may come along with them: read in the same go.)
        assert sum(size for _, stream, size in r.chunks[:err_at] if stream == wire.STDOUT) >= 500, r.chunks


@pytest.mark.timeout(30)
def test_exit_code_and_killing_signal_are_exact(joined):
    r = joined.execute(["sh", "-c", "exit 3"])
    assert (r.exit.exit_code, r.exit.signal) == (3, None)
    r = joined.execute(["sh", "-c", "kill -9 $$"])
    assert (r.exit.exit_code, r.exit.signal) == (None, 9)
    r = joined.execute(["sh", "-c", "kill -TERM $$"])
    assert (r.exit.exit_code, r.exit.signal) == (None, 15)
    assert not r.exit.aborted and not r.exit.timed_out


@pytest.mark.timeout(30)
def test_timeout_reports_124_and_kills_the_tree(joined):
    mark = marker()
    t0 = time.monotonic()
    r = joined.execute(["sh", "-c", f"sleep {mark} & setsid sleep {mark} & wait"], timeout_ms=500)
    assert r.exit.timed_out
    assert (r.exit.exit_code, r.exit.signal) == (124, None)
    assert not r.exit.aborted
    assert 0.4 < time.monotonic() - t0 < 5
    assert 0.4 < r.exit.duration_s < 5
    assert survivors(mark) == []


@pytest.mark.alone
@pytest.mark.timeout(30)
def test_cancel_aborts_and_nothing_survives(joined):
    mark = marker()
    corr = joined.run(["sh", "-c", f"sleep {mark} & setsid sleep {mark} & echo up; wait"])
    r = joined.wait_started(corr)
    while not r.stdout:
        joined.pump()
    sleepers(mark, 2)
    t0 = time.monotonic()
    joined.send(wire.CANCEL, corr)
    joined.wait_exit(corr)
    latency = time.monotonic() - t0
    assert r.exit.aborted and not r.exit.timed_out
    assert r.exit.error is None
    # The real status is kept: the shell died of the SIGTERM.
    assert (r.exit.exit_code, r.exit.signal) != (None, None)
    assert latency < 0.45, f"cancel took {latency:.3f} s; SIGTERM should have been enough"
    assert survivors(mark) == []


@pytest.mark.timeout(30)
def test_cancel_kills_after_grace_when_sigterm_is_ignored(joined):
    mark = marker()
    corr = joined.run(["sh", "-c", f"trap '' TERM; echo up; sleep {mark}"])
    r = joined.wait_started(corr)
    while not r.stdout:
        joined.pump()
    t0 = time.monotonic()
    joined.send(wire.CANCEL, corr)
    joined.wait_exit(corr)
    waited = time.monotonic() - t0
    assert r.exit.aborted
    assert 0.4 <= waited < 3
    assert survivors(mark) == []


@pytest.mark.timeout(30)
def test_cancel_of_unknown_call_is_ignored(joined):
    joined.send(wire.CANCEL, "no-such-call")
    r = joined.execute(["echo", "still here"])
    assert r.stdout == b"still here\n" and r.exit.exit_code == 0


@pytest.mark.timeout(30)
def test_capture_keeps_the_head_and_counts_the_rest(joined):
    r = joined.execute(
        ["sh", "-c", "head -c 5000 /dev/zero | tr '\\0' a; head -c 300 /dev/zero | tr '\\0' e >&2"],
        capture_limit=1000,
    )
    assert r.exit.exit_code == 0
    assert r.stdout == b"a" * 5000  # the stream is complete; only the copy is capped
    assert r.exit.stdout == b"a" * 1000
    assert r.exit.stdout_dropped == 4000
    assert r.exit.stderr == b"e" * 300
    assert r.exit.stderr_dropped == 0


@pytest.mark.timeout(60)
def test_flow_control_stalls_at_the_window_and_resumes_on_ack(joined):
    total = 20_000_000
    corr = joined.run(["head", "-c", str(total), "/dev/zero"])
    r = joined.results[corr]
    # Without acks the output stops at the window.
    while True:
        try:
            joined.pump(timeout=1.0, ack=False)
        except TimeoutError:
            break
    got = sum(size for _, _, size in r.chunks)
    assert r.exit is None
    assert got <= wire.WINDOW_BYTES and len(r.chunks) <= wire.WINDOW_CHUNKS
    assert got == wire.WINDOW_BYTES or len(r.chunks) == wire.WINDOW_CHUNKS, (got, len(r.chunks))
    # Acks reopen it; every byte arrives, exactly once.
    joined.send(wire.ACK, corr, n=got, seq=len(r.chunks))
    joined.wait_exit(corr)
    assert len(r.stdout) == total
    assert r.exit.exit_code == 0
    assert len(r.exit.stdout) == wire.DEFAULT_CAPTURE_LIMIT
    assert r.exit.stdout_dropped == total - wire.DEFAULT_CAPTURE_LIMIT


@pytest.mark.timeout(60)
def test_calls_run_concurrently_without_mixing(joined):
    corrs = {joined.run(["sh", "-c", f"sleep 0.3; echo call-{i}; echo err-{i} >&2"]): i for i in range(20)}
    t0 = time.monotonic()
    for corr in corrs:
        joined.wait_exit(corr)
    assert time.monotonic() - t0 < 5
    for corr, i in corrs.items():
        r = joined.results[corr]
        assert r.stdout == f"call-{i}\n".encode()
        assert r.stderr == f"err-{i}\n".encode()
        assert r.exit.exit_code == 0


@pytest.mark.timeout(30)
def test_env_is_filtered_and_passthrough_honoured(joined):
    env = {"PATH": "/usr/bin:/bin", "PLAIN": "p", "MY_API_KEY": "k1", "GITHUB_TOKEN": "t1"}
    r = joined.execute(["env"], env=env, env_passthrough=["GITHUB_TOKEN"])
    lines = set(r.stdout.decode().splitlines())
    assert "PLAIN=p" in lines
    assert "GITHUB_TOKEN=t1" in lines
    assert not any(line.startswith("MY_API_KEY=") for line in lines)


@pytest.mark.timeout(30)
def test_hidden_paths_are_hidden_from_commands(broker):
    broker.join(extra=("--hide", broker.dir))
    r = broker.execute(["cat", broker.token_file])
    assert r.exit.exit_code != 0
    assert broker.token.encode() not in r.stdout


@pytest.mark.timeout(30)
def test_a_full_executor_refuses_more_runs(broker):
    broker.join(extra=("--slots", "1"))
    mark = marker()
    first = broker.run(["sleep", mark])
    broker.wait_started(first)
    r = broker.execute(["true"])
    assert r.started is None and r.exit.error and "slots" in r.exit.error
    broker.send(wire.CANCEL, first)
    assert broker.wait_exit(first).exit.aborted
    assert broker.execute(["true"]).exit.exit_code == 0


# -- failures -----------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_command_not_found_reports_an_error(joined):
    r = joined.execute(["no-such-command-sluice-test"])
    assert r.exit.error
    assert "\n" not in r.exit.error
    assert r.exit.signal is None


@pytest.mark.timeout(30)
def test_missing_cwd_reports_an_error_without_exit_code(joined):
    r = joined.execute(["true"], cwd="/no/such/dir/sluice")
    assert r.started is None
    assert r.exit.error and "\n" not in r.exit.error
    assert r.exit.exit_code is None and r.exit.signal is None


@pytest.mark.timeout(30)
def test_bad_policy_reports_an_error(joined):
    r = joined.execute(["true"], permissions=["disk-write-everything-please"])
    assert r.started is None
    assert r.exit.error and "permission" in r.exit.error
    assert r.exit.exit_code is None


@pytest.mark.timeout(30)
def test_bad_frames_do_not_kill_the_worker(joined):
    joined.send_raw(b"\xc1\xc1 not msgpack")
    joined.send_raw(wire.header("no-such-kind", "x"))
    joined.send_raw(wire.header(wire.RUN, ""), b"\x00")
    joined.send_raw(wire.header(wire.ACK, "unknown-call", n=5))
    joined.send_raw(wire.header(wire.WELCOME, ""), b"\xff")
    corr = uuid.uuid4().hex
    joined.results[corr] = Result()
    joined.send_raw(wire.header(wire.RUN, corr), b"\x93garbage")
    r = joined.wait_exit(corr)
    assert r.exit.error and "bad run request" in r.exit.error
    r = joined.execute(["echo", "alive"])
    assert r.stdout == b"alive\n" and r.exit.exit_code == 0
    assert joined.proc.poll() is None


@pytest.mark.timeout(30)
def test_ping_is_answered(joined):
    joined.send(wire.PING, "p-7", seq=7)
    h, _ = joined.pump()
    assert h.kind == wire.PONG and h.seq == 7


# -- going away ----------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_sigterm_kills_commands_reports_them_and_says_bye(joined):
    mark = marker()
    corrs = [joined.run(["sh", "-c", f"sleep {mark} & setsid sleep {mark} & echo up; wait"]) for _ in range(2)]
    for corr in corrs:
        r = joined.wait_started(corr)
        while not r.stdout:
            joined.pump()
    sleepers(mark, 4)
    joined.proc.send_signal(signal.SIGTERM)
    for corr in corrs:
        r = joined.wait_exit(corr)
        assert r.exit.aborted
        assert r.exit.error == "executor shutting down"
    while not any(h.kind == wire.BYE for h, _ in joined.other):
        joined.pump()
    assert joined.proc.wait(10) == 0
    assert survivors(mark) == []


@pytest.mark.timeout(30)
def test_silent_broker_is_presumed_gone(broker):
    broker.join(heartbeat_s=0.1)
    mark = marker()
    corr = broker.run(["sh", "-c", f"setsid sleep {mark} & echo up; wait"])
    r = broker.wait_started(corr)
    while not r.stdout:
        broker.pump()
    # No pings from here on: after ten missed intervals the executor leaves.
    assert broker.proc.wait(10) != 0
    assert survivors(mark) == []


@pytest.mark.timeout(30)
def test_pings_keep_the_executor_alive(broker):
    broker.join(heartbeat_s=0.1)
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        broker.send(wire.PING)
        time.sleep(0.05)
    assert broker.proc.poll() is None


@pytest.mark.timeout(30)
def test_die_with_parent(broker):
    # A parent shell starts the executor in the background, then is SIGKILLed.
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    argv = f"{sys.executable} -m executor --connect {broker.endpoint} --token-file {broker.token_file} --die-with-parent"
    parent = subprocess.Popen(["sh", "-c", f"{argv} & echo $!; wait"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    child_pid = int(parent.stdout.readline())
    _, h, _ = broker.recv()
    assert h.kind == wire.HELLO
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 5
    while psutil.pid_exists(child_pid) and psutil.Process(child_pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the executor outlived its parent"
        time.sleep(0.05)


# -- figures --------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_round_trip_figures(joined):
    """Prints round-trip and throughput figures (run with -s); asserts only correctness."""
    n = 50
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = joined.execute(["true"])
        samples.append(time.perf_counter() - t0)
        assert r.exit.exit_code == 0
    samples.sort()
    total = 256 * 1024 * 1024
    t0 = time.perf_counter()
    r = joined.execute(["head", "-c", str(total), "/dev/zero"])
    dt = time.perf_counter() - t0
    assert len(r.stdout) == total
    print(
        f"\n`true` round trip over {n}: median {samples[n // 2] * 1000:.1f} ms, "
        f"p90 {samples[int(n * 0.9)] * 1000:.1f} ms; "
        f"{total >> 20} MiB streamed in {dt:.2f} s ({total / dt / 2**20:.0f} MiB/s, "
        f"{len(r.chunks)} chunks)"
    )


# -- the send backlog (in-process: a real socket rarely fills up in a test) -----------------


class _FullSocket:
    """Stands in for ZSocket: refuses ``refusals`` sends, then accepts."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.sent: list = []

    def send(self, parts) -> None:
        if self.refusals:
            self.refusals -= 1
            raise zmq.Again()
        self.sent.append(parts)


class _Reader:
    def __init__(self) -> None:
        self.updates = 0

    def update_readers(self) -> None:
        self.updates += 1


@pytest.mark.timeout(10)
def test_send_backlog_keeps_order_and_pauses_reading():
    import asyncio

    from executor.worker import Worker

    async def scenario():
        w = Worker("ipc:///nonexistent", "t", name="n", slots=1)
        w.link.zs = _FullSocket(refusals=3)
        call = w.calls["c"] = _Reader()
        for i in range(5):
            w.send([b"%d" % i])
        assert w.congested and call.updates == 1
        for _ in range(200):
            if not w.congested:
                break
            await asyncio.sleep(0.005)
        assert not w.congested and call.updates == 2
        assert w.link.zs.sent == [[b"%d" % i] for i in range(5)]

    asyncio.run(scenario())
