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

Durability: every line is written to the file (one ``write(2)``, no buffer of ours) by
the call that records it, so it is in the kernel before the event about it goes out,
and a SIGKILL of the agent or of the daemon loses nothing recorded; :meth:`RolloutRecorder.sync`
(at the end of every turn, and at shutdown) fsyncs it, so it survives the machine too.

A write that fails (``ENOSPC``, ``EIO``...) never crashes the session: a partly written
line is cut off again, the recorder stops writing and reports it once, as
``rollout: no space left on device: PATH`` (:attr:`RolloutRecorder.failure`, and its
``on_failure`` callback), and the session goes on without a record.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import errno
import fcntl
import json
import os
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from agent.items import CALL_TYPES, OUTPUT_TYPES
from broker.net.runtime import sluice_home
from broker.wire.protocol import ROLLOUT_ERROR_PREFIX

log = structlog.get_logger("agent.rollout")

SESSIONS_SUBDIR = "sessions"
REDACTED = "[redacted]"
# Skipped line numbers named in the report, at most.
SKIPPED_SHOWN = 10
PERSISTED_TYPES = frozenset({"message", "reasoning", "function_call", "function_call_output", "local_shell_call",
                             "custom_tool_call", "custom_tool_call_output"})


class RolloutError(Exception):
    """A rollout file that cannot be read or written; one line for a person."""


class InUse(Exception):
    """Another recorder holds the rollout file."""


def is_persisted(item: Mapping[str, Any]) -> bool:
    return item.get("type") in PERSISTED_TYPES


@dataclass
class SavedSession:
    """What a rollout file holds: the session id, its meta line and its items; the lines
    that could not be read (their numbers, from 1) and the tool outputs left out with them."""

    session_id: uuid.UUID
    meta: dict[str, Any]
    items: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    orphan_outputs: int = 0

    def report(self, path: str | os.PathLike[str]) -> str | None:
        """One line for a person about what was skipped (None when nothing was)."""
        if not self.skipped:
            return None
        shown = ", ".join(map(str, self.skipped[:SKIPPED_SHOWN]))
        more = f" and {len(self.skipped) - SKIPPED_SHOWN} more" if len(self.skipped) > SKIPPED_SHOWN else ""
        which = "line" if len(self.skipped) == 1 else "lines"
        text = f"rollout {path}: {which} {shown}{more} not readable (corrupt), skipped"
        if self.orphan_outputs:
            text += f", with {self.orphan_outputs} tool output(s) whose call was on them"
        return text + "; the conversation goes on without them"


def sessions_dir(env: Mapping[str, str] | None = None, home: Path | None = None) -> Path:
    return (home if home is not None else Path(sluice_home(env))) / SESSIONS_SUBDIR


def rollout_path(session_id: uuid.UUID, when: dt.datetime, root: Path) -> Path:
    day = root / f"{when.year:04d}" / f"{when.month:02d}" / f"{when.day:02d}"
    return day / f"rollout-{when.strftime('%Y-%m-%dT%H-%M-%S')}-{session_id}.jsonl"


