"""Fan-out: session events delivered to 1, 10 and 50 attached frontends, and replay.

A real daemon and agent process, and a scripted model server on loopback whose answer
streams ``EVENTS`` text deltas, each of which the agent turns into one
``agent_message_delta`` event. Every frontend is a process of its own (this file run
with ``--worker``) with one client connection, as frontends are.

- ``fanout-N``: N frontends attach live, then the turn runs. The figure is the
  aggregate: events delivered to all of them per second, from the first delivery to the
  last. The baseline is N = 1, measured in the same run. The stats column gives the
  per-frontend rates (events received / (its last event - its first)), the note the
  slowest frontend's time. Target for N = 50: >= 200,000 events/s in all, every
  frontend getting every event.
- ``replay-100k``: a finished session of 100,000 events and a few; one frontend attaches
  with ``since=0``; the figure is the time from attaching to its last event (most of
  them come from the on-disk journal: the memory log keeps 4096). Target: <= 300 ms.
- ``replay-100k-x10``: ten frontends replay it at once; the time until the last of them
  has every event. No target.

With --quick: 2,000 live events, 1 and 50 frontends, and a session of 10,000 events
to replay (the replay rows keep their ids; ``replay-100k``'s target is not judged).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from common import ROOT, Daemon, Row, Stats, bench_main, error_row, fmt, log, ratio

EVENTS = 20_000
QUICK_EVENTS = 2_000
REPLAY_EVENTS = 100_000
FANOUT = (1, 10, 50)
QUICK_FANOUT = (1, 50)
TARGET_FANOUT_50 = 200_000.0  # events/s delivered in all
TARGET_REPLAY_MS = 300.0


# -- the frontend process --------------------------------------------------------------------


def worker(runtime_path: str, session_id: str, mode: str) -> int:
    """Attach, say "ready", count events; print {"n", "first", "last", "attached"} (monotonic ns).

    ``live``: from the head on, until ``task_complete``; ``replay``: since 0 until the head
    the daemon named at attach.
    """
    from broker.client import Client
    from broker.net.runtime import RuntimeDir

    client = Client.connect(RuntimeDir(runtime_path), autostart=False, timeout=30.0, name=f"bench {mode}")
    if mode == "replay":
        sys.stdin.readline()  # start together
    attached = time.monotonic_ns()
    session = client.attach(session_id, since=0 if mode == "replay" else session_head(client, session_id) + 1)
    head = session.info.seq
    print("ready", flush=True)
    n = 0
    first = last = 0
    while True:
        event = session.next_event(60.0)
        if event is None:
            print(json.dumps({"error": f"no event for 60 s after {n}"}), flush=True)
            return 1
        last = time.monotonic_ns()
        if not n:
            first = last
        n += 1
        if mode == "live" and type(event.msg).__struct_config__.tag == "task_complete":
            break
        if mode == "replay" and event.seq >= head:
            break
    print(json.dumps({"n": n, "first": first, "last": last, "attached": attached, "lagged": session.lagged}), flush=True)
    session.detach()
    client.close()
    return 0


def session_head(client, session_id: str) -> int:
    for info in client.list_sessions().sessions:
        if info.id == session_id:
            return info.seq
    raise RuntimeError(f"session {session_id} is gone")


# -- the benchmark ------------------------------------------------------------------------


class Frontends:
    """N worker processes attached to one session."""

    def __init__(self, daemon: Daemon, session_id: str, n: int, mode: str) -> None:
        argv = [sys.executable, os.path.abspath(__file__), "--worker", daemon.runtime.path, session_id, mode]
        self.procs = [subprocess.Popen(argv, env=daemon.env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       text=True, cwd=ROOT) for _ in range(n)]
        self.mode = mode

    def start(self) -> None:
        """Replay workers attach when told, all at once; live ones say ready once attached."""
        if self.mode == "replay":
            for p in self.procs:
                p.stdin.write("go\n")
                p.stdin.flush()
        for p in self.procs:
            line = p.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"a frontend did not attach: {line!r}")

    def results(self, timeout: float = 300.0) -> list[dict]:
        out = []
        for p in self.procs:
            try:
                stdout, _ = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                raise RuntimeError("a frontend did not finish in time") from None
            lines = stdout.strip().splitlines()
            if not lines:
                raise RuntimeError(f"a frontend exited {p.returncode} without a result")
            result = json.loads(lines[-1])
            if "error" in result:
                raise RuntimeError(f"a frontend failed: {result['error']}")
            out.append(result)
        return out

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def open_session(daemon: Daemon, server):
    from broker.wire.protocol import (
        AskForApproval,
        ConfigureSession,
        ModelProviderInfo,
        WireApi,
    )
    from landlock_helper.policy import SandboxPolicy

    client = daemon.client()
    op = ConfigureSession(
        provider=ModelProviderInfo(name="bench", base_url=server.base_url, env_key="BENCH_KEY", wire_api=WireApi.RESPONSES),
        model="bench-model", approval_policy=AskForApproval.NEVER, sandbox_policy=SandboxPolicy.from_mode("read-only"),
        cwd=ROOT, api_key="sk-bench",
    )
    session = client.open_session(op)
    while (event := session.next_event(30.0)) is not None and type(event.msg).__struct_config__.tag != "session_configured":
        pass
    return client, session


def turn(server, session, events: int) -> None:
    """Script a turn of ``events`` text deltas and start it (the driver does not watch)."""
    from broker.wire.protocol import TextInput, UserInput
    from tests.support.fake_model import assistant, response

    server.script(response(assistant("x" * events), deltas=["x"] * events))
    session.submit(UserInput([TextInput("go")]))


def wait_idle(client, session_id: str, after: int, timeout: float = 300.0) -> int:
    """Wait for a turn that started after event ``after`` to end; the newest seq then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for info in client.list_sessions().sessions:
            if info.id == session_id and info.state == "idle" and info.turn_start > after:
                return info.seq
        time.sleep(0.05)
    raise RuntimeError("the turn did not end in time")


