"""The daemon, driven as a real process over its real socket.

Each test starts ``serve`` in a subprocess with a private runtime dir and talks to it with
raw DEALER sockets speaking broker.wire.frames, playing frontends and (mostly) executors. The
supervisor is tested with a small fake executor program; the last tests use the real
``python -m executor`` when it exists.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import shutil
import signal
import stat
import sys
import tempfile
import textwrap
import time
from datetime import datetime
from pathlib import Path

import psutil
import pytest
import zmq

from broker.daemon.server import DaemonAlreadyRunning, serve
from broker.net.peer import DEAD_AFTER_HEARTBEATS
from broker.net.runtime import RuntimeDir
from broker.wire import frames as wire
from broker.wire.results import DAEMON_STOPPED
from landlock_helper.policy import SandboxPolicy
from tests.support.harness import daemons as harness_daemons
from tests.support.harness import wait_for

DAEMON_SCRIPT = textwrap.dedent(
    """
    import sys
    from broker.daemon import supervisor
    from broker.daemon.server import DaemonAlreadyRunning, serve
    from broker.net.runtime import RuntimeDir, RuntimeDirError

    count, fake = sys.argv[1], sys.argv[2]
    if fake:
        supervisor.EXECUTOR_COMMAND = [sys.executable, fake]
    try:
        code = serve(RuntimeDir.default(), executors=None if count == "default" else int(count), log_json=True)
    except (DaemonAlreadyRunning, RuntimeDirError) as e:
        print(f"sluice: {e}", file=sys.stderr)
        sys.exit(1)
    sys.exit(code)
    """
)

# Plays an executor for the supervisor tests. Commands (argv[0]): echo ARGS (prints them),
# sleep (runs until cancelled), hang (stops answering anything), die (exits 7).
FAKE_EXECUTOR = textwrap.dedent(
    """
    import argparse, ctypes, os, signal, sys, time
    import zmq
    from broker.wire import frames as wire

    ap = argparse.ArgumentParser()
    ap.add_argument("--connect", required=True)
    ap.add_argument("--token-file", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--hide", required=True)
    ap.add_argument("--die-with-parent", action="store_true")
    ap.add_argument("--fd-channel", type=int)
    args = ap.parse_args()
    mode = os.environ.get("FAKE_EXECUTOR_MODE", "")
    parent = os.getppid()
    if args.die_with_parent:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the prctl took
            os._exit(1)
    if mode == "crash":
        sys.exit(3)
    stopping = False
    def on_term(*_):
        global stopping
        stopping = True
    signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "stubborn" else on_term)

    token = open(args.token_file).read().strip()
    sock = zmq.Context().socket(zmq.DEALER)
    sock.linger = 2000
    sock.connect(args.connect)
    def send(kind, corr="", body=None, **fields):
        sock.send_multipart(wire.message(kind, corr, body, **fields))
    send("hello", body=wire.Hello(role="executor", token=token, pid=os.getpid(), name=args.name, slots=2))
    pending = set()
    while True:
        if stopping:
            for corr in pending:
                send("exit", corr, wire.ExitStatus(signal=15, aborted=True))
            send("bye")
            sock.close()
            sys.exit(0)
        if not sock.poll(50):
            continue
        frames = sock.recv_multipart()
        head = wire.decode_header(frames[0])
        if head.kind == "ping":
            send("pong", head.corr)
        elif head.kind == "run":
            argv = wire.decode("run", frames[1]).argv
            send("started", head.corr, wire.Started(pid=os.getpid(), executor=args.name))
            if argv[0] == "echo":
                sock.send_multipart([wire.header("out", head.corr, stream=1), (" ".join(argv[1:]) + "\\n").encode()])
                send("exit", head.corr, wire.ExitStatus(exit_code=0))
            elif argv[0] == "sleep":
                pending.add(head.corr)
            elif argv[0] == "hang":
                # Answers nothing more, but never outlives its daemon (PDEATHSIG follows the
                # thread that forked us, not the process).
                while os.getppid() == parent:
                    time.sleep(0.05)
                os._exit(0)
            elif argv[0] == "die":
                os._exit(7)
        elif head.kind == "cancel" and head.corr in pending:
            pending.discard(head.corr)
            send("exit", head.corr, wire.ExitStatus(signal=15, aborted=True))
    """
)


def run_request(*argv: str) -> wire.RunRequest:
    return wire.RunRequest(argv=list(argv), cwd="/tmp", sandbox=SandboxPolicy.from_json({"permissions": ["disk-full-read-access"]}))


# ---------------------------------------------------------------- harness


class Dealer:
    """A raw peer. ``recv`` answers pings by itself unless told not to."""

    def __init__(self, ctx: zmq.Context, rt: RuntimeDir) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.rcvtimeo = -1
        self.sock.connect(rt.endpoint)
        self.rt = rt
        self.notices: list[str] = []
        self.holds: list[tuple[str, int]] = []

    def send(self, kind: str, corr: str = "", body=None, **fields) -> list[bytes]:
        parts = wire.message(kind, corr, body, **fields)
        self.sock.send_multipart(parts)
        return parts

    def send_raw(self, parts: list[bytes]) -> None:
        self.sock.send_multipart(parts)

    def recv(self, timeout: float = 5.0, *, answer_pings: bool = True) -> tuple[wire.Header, list[bytes]]:
        """Next message: (decoded header, [raw header, body...])."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(int(left * 1000) + 1):
                raise TimeoutError(f"nothing received within {timeout} s")
            frames = self.sock.recv_multipart()
            head = wire.decode_header(frames[0])
            if head.kind == wire.PING and answer_pings:
                self.send(wire.PONG, head.corr)
                continue
            if head.kind == wire.NOTICE:  # a line for a person (an executor is restarting): noted, not awaited
                self.notices.append(wire.decode(wire.NOTICE, frames[1]).message)
                continue
            if head.kind == wire.HOLD:  # flow control a fake executor may ignore: noted, not awaited
                self.holds.append((head.corr, head.n))
                continue
            return head, frames

    def expect(self, kind: str, corr: str | None = None, timeout: float = 5.0):
        head, frames = self.recv(timeout)
        assert head.kind == kind, (head, frames)
        if corr is not None:
            assert head.corr == corr, head
        body = wire.decode(kind, frames[1]) if kind in (wire.WELCOME, wire.ERROR, wire.RUN, wire.STARTED, wire.EXIT) else None
        return head, body, frames

    def expect_error(self, corr: str | None = None, contains: str = "", timeout: float = 5.0) -> str:
        _, body, _ = self.expect(wire.ERROR, corr, timeout)
        assert contains in body.message, body.message
        return body.message

    def nothing(self, within: float = 0.3) -> None:
        try:
            head, frames = self.recv(within)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected message {head}: {frames}")

    def hello(self, role: str = wire.ROLE_FRONTEND, *, token: str | None = None, slots: int = 0, name: str = "", pid: int = 0):
        token = self.rt.read_token() if token is None else token
        self.send(wire.HELLO, body=wire.Hello(role=role, token=token, pid=pid or os.getpid(), name=name, slots=slots))
        return self

    def welcomed(self, **kw) -> wire.Welcome:
        self.hello(**kw)
        _, welcome, _ = self.expect(wire.WELCOME)
        return welcome

    def close(self) -> None:
        self.sock.close(linger=0)


