"""The daemon overloaded or stalled: a stopped client with many chatty calls, a message of
millions of parts, a daemon paused for half a minute, more callers than executor slots.

Each test first shows the fault reached (the client's queue full, the parts sent, the
daemon really stopped, callers really beyond the slots), then that nothing is lost and
nobody is wrongly given up. Counts are modest and every wait has a deadline: the machine
these run on is small and shared.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import zmq

from broker.daemon.receipts import UNPROVEN_BYTES
from broker.daemon.router import MAX_PARTS
from broker.net import peer
from broker.wire import frames as wire
from broker.wire.protocol import TextInput, UserInput
from tests.support.fake_model import assistant, response
from tests.support.harness import SANDBOX_PYTHON, reap, wait_for
from tests.support.sessions import collect, configure_op

pytestmark = pytest.mark.timeout(300)

# What a stopped client may cost the daemon, at most (docs/faults.md says so).
CLIENT_BOUND = 64 * 1024 * 1024


def _rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


# A client of its own process: ``calls`` calls of a command that prints ``lines`` lines
# a little apart, so that most are a message of their own (a progress log, a test
# runner); it says "started" once all run, then prints one JSON line per call.
_CHATTY_CLIENT = textwrap.dedent("""
    import json, sys
    from broker.client import Client
    calls_n, lines, cwd, python, marker = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    script = ("import sys, time\\n"
              "for i in range(int(sys.argv[1])):\\n"
              "    print(f'line-{i:05} ' + 'x' * 290, flush=True)\\n"
              "    time.sleep(0.002)\\n")
    c = Client.connect(autostart=False)
    calls = [c.submit([python, "-c", script, str(lines), marker], cwd=cwd, capture_limit=16 << 20)
             for _ in range(calls_n)]
    while not all(call.started for call in calls):
        c.poll(0.05)
    print("started", flush=True)
    notices = []
    for call in calls:
        call.on_notice = lambda call, note: notices.append(note)
    for r in c.wait_all(calls, 240):
        print(json.dumps({"code": r.returncode, "error": r.error, "stdout": r.stdout.decode()}), flush=True)
    print(json.dumps({"notices": notices}), flush=True)
