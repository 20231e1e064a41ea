"""The executor's receiving end without a broker: a message that does not decode never
escapes its handler, and a run that does not decode is answered with an ``exit`` naming
the problem, for the call it was (nobody waits forever)."""

from __future__ import annotations

import msgspec

from broker.wire import frames as wire
from executor.worker import Worker


class Frame:
    def __init__(self, data: bytes) -> None:
        self.bytes = data
        self.buffer = memoryview(data)


class Recorder:
    def __init__(self) -> None:
        self.sent: list[list[bytes]] = []

    def send(self, parts) -> None:
        self.sent.append(parts)


def worker() -> Worker:
    w = Worker("ipc:///nonexistent", "t", name="n", slots=1)
    w.link.zs = Recorder()
    w.link.joined = True
    return w


def run_body(**fields) -> bytes:
    body = {"argv": ["true"], "cwd": "/", "sandbox": {"permissions": ["disk-full-read-access"]}, **fields}
    return msgspec.msgpack.encode(body)


def test_a_run_that_does_not_decode_gets_an_exit_with_the_reason() -> None:
    w = worker()
    bodies = {
        "deep": run_body(extra=msgspec.Raw(b"\x91" * 100_000 + b"\xc0")),
        "utf8": run_body(argv=[msgspec.Raw(b"\xa2\xff\xfe")]),
        "truncated": run_body()[:-3],
    }
    for corr, body in bodies.items():
        w.link.receive([Frame(wire.header(wire.RUN, corr)), Frame(body)])
    answers = {wire.decode_header(parts[0]).corr: wire.decode(wire.EXIT, parts[1]) for parts in w.link.zs.sent}
    assert set(answers) == set(bodies)
    assert "nested too deeply" in answers["deep"].error
    assert "not valid UTF-8" in answers["utf8"].error
    assert "truncated" in answers["truncated"].error
    assert all(a.error.startswith("bad run request: ") and a.exit_code is None for a in answers.values())
    assert not w.calls


def test_a_header_that_does_not_decode_is_dropped() -> None:
    w = worker()
    for header in (msgspec.msgpack.encode([msgspec.Raw(b"\xa2\xff\xfe"), "c"]), b"\x97\xa3run\xa1c\xa0\x00\x00\x00"
                   + b"\x91" * 5000 + b"\xc0", b"", b"\xc1"):
        w.link.receive([Frame(header), Frame(run_body())])
    w.link.receive([Frame(wire.header(wire.RUN, "no-body"))])
    assert [wire.decode_header(p[0]).corr for p in w.link.zs.sent] == ["no-body"]
    assert not w.calls


def test_a_fileops_run_has_no_stdio_of_its_own() -> None:
    # Its batches come in the request or (with an empty one) on its stdin, not both.
    w = worker()
    for corr, extra in (("tty", {"tty": {"rows": 24, "cols": 80}}), ("stdin", {"stdin": True})):
        w.link.receive([Frame(wire.header(wire.RUN, corr)), Frame(run_body(fileops=b"{}", **extra))])
    answers = {wire.decode_header(parts[0]).corr: wire.decode(wire.EXIT, parts[1]) for parts in w.link.zs.sent}
    assert {corr: a.error for corr, a in answers.items()} == dict.fromkeys(
        ("tty", "stdin"), "a fileops run has no terminal or stdio of its own, and its batches come "
                          "either in the request or on its stdin")
    assert not w.calls
