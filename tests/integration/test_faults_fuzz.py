"""Malformed frames of every kind, sent with a valid token: the daemon answers what it
owes an answer, drops the rest, stays up, goes on serving, and its memory stays bounded.

A seeded generator (the seed is in every failure message; ``SLUICE_FUZZ_SEED=N`` replays
a run) makes, for every message kind of :mod:`broker.wire.frames`, messages whose body
is truncated, of the wrong types, with strings that are not UTF-8, nested far deeper than
any stack, with huge sizes (declared, and a few real ones within MAXMSGSIZE), or another
kind's, and whose frames are missing or too many; and headers that do not decode. They go
to one real daemon from an authenticated frontend, an executor and an agent (not the
daemon's own, which may only run commands), from a peer that never said hello, and, for
``hello`` bodies, from fresh connections.

Then: the daemon is alive; every message the protocol owes an answer (its header
readable, with a correlation id, and either a kind that is answered or a message its
sender may not send in that shape) got one carrying that correlation id; a normal run
through the client library works; the daemon's RSS grew by less than
:data:`RSS_GROWTH_LIMIT`; its log has no traceback and stayed short (throttled).

The daemon reads only the head of a submission (its id and op type) before forwarding it
to the agent; submissions to a real session whose op only the agent finds malformed
(strings that are not UTF-8 where the daemon skips them, wrong types, unknown types) are
answered by the agent with an ``error`` event each, and the session's next turn runs.
"""

from __future__ import annotations

import os
import random
import re
import time

import msgspec
import psutil
import pytest
import zmq

from broker.wire import frames as wire
from broker.wire import protocol as P
from landlock_helper.policy import SandboxPolicy
from tests.support.fake_model import assistant, response, tag, user_item
from tests.support.frontends import configure_op
from tests.support.harness import daemons, short_tempdir

pytestmark = pytest.mark.timeout(90)

