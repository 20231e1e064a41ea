"""The cross-session message history: ``$SLUICE_HOME/history.jsonl`` (``~/.sluice``).

One JSON object per line, Codex's ``HistoryEntry``::

    {"session_id":"67e55044-10b1-426f-9247-bb680e5fe0c8","ts":1718000000,"text":"fix the tests"}

Frontends add what the user typed (``add_to_history``) and page back through it
(``get_history_entry_request{offset, log_id}``). ``log_id`` is the file's inode, so a
frontend holding an offset into a file that was since replaced gets no entry rather than
the wrong one. The file is created 0600 (and narrowed to 0600 if it was wider); writers
hold an exclusive ``flock`` while appending, readers a shared one, each retried for about a
second before giving up, as Codex does.

These functions block (file I/O, locks); the session calls them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import fcntl
import os
import stat
import time
from collections.abc import Mapping
from pathlib import Path

import msgspec

from broker.net.runtime import sluice_home
from broker.wire.protocol import HistoryEntry

HISTORY_FILENAME = "history.jsonl"
LOCK_RETRIES = 10
LOCK_RETRY_SLEEP_S = 0.1

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(HistoryEntry)


class HistoryError(OSError):
    """The history file could not be written; one line for a person."""


def history_path(env: Mapping[str, str] | None = None, home: Path | None = None) -> Path:
    return (home if home is not None else Path(sluice_home(env))) / HISTORY_FILENAME


def _lock(fd: int, kind: int) -> None:
    for attempt in range(LOCK_RETRIES):
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if attempt + 1 == LOCK_RETRIES:
                break
            time.sleep(LOCK_RETRY_SLEEP_S)
    raise HistoryError("could not lock the history file: another process holds it")


def append_entry(text: str, session_id: str, path: Path, *, now: float | None = None) -> None:
    """Append one entry under an exclusive lock; the file is kept 0600."""
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    entry = HistoryEntry(session_id=str(session_id), ts=int(time.time() if now is None else now), text=text)
    line = _encoder.encode(entry) + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & 0o077:
            os.fchmod(fd, 0o600)
        _lock(fd, fcntl.LOCK_EX)
        try:
            os.write(fd, line)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def history_metadata(path: Path) -> tuple[int, int]:
    """``(log_id, entry_count)``: the file's inode and its number of lines; ``(0, 0)``
    when there is no file."""
    try:
        with open(path, "rb") as f:
            log_id = os.fstat(f.fileno()).st_ino
            count = 0
            while chunk := f.read(1 << 16):
                count += chunk.count(b"\n")
    except OSError:
        return 0, 0
    return log_id, count


def lookup(log_id: int, offset: int, path: Path) -> HistoryEntry | None:
    """The entry at line ``offset`` of the file whose inode is ``log_id``, else None."""
    if offset < 0:
        return None
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_ino != log_id:
                return None
            _lock(f.fileno(), fcntl.LOCK_SH)
            try:
                for index, line in enumerate(f):
                    if index == offset:
                        try:
                            return _decoder.decode(line)
                        except (msgspec.DecodeError, msgspec.ValidationError):
                            return None
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    except (OSError, HistoryError):
        return None
    return None