def _timestamp(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def read_rollout(path: str | os.PathLike[str]) -> SavedSession:
    """Parse a rollout file, line by line as bytes; raises :class:`RolloutError` if it is
    not one (it cannot be read, or its first line is no session line).

    A last line without its newline was cut by a kill in the middle of writing it (no event
    ever spoke of it): it is dropped. Any other line that is not UTF-8 JSON (a corrupt byte)
    is skipped and listed in :attr:`SavedSession.skipped` for the session to report; a tool
    output whose call was on such a line goes with it (the model refuses an output without
    its call; a call without its output gets an ``aborted`` one at the next request)."""
    try:
        with open(path, "rb") as f:
            first = f.readline()
            if not first.endswith(b"\n") or not first.strip():
                raise RolloutError(f"rollout {path} is empty")
            meta = _json_line(first)
            try:
                session_id = uuid.UUID(str(meta["id"]))
            except (ValueError, KeyError, TypeError):
                raise RolloutError(f"rollout {path} does not start with a session line") from None
            saved = SavedSession(session_id, meta)
            items: list[dict[str, Any]] = []
            for number, line in enumerate(f, 2):
                if not line.endswith(b"\n"):  # the last line, cut short
                    log.warning("rollout: a partly written last line dropped", path=str(path), line=number)
                    break
                if not line.strip():
                    continue
                value = _json_line(line)
                if not isinstance(value, dict):
                    saved.skipped.append(number)
                    continue
                record = value.get("record_type")
                if record == "compacted":
                    items = [i for i in value.get("items") or [] if isinstance(i, dict) and is_persisted(i)]
                elif record is None and is_persisted(value):
                    items.append(value)
    except OSError as err:
        raise RolloutError(f"cannot read rollout {path}: {err.strerror or err}") from None
    if saved.skipped:
        calls = {i.get("call_id") for i in items if i.get("type") in CALL_TYPES}
        kept = [i for i in items if i.get("type") not in OUTPUT_TYPES or i.get("call_id") in calls]
        saved.orphan_outputs = len(items) - len(kept)
        items = kept
        log.warning("rollout: unreadable lines skipped", path=str(path), lines=saved.skipped[:100],
                    orphan_outputs=saved.orphan_outputs)
    saved.items = items
    return saved


def _json_line(line: bytes) -> Any:
    """The JSON value of one line; None if it is not UTF-8 JSON."""
    try:
        return json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None


def failure_message(err: OSError, path: str | os.PathLike[str]) -> str:
    """``rollout: no space left on device: PATH``: one line for a person."""
    reason = err.strerror or str(err) or type(err).__name__
    return f"{ROLLOUT_ERROR_PREFIX}{reason[:1].lower()}{reason[1:]}: {path}"


class RolloutRecorder:
    """Appends a session's items to its rollout file, each written as it is recorded
    (see the module docstring). Create with :meth:`create` or :meth:`resume`."""

    def __init__(self, path: Path, fd: int, secrets: Iterable[str] = (), *, size: int = 0) -> None:
        self.path = path
        self._fd: int | None = fd
        self._size = size  # bytes of whole lines in the file
        self._secrets = [s for s in secrets if s]
        self._unsynced = False
        self._syncing: asyncio.Future[None] | None = None
        self.failure: str | None = None
        """Set once a write failed (the one-line message); nothing is written after it."""
        self.on_failure: Callable[[str], object] | None = None
        """Called once, with :attr:`failure`, when a write fails."""

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
        """A new rollout file for ``session_id`` under ``root`` (default ``$SLUICE_HOME/sessions``),
        its meta line written; raises :class:`RolloutError` (the :func:`failure_message`)
        if it cannot be made or written, and leaves no empty file behind."""
        when = now or dt.datetime.now(dt.timezone.utc)
        path = rollout_path(session_id, when, root if root is not None else sessions_dir())
        try:
            fd = await asyncio.to_thread(_open_new, path)
        except OSError as err:
            raise RolloutError(failure_message(err, path)) from None
        recorder = cls(path, fd, secrets)
        recorder._write({"id": str(session_id), "timestamp": _timestamp(when), "instructions": instructions})
        if recorder.failure is not None:
            recorder.close()
            with contextlib.suppress(OSError):
                path.unlink()
            raise RolloutError(recorder.failure)
        return recorder

    @classmethod
    async def resume(cls, path: str | os.PathLike[str], *, secrets: Iterable[str] = ()) -> tuple[RolloutRecorder, SavedSession]:
        """Read ``path`` and keep appending to it. A last line cut short (the process was
        killed in the middle of writing it, so no event ever spoke of it) is dropped."""
        saved = await asyncio.to_thread(read_rollout, path)
        try:
            fd, size = await asyncio.to_thread(_open_for_append, Path(path))
        except InUse:
            raise RolloutError(f"rollout {path} is in use by another session; attach to that one") from None
        except OSError as err:
            raise RolloutError(f"cannot append to rollout {path}: {err.strerror}") from None
        return cls(Path(path), fd, secrets, size=size), saved

    def add_secret(self, value: str) -> None:
        if value and value not in self._secrets:
            self._secrets.append(value)

    # -- recording --------------------------------------------------------------------

    def record_items(self, items: Iterable[Mapping[str, Any]]) -> None:
        """Write the items that belong to the conversation, one line each, now."""
        for item in items:
            if is_persisted(item):
                self._write(item)

    def record_compaction(self, items: Iterable[Mapping[str, Any]]) -> None:
        self._write({"record_type": "compacted", "items": [dict(i) for i in items if is_persisted(i)]})

    def _scrub(self, line: str) -> str:
        for secret in self._secrets:
            line = line.replace(secret, REDACTED)
            escaped = json.dumps(secret, ensure_ascii=False)[1:-1]
            if escaped != secret:
                line = line.replace(escaped, REDACTED)
        return line

    # -- writing ----------------------------------------------------------------------

    def _write(self, value: Mapping[str, Any]) -> None:
        fd = self._fd
        if fd is None or self.failure is not None:
            return
        line = self._scrub(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
        encoded = f"{line}\n".encode()
        data = memoryview(encoded)
        try:
            while data:
                written = os.write(fd, data)
                if written <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                data = data[written:]
        except OSError as err:
            # Cut a partly written line off again, so the file stays whole lines.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, self._size)
            self._fail(err)
            return
        self._size += len(encoded)
        self._unsynced = True

    def _fail(self, err: OSError) -> None:
        if self.failure is not None:
            return
        self.failure = failure_message(err, self.path)
        log.error("rollout write failed; the session goes on without it", path=str(self.path),
                  error=err.strerror or str(err))
        if self.on_failure is not None:
            try:
                self.on_failure(self.failure)
            except Exception:
                log.exception("rollout failure callback failed")

    async def sync(self) -> None:
        """fsync what was written since the last sync (a failure is reported, not raised).
        The fsync runs in a thread and goes on if the caller is cancelled; :meth:`shutdown`
        waits for it before closing the file."""
        while self._syncing is not None:  # one in flight: what came since needs another
            with contextlib.suppress(Exception):  # its failure is reported by _synced
                await asyncio.shield(self._syncing)
        fd = self._fd
        if fd is None or not self._unsynced or self.failure is not None:
            return
        self._unsynced = False
        syncing = self._syncing = asyncio.ensure_future(asyncio.to_thread(os.fsync, fd))
        syncing.add_done_callback(self._synced)
        with contextlib.suppress(Exception):
            await asyncio.shield(syncing)

    def _synced(self, syncing: asyncio.Future[None]) -> None:
        self._syncing = None
        if syncing.cancelled():
            return
        err = syncing.exception()
        if isinstance(err, OSError):
            self._fail(err)
        elif err is not None:
            log.error("rollout sync failed", error=repr(err))

    async def flush(self) -> None:
        """Wait until everything recorded so far is on disk (recorded is already written:
        this is :meth:`sync`)."""
        await self.sync()

    async def shutdown(self) -> None:
        """Sync and close; later records are dropped."""
        if self._fd is None:
            return
        await self.sync()
        self.close()

    def close(self) -> None:
        """Close without syncing (what was written stays written)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


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


def _open_new(path: Path) -> int:
    make_private_dirs(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new: nobody else has it open
    return fd


def _open_for_append(path: Path) -> tuple[int, int]:
    """``path`` opened to append, a partial last line cut off; the fd and the file's size.
    The file is locked while a recorder holds it: a session resumed twice at once would
    interleave its lines, and two sessions would claim the one session id
    (:class:`InUse` if another recorder holds it)."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InUse from None
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            with open(path, "rb") as f:
                whole = f.read()
            size = whole.rfind(b"\n") + 1
            log.warning("rollout: a partly written last line dropped", path=str(path), kept=size)
            os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd, size