SEED = int(os.environ.get("SLUICE_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
RSS_GROWTH_LIMIT = 64 * 1024 * 1024
# Messages per role; a few of them carry real bodies of many MiB.
PER_ROLE = 1500
HUGE_BODIES = 6
HELLOS = 150
ANSWER_TIMEOUT_S = 15.0

# Every message kind, as the table in broker.wire.frames' docstring lists them (so a kind
# added there is fuzzed too); "kind" is the table's heading.
KINDS = sorted(set(re.findall(r"^([a-z_]+) {2,}", wire.__doc__, re.M)) - {"kind"})
# What a peer may send the daemon, and with how many body frames (the module docstring of
# broker.wire.frames: "Frame counts are strict"); other kinds are the daemon's own.
BODY_FRAMES = {wire.HELLO: 1, wire.RUN: 1, wire.STARTED: 1, wire.OUT: 1, wire.EXIT: 1, wire.SUBMIT: 1, wire.EVENT: 1,
               wire.EVENTS: 1,
               wire.ACK: 0, wire.IN: 1, wire.RESIZE: 1, wire.SIGNAL: 0, wire.CANCEL: 0, wire.PING: 0, wire.PONG: 0, wire.BYE: 0, wire.CLOSED: 0, wire.SERVE: 0,
               wire.ATTACH: 0, wire.DETACH: 0, wire.SESSIONS: 0, wire.STATUS: 0}
# Per role: the kinds it may send, and those of them that are answered (pings with a pong,
# requests with their result or an error; a second hello, an agent's events, closes and
# serves, which only the daemon's own agent may send, with an error).
MAY_SEND = {
    wire.ROLE_FRONTEND: {wire.HELLO, wire.RUN, wire.ACK, wire.IN, wire.RESIZE, wire.SIGNAL, wire.CANCEL, wire.PING,
                         wire.PONG, wire.BYE,
                         wire.SUBMIT, wire.ATTACH, wire.DETACH, wire.SESSIONS, wire.STATUS},
    wire.ROLE_EXECUTOR: {wire.HELLO, wire.STARTED, wire.OUT, wire.EXIT, wire.ACK, wire.PING, wire.PONG, wire.BYE},
    wire.ROLE_AGENT: {wire.HELLO, wire.RUN, wire.ACK, wire.IN, wire.RESIZE, wire.SIGNAL, wire.CANCEL, wire.PING,
                      wire.PONG, wire.BYE,
                      wire.EVENT, wire.CLOSED, wire.SERVE},
}
ANSWERED = {
    wire.ROLE_FRONTEND: {wire.HELLO, wire.RUN, wire.PING, wire.SUBMIT, wire.ATTACH, wire.SESSIONS, wire.STATUS},
    wire.ROLE_EXECUTOR: {wire.HELLO, wire.PING},
    wire.ROLE_AGENT: {wire.HELLO, wire.RUN, wire.PING, wire.EVENT, wire.CLOSED, wire.SERVE},
}
STRANGER = "stranger"


def seeded(message: str) -> str:
    return f"{message} (seed {SEED}; replay with SLUICE_FUZZ_SEED={SEED})"


def expects_answer(role: str, kind: str, body_frames: int) -> bool:
    """Whether the protocol owes an answer to a message with a readable header and a
    correlation id: a request, or a message its sender may not send (in that shape)."""
    if role == STRANGER:
        return True  # "send hello first", or a malformed hello refused
    if BODY_FRAMES.get(kind) != body_frames or kind not in MAY_SEND[role]:
        return True
    return kind in ANSWERED[role]


# -- the generator ----------------------------------------------------------------------


def valid_bodies(token: str) -> dict[str, object]:
    """A valid body of every kind that has one, as msgpack builtins (mutated below)."""
    policy = SandboxPolicy.from_mode("read-only")
    structs = {
        wire.HELLO: wire.Hello(role=wire.ROLE_FRONTEND, token=token, pid=os.getpid(), name="fuzz"),
        wire.WELCOME: wire.Welcome(peer_id="frontend-1"),
        wire.ERROR: wire.ErrorMsg("no"),
        wire.NOTICE: wire.ErrorMsg("note"),
        wire.RUN: wire.RunRequest(argv=["true"], cwd="/", sandbox=policy, env={"A": "b"}, timeout_ms=1000),
        wire.STARTED: wire.Started(pid=1, executor="x"),
        wire.EXIT: wire.ExitStatus(exit_code=0, stdout=b"out"),
        wire.ATTACHED: wire.SessionInfo(id="s", frontends=["a"]),
        wire.SESSIONS: wire.SessionList(sessions=[wire.SessionInfo(id="s")]),
        wire.STATUS: wire.DaemonInfo(pid=1, executors=[wire.ExecutorInfo(name="e", slots=1)]),
    }
    bodies = {kind: msgspec.msgpack.decode(wire.encode(s)) for kind, s in structs.items()}
    bodies[wire.SUBMIT] = msgspec.msgpack.decode(P.encode_msgpack(P.Submission("s1", P.UserInput([P.TextInput("hi")]))))
    bodies[wire.EVENT] = msgspec.msgpack.decode(P.encode_msgpack(P.Event(id="e", msg=P.ErrorEvent("x"))))
    bodies[wire.OUT] = b"a chunk"
    return bodies


def deep(rng: random.Random) -> msgspec.Raw:
    depth = rng.choice([1100, 5000, 100_000, 1_000_000])
    if rng.random() < 0.5:
        return msgspec.Raw(b"\x91" * depth + b"\xc0")  # [[[...nil...]]]
    return msgspec.Raw(b"\x81\xa1k" * depth + b"\xc0")  # {"k": {"k": ...}}


def bad_utf8(rng: random.Random) -> msgspec.Raw:
    junk = rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"ok\xf8\x88\x80\x80\x80", b"\xe2\x82"])
    return msgspec.Raw(bytes([0xA0 | len(junk)]) + junk)  # a fixstr that is not UTF-8


def huge_declared(rng: random.Random) -> msgspec.Raw:
    # A str, bin, array or map that says it holds 4 Gi (bytes or elements), and holds nothing.
    return msgspec.Raw(rng.choice([b"\xdb", b"\xc6", b"\xdd", b"\xdf"]) + b"\xff\xff\xff\xff")


def wrong_value(rng: random.Random) -> object:
    return rng.choice([0, -1, 2**64 - 1, -(2**63), 1.5, float("nan"), True, None, "", "text", b"bin", [], {},
                       [1, "a", None], {"k": [1]}, {1: 2}, msgspec.msgpack.Ext(5, b"x")])


def nodes(value, path=()):
    """Paths to every value inside ``value`` (dict values, list items), itself included."""
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from nodes(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from nodes(item, (*path, i))


def replaced(value, path, new):
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: replaced(value[head], rest, new)}
    copy = list(value)
    copy[head] = replaced(copy[head], rest, new)
    return copy


