"""structlog set-up shared by the daemon and its helpers.

JSON lines when stderr is not a terminal (a daemon's log is read by programs), a
readable console format otherwise. A processor redacts the value of every field that
sluice's one secret rule (:func:`landlock_helper.env.is_secret`, the rule that keeps
secrets out of commands' environments) calls secret, by the field's name or by its value,
so a careless ``log.info(..., token=t)`` cannot leak the auth token, nor
``error=str(e)`` a URL with a password in it.

Also :class:`Throttle`: a peer sending garbage in a tight loop must not be able to fill
the disk through our log, so per-event rate limiting with a "suppressed N" summary.

Logging never raises. The log is a file on some disk, and a full disk (a command that
fills ``/tmp``, where a log may live) must not turn every ``log.info`` in the daemon's
message handlers into an exception. Lines go to the stream through :class:`SafeSink`,
which drops what cannot be written, counts it, and once a write goes through again
first writes one line saying how many were lost and why.
"""

from __future__ import annotations

import errno
import logging as _stdlib_logging
import os
import sys
import time
from typing import Any, TextIO

import structlog

from landlock_helper.env import is_secret, is_secret_value

# Fields that hold CurveZMQ public keys, logged on purpose (who connected, with which key):
# public by design, though the rule would take a field called "key" for a secret.
_PUBLIC_FIELDS = frozenset({"key", "keys"})
_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


def _redact_secrets(_logger: Any, _method: str, event: dict) -> dict:
    for key, value in event.items():
        text = value if isinstance(value, str) else None
        if key in _PUBLIC_FIELDS:
            secret = text is not None and is_secret_value(text)
        else:
            secret = is_secret(key, text)
        if secret:
            event[key] = "[redacted]"
    return event


def configure(json: bool | None = None, *, level: str | int | None = None, stream: TextIO | None = None) -> None:
    """Configure structlog for this process.

    ``json=None`` picks JSON lines unless ``stream`` (default stderr) is a TTY. ``level``
    defaults to ``$SLUICE_LOG_LEVEL`` or ``info``.
    """
    stream = stream if stream is not None else sys.stderr
    if json is None:
        try:
            json = not stream.isatty()
        except (AttributeError, ValueError):
            json = True
    if level is None:
        level = os.environ.get("SLUICE_LOG_LEVEL", "info")
    if isinstance(level, str):
        level = _LEVELS.get(level.strip().lower(), _stdlib_logging.INFO)

    processors: list = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _redact_secrets,
    ]
    if json:
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=False))
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.WriteLoggerFactory(file=SafeSink(stream)),
        cache_logger_on_first_use=False,
    )


# A log line is written only while this much more is free where the log is.
LOG_ROOM_BYTES = 64 * 1024


class SafeSink:
    """A text stream for log lines that never raises: see the module docstring."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        try:
            stream.flush()  # what was printed before goes first
        except (AttributeError, OSError, ValueError):
            pass
        try:
            self._fd: int | None = stream.fileno()
        except (AttributeError, OSError, ValueError):
            self._fd = None  # not a file (a test's StringIO): write through it
        self.lost = 0
        self._why = ""
        # Part of a line reached the file before the disk filled.
        self._torn = False

    def write(self, text: str) -> None:
        if self.lost:
            # A line cut short by the full disk is ended first, so every line stays whole JSON.
            end = "\n" if self._torn else ""
            note = (f'{end}{{"event": "{self.lost} log lines lost: {self._why}", '
                    f'"level": "warning", "component": "logging"}}\n')
            if not self._put(note):
                self.lost += text.count("\n") or 1
                return
            self.lost = 0
            self._torn = False
        if not self._put(text):
            self.lost += text.count("\n") or 1

    def _put(self, text: str) -> bool:
        if self._fd is None:
            try:
                self._stream.write(text)
                return True
            except (OSError, ValueError) as e:
                self._why = getattr(e, "strerror", None) or str(e)
                return False
        # Straight to the descriptor: a buffered stream would keep what failed and fail
        # again on every later write.
        data = text.encode("utf-8", "replace")
        done = 0
        try:
            if self._nearly_full(len(data)):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            while done < len(data):
                done += os.write(self._fd, data[done:])
            return True
        except OSError as e:
            self._why = e.strerror or str(e)
            self._torn = self._torn or done > 0
            return False

    def _nearly_full(self, size: int) -> bool:
        """Too little room left for the line and a margin: dropped whole rather than cut
        short by the disk filling halfway through it (other processes write there too)."""
        try:
            st = os.fstatvfs(self._fd)
        except OSError:
            return False
        return st.f_blocks > 0 and st.f_bavail * st.f_frsize < size + LOG_ROOM_BYTES

    def flush(self) -> None:
        if self._fd is None:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                pass


class Throttle:
    """Rate-limits log events by event name: ``burst`` per ``period`` seconds each.

    Suppressed occurrences are counted and reported with the next event that gets
    through, or by :meth:`flush` (call it from a periodic timer).
    """

    def __init__(self, logger: Any, *, burst: int = 5, period: float = 10.0) -> None:
        self._log = logger
        self._burst = burst
        self._period = period
        # event -> [window start, emitted in window, suppressed in window, level]
        self._windows: dict[str, list] = {}

    def __call__(self, level: str, event: str, **fields: Any) -> None:
        now = time.monotonic()
        window = self._windows.get(event)
        if window is None or now - window[0] >= self._period:
            if window is not None and window[2]:
                fields["suppressed"] = window[2]
            window = [now, 0, 0, level]
            self._windows[event] = window
        if window[1] < self._burst:
            window[1] += 1
            getattr(self._log, level)(event, **fields)
        else:
            window[2] += 1

    def flush(self) -> None:
        """Report events suppressed in windows that have ended."""
        now = time.monotonic()
        for event, window in list(self._windows.items()):
            if now - window[0] < self._period:
                continue
            if window[2]:
                getattr(self._log, window[3])(event + " (suppressed repeats)", suppressed=window[2])
            del self._windows[event]
