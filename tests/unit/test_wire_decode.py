"""Decoding what comes from outside: every failure is one WireError with one line.

Frames (:func:`broker.wire.frames.decode_header`, :func:`~broker.wire.frames.decode`), the
protocol's submissions and events (a :class:`~broker.wire.protocol.ProtocolError` is a
WireError), and the lines a bridge reads (:class:`broker.cli.session_loop.LineReader`): bodies
nested deeper than the stack, strings that are not UTF-8, huge declared sizes, a
dec_hook that fails, lines past the limit.
"""

from __future__ import annotations

import os
import threading

import msgspec
import pytest

from broker.cli import session_loop
from broker.cli.session_loop import LineReader, parse_submission
from broker.wire import frames as wire
from broker.wire.protocol import (
    ProtocolError,
    decode_event_json,
    decode_event_msgpack,
    decode_submission_json,
    decode_submission_msgpack,
)

DEEP = 100_000
BAD_UTF8 = msgspec.Raw(b"\xa2\xff\xfe")  # a msgpack str of two bytes that are not UTF-8


def deep_array(depth: int = DEEP) -> bytes:
    return b"\x91" * depth + b"\xc0"


def deep_map(depth: int = DEEP) -> bytes:
    return b"\x81\xa1k" * depth + b"\xc0"


def run_body(**fields) -> dict:
    return {"argv": ["true"], "cwd": "/", "sandbox": {"permissions": ["disk-full-read-access"]}, **fields}


def raises_wire_error(call, *args) -> str:
    with pytest.raises(wire.WireError) as info:
        call(*args)
    message = str(info.value)
    assert "\n" not in message and len(message) <= 600
    return message


# -- frames -----------------------------------------------------------------------------


@pytest.mark.parametrize(("frame", "reason"), [
    (msgspec.msgpack.encode([BAD_UTF8, "corr"]), "not valid UTF-8"),
    (msgspec.msgpack.encode(["run", BAD_UTF8]), "not valid UTF-8"),
    # Elements past the header's six are skipped: skipping them must not recurse without end.
    (b"\x97\xa3run\xa1c\xa0\x00\x00\x00" + deep_array(4000), "nested too deeply"),
    (b"\x97\xa3run\xa1c\xa0\x00\x00\x00" + deep_map(), "nested too deeply"),
    (deep_array(), "Expected `str`, got `array`"),
    (b"\x92\xa3run\xdb\xff\xff\xff\xff", "truncated"),  # a corr of 4 GiB, not there
    (b"\x92\xa3run\xdd\xff\xff\xff\xff", "Expected `str`"),
    (wire.header(wire.RUN, "c")[:-1], "truncated"),
    (b"", "truncated"),
    (msgspec.msgpack.encode({"kind": "run"}), "Expected `array`"),
    (msgspec.msgpack.encode([7]), "Expected `str`"),
])
def test_a_bad_header_is_a_wire_error(frame, reason) -> None:
    message = raises_wire_error(wire.decode_header, frame)
    assert message.startswith("bad header: ") and reason in message, message


def test_the_body_of_every_kind_that_has_one_fails_as_a_wire_error() -> None:
    for kind in (wire.HELLO, wire.WELCOME, wire.ERROR, wire.RUN, wire.STARTED, wire.EXIT, wire.ATTACHED,
                 wire.SESSIONS):
        for body, reason in [
            (deep_array(), "Expected `object`, got `array`"),
            (deep_map(), ""),
            # An unknown field is skipped: skipping it must not recurse without end.
            (msgspec.msgpack.encode({"zz": msgspec.Raw(deep_array())}), "nested too deeply"),
            (msgspec.msgpack.encode({"zz": msgspec.Raw(deep_map())}), "nested too deeply"),
            (b"\xdf\xff\xff\xff\xff", "truncated"),  # a map of 4 Gi entries, not there
            (b"\xc1", "malformed"),
            (b"", "truncated"),
        ]:
            message = raises_wire_error(wire.decode, kind, body)
            assert message.startswith(f"bad {kind} body: ") and reason in message, (kind, message)


@pytest.mark.parametrize(("body", "reason"), [
    (run_body(argv=[BAD_UTF8]), "not valid UTF-8"),
    (run_body(cwd=BAD_UTF8), "not valid UTF-8"),
    (run_body(env={"A": BAD_UTF8}), "not valid UTF-8"),
    (run_body(env={"A": msgspec.Raw(deep_array())}), "Expected `str`, got `array`"),
    (run_body(sandbox={"permissions": [{"disk-write-folder": 5}]}), "disk-write-folder is"),
    (run_body(sandbox={"permissions": ["disk-full-read-access"], "x": msgspec.Raw(deep_map())}), "nested too deeply"),
    (run_body(capture_limit="all"), "Expected `int`, got `str`"),
    (run_body(extra=msgspec.Raw(deep_array())), "nested too deeply"),
])
def test_a_bad_run_body_is_a_wire_error(body, reason) -> None:
    message = raises_wire_error(wire.decode, wire.RUN, msgspec.msgpack.encode(body))
    assert reason in message, message


def test_whatever_a_decoder_raises_becomes_a_wire_error() -> None:
    class Thing:
        pass

    def hook(type_, obj):
        raise KeyError("the hook's own failure")

    decoder = msgspec.msgpack.Decoder(Thing, dec_hook=hook)
    message = raises_wire_error(wire.decode_with, decoder, msgspec.msgpack.encode({"a": 1}), "thing")
    assert message.startswith("bad thing: ") and "KeyError" in message, message
    error = pytest.raises(wire.WireError, wire.decode_with, msgspec.msgpack.Decoder(), deep_array(), "n").value
    assert str(error) == "bad n: nested too deeply" and error.reason == "nested too deeply"