def bad_body(rng: random.Random, kind: str, bodies: dict) -> tuple[str, bytes]:
    """(how it is bad, the body): a mutation of ``kind``'s valid body (or of any kind's)."""
    base = bodies.get(kind)
    if base is None or isinstance(base, bytes):
        base = bodies[rng.choice([k for k, v in bodies.items() if not isinstance(v, bytes)])]
    encoded = msgspec.msgpack.encode(base)
    paths = list(nodes(base))
    how = rng.choice(["truncated", "wrong type", "bad utf-8", "bad utf-8 key", "deep", "deep extra", "huge declared",
                      "random bytes", "empty", "other kind", "wrong top type"])
    if how == "truncated":
        return how, encoded[: rng.randrange(len(encoded))]
    if how == "wrong type":
        return how, msgspec.msgpack.encode(replaced(base, rng.choice(paths), wrong_value(rng)))
    if how == "bad utf-8":
        return how, msgspec.msgpack.encode(replaced(base, rng.choice(paths), bad_utf8(rng)))
    if how == "bad utf-8 key":
        # The first key of the body's map, in bytes that are not UTF-8.
        return how, encoded[:1] + bad_utf8(rng) + encoded[1 + 1 + len(next(iter(base))):]
    if how == "deep":
        return how, msgspec.msgpack.encode(replaced(base, rng.choice(paths), deep(rng)))
    if how == "deep extra":
        return how, msgspec.msgpack.encode({**base, "zz_unknown": deep(rng)})
    if how == "huge declared":
        return how, msgspec.msgpack.encode(replaced(base, rng.choice(paths), huge_declared(rng)))
    if how == "random bytes":
        return how, rng.randbytes(rng.randrange(1, 300))
    if how == "empty":
        return how, b""
    if how == "other kind":
        other = rng.choice([k for k in bodies if k != kind])
        body = bodies[other]
        return how, body if isinstance(body, bytes) else msgspec.msgpack.encode(body)
    return how, msgspec.msgpack.encode(wrong_value(rng))


def huge_body(rng: random.Random, kind: str, bodies: dict) -> tuple[str, bytes]:
    """A body of many MiB (within MAXMSGSIZE) that does not decode."""
    size = rng.randrange(8, 48) * 1024 * 1024
    base = bodies.get(kind)
    if not isinstance(base, dict):
        base = bodies[wire.RUN]
    if rng.random() < 0.5:
        junk = msgspec.Raw(b"\xdb" + size.to_bytes(4, "big") + b"\xff" * size)  # a str, not UTF-8
        return "huge bad utf-8", msgspec.msgpack.encode(replaced(base, rng.choice(list(nodes(base))[1:]), junk))
    return "huge truncated", msgspec.msgpack.encode({**base, "zz_unknown": "x" * size})[:-1]


def bad_header(rng: random.Random) -> tuple[str, bytes]:
    """A header frame that does not decode (or is too big to be read)."""
    good = wire.header(rng.choice(KINDS), "c-bad")
    how = rng.choice(["truncated", "bad utf-8", "wrong type", "deep", "map", "too long array", "huge declared",
                      "oversized", "empty", "random bytes"])
    if how == "truncated":
        return how, good[: rng.randrange(len(good))]
    if how == "bad utf-8":
        return how, msgspec.msgpack.encode([bad_utf8(rng), "c"])
    if how == "wrong type":
        return how, msgspec.msgpack.encode([wrong_value(rng) if rng.random() < 0.5 else 7, "c", wrong_value(rng)])
    if how == "deep":
        return how, b"\x92\xa3run" + b"\x91" * rng.randrange(1100, 4000) + b"\xc0"
    if how == "map":
        return how, msgspec.msgpack.encode({"kind": "run", "corr": "c"})
    if how == "too long array":
        return how, msgspec.msgpack.encode(["run", "c", "", 0, 0, 0, 0])
    if how == "huge declared":
        return how, b"\x92" + huge_declared(rng)
    if how == "oversized":
        return how, wire.header(wire.RUN, "c" * 5000)
    if how == "empty":
        return how, b""
    return how, rng.randbytes(rng.randrange(1, 64))