def replay_row(daemon: Daemon, session_id: str, head: int, n: int, row_id: str) -> Row:
    """``n`` frontends replay the finished session (``head`` events) at once."""
    fronts = Frontends(daemon, session_id, n, "replay")
    try:
        fronts.start()
        results = fronts.results()
    finally:
        fronts.kill()
    if any(r["n"] != head for r in results):
        raise RuntimeError(f"a replay got {[r['n'] for r in results]} events, expected {head}")
    took = (max(r["last"] for r in results) - min(r["attached"] for r in results)) / 1e6
    targeted = n == 1
    judged = targeted and head >= REPLAY_EVENTS  # not the smaller session of --quick
    return Row(row_id, took, "ms", target=f"<= {TARGET_REPLAY_MS:g} ms" if targeted else None,
               holds=took <= TARGET_REPLAY_MS if judged else None,
               note=f"{head} events each; {fmt(n * head / (took / 1e3))} ev/s delivered"
               + ("" if judged or not targeted else "; not judged: fewer than 100,000 events (--quick)"))


def run(quick: bool) -> list[Row]:
    from tests.support.fake_model import FakeModelServer

    events = QUICK_EVENTS if quick else EVENTS
    replay_events = QUICK_EVENTS * 5 if quick else REPLAY_EVENTS
    rows: list[Row] = []
    with Daemon() as daemon, FakeModelServer() as server:
        client, session = open_session(daemon, server)
        session.detach()  # the driver only submits; the frontends watch
        base = None
        for n in (QUICK_FANOUT if quick else FANOUT):
            log(f"fan-out to {n} frontends, {events} events")
            fronts = Frontends(daemon, session.id, n, "live")
            try:
                fronts.start()
                before = session_head(client, session.id)
                turn(server, session, events)
                results = fronts.results()
            finally:
                fronts.kill()
            wait_idle(client, session.id, before)
            per = [r["n"] / ((r["last"] - r["first"]) / 1e9) for r in results]
            got = {r["n"] for r in results}
            span = (max(r["last"] for r in results) - min(r["first"] for r in results)) / 1e9
            aggregate = sum(r["n"] for r in results) / span
            base = base or aggregate
            # Every frontend got every event (a lagged notice is flow control: nothing is lost).
            complete = got == {results[0]["n"]} and results[0]["n"] >= events
            judged = n == 50
            rows.append(Row(
                f"fanout-{n}", aggregate, "ev/s", base, ratio(aggregate, base),
                f">= {TARGET_FANOUT_50:,.0f} ev/s in all" if judged else None,
                (aggregate >= TARGET_FANOUT_50 and complete) if judged else None, Stats.of(per),
                note=f"events/s in all; per frontend (stats column) median {fmt(Stats.of(per).median)} ev/s; "
                f"slowest frontend {fmt(max(r['last'] - r['first'] for r in results) / 1e6)} ms; "
                f"events per frontend {sorted(got)}; lagged notices {sum(r['lagged'] for r in results)}",
            ))

        log(f"a session of {replay_events} events")
        client, session = open_session(daemon, server)  # a fresh one: only this turn in it
        session.detach()
        before = session_head(client, session.id)
        turn(server, session, replay_events)
        head = wait_idle(client, session.id, before)
        for n, row_id in ((1, "replay-100k"), (10, "replay-100k-x10")):
            try:
                rows.append(replay_row(daemon, session.id, head, n, row_id))
            except (RuntimeError, ValueError) as e:  # the live rows above still count
                rows.append(error_row(row_id, e))
    return rows


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        sys.exit(worker(*sys.argv[2:5]))
    bench_main(run, __doc__)
