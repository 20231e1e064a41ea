"""Server-sent events: an incremental decoder for ``text/event-stream`` bodies.

Both OpenAI wire APIs stream their answers as SSE. The format (WHATWG HTML, "server-sent
events"): UTF-8 text, lines ended by CRLF, LF or CR; ``field: value`` lines (one space
after the colon is dropped, a line without a colon is a field with an empty value);
lines starting with ``:`` are comments (servers send them as keep-alives); a blank line
dispatches the event built so far. ``data`` lines accumulate, joined by ``\\n``;
``event`` names the event (``message`` when absent); ``id`` and ``retry`` are kept but
sluice does not reconnect by itself. An event with no data is not dispatched, and a
half-built event at the end of the stream is dropped, as the standard says: a body cut
mid-event never yields a truncated JSON payload.

Chat Completions ends its stream with ``data: [DONE]``; that is an ordinary event here
and the model client gives it its meaning.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    data: str
    event: str = "message"
    id: str | None = None
    retry_ms: int | None = None


class SSEDecoder:
    """Feed it text or bytes as they arrive; it returns the events each piece completes."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
        # A CR at the end of one chunk may be the first half of a CRLF split across two.
        self._skip_lf = False
        self._first_line = True
        self._data: list[str] = []
        self._event = ""
        self._last_id: str | None = None
        self._retry_ms: int | None = None

    def feed(self, chunk: bytes | str) -> list[ServerSentEvent]:
        text = self._utf8.decode(chunk) if isinstance(chunk, bytes) else chunk
        if not text:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if text.startswith("\n"):
                text = text[1:]
        self._buffer += text
        events: list[ServerSentEvent] = []
        while True:
            cut = _line_end(self._buffer)
            if cut < 0:
                break
            line = self._buffer[:cut]
            if self._buffer[cut] == "\r":
                if cut + 1 < len(self._buffer):
                    rest = cut + 2 if self._buffer[cut + 1] == "\n" else cut + 1
                else:
                    rest = cut + 1
                    self._skip_lf = True
            else:
                rest = cut + 1
            self._buffer = self._buffer[rest:]
            event = self._line(line)
            if event is not None:
                events.append(event)
        return events

    def _line(self, line: str) -> ServerSentEvent | None:
        if self._first_line:
            self._first_line = False
            line = line.removeprefix("\ufeff")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._last_id = value
        elif name == "retry":
            if value.isdigit():
                self._retry_ms = int(value)
        return None

    def _dispatch(self) -> ServerSentEvent | None:
        data, event = self._data, self._event
        self._data, self._event = [], ""
        if not data:
            return None
        return ServerSentEvent("\n".join(data), event or "message", self._last_id, self._retry_ms)


def _line_end(text: str) -> int:
    lf, cr = text.find("\n"), text.find("\r")
    if lf < 0:
        return cr
    if cr < 0:
        return lf
    return min(lf, cr)
