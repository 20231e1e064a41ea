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

The decoder's work is linear in what it is fed, however the body is cut: the piece of a
line still waiting for its end is kept as a list of pieces, and only new text is searched
for a line end. An event (its data plus the line being read) over
:data:`MAX_EVENT_CHARS` characters raises :class:`SSEError`, so a server cannot make the
agent hold an unbounded event.

Chat Completions ends its stream with ``data: [DONE]``; that is an ordinary event here
and the model client gives it its meaning.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

from landlock_helper.limits import format_size

# An event's size limit, in characters (so an event past it is also past it in bytes).
MAX_EVENT_CHARS = 64 * 1024 * 1024

_LINE_END = re.compile(r"\r\n?|\n")


class SSEError(ValueError):
    """The stream broke the decoder's limits; one line."""


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    data: str
    event: str = "message"
    id: str | None = None
    retry_ms: int | None = None


class SSEDecoder:
    """Feed it text or bytes as they arrive; it returns the events each piece completes."""

    def __init__(self, max_event_chars: int | None = None) -> None:
        self.max_event_chars = MAX_EVENT_CHARS if max_event_chars is None else max_event_chars
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # The start of a line whose end has not come yet, in the pieces it came in.
        self._partial: list[str] = []
        self._partial_chars = 0
        # Characters of the event being built: its data lines (the partial line's apart).
        self._data_chars = 0
        # A CR at the end of one chunk may be the first half of a CRLF split across two.
        self._skip_lf = False
        self._first_line = True
        self._data: list[str] = []
        self._event = ""
        self._last_id: str | None = None
        self._retry_ms: int | None = None

    def feed(self, chunk: bytes | str) -> list[ServerSentEvent]:
        """The events ``chunk`` completes; raises :class:`SSEError` for an event over the limit."""
        text = self._utf8.decode(chunk) if isinstance(chunk, bytes) else chunk
        if not text:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if text.startswith("\n"):
                text = text[1:]
        events: list[ServerSentEvent] = []
        start = 0
        for end in _LINE_END.finditer(text):
            if self._partial:
                self._partial.append(text[start:end.start()])
                line = "".join(self._partial)
                self._partial.clear()
                self._partial_chars = 0
            else:
                line = text[start:end.start()]
            start = end.end()
            event = self._line(line)
            if event is not None:
                events.append(event)
        if start < len(text):
            self._partial.append(text[start:])
            self._partial_chars += len(text) - start
            self._check_size()
        elif text.endswith("\r"):
            self._skip_lf = True
        return events

    def _check_size(self) -> None:
        if self._data_chars + self._partial_chars > self.max_event_chars:
            self._partial.clear()
            self._data.clear()
            self._partial_chars = self._data_chars = 0
            raise SSEError(f"an event over {format_size(self.max_event_chars)}")

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
            self._data_chars += len(value) + 1
            self._check_size()
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
        self._data_chars = 0
        if not data:
            return None
        return ServerSentEvent("\n".join(data), event or "message", self._last_id, self._retry_ms)
