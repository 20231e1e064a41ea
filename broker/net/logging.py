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

A daemon started in the background logs to ``daemon.log`` in its runtime dir through
:class:`LogFile`, which rotates it (:data:`LOG_MAX_BYTES`, :data:`LOG_KEEP` old files),
and :func:`capture_stdio` turns whatever else reaches its stdout and stderr (its
children's, a traceback) into JSON lines, so the log holds nothing else.
"""

from __future__ import annotations

import errno
import json as _json
import logging as _stdlib_logging
import os
import sys
import threading
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


def configure(json: bool | None = None, *, level: str | int | None = None, stream=None) -> SafeSink:
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
    sink = SafeSink(stream)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.WriteLoggerFactory(file=sink),
        cache_logger_on_first_use=False,
    )
    return sink


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
        # Lines come from the loop and from capture_stdio's thread.
        self._lock = threading.Lock()

    def write(self, text: str) -> None:
        with self._lock:
            self._write(text)

    def _write(self, text: str) -> None:
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
        prepare = getattr(self._stream, "prepare", None)
        if prepare is not None:
            self._fd = prepare(len(data))
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


# daemon.log is rotated once a line would take it past this; this many old ones are kept
# (daemon.log.1 the newest).
LOG_MAX_BYTES = 4 * 1024 * 1024
LOG_KEEP = 2


class LogFile:
    """A log file in a directory (by descriptor), rotated by size: see the module docstring.
    For :class:`SafeSink`: :meth:`fileno` is where lines go, :meth:`prepare` rotates first
    when the next line would not fit."""

    def __init__(self, dir_fd: int, name: str, *, max_bytes: int = LOG_MAX_BYTES, keep: int = LOG_KEEP) -> None:
        self._dir_fd = os.dup(dir_fd)
        os.set_inheritable(self._dir_fd, False)
        self.name = name
        self.max_bytes = max_bytes
        self.keep = keep
        self._fd = self._open()

    def _open(self) -> int:
        return os.open(self.name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                       dir_fd=self._dir_fd)

    def fileno(self) -> int:
        return self._fd

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def prepare(self, size: int) -> int:
        try:
            if os.fstat(self._fd).st_size + size > self.max_bytes:
                self.rotate()
        except OSError:
            pass  # the line goes where it can; SafeSink counts what cannot be written
        return self._fd

    def rotate(self) -> None:
        d = self._dir_fd
        for k in range(self.keep - 1, 0, -1):
            try:
                os.rename(f"{self.name}.{k}", f"{self.name}.{k + 1}", src_dir_fd=d, dst_dir_fd=d)
            except FileNotFoundError:
                pass
        os.rename(self.name, f"{self.name}.1", src_dir_fd=d, dst_dir_fd=d)
        fd = self._open()
        os.close(self._fd)
        self._fd = fd


def capture_stdio(sink: SafeSink, component: str = "stderr") -> None:
    """Point this process's stdout and stderr (and so its children's) at a pipe whose lines
    a thread writes to ``sink``: JSON objects as they are, anything else (a traceback, a
    child's stray output) wrapped in one JSON line per read."""
    r, w = os.pipe()
    os.dup2(w, 1)
    os.dup2(w, 2)
    os.close(w)
    os.set_inheritable(r, False)
    thread = threading.Thread(target=_pump_lines, args=(r, sink, component), name="log-capture", daemon=True)
    thread.start()


def _pump_lines(fd: int, sink: SafeSink, component: str) -> None:
    partial = b""
    while True:
        try:
            data = os.read(fd, 65536)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            data = b"\n" if partial else b""
            if not data:
                return
        *lines, partial = (partial + data).split(b"\n")
        if len(partial) > 65536:  # no newline in sight: cut
            lines.append(partial)
            partial = b""
        out = []
        plain = []
        for line in lines:
            text = line.decode("utf-8", "replace").rstrip("\r")
            if not text.strip():
                continue
            if text.startswith("{") and text.endswith("}") and _is_json_object(text):
                if plain:
                    out.append(_wrapped(plain, component))
                    plain = []
                out.append(text)
            else:
                plain.append(text)
        if plain:
            out.append(_wrapped(plain, component))
        if out:
            sink.write("\n".join(out) + "\n")


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(_json.loads(text), dict)
    except ValueError:
        return False


def _wrapped(lines: list[str], component: str) -> str:
    record = {"event": lines[0] if len(lines) == 1 else "output on stderr", "level": "warning",
              "component": component, "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if len(lines) > 1:
        record["text"] = "\n".join(lines)
    return _json.dumps(record, ensure_ascii=False)


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