class Sent:
    """One message: what it was, and whether it is owed an answer (by its corr)."""

    def __init__(self, role: str, kind: str, how: str, corr: str, owed: bool) -> None:
        self.role, self.kind, self.how, self.corr, self.owed = role, kind, how, corr, owed

    def __repr__(self) -> str:
        return f"{self.role} {self.kind} ({self.how}) corr={self.corr}"


def messages(rng: random.Random, role: str, bodies: dict, count: int, huge: int):
    """``count`` malformed or unusual messages as ``role`` sends them: (Sent, frames)."""
    huge_at = set(rng.sample(range(count), huge))
    for i in range(count):
        kind = KINDS[i % len(KINDS)]  # every kind, evenly
        corr = f"{role[:2]}-{i}-{rng.randrange(10**6)}"
        if i % 9 == 4:
            how, head = bad_header(rng)
            yield Sent(role, kind, "header " + how, corr, owed=False), [head]
            continue
        session = rng.choice(["", "", "no-such-session", "\x00" * 3, "s" * 300])
        numbers = [rng.choice([0, 1, -1, 2**63 - 1, -(2**63), rng.randrange(-1000, 10**6)]) for _ in range(3)]
        head = wire.header(kind, corr, session=session, seq=numbers[0], stream=numbers[1], n=numbers[2])
        if i in huge_at:
            how, body = huge_body(rng, kind, bodies)
        else:
            how, body = bad_body(rng, kind, bodies)
        # Mostly the frame count the kind takes, else one missing or too many.
        shape = rng.choice(["right"] * 5 + ["none", "extra", "two extra"])
        takes = BODY_FRAMES.get(kind, 1)
        if shape == "right":
            frames = [head, body] if takes else [head]
        elif shape == "none":
            frames = [head]
        elif shape == "extra":
            frames = [head, body, b"more"] if takes else [head, body]
        else:
            frames = [head, body, b"", rng.randbytes(8)]
        body_frames = len(frames) - 1
        if role != STRANGER and kind == wire.BYE and body_frames == 0:
            continue  # a good bye would end this peer: sent at the end instead
        if role == STRANGER and kind == wire.HELLO and body_frames == 1:
            frames.append(b"")  # a stranger's good-shaped hello could make it a peer: see hellos()
            body_frames = 2
        yield Sent(role, kind, f"{how}, {shape} frames", corr, expects_answer(role, kind, body_frames)), frames


def hellos(rng: random.Random, bodies: dict, count: int):
    """Hellos with bad bodies (bad token, types, UTF-8, nesting...), each from a new peer."""
    for i in range(count):
        corr = f"hello-{i}"
        if i % 4 == 0:
            how, body = "wrong token", msgspec.msgpack.encode({**bodies[wire.HELLO], "token": "x" * rng.randrange(80)})
        else:
            how, body = bad_body(rng, wire.HELLO, bodies)
        yield Sent(STRANGER, wire.HELLO, how, corr, owed=True), [wire.header(wire.HELLO, corr), body]


# -- the peers ---------------------------------------------------------------------------


class RawPeer:
    """A DEALER on the daemon's socket that records the correlation ids it was answered with,
    answers pings, and (as an executor) fails every run it is given."""

    def __init__(self, ctx: zmq.Context, endpoint: str, role: str) -> None:
        self.role = role
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)  # never let the daemon find our queue full
        self.sock.setsockopt(zmq.SNDTIMEO, 10_000)
        self.sock.connect(endpoint)
        self.answered: dict[str, str] = {}
        self.received = 0
        # Bodies of the session events received.
        self.events: list[bytes] = []

    def send(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)

    def drain(self, timeout_ms: int = 0) -> None:
        while self.sock.poll(timeout_ms):
            timeout_ms = 0
            frames = self.sock.recv_multipart()
            self.received += 1
            head = wire.decode_header(frames[0])  # the daemon's headers always decode
            if head.corr:
                self.answered.setdefault(head.corr, head.kind)
            if head.kind == wire.EVENT and len(frames) > 1:
                self.events.append(frames[1])
            elif head.kind == wire.EVENTS and len(frames) > 1:
                self.events += [bytes(raw) for raw in msgspec.msgpack.decode(frames[1], type=list[msgspec.Raw])]
            if head.kind == wire.PING:
                self.send([wire.header(wire.PONG, head.corr)])
            elif head.kind == wire.RUN and self.role == wire.ROLE_EXECUTOR:
                self.send(wire.message(wire.EXIT, head.corr, wire.ExitStatus(error="the fuzzing executor runs nothing")))

    def join(self, token: str, *, slots: int = 0) -> None:
        self.send(wire.message(wire.HELLO, "join", wire.Hello(role=self.role, token=token, pid=os.getpid(),
                                                              name=f"fuzz-{self.role}", slots=slots)))
        deadline = time.monotonic() + 10
        while "join" not in self.answered and time.monotonic() < deadline:
            self.drain(100)
        assert self.answered.get("join") == wire.WELCOME, seeded(f"{self.role} not welcomed: {self.answered}")

    def close(self) -> None:
        self.sock.close(linger=0)


