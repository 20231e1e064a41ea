"""The SSE decoder (agent/sse.py): every way a body can be cut gives the same events, its
work is linear in what it is fed, and an event over the limit is one clear error."""

from __future__ import annotations

import statistics
import time

import pytest

from agent.sse import ServerSentEvent, SSEDecoder, SSEError

STREAM = ("\ufeff: keep-alive\r\nevent: a\r\ndata: one\r\ndata:two é\r\n\r\n"
          "data: x\rid: 7\r\rdata\n\nretry: 30\nevent: only\n\ndata: {\"k\": \"ü\"}\r\n\r\ndata: half").encode()
EXPECTED = [
    ServerSentEvent("one\ntwo é", "a"),
    ServerSentEvent("x", "message", "7"),
    ServerSentEvent("", "message", "7"),
    ServerSentEvent('{"k": "ü"}', "message", "7", 30),
]


def decode(pieces: list[bytes], decoder: SSEDecoder | None = None) -> list[ServerSentEvent]:
    decoder = decoder or SSEDecoder()
    return [event for piece in pieces for event in decoder.feed(piece)]


def test_whole_body_gives_every_event_and_drops_the_half_one_at_the_end() -> None:
    assert decode([STREAM]) == EXPECTED


@pytest.mark.parametrize("at", range(1, len(STREAM)))
def test_split_at_every_byte(at: int) -> None:
    # Cuts inside CRLF pairs and inside UTF-8 characters included.
    assert decode([STREAM[:at], STREAM[at:]]) == EXPECTED


def test_split_at_every_pair_of_bytes() -> None:
    for first in range(1, len(STREAM)):
        for second in range(first, len(STREAM)):
            assert decode([STREAM[:first], STREAM[first:second], STREAM[second:]]) == EXPECTED, (first, second)


def test_one_byte_at_a_time() -> None:
    assert decode([STREAM[i:i + 1] for i in range(len(STREAM))]) == EXPECTED


def test_a_cr_ending_a_piece_and_an_lf_starting_the_next_are_one_line_end() -> None:
    assert decode([b"data: a\r", b"\n", b"\r", b"\ndata: b\r", b"\r"]) == [ServerSentEvent("a"), ServerSentEvent("b")]


def test_an_event_over_the_limit_is_one_error_and_the_decoder_goes_on() -> None:
    decoder = SSEDecoder(max_event_chars=1024)
    # Many data lines adding up past the limit.
    with pytest.raises(SSEError, match=r"^an event over 1 KiB$"):
        decode([b"data: " + b"x" * 100 + b"\n"] * 11, decoder)
    # One line past the limit, fed in small pieces: refused before its end comes.
    decoder = SSEDecoder(max_event_chars=1024)
    with pytest.raises(SSEError):
        decode([b"data: " + b"y" * 100] * 11, decoder)
    assert decoder.feed(b"\n\ndata: small\n\n") == [ServerSentEvent("small")]


def test_the_default_limit_is_64_mib_and_says_so() -> None:
    decoder = SSEDecoder()
    with pytest.raises(SSEError, match=r"^an event over 64 MiB$"):
        decode([b"data: ", b"z" * (64 * 1024 * 1024 + 1)], decoder)


def _feed_time(size: int, piece: int = 4096) -> float:
    body = b"data: " + b"a" * size + b"\n\n"
    decoder = SSEDecoder()
    started = time.perf_counter()
    events = decode([body[i:i + piece] for i in range(0, len(body), piece)], decoder)
    elapsed = time.perf_counter() - started
    assert len(events) == 1 and len(events[0].data) == size
    return elapsed


# alone: a ratio of two timings taken a few seconds apart; beside a parallel run's load the
# 40 MiB one took 36 times the baseline (2.93 s against 82 ms).
@pytest.mark.alone
def test_a_40_mib_event_in_4_kib_pieces_takes_time_linear_in_its_size() -> None:
    # Linear: ten times the size, about ten times the time; quadratic (as it was: 306 s
    # for this one) would be a hundred times. The bound is 30 times, relative to a
    # baseline measured here, so a loaded machine slows both alike.
    small = statistics.median(_feed_time(4 * 1024 * 1024) for _ in range(3))
    big = _feed_time(40 * 1024 * 1024)
    print(f"\nSSE: 4 MiB event in 4 KiB pieces {small * 1000:.0f} ms, 40 MiB {big * 1000:.0f} ms "
          f"({big / small:.1f}x)")
    assert big < 30 * small
