"""Rollout files: each session's conversation as JSON lines, to inspect and to resume.

A session writes ``$SLUICE_HOME/sessions/YYYY/MM/DD/rollout-YYYY-MM-DDThh-mm-ss-<session id>.jsonl``
(``~/.sluice`` by default; directories 0700, the file 0600), as Codex does under
``~/.codex``. The first line is the session's meta data, every later line one
conversation item in the Responses API shape::

    {"id":"67e55044-...","timestamp":"2025-05-07T17:24:21.123Z","instructions":null}
    {"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}
    {"type":"function_call","name":"shell","arguments":"{...}","call_id":"c1"}
    {"type":"function_call_output","call_id":"c1","output":"{...}"}

Only what the conversation is made of is kept (messages, reasoning, function and local
shell calls, their outputs). ``{"record_type":"compacted","items":[...]}`` marks a
compaction: on resume the items before it are replaced by the ones it holds. Other
``record_type`` lines are skipped on resume.

Secrets: the recorder is given the values it must never write (the provider's API key);
every line is scrubbed of them before it reaches the disk, wherever they appear (a
command's output that echoes the key, say).

Writes go through a queue drained by one writer task, so recording never waits for the
disk; :meth:`RolloutRecorder.flush` waits until everything queued is written and
synced, :meth:`RolloutRecorder.shutdown` also closes the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from agent.config import sluice_home

log = structlog.get_logger("agent.rollout")

SESSIONS_SUBDIR = "sessions"
REDACTED = "[redacted]"
PERSISTED_TYPES = frozenset({"message", "reasoning", "function_call", "function_call_output", "local_shell_call"})


class RolloutError(Exception):
    """A rollout file that cannot be read or written; one line for a person."""


def is_persisted(item: Mapping[str, Any]) -> bool:
    return item.get("type") in PERSISTED_TYPES


@dataclass
class SavedSession:
    """What a rollout file holds: the session id, its meta line and its items."""

    session_id: uuid.UUID
    meta: dict[str, Any]
    items: list[dict[str, Any]] = field(default_factory=list)


def sessions_dir(env: Mapping[str, str] | None = None, home: Path | None = None) -> Path:
    return (home if home is not None else sluice_home(env)) / SESSIONS_SUBDIR


def rollout_path(session_id: uuid.UUID, when: dt.datetime, root: Path) -> Path:
    day = root / f"{when.year:04d}" / f"{when.month:02d}" / f"{when.day:02d}"
    return day / f"rollout-{when.strftime('%Y-%m-%dT%H-%M-%S')}-{session_id}.jsonl"


def _timestamp(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def read_rollout(path: str | os.PathLike[str]) -> SavedSession:
    """Parse a rollout file; raises :class:`RolloutError` if it is not one."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise RolloutError(f"cannot read rollout {path}: {reason}") from None
    lines = text.splitlines()
    if not lines or not lines[0].strip():
        raise RolloutError(f"rollout {path} is empty")
    try:
        meta = json.loads(lines[0])
        session_id = uuid.UUID(str(meta["id"]))
    except (ValueError, KeyError, TypeError):
        raise RolloutError(f"rollout {path} does not start with a session line") from None
    items: list[dict[str, Any]] = []
    for number, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            log.warning("rollout line skipped: not JSON", path=str(path), line=number)
            continue
        if not isinstance(value, dict):
            continue
        record = value.get("record_type")
        if record == "compacted":
            items = [i for i in value.get("items") or [] if isinstance(i, dict) and is_persisted(i)]
        elif record is None and is_persisted(value):
            items.append(value)
    return SavedSession(session_id, meta, items)