def log_lines(handle) -> list[str]:
    return handle.log().splitlines()


def test_malformed_frames_of_every_kind_are_answered_or_dropped_and_the_daemon_goes_on() -> None:
    rng = random.Random(SEED)
    print(f"fuzz seed {SEED}")
    assert {wire.HELLO, wire.RUN, wire.OUT, wire.SUBMIT, wire.EVENT, wire.SESSIONS, wire.NOTICE} <= set(KINDS), KINDS
    started = time.monotonic()
    with daemons() as factory:
        handle = factory.start(executors=1)
        client = handle.client()
        assert client.run(["true"], cwd="/", sandbox="read-only", wait_timeout=30).returncode == 0
        daemon = psutil.Process(handle.pid)
        rss_before = daemon.memory_info().rss
        lines_before = len(log_lines(handle))
        token = handle.runtime.read_token()
        bodies = valid_bodies(token)
        ctx = zmq.Context()
        peers = []
        try:
            sent: list[tuple[RawPeer, Sent]] = []
            for role in (wire.ROLE_FRONTEND, wire.ROLE_EXECUTOR, wire.ROLE_AGENT, STRANGER):
                p = RawPeer(ctx, handle.runtime.endpoint, role)
                peers.append(p)
                if role != STRANGER:
                    p.join(token, slots=1 if role == wire.ROLE_EXECUTOR else 0)
                for message, frames in messages(rng, role, bodies, PER_ROLE, HUGE_BODIES if role != STRANGER else 1):
                    p.send(frames)
                    sent.append((p, message))
                    p.drain()
                    for other in peers:  # pings for the peers sent earlier
                        other.drain()
            for message, frames in hellos(rng, bodies, HELLOS):
                fresh = RawPeer(ctx, handle.runtime.endpoint, STRANGER)
                peers.append(fresh)
                fresh.send(frames)
                sent.append((fresh, message))

            owed = [(p, m) for p, m in sent if m.owed]
            deadline = time.monotonic() + ANSWER_TIMEOUT_S
            while time.monotonic() < deadline:
                for p in peers:
                    p.drain(10)
                if all(m.corr in p.answered for p, m in owed):
                    break
            unanswered = [m for p, m in owed if m.corr not in p.answered]
            assert handle.proc.poll() is None, seeded(f"the daemon died:\n{handle.log()[-3000:]}")
            assert not unanswered, seeded(f"{len(unanswered)} of {len(owed)} messages owed an answer got none, "
                                          f"e.g. {unanswered[:5]}")
            kinds = {m.kind for _, m in sent}
            assert kinds == set(KINDS), seeded(f"kinds never sent: {set(KINDS) - kinds}")

            for p in peers[:3]:
                p.send([wire.header(wire.BYE)])  # the frontend, executor and agent leave
            # Served as before: a command through the client library.
            result = client.run(["echo", "still here"], cwd="/", sandbox="read-only", wait_timeout=30)
            assert result.returncode == 0 and result.stdout == b"still here\n", seeded(f"after the fuzzing: {result}")
            rss_after = daemon.memory_info().rss
        finally:
            for p in peers:
                p.close()
            ctx.destroy(linger=0)
        lines = log_lines(handle)[lines_before:]
        tracebacks = [line for line in lines if "Traceback" in line or "internal error" in line]
        assert not tracebacks, seeded("the daemon logged internal errors:\n" + "\n".join(tracebacks[:20]))
        # Thousands of bad messages, a few dozen lines (throttled).
        assert len(lines) < 200, seeded(f"the daemon logged {len(lines)} lines:\n" + "\n".join(lines[:50]))
        grown = rss_after - rss_before
        print(f"fuzz: {len(sent)} messages ({len(owed)} owed an answer; {len(lines)} log lines) in {time.monotonic() - started:.1f} s; "
              f"daemon RSS {rss_before / 2**20:.1f} -> {rss_after / 2**20:.1f} MiB")
        assert grown < RSS_GROWTH_LIMIT, seeded(f"the daemon's RSS grew by {grown / 2**20:.1f} MiB "
                                                f"({rss_before / 2**20:.1f} -> {rss_after / 2**20:.1f} MiB)")


