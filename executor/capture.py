"""A capped copy of one output stream, kept for the final ``exit`` message.

Only the head is kept: the start of a command's output usually says what went wrong,
and a fixed cap keeps an executor's memory bounded however much a command prints.
"""

from __future__ import annotations


class Capture:
    __slots__ = ("limit", "buf", "dropped")

    def __init__(self, limit: int) -> None:
        self.limit = max(0, limit)
        self.buf = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = self.limit - len(self.buf)
        size = len(chunk)
        if size <= room:
            self.buf += chunk
        elif room > 0:
            self.buf += memoryview(chunk)[:room]
            self.dropped += size - room
        else:
            self.dropped += size

    def value(self) -> bytes:
        return bytes(self.buf)