class RolloutRecorder:
    """Appends a session's items to its rollout file. Create with :meth:`create` or
    :meth:`resume` from inside the event loop."""

    def __init__(self, path: Path, file: Any, secrets: Iterable[str] = ()) -> None:
        self.path = path
        self._file = file
        self._secrets = [s for s in secrets if s]
        self._queue: asyncio.Queue[tuple[str | None, asyncio.Future[None] | None]] = asyncio.Queue()
        self._writer = asyncio.get_running_loop().create_task(self._write_loop())
        self._closed = False

    @classmethod
    async def create(
        cls,
        session_id: uuid.UUID,
        *,
        instructions: str | None = None,
        root: Path | None = None,
        secrets: Iterable[str] = (),
        now: dt.datetime | None = None,
    ) -> RolloutRecorder:
        """A new rollout file for ``session_id`` under ``root`` (default ``$SLUICE_HOME/sessions``)."""
        when = now or dt.datetime.now(dt.timezone.utc)
        path = rollout_path(session_id, when, root if root is not None else sessions_dir())
        file = await asyncio.to_thread(_open_new, path)
        recorder = cls(path, file, secrets)
        recorder._enqueue({"id": str(session_id), "timestamp": _timestamp(when), "instructions": instructions})
        return recorder

    @classmethod
    async def resume(cls, path: str | os.PathLike[str], *, secrets: Iterable[str] = ()) -> tuple[RolloutRecorder, SavedSession]:
        """Read ``path`` and keep appending to it."""
        saved = await asyncio.to_thread(read_rollout, path)
        try:
            file = await asyncio.to_thread(open, path, "a", encoding="utf-8")
        except OSError as err:
            raise RolloutError(f"cannot append to rollout {path}: {err.strerror}") from None
        return cls(Path(path), file, secrets), saved

    def add_secret(self, value: str) -> None:
        if value and value not in self._secrets:
            self._secrets.append(value)

    # -- recording --------------------------------------------------------------------

    def record_items(self, items: Iterable[Mapping[str, Any]]) -> None:
        for item in items:
            if is_persisted(item):
                self._enqueue(item)

    def record_compaction(self, items: Iterable[Mapping[str, Any]]) -> None:
        self._enqueue({"record_type": "compacted", "items": [dict(i) for i in items if is_persisted(i)]})

    def _enqueue(self, value: Mapping[str, Any]) -> None:
        if self._closed:
            return
        line = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        self._queue.put_nowait((self._scrub(line), None))

    def _scrub(self, line: str) -> str:
        for secret in self._secrets:
            line = line.replace(secret, REDACTED)
            escaped = json.dumps(secret, ensure_ascii=False)[1:-1]
            if escaped != secret:
                line = line.replace(escaped, REDACTED)
        return line

    # -- writing ----------------------------------------------------------------------

    async def _write_loop(self) -> None:
        while True:
            line, done = await self._queue.get()
            lines = [] if line is None else [line]
            waiters = [] if done is None else [done]
            while not self._queue.empty():
                more, waiter = self._queue.get_nowait()
                if more is not None:
                    lines.append(more)
                if waiter is not None:
                    waiters.append(waiter)
            try:
                await asyncio.to_thread(self._write, lines, bool(waiters))
            except OSError as err:
                log.error("rollout write failed", path=str(self.path), error=err.strerror or str(err))
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _write(self, lines: list[str], sync: bool) -> None:
        if lines:
            self._file.write("".join(f"{line}\n" for line in lines))
        if sync:
            self._file.flush()
            os.fsync(self._file.fileno())

    async def flush(self) -> None:
        """Wait until everything recorded so far is on disk."""
        if self._writer.done():
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((None, done))
        await done

    async def shutdown(self) -> None:
        """Flush and close; later records are dropped."""
        if self._closed:
            return
        await self.flush()
        self._closed = True
        self._writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._writer
        await asyncio.to_thread(self._file.close)


def make_private_dirs(directory: Path) -> None:
    """Create ``directory`` and any missing parent, each 0700 (conversations are private)."""
    missing = []
    while not directory.exists():
        missing.append(directory)
        if directory.parent == directory:
            break
        directory = directory.parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)


def _open_new(path: Path) -> Any:
    make_private_dirs(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    return os.fdopen(fd, "a", encoding="utf-8")