# -- what only the agent finds malformed ----------------------------------------------------


def agent_only_bad_submission(rng: random.Random, sub_id: str) -> tuple[str, bytes]:
    """A submission whose head the daemon reads (id, op type) and forwards, but whose op
    the agent cannot decode: strings that are not UTF-8 where the daemon skips them, items
    of the wrong types, unknown op or item types, missing fields."""
    how = rng.choice(["text not utf-8", "item type not utf-8", "items wrong type", "item wrong type",
                      "unknown item type", "unknown op type", "items missing"])
    op: dict = {"type": "user_input", "items": [{"type": "text", "text": "hi"}]}
    if how == "text not utf-8":
        op["items"] = [{"type": "text", "text": bad_utf8(rng)}]
    elif how == "item type not utf-8":
        op["items"] = [{"type": bad_utf8(rng), "text": "hi"}]
    elif how == "items wrong type":
        op["items"] = rng.choice([5, "text", {"type": "text"}, None, 1.5])
    elif how == "item wrong type":
        op["items"] = [rng.choice([5, "text", [1], None, {"type": "text", "text": 7}])]
    elif how == "unknown item type":
        op["items"] = [{"type": "hologram"}]
    elif how == "unknown op type":
        op = {"type": "warp_drive", "items": []}
    else:
        del op["items"]
    return how, msgspec.msgpack.encode({"id": sub_id, "op": op})


def test_submissions_only_the_agent_finds_malformed_are_answered_and_the_session_goes_on(server, tmp_path) -> None:
    rng = random.Random(SEED + 1)
    print(f"fuzz seed {SEED}")
    count = 60
    with daemons() as factory:
        handle = factory.start(executors=1, env={"SLUICE_HOME": short_tempdir("sl-fuzz-home-")})
        client = handle.client()
        session = client.open_session(configure_op(server, tmp_path))
        event = session.next_event(20)
        assert event is not None and tag(event) == "session_configured", event
        ctx = zmq.Context()
        peer = RawPeer(ctx, handle.runtime.endpoint, wire.ROLE_FRONTEND)
        try:
            peer.join(handle.runtime.read_token())
            sent = []
            for i in range(count):
                how, body = agent_only_bad_submission(rng, f"bad-{i}")
                peer.send([wire.header(wire.SUBMIT, f"c-{i}", session=session.id), body])
                sent.append(how)
                peer.drain()

            def errors() -> list[str]:
                found = []
                for body in peer.events:
                    event = P.decode_event_msgpack(body)
                    if tag(event) == "error" and not event.id:
                        found.append(event.msg.message)
                return found

            deadline = time.monotonic() + ANSWER_TIMEOUT_S
            while len(errors()) < count and time.monotonic() < deadline:
                peer.drain(50)
            got = errors()
            assert len(got) == count, seeded(f"{count} submissions the agent cannot decode, {len(got)} errors: "
                                             f"{got[-5:]}; sent {sorted(set(sent))}")
            assert all(m.startswith(("invalid submission: ", "unknown op type")) for m in got), seeded(str(got[:5]))
        finally:
            peer.close()
            ctx.destroy(linger=0)

        # The agent and the session go on.
        server.script(response(assistant("Still fine.")))
        sub_id = session.submit(P.UserInput([P.TextInput("after the bad ones")]))
        deadline = time.monotonic() + 30
        while True:
            event = session.next_event(max(0.1, deadline - time.monotonic()))
            assert event is not None and time.monotonic() < deadline, seeded("the turn after did not complete")
            if event.id == sub_id and tag(event) in ("task_complete", "turn_aborted", "error"):
                break
        assert tag(event) == "task_complete", seeded(f"the turn after ended with {event}")
        assert server.requests[-1]["json"]["input"][-1] == user_item("after the bad ones")
        log = handle.log()
        assert "Traceback" not in log and "handler failed" not in log, seeded(log[-3000:])