""")


def test_a_stopped_client_with_many_chatty_calls_loses_nothing_and_costs_the_daemon_a_bound(daemon_factory, tmp_path):
    calls, lines = 32, 3_000  # 28 MiB in all: past the 8 MiB a client may have unproven by 3.5 times
    d = daemon_factory.start(executors=1)
    marker = f"chatty-{os.getpid()}"
    argv = [sys.executable, "-c", _CHATTY_CLIENT, str(calls), str(lines), str(tmp_path), SANDBOX_PYTHON, marker]
    client = subprocess.Popen(argv, env=d.env_for_children(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline() == "started\n", client.stderr.read()
        before = _rss(d.pid)
        client.send_signal(signal.SIGSTOP)
        peak = before

        def held() -> bool:
            nonlocal peak
            peak = max(peak, _rss(d.pid))
            return "frontend behind: its commands are held" in d.log()

        # The fault: the stopped client's queue fills (more than the daemon lets a client
        # have unproven), and only the hold stops the flow.
        wait_for(held, 120, "the stopped client's queue to fill", interval=0.1)
        queued = max(int(q) for q in re.findall(r'"queued_bytes": (\d+)', d.log()))
        assert queued > UNPROVEN_BYTES
        # Held, the commands block on their pipes instead of running on into a queue: a
        # while later they all still run and the daemon has stopped growing.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            peak = max(peak, _rss(d.pid))
            time.sleep(0.1)
        running = [p for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]
        assert running, "every command ended while its client was stopped: nothing was held"
        print(f"daemon RSS with a stopped client of {calls} chatty calls: {before >> 20} MiB before, "
              f"{peak >> 20} MiB at the peak; {queued >> 20} MiB queued when held")
        assert peak - before < CLIENT_BOUND, f"the daemon grew by {(peak - before) >> 20} MiB"
    finally:
        client.send_signal(signal.SIGCONT)
    try:
        out, err = client.communicate(timeout=240)
    finally:
        reap(client)
    results = [json.loads(line) for line in out.splitlines()]
    notices = results.pop()["notices"]
    expected = "".join(f"line-{i:05} {'x' * 290}\n" for i in range(lines))
    assert len(results) == calls, err
    for r in results:
        assert (r["code"], r["error"]) == (0, None)
        assert r["stdout"] == expected, f"{len(r['stdout'])} of {len(expected)} bytes"
    assert notices == []
    assert "message not sent" not in d.log()
    assert "frontend caught up: its commands go on" in d.log()


def _joined(ctx: zmq.Context, d, name: str) -> zmq.Socket:
    """A raw frontend that said hello and was welcomed."""
    sock = peer.dealer(ctx, sndhwm=0, rcvhwm=1000)
    sock.connect(d.runtime.endpoint)
    sock.send_multipart(peer.hello(wire.ROLE_FRONTEND, d.runtime.read_token(), name))
    assert sock.poll(10_000), "no welcome"
    assert wire.decode_header(sock.recv_multipart()[0]).kind == wire.WELCOME
    return sock


def test_a_message_of_a_million_parts_is_refused_unread_and_stalls_nobody(daemon_factory, tmp_path):
    parts = 1_000_000
    d = daemon_factory.start(executors=1)
    client = d.client()
    assert client.run(["echo", "warm"], cwd=str(tmp_path)).stdout == b"warm\n"
    executors = d.executor_pids()
    ctx = zmq.Context()
    sock = _joined(ctx, d, "parts")
    try:
        before = _rss(d.pid)
        for _ in range(parts - 1):
            sock.send(b"", zmq.SNDMORE)
        sock.send(b"")
        t0 = time.monotonic()
        assert sock.poll(60_000), "the sender was not told"
        refused_s = time.monotonic() - t0
        head, body = sock.recv_multipart()
        assert wire.decode_header(head).kind == wire.ERROR
        message = wire.decode(wire.ERROR, body).message
        assert message.startswith(f"message refused unread: more than {MAX_PARTS} parts"), message
        # Told as soon as it was judged, the rest is read through (libzmq hands a message over
        # whole, in order: until then, nothing else on that socket can be read). Others wait
        # for that, and no longer: a run started now ends.
        t0 = time.monotonic()
        assert client.run(["echo", "served"], cwd=str(tmp_path), wait_timeout=60).stdout == b"served\n"
        served_s = time.monotonic() - t0
        grew = _rss(d.pid) - before
        print(f"a message of {parts} parts: refused after {refused_s:.1f} s, another client served in "
              f"{served_s:.1f} s; the daemon grew by "
              f"{grew >> 20} MiB ({grew / parts:.0f} bytes a part)")
        # libzmq takes a message in whole before the daemon sees its first part (64 bytes a
        # part in its queue); the daemon itself holds none of it.
        assert grew < parts * 128
        # ... and once it is read through, that memory goes back to the system.
        wait_for(lambda: _rss(d.pid) - before < parts * 16, 60, "the parts' memory to be given back", interval=0.2)
        # The refusal cost the sender nothing more: it is still a peer, and nobody was given up.
        sock.send_multipart([wire.header(wire.PING, "still")])
        assert sock.poll(10_000)
        assert wire.decode_header(sock.recv_multipart()[0]).kind == wire.PONG
    finally:
        sock.close(linger=0)
        ctx.term()
    assert d.executor_pids() == executors
    assert "hung" not in d.log()


def test_a_daemon_paused_for_half_a_minute_loses_no_session_and_no_command(daemon_factory, server, sluice, tmp_path):
    pause_s = 30
    # Longer than the daemon's own check, and than the peers gave it before (6.5 s, 10 s).
    assert peer.DEAD_AFTER_HEARTBEATS * peer.HEARTBEAT_S < pause_s < peer.PATIENCE_HEARTBEATS * peer.HEARTBEAT_S
    d = daemon_factory.start(executors=1, env={"SLUICE_HOME": str(tmp_path / "home")})
    client = d.client()
    server.script(response(assistant("before the pause")), response(assistant("after the pause")))
    session = client.open_session(configure_op(server, str(tmp_path)))
    collect(session, "session_configured")
    session.submit(UserInput([TextInput("one")]))
    collect(session, "task_complete")
    children = sorted(p.pid for p in psutil.Process(d.pid).children())
    script = "echo before; while [ ! -e go ]; do sleep 0.1; done; echo after"
    proc = subprocess.Popen([*sluice, "run", "--via-broker", "--cwd", str(tmp_path), "--", "sh", "-c", script],
                            env=d.env_for_children(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"before\n"
        os.kill(d.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: psutil.Process(d.pid).status() == psutil.STATUS_STOPPED, what="the daemon to stop")
            time.sleep(pause_s)  # the fault itself: the daemon stays stopped this long
            (tmp_path / "go").touch()
            # Every peer noticed, and waits: the agent and the executor say so in the log.
            log = d.log()
            assert log.count("has not answered for") >= 2, log[-3000:]
        finally:
            os.kill(d.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=60)
    finally:
        reap(proc)
    assert (proc.returncode, out) == (0, b"after\n"), err.decode()
    assert "waiting for it" in err.decode()  # the caller was told why nothing came
    session.submit(UserInput([TextInput("two")]))
    events = collect(session, "task_complete", timeout=60)
    assert any(getattr(e.msg, "message", None) == "after the pause" for e in events), events[-3:]
    assert sorted(p.pid for p in psutil.Process(d.pid).children()) == children  # nobody was killed or replaced
    assert "sessions lost" not in d.log() and "hung" not in d.log()


def test_more_callers_than_executor_slots_wait_their_turn_and_none_fails(daemon_factory, sluice, tmp_path):
    slots, callers = 4, 40
    d = daemon_factory.start(executors=0)
    argv = [sys.executable, "-m", "executor", "--connect", d.runtime.endpoint, "--token-file", d.runtime.token_path,
            "--name", "small", "--slots", str(slots), "--hide", d.runtime.path]
    executor = subprocess.Popen(argv, env=d.env_for_children(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    procs = []
    try:
        client = d.client()
        wait_for(lambda: client.daemon_info().executors, 30, "the executor to join")
        for i in range(callers):
            command = ["sh", "-c", "sleep 0.3; echo $0", str(i)]
            procs.append(subprocess.Popen([*sluice, "run", "--via-broker", "--cwd", str(tmp_path), "--", *command],
                                          env=d.env_for_children(), stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        # The fault: more commands than slots at once; the daemon queues the rest.
        queued = 0
        while any(p.poll() is None for p in procs):
            queued = max(queued, client.daemon_info().queued)
            time.sleep(0.05)
        assert queued > 0, "the callers never exceeded the executor's slots"
        for i, p in enumerate(procs):
            out, err = p.communicate()
            assert (p.returncode, out) == (0, f"{i}\n".encode()), err.decode()
        print(f"{callers} callers on {slots} slots: at most {queued} waited at once, none failed")
        assert executor.poll() is None and "stopped responding" not in d.log()
    finally:
        for p in procs:
            reap(p)
        executor.terminate()
        executor.wait(30)
        executor.stderr.close()