@pytest.fixture
def base():
    # Short: ipc socket paths are limited to 107 bytes.
    path = Path(tempfile.mkdtemp(prefix="sl-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def rt(base) -> RuntimeDir:
    return RuntimeDir(str(base / "rt"))


@pytest.fixture
def fake_executor(base) -> Path:
    path = base / "fake_executor.py"
    path.write_text(FAKE_EXECUTOR)
    return path


@pytest.fixture
def daemons(rt):
    """``start(executors=0, fake=None, env=None, ready=True, executors_ready=True)``: a daemon serving ``rt``, run
    by DAEMON_SCRIPT (so that its executors can be the fake one); stopped at the end, and
    one that left processes behind fails the test."""
    with harness_daemons() as factory:
        def start(executors: int | str = 0, *, fake: Path | None = None, env=None, ready: bool = True,
                  executors_ready: bool = True):
            argv = [sys.executable, "-c", DAEMON_SCRIPT, str(executors), str(fake or "")]
            return factory.start(env=env, runtime=rt, argv=argv, ready=ready, executors_ready=executors_ready)

        yield start


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def peer(ctx, rt):
    def make(role: str | None = None, **kw) -> Dealer:
        d = Dealer(ctx, rt)
        if role is not None:
            d.welcomed(role=role, **kw)
        return d

    return make


def frontend(peer) -> Dealer:
    return peer(wire.ROLE_FRONTEND)


def executor(peer, slots: int = 2, name: str = "fake") -> Dealer:
    return peer(wire.ROLE_EXECUTOR, slots=slots, name=name)


def take_run(ex: Dealer, corr: str | None = None, timeout: float = 5.0):
    head, req, frames = ex.expect(wire.RUN, corr, timeout)
    return head, req, frames


# ------------------------------------------------------- runtime dir, lock


@pytest.mark.timeout(30)
def test_runtime_dir_token_socket_and_pid_file(daemons, rt, peer):
    d = daemons()
    assert stat.S_IMODE(os.stat(rt.path).st_mode) == 0o700
    st = os.stat(rt.token_path)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert len(rt.read_token()) == 64
    st = os.stat(rt.socket_path)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert rt.read_pid() == d.pid
    welcome = peer().welcomed()
    assert welcome.peer_id and welcome.heartbeat_s == 1.0 and welcome.version == wire.PROTOCOL_VERSION
    assert rt.read_token() not in d.log()


@pytest.mark.timeout(30)
def test_second_daemon_refuses_and_first_keeps_serving(daemons, rt, peer):
    first = daemons()
    token = rt.read_token()
    second = daemons(ready=False)
    assert second.proc.wait(15) == 1
    assert second.log().strip() == f"sluice: a sluice daemon is already running (pid {first.pid})"
    with pytest.raises(DaemonAlreadyRunning, match=rf"already running \(pid {first.pid}\)"):
        serve(rt, executors=0, log_json=True)
    assert rt.read_token() == token
    assert rt.read_pid() == first.pid
    assert os.path.exists(rt.socket_path)
    peer().welcomed()
    assert first.proc.poll() is None


@pytest.mark.timeout(30)
def test_stale_socket_and_pid_file_are_replaced(daemons, rt, peer):
    os.makedirs(rt.path, mode=0o700)
    Path(rt.socket_path).write_text("stale")
    Path(rt.pid_path).write_text("999999\n")
    Path(rt.token_path).write_text("old-token")
    d = daemons()
    assert stat.S_ISSOCK(os.stat(rt.socket_path).st_mode)
    assert rt.read_pid() == d.pid
    assert rt.read_token() != "old-token"
    peer().welcomed()


@pytest.mark.timeout(30)
def test_shutdown_removes_socket_and_pid_file_and_ends_calls(daemons, rt, peer):
    d = daemons()
    fe = frontend(peer)
    fe.send(wire.RUN, "queued", run_request("true"))  # no executor: stays queued
    ex = executor(peer)
    fe.send(wire.RUN, "running", run_request("sleep"))
    fe.send(wire.RUN, "queued-too", run_request("sleep"))
    fe.send(wire.RUN, "queued-3", run_request("sleep"))
    # The daemon reads a peer's messages in order: once it answers this ping it has read
    # the four runs (a SIGTERM that came first would leave the last ones unread, unanswered).
    fe.send(wire.PING, "read")
    fe.expect(wire.PONG, "read")
    take_run(ex, "queued")
    take_run(ex, "running")
    assert d.terminate() == 0
    # The executor was not ours to stop: it is told to cancel what it still runs.
    assert {(h.kind, h.corr) for h, _ in (ex.recv(), ex.recv())} == {(wire.CANCEL, "queued"), (wire.CANCEL, "running")}
    ends = {}
    for _ in range(4):
        try:
            head, body, _ = fe.expect(wire.EXIT)
        except TimeoutError:
            pytest.fail(f"exits for {sorted(ends)} only; the daemon's log:\n{d.log()[-8000:]}")
        ends[head.corr] = body
    assert set(ends) == {"queued", "running", "queued-too", "queued-3"}
    assert all("shut down" in body.error for body in ends.values())
    assert not os.path.exists(rt.socket_path)
    assert not os.path.exists(rt.pid_path)
    with open(rt.lock_path) as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released
    assert '"daemon stopped"' in d.log()


# ------------------------------------------------------------- hello, auth


@pytest.mark.timeout(30)
def test_wrong_token_is_refused_and_logged_without_tokens(daemons, rt, peer):
    d = daemons()
    bad = "f" * 64
    intruder = peer()
    intruder.hello(token=bad, pid=4242, role=wire.ROLE_EXECUTOR, slots=4)
    intruder.expect_error(contains="authentication failed")
    intruder.send(wire.RUN, "c1", run_request("true"))
    intruder.expect_error("c1", "send hello first")

    fe = frontend(peer)
    fe.send(wire.PING, "p")
    assert fe.recv()[0].kind == wire.PONG

    wait_for(lambda: "authentication failed" in d.log(), 5, "the refusal in the log")
    line = next(line for line in d.log().splitlines() if "authentication failed" in line)
    assert '"level": "warning"' in line and '"pid": 4242' in line and '"role": "executor"' in line
    assert bad not in d.log() and rt.read_token() not in d.log()


@pytest.mark.timeout(30)
def test_hello_with_bad_role_version_or_slots_is_refused(daemons, peer):
    daemons()
    p = peer()
    p.hello(role="overlord")
    p.expect_error(contains="unknown role 'overlord'")
    p.send(wire.HELLO, body=wire.Hello(role="frontend", token=p.rt.read_token(), version=99))
    p.expect_error(contains="protocol version 99")
    p.hello(role=wire.ROLE_EXECUTOR, slots=0)
    p.expect_error(contains="at least one slot")
    p.send_raw([wire.header(wire.HELLO, "h"), b"\xc1not msgpack"])
    p.expect_error("h", "bad hello")
    p.welcomed()
    p.hello()
    p.expect_error(contains="already said hello")


# ---------------------------------------------------------- malformed input


@pytest.mark.timeout(60)
def test_garbage_is_dropped_rate_limited_and_the_daemon_keeps_serving(daemons, peer, ctx, rt):
    d = daemons()
    rng = random.Random(7)
    stranger = peer()
    for _ in range(3000):
        size = rng.choice([0, 1, 5, 40, 300])
        stranger.send_raw([os.urandom(size) for _ in range(rng.randint(1, 4))])
    stranger.send_raw([wire.header(wire.OUT, "x"), b"data"])
    stranger.expect_error("x", "send hello first")

    fe = frontend(peer)
    cases = [
        ([b""], "bad header"),
        ([b"\x93\x01\x02"], "bad header"),
        ([os.urandom(64)], ""),
        ([wire.header("launch-missiles", "k1")], "unknown message kind"),
        ([wire.header(wire.RUN, "k2")], "run takes 2 frame"),
        ([wire.header(wire.CANCEL, "k3"), b"extra"], "cancel takes 1 frame"),
        ([wire.header(wire.EXIT, "k4"), wire.encode(wire.ExitStatus(exit_code=0))], "frontend may not send exit"),
        ([wire.header(wire.OUT, "k5"), b"chunk"], "frontend may not send out"),
        ([b"\x91" + b"\xda\x40\x00" + b"k" * 0x4000], "header frame of"),
    ]
    for parts, why in cases:
        fe.send_raw(parts)
        message = fe.expect_error(contains=why)
        assert message.startswith("malformed message")

    # Bigger than MAX_MESSAGE_SIZE: zmq drops that connection, nobody else notices.
    huge = Dealer(ctx, rt)
    huge.send_raw([wire.header(wire.PING), b"\0" * (wire.MAX_MESSAGE_SIZE + 1024)])
    huge.send_raw([b"\0" * (wire.MAX_MESSAGE_SIZE + 1)])

    ex = executor(peer)
    fe.send(wire.RUN, "ok", run_request("echo", "fine"))
    take_run(ex, "ok")
    ex.send(wire.EXIT, "ok", wire.ExitStatus(exit_code=0))
    _, status, _ = fe.expect(wire.EXIT, "ok")
    assert status.exit_code == 0
    malformed_lines = [line for line in d.log().splitlines() if "malformed message dropped" in line]
    assert 1 <= len(malformed_lines) <= 20, len(malformed_lines)
    assert d.proc.poll() is None


# ----------------------------------------------------------------- routing


@pytest.mark.timeout(30)
def test_run_and_call_traffic_is_forwarded_byte_for_byte(daemons, peer):
    daemons()
    ex = executor(peer)
    fe = frontend(peer)
    sent = fe.send(wire.RUN, "c1", run_request("echo", "hi"), session="s1")
    _, req, frames = take_run(ex, "c1")
    assert frames == sent and req.argv == ["echo", "hi"]

    from_exec = [
        wire.message(wire.STARTED, "c1", wire.Started(pid=123, executor="fake")),
        [wire.header(wire.OUT, "c1", stream=wire.STDOUT, seq=0, n=3), b"hi\n"],
        [wire.header(wire.OUT, "c1", stream=wire.STDERR, seq=1, n=4), b"\xff\x00\xc1\x93"],
        [wire.header(wire.OUT, "c1", stream=wire.STDOUT, seq=2, n=1 << 20), os.urandom(1 << 20)],
    ]
    for parts in from_exec:
        ex.send_raw(parts)
        assert fe.recv()[1] == parts

    for parts in ([wire.header(wire.ACK, "c1", seq=3, n=(1 << 20) + 7)], [wire.header(wire.CANCEL, "c1")]):
        fe.send_raw(parts)
        assert ex.recv()[1] == parts

    done = wire.message(wire.EXIT, "c1", wire.ExitStatus(signal=15, aborted=True, stdout=b"hi\n"))
    ex.send_raw(done)
    assert fe.recv()[1] == done
    # The call is over: late traffic about it goes nowhere.
    fe.send(wire.ACK, "c1", seq=4, n=1)
    fe.send(wire.CANCEL, "c1")
    ex.send_raw([wire.header(wire.OUT, "c1", stream=1), b"late"])
    ex.nothing()
    fe.nothing()


@pytest.mark.timeout(30)
def test_bad_run_and_duplicate_call_id_are_refused(daemons, peer):
    daemons()
    ex = executor(peer)
    fe = frontend(peer)
    fe.send_raw([wire.header(wire.RUN, "bad"), b"\x01\x02garbage"])
    fe.expect_error("bad", "bad run request")
    fe.send_raw([wire.header(wire.RUN, "bad2"), wire.encode(wire.ErrorMsg("not a run"))])
    fe.expect_error("bad2", "bad run request")
    fe.send(wire.RUN, "", run_request("true"))
    fe.expect_error("", "call id")
    ex.nothing()

    fe.send(wire.RUN, "dup", run_request("sleep"))
    take_run(ex, "dup")
    other = frontend(peer)
    for who in (fe, other):
        who.send(wire.RUN, "dup", run_request("true"))
        who.expect_error("dup", "already in flight")
    ex.nothing()
    ex.send(wire.EXIT, "dup", wire.ExitStatus(exit_code=0))
    fe.expect(wire.EXIT, "dup")
    other.send(wire.RUN, "dup", run_request("true"))
    take_run(ex, "dup")


@pytest.mark.timeout(30)
def test_runs_queue_until_an_executor_says_hello_then_go_fifo(daemons, peer):
    daemons()
    fe = frontend(peer)
    for k in range(4):
        fe.send(wire.RUN, f"q{k}", run_request("sleep"))
    fe.nothing()
    ex = executor(peer, slots=2)
    assert [take_run(ex)[0].corr for _ in range(2)] == ["q0", "q1"]
    ex.nothing()
    ex.send(wire.EXIT, "q1", wire.ExitStatus(exit_code=0))
    take_run(ex, "q2")
    ex.send(wire.EXIT, "q0", wire.ExitStatus(exit_code=0))
    take_run(ex, "q3")
    ex.nothing()
    assert {fe.expect(wire.EXIT)[0].corr for _ in range(2)} == {"q0", "q1"}


@pytest.mark.timeout(30)
def test_runs_go_to_the_executor_with_most_free_slots(daemons, peer):
    daemons()
    small = executor(peer, slots=1, name="small")
    big = executor(peer, slots=3, name="big")
    fe = frontend(peer)
    for k in range(5):
        fe.send(wire.RUN, f"c{k}", run_request("sleep"))
    got_big = [take_run(big)[0].corr for _ in range(3)]
    got_small = [take_run(small)[0].corr]
    assert sorted(got_big + got_small) == ["c0", "c1", "c2", "c3"]
    assert got_big[:2] == ["c0", "c1"]  # 3 free vs 1, then 2 vs 1
    small.nothing()
    big.nothing()
    small.send(wire.EXIT, got_small[0], wire.ExitStatus(exit_code=0))
    take_run(small, "c4")


@pytest.mark.timeout(30)
def test_cancel_of_a_queued_call_answers_aborted_exit(daemons, peer):
    daemons()
    fe = frontend(peer)
    fe.send(wire.RUN, "q", run_request("sleep"))
    fe.send(wire.CANCEL, "q")
    _, status, _ = fe.expect(wire.EXIT, "q")
    assert status.aborted and status.error is None and status.exit_code is None and status.signal is None
    fe.send(wire.CANCEL, "q")  # unknown by now: ignored
    ex = executor(peer)
    ex.nothing()
    fe.nothing()


@pytest.mark.timeout(30)
def test_executor_cannot_touch_another_executors_calls(daemons, peer):
    daemons()
    ex1 = executor(peer, slots=1, name="one")
    ex2 = executor(peer, slots=1, name="two")
    fe = frontend(peer)
    fe.send(wire.RUN, "a", run_request("sleep"))
    owner, other = (ex1, ex2) if ex1.sock.poll(2000) else (ex2, ex1)
    take_run(owner, "a")
    other.send(wire.EXIT, "a", wire.ExitStatus(exit_code=0))
    other.send_raw([wire.header(wire.OUT, "a", stream=1), b"forged"])
    fe.nothing()
    owner.send(wire.EXIT, "a", wire.ExitStatus(exit_code=3))
    _, status, _ = fe.expect(wire.EXIT, "a")
    assert status.exit_code == 3


# ---------------------------------------------------------- losing peers


@pytest.mark.alone
@pytest.mark.timeout(30)
def test_executor_bye_fails_its_calls_and_others_take_over(daemons, peer):
    daemons()
    ex = executor(peer, slots=1)
    fe = frontend(peer)
    fe.send(wire.RUN, "a", run_request("sleep"))
    fe.send(wire.RUN, "b", run_request("sleep"))
    take_run(ex, "a")
    t0 = time.monotonic()
    ex.send(wire.BYE)
    _, status, _ = fe.expect(wire.EXIT, "a", timeout=1.0)
    assert time.monotonic() - t0 < 1.0
    assert "executor fake left while running this command" in status.error
    replacement = executor(peer, slots=1)
    take_run(replacement, "b")


@pytest.mark.timeout(30)
def test_executor_that_vanishes_fails_its_calls(daemons, peer):
    daemons()
    ex = executor(peer)
    fe = frontend(peer)
    fe.send(wire.RUN, "a", run_request("sleep"))
    take_run(ex, "a")
    ex.close()
    _, status, _ = fe.expect(wire.EXIT, "a", timeout=3.0)
    assert "unreachable" in status.error


@pytest.mark.timeout(30)
def test_hung_executor_is_given_up_after_its_heartbeats(daemons, peer):
    daemons()
    ex = executor(peer)
    fe = frontend(peer)
    fe.send(wire.RUN, "a", run_request("sleep"))
    take_run(ex, "a")
    t0 = time.monotonic()
    _, status, _ = fe.expect(wire.EXIT, "a", timeout=DEAD_AFTER_HEARTBEATS + 10.0)  # ex never answers pings now
    assert DEAD_AFTER_HEARTBEATS - 1 < time.monotonic() - t0
    assert "stopped responding" in status.error
    ex.send(wire.PING)
    ex.expect_error(contains="send hello first")


@pytest.mark.timeout(30)
def test_frontend_that_disconnects_gets_its_calls_cancelled(daemons, peer):
    daemons()
    ex = executor(peer, slots=1)
    fe = frontend(peer)
    fe.send(wire.RUN, "a", run_request("sleep"))
    fe.send(wire.RUN, "queued", run_request("sleep"))
    take_run(ex, "a")
    fe.close()
    head, _ = ex.recv(timeout=3.0)
    assert (head.kind, head.corr) == (wire.CANCEL, "a")
    # The slot stays taken until the executor reports the exit; then it is free again.
    fe2 = frontend(peer)
    fe2.send(wire.RUN, "b", run_request("sleep"))
    ex.nothing(0.3)
    ex.send_raw([wire.header(wire.OUT, "a", stream=1), b"into the void"])
    ex.send(wire.EXIT, "a", wire.ExitStatus(signal=15, aborted=True))
    take_run(ex, "b")  # "queued" went with its frontend
    ex.nothing()


@pytest.mark.timeout(30)
def test_frontend_that_stops_answering_pings_gets_its_calls_cancelled(daemons, peer):
    daemons()
    ex = executor(peer)
    fe = frontend(peer)
    fe.send(wire.RUN, "a", run_request("sleep"))
    take_run(ex, "a")
    t0 = time.monotonic()
    head, _ = ex.recv(timeout=DEAD_AFTER_HEARTBEATS + 10.0)  # fe never reads, so never pongs
    assert (head.kind, head.corr) == (wire.CANCEL, "a")
    assert DEAD_AFTER_HEARTBEATS - 1 < time.monotonic() - t0


@pytest.mark.timeout(60)
def test_stalled_frontend_does_not_stall_others(daemons, peer):
    daemons()
    ex = executor(peer, slots=2)
    slow = frontend(peer)
    slow.sock.rcvhwm = 10
    fast = frontend(peer)
    slow.send(wire.RUN, "slow", run_request("flood"))
    take_run(ex, "slow")
    chunk = b"x" * 4096

    def flood(first: int, count: int) -> None:
        for seq in range(first, first + count):
            ex.send_raw([wire.header(wire.OUT, "slow", stream=1, seq=seq, n=len(chunk)), chunk])

    # Never read: output until every buffer on the way is full and the daemon holds the
    # command (not a fixed 120 MB: under load, the daemon would take longer to read that
    # than it waits for the silent frontend's pongs, and cancel the command first).
    sent = 0
    while ("slow", 1) not in ex.holds:
        assert sent < 30_000, "the stalled frontend's command was never held"
        flood(sent, 100)
        sent += 100
        with contextlib.suppress(TimeoutError):
            head, _ = ex.recv(0.001)  # holds are noted; nothing else is due
            raise AssertionError(f"unexpected message {head}")
    flood(sent, 1000)  # and more, as from an executor the hold reached late
    t0 = time.monotonic()
    fast.send(wire.RUN, "fast", run_request("echo"))
    take_run(ex, "fast", timeout=10)
    ex.send_raw([wire.header(wire.OUT, "fast", stream=1), b"quick\n"])
    ex.send(wire.EXIT, "fast", wire.ExitStatus(exit_code=0))
    assert fast.recv(10)[1][1] == b"quick\n"
    fast.expect(wire.EXIT, "fast", timeout=5)
    assert time.monotonic() - t0 < 10


# ------------------------------------------------------- spawned executors


@pytest.mark.timeout(60)
def test_spawned_executors_serve_runs(daemons, peer, fake_executor):
    d = daemons(2, fake=fake_executor)
    fe = frontend(peer)
    fe.send(wire.RUN, "e", run_request("echo", "hello", "there"))
    _, started, _ = fe.expect(wire.STARTED, "e", timeout=20)
    assert started.executor in ("exec-1", "exec-2")
    assert fe.recv()[1][1] == b"hello there\n"
    _, status, _ = fe.expect(wire.EXIT, "e")
    assert status.exit_code == 0
    assert len(d.executor_pids()) == 2
    cmdline = psutil.Process(d.executor_pids()[0]).cmdline()
    assert cmdline[cmdline.index("--hide") + 1] == d.runtime.path
    assert "--die-with-parent" in cmdline


@pytest.mark.alone
@pytest.mark.timeout(60)
def test_killed_executor_fails_its_call_at_once_and_is_replaced(daemons, peer, fake_executor):
    d = daemons(1, fake=fake_executor)
    fe = frontend(peer)
    fe.send(wire.RUN, "long", run_request("sleep"))
    _, started, _ = fe.expect(wire.STARTED, "long", timeout=20)
    t0 = time.monotonic()
    os.kill(started.pid, signal.SIGKILL)
    _, status, _ = fe.expect(wire.EXIT, "long", timeout=1.0)
    assert time.monotonic() - t0 < 1.0
    assert status.error == "executor exec-1 died (killed by signal 9) while running this command"
    fe.send(wire.RUN, "next", run_request("echo", "again"))
    _, started2, _ = fe.expect(wire.STARTED, "next", timeout=20)
    assert started2.pid != started.pid
    assert fe.recv()[1][1] == b"again\n"
    assert fe.expect(wire.EXIT, "next")[1].exit_code == 0
    wait_for(lambda: d.executor_pids() == [started2.pid], 5, "exactly one executor")


@pytest.mark.timeout(60)
def test_hung_spawned_executor_is_killed_and_replaced(daemons, peer, fake_executor):
    d = daemons(1, fake=fake_executor)
    fe = frontend(peer)
    fe.send(wire.RUN, "h", run_request("hang"))
    _, started, _ = fe.expect(wire.STARTED, "h", timeout=20)
    _, status, _ = fe.expect(wire.EXIT, "h", timeout=DEAD_AFTER_HEARTBEATS + 10)
    assert "exec-1 stopped responding" in status.error
    wait_for(lambda: not psutil.pid_exists(started.pid) or psutil.Process(started.pid).status() == psutil.STATUS_ZOMBIE,
             5, "the hung executor to be killed")
    fe.send(wire.RUN, "after", run_request("echo", "ok"))
    _, started2, _ = fe.expect(wire.STARTED, "after", timeout=20)
    assert started2.pid != started.pid
    assert '"executor died"' in d.log() and "killed by signal 9" in d.log()


@pytest.mark.timeout(60)
def test_executor_crashing_at_start_is_restarted_with_backoff(daemons, peer, fake_executor):
    d = daemons(1, fake=fake_executor, env={"FAKE_EXECUTOR_MODE": "crash"}, executors_ready=False)

    def backoffs() -> list[float]:
        return [json.loads(line)["delay_s"] for line in d.log().splitlines() if "backing off" in line]

    # Six quick deaths, however long a start takes: each restart waits twice as long as
    # the one before (0.1 s after the first), so they come a few a second, not dozens.
    wait_for(lambda: len(backoffs()) >= 5, timeout=40, what="six executor deaths")
    assert backoffs()[:5] == [0.2, 0.4, 0.8, 1.6, 3.2]
    died = [datetime.fromisoformat(json.loads(line)["timestamp"]) for line in d.log().splitlines()
            if '"executor died"' in line]
    assert (died[5] - died[0]).total_seconds() >= 0.1 + 0.2 + 0.4 + 0.8 + 1.6  # the waits were kept
    fe = frontend(peer)
    fe.send(wire.RUN, "waits", run_request("echo"))
    fe.send(wire.PING, "read")  # answered: the run before it was read (it waits, unanswered)
    fe.expect(wire.PONG, "read")
    fe.nothing(0.5)
    assert d.terminate() == 0
    _, status, _ = fe.expect(wire.EXIT, "waits")
    assert "shut down" in status.error


@pytest.mark.timeout(60)
def test_shutdown_stops_executors_and_forwards_their_last_exits(daemons, peer, fake_executor):
    d = daemons(2, fake=fake_executor)
    fe = frontend(peer)
    fe.send(wire.RUN, "s", run_request("sleep"))
    fe.expect(wire.STARTED, "s", timeout=20)
    wait_for(lambda: len(d.executor_pids()) == 2, 20, "two executors")
    pids = d.executor_pids()
    assert d.terminate() == 0
    _, status, _ = fe.expect(wire.EXIT, "s")
    # Its executor's exit, said to be the shutdown's doing (75), not a cancel (130).
    assert status.signal == 15 and status.error == DAEMON_STOPPED and not status.aborted
    assert not any(psutil.pid_exists(p) for p in pids)


@pytest.mark.alone
@pytest.mark.timeout(60)
def test_shutdown_kills_executors_that_ignore_sigterm(daemons, peer, fake_executor):
    d = daemons(1, fake=fake_executor, env={"FAKE_EXECUTOR_MODE": "stubborn"})
    fe = frontend(peer)
    fe.send(wire.RUN, "s", run_request("sleep"))
    fe.expect(wire.STARTED, "s", timeout=20)
    pids = d.executor_pids()
    t0 = time.monotonic()
    assert d.terminate() == 0
    assert 2.5 < time.monotonic() - t0 < 6
    _, status, _ = fe.expect(wire.EXIT, "s")
    assert "killed by signal 9" in status.error
    assert not any(psutil.pid_exists(p) for p in pids)


# ------------------------------------------------------ the real executor


def real_run(fe: Dealer, corr: str, *argv: str, timeout: float = 20.0):
    """Run through the real executor; returns (Started, ExitStatus, stdout bytes)."""
    fe.send(wire.RUN, corr, wire.RunRequest(argv=list(argv), cwd="/tmp", sandbox=SandboxPolicy.from_json(
        {"permissions": ["disk-full-read-access", "disk-write-platform-global-temp-folder"]})))
    started = None
    out = b""
    deadline = time.monotonic() + timeout
    while True:
        head, frames = fe.recv(max(0.1, deadline - time.monotonic()))
        assert head.corr == corr, head
        if head.kind == wire.STARTED:
            started = wire.decode(wire.STARTED, frames[1])
        elif head.kind == wire.OUT:
            out += frames[1]
            fe.send(wire.ACK, corr, seq=head.seq, n=len(frames[1]))
        elif head.kind == wire.EXIT:
            return started, wire.decode(wire.EXIT, frames[1]), out
        else:
            raise AssertionError(f"unexpected {head}: {frames}")


@pytest.mark.timeout(60)
def test_real_executor_runs_a_command(daemons, peer):
    daemons(1)
    fe = frontend(peer)
    started, status, out = real_run(fe, "r1", "sh", "-c", "echo sluice-ok")
    assert status.error is None, status.error
    assert status.exit_code == 0 and b"sluice-ok" in out


@pytest.mark.alone
@pytest.mark.timeout(60)
def test_real_executor_killed_mid_command_fails_the_call_within_a_second(daemons, peer):
    d = daemons(1)
    fe = frontend(peer)
    wait_for(lambda: len(d.executor_pids()) == 1, 20, "the executor")
    fe.send(wire.RUN, "long", wire.RunRequest(argv=["sleep", "30"], cwd="/tmp",
                                              sandbox=SandboxPolicy.from_json({"permissions": ["disk-full-read-access"]})))
    fe.expect(wire.STARTED, "long", timeout=20)
    [pid] = d.executor_pids()
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    while True:
        head, frames = fe.recv(1.0)
        if head.kind == wire.EXIT:
            break
    assert time.monotonic() - t0 < 1.0
    status = wire.decode(wire.EXIT, frames[1])
    assert status.error == "executor exec-1 died (killed by signal 9) while running this command"
    _, status, out = real_run(fe, "next", "sh", "-c", "echo still-here")
    assert status.exit_code == 0 and b"still-here" in out, status
