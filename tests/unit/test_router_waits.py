"""What a command queued while no executor is connected is told, by the router alone
(no processes): at once when none is coming, only after a grace when the daemon's own
executors are on their way (a daemon just started by this very command, on a busy
machine), and then that they are still starting; and how long its silent frontend is
waited for."""

from __future__ import annotations

import collections

import zmq

from broker.client import make_request
from broker.daemon import router as R
from broker.wire import frames as wire

TOKEN = "t" * 32


class _Transport:
    def __init__(self) -> None:
        self.sent: dict[bytes, list[list[bytes]]] = collections.defaultdict(list)

    def __call__(self, parts) -> None:
        self.sent[bytes(parts[0])].append([bytes(memoryview(p)) for p in parts[1:]])


class _Executors:
    """The executors' supervisor: some are on their way (started, not yet joined), or none."""

    def __init__(self, starting: bool) -> None:
        self._starting = starting

    def claim(self, peer) -> bool:
        return False

    def kill(self, peer) -> bool:
        return False

    def exited(self, peer) -> str | None:
        return None

    def restarting(self) -> str | None:
        return None

    def starting(self) -> bool:
        return self._starting

    def passes_fds(self, peer=None) -> bool:
        return False

    def pass_fds(self, peer, call_id, fds) -> str | None:
        return "no"


def _queued_run(starting: bool, **router_kw) -> tuple[R.Router, _Transport, bytes]:
    router = R.Router(TOKEN, defer=lambda fn: fn(), supervisor=_Executors(starting), **router_kw)
    transport = router.transport = _Transport()
    frontend = b"\x00\x00\x00\x00\x01"
    hello = wire.Hello(role=wire.ROLE_FRONTEND, token=TOKEN, pid=1, name="sluice run")
    router.on_message([zmq.Frame(frontend), *(zmq.Frame(p) for p in wire.message(wire.HELLO, body=hello))])
    request = make_request(["true"], cwd="/tmp", check_paths=False)
    router.on_message([zmq.Frame(frontend), *(zmq.Frame(p) for p in wire.message(wire.RUN, "c1", request))])
    return router, transport, frontend


def _notices(transport: _Transport, frontend: bytes) -> list[str]:
    out = []
    for parts in transport.sent[frontend]:
        head = wire.decode_header(parts[0])
        if head.kind == wire.NOTICE:
            out.append(wire.decode(wire.NOTICE, parts[1]).message)
    return out


def test_with_no_executor_coming_the_command_is_told_at_once():
    router, transport, frontend = _queued_run(starting=False)
    assert _notices(transport, frontend) == [R.NO_EXECUTOR]


def test_while_its_executors_start_the_command_waits_in_silence_then_is_told_they_still_start():
    router, transport, frontend = _queued_run(starting=True)
    for _ in range(R.STARTING_GRACE - 1):
        router.heartbeat()
    assert _notices(transport, frontend) == []
    for _ in range(2):
        router.heartbeat()
    assert _notices(transport, frontend) == [R.STILL_STARTING]  # once


def test_a_faster_heartbeat_keeps_a_silent_frontends_allowance_in_seconds():
    """``--heartbeat 0.35`` (for executors on hosts that can power off) must not cut a
    library caller's 10 s: it answers pings only while it waits on its client."""
    router, transport, frontend = _queued_run(starting=False, heartbeat_s=0.35)
    beats = 29  # ceil(10 s / 0.35 s)
    assert router.frontend_beats == beats
    for _ in range(beats):
        router.heartbeat()
    assert frontend in router.callers
    router.heartbeat()
    assert frontend not in router.callers


def test_at_the_default_heartbeat_a_silent_frontend_is_given_up_after_ten():
    router, transport, frontend = _queued_run(starting=False)
    for _ in range(R.DEAD_AFTER_HEARTBEATS):
        router.heartbeat()
    assert frontend in router.callers
    router.heartbeat()
    assert frontend not in router.callers