def test_a_kind_without_a_body_is_a_wire_error() -> None:
    assert "has no body" in raises_wire_error(wire.decode, wire.PING, b"\xc0")


# -- the protocol -----------------------------------------------------------------------


@pytest.mark.parametrize("decode", [decode_submission_json, decode_event_json])
def test_deep_json_is_a_protocol_error(decode) -> None:
    for data in (b'{"a":' * DEEP + b"1" + b"}" * DEEP, b"[" * DEEP + b"]" * DEEP,
                 b'{"id":"1","op":{"type":"interrupt","x":' + b"[" * DEEP + b"]" * DEEP + b"}}",
                 b'{"id":"1","msg":{"type":"error","message":"m","x":' + b"[" * DEEP + b"]" * DEEP + b"}}"):
        with pytest.raises(ProtocolError) as info:
            decode(data)
        assert "nested too deeply" in str(info.value) or "Expected `object`" in str(info.value)
    with pytest.raises(ProtocolError, match="nested too deeply"):
        decode(b'{"id":"1","x":' + b"[" * DEEP + b"]" * DEEP + b"}")


def test_msgpack_submissions_and_events_that_do_not_decode_are_protocol_errors() -> None:
    text = {"type": "text", "text": BAD_UTF8}
    submission = msgspec.msgpack.encode({"id": "1", "op": {"type": "user_input", "items": [text]}})
    with pytest.raises(ProtocolError, match="invalid submission: a string is not valid UTF-8"):
        decode_submission_msgpack(submission)
    with pytest.raises(ProtocolError, match="invalid submission: nested too deeply"):
        decode_submission_msgpack(msgspec.msgpack.encode({"id": "1", "op": msgspec.Raw(deep_map())}))
    with pytest.raises(ProtocolError, match="invalid event: nested too deeply"):
        decode_event_msgpack(msgspec.msgpack.encode({"id": "1", "x": msgspec.Raw(deep_array())}))
    with pytest.raises(ProtocolError, match="unknown event type 'nope'"):
        decode_event_msgpack(msgspec.msgpack.encode({"id": "1", "msg": {"type": "nope"}}))
    # One error root: whoever catches WireError catches these too.
    assert issubclass(ProtocolError, wire.WireError)


def test_invalid_utf8_in_json_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="invalid submission"):
        decode_submission_json(b'{"id":"\xff\xfe","op":{"type":"interrupt"}}')


# -- lines ------------------------------------------------------------------------------


def read_all(chunks: list[bytes]) -> list[tuple[int, bytes | None]]:
    """What a LineReader makes of ``chunks`` written to a pipe one by one."""
    r, w = os.pipe()

    def write() -> None:
        try:
            for chunk in chunks:
                os.write(w, chunk)
        finally:
            os.close(w)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        reader = LineReader(r)
        while not reader.eof:
            reader.fill()
        return list(reader.lines)
    finally:
        writer.join()
        os.close(r)


def test_lines_are_numbered_across_reads_empty_ones_included() -> None:
    lines = read_all([b"one\n\ntw", b"o\nthr", b"ee", b"\n\nlast"])
    assert lines == [(1, b"one"), (2, b""), (3, b"two"), (4, b"three"), (5, b""), (6, b"last")]
    assert read_all([b"a\n"]) == [(1, b"a")]
    assert read_all([]) == []


def test_a_line_past_the_limit_is_none_and_skipped_to_its_newline(monkeypatch) -> None:
    monkeypatch.setattr(session_loop, "MAX_LINE", 10)
    lines = read_all([b"short\n", b"x" * 6, b"y" * 6, b"z" * 30, b"zz\nafter\n", b"1234567890\n", b"12345678901"])
    assert lines == [(1, b"short"), (2, None), (3, b"after"), (4, b"1234567890"), (5, None)]
    assert read_all([b"x" * 11 + b"\nok"]) == [(1, None), (2, b"ok")]


def test_a_line_past_the_limit_is_reported_before_its_end_arrives(monkeypatch) -> None:
    monkeypatch.setattr(session_loop, "MAX_LINE", 10)
    r, w = os.pipe()
    try:
        reader = LineReader(r)
        os.write(w, b"ok\n" + b"x" * 20)
        reader.fill()
        assert list(reader.lines) == [(1, b"ok"), (2, None)] and not reader.eof
    finally:
        os.close(r)
        os.close(w)


def test_a_long_line_is_read_whole() -> None:
    line = os.urandom(3 * 1024 * 1024).replace(b"\n", b"n")
    assert read_all([line[i:i + 4096] for i in range(0, len(line), 4096)] + [b"\nnext"]) == [(1, line), (2, b"next")]


def test_bad_lines_are_one_line_value_errors() -> None:
    with pytest.raises(ValueError, match="longer than 64 MiB, the most one submission may be; skipped to its end"):
        parse_submission(None)
    with pytest.raises(ValueError, match="nested too deeply"):
        parse_submission(b'{"a":' * DEEP)
    with pytest.raises(ValueError, match="nested too deeply"):
        parse_submission(b'{"id":"1","op":' + b'{"a":' * DEEP + b"1" + b"}" * DEEP + b"}")
