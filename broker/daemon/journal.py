"""A session's events on disk, so a frontend can replay further back than the memory log.

The broker keeps the newest events of each session in memory (:mod:`broker.daemon.sessions`);
every event is also appended here, as the body frame it came in (msgpack, never decoded),
so ``attach --since 0`` and a frontend catching up after falling behind get a gap-free
stream however old the events they need. The journal lives in the daemon's runtime dir
(``journal/``, 0700, emptied at daemon start, hidden from sandboxed commands like the
rest of the runtime dir) and a session's files go when the session closes. Files are
made and removed relative to a descriptor of that directory, never through a link: a
segment is created new (``O_EXCL``) and only the file it still is gets unlinked.

Layout: two files per segment: ``<session id>.<n>.events`` holds the event bodies back to
back, ``<session id>.<n>.index`` where each body ends in it (one little-endian u64 per
event, in seq order). Seqs are consecutive. When the newest segment passes half of
``max_bytes`` a new one is started and the one before the previous is deleted, so a
session keeps between half and all of ``max_bytes`` of its newest events and the
readable range is always one contiguous ``[first_seq, last_seq]``.

Appends are buffered in memory and written in blocks (and before every read), so the
broker's loop pays a memcpy per event, not a syscall. A read (:meth:`Journal.read`) is a
:class:`Block`: a run of consecutive events whose bodies come off the disk in one
``pread``, as they are stored, with their ends from the index in another: nothing is
done per event, so a replay forwards what it reads as it is. A segment is open only
while it is written or read: a daemon hosting a thousand idle sessions holds no
descriptor for them (descriptors are what a flood of connections runs out of).
Reopening goes through the directory's descriptor with ``O_NOFOLLOW`` and must find the
file it made (same device and inode), or the journal turns itself off.

Disk trouble (full, unwritable) never reaches the caller: the journal logs once, deletes
what it wrote and turns itself off; ``first_seq`` then says nothing is readable, and
replay falls back to what the memory log holds.

All of a daemon's journals together are bounded too (:class:`JournalSpace`): the runtime
dir is often in RAM (``/run``), and a session printing with nobody attached (``yes`` in a
terminal) would fill it at megabytes a second. Past the cap, the biggest journal loses
its oldest segment, and so on until the total fits; its readable range stays contiguous
(it starts later), so a frontend that replays across what was dropped is told which
events are gone, as for any event no longer kept (:mod:`broker.daemon.sessions`).
"""

from __future__ import annotations

import array
import bisect
import os
import stat
import struct
import sys

import structlog

from broker.net.logging import Throttle

log = structlog.get_logger(component="journal")
_throttle = Throttle(log)

# Per session: between half and all of this is kept.
JOURNAL_BYTES = 256 * 1024 * 1024
# All sessions together (:class:`JournalSpace`): at most this, and a quarter of the
# filesystem the journals are on (:func:`default_limit`).
JOURNALS_BYTES = 1024 * 1024 * 1024
# Buffered appends are written out at this size.
WRITE_BLOCK = 256 * 1024

_END = struct.Struct("<Q")
SUFFIX = ".events"
INDEX_SUFFIX = ".index"


class Block:
    """Consecutive events ``first``, ``first + 1``, ...: their bodies back to back in
    ``parts`` (buffers, joined in order), event i's body ending at ``ends[i] - base`` of
    the whole. A read from the journal or the memory log; never empty."""

    __slots__ = ("first", "parts", "ends", "base")

    def __init__(self, first: int, parts: list, ends, base: int = 0) -> None:
        self.first = first
        self.parts = parts
        self.ends = ends
        self.base = base

    @property
    def count(self) -> int:
        return len(self.ends)

    @property
    def last(self) -> int:
        return self.first + len(self.ends) - 1

    @property
    def nbytes(self) -> int:
        """The bodies' bytes, all together."""
        return self.ends[-1] - self.base

    @property
    def last_size(self) -> int:
        ends = self.ends
        return ends[-1] - (ends[-2] if len(ends) > 1 else self.base)

    def events(self) -> list[tuple[int, bytes]]:
        """``(seq, body)`` for each event (for tests and the odd caller: a replay needs none)."""
        data = b"".join(self.parts)
        out = []
        start = 0
        for i, end in enumerate(self.ends):
            end -= self.base
            out.append((self.first + i, data[start:end]))
            start = end
        return out

    def __repr__(self) -> str:
        return f"<Block {self.first}..{self.last} {self.nbytes} bytes>"


class _Segment:
    __slots__ = ("path", "index_path", "ident", "index_ident", "first_seq", "last_seq", "data_size")

    def __init__(self, path: str, index_path: str, ident: tuple[int, int], index_ident: tuple[int, int],
                 first_seq: int) -> None:
        self.path = path
        self.index_path = index_path
        self.ident = ident
        self.index_ident = index_ident
        self.first_seq = first_seq
        self.last_seq = first_seq - 1
        # Bytes of bodies, on disk plus still in the journal's write buffer.
        self.data_size = 0

    @property
    def size(self) -> int:
        """Bytes it takes on disk (once written): bodies and index."""
        return self.data_size + _END.size * (self.last_seq - self.first_seq + 1)


class JournalSpace:
    """The cap on all journals together: past ``limit`` bytes, the biggest journal drops its
    oldest segment until they fit (see the module docstring)."""

    def __init__(self, limit: int) -> None:
        if limit < 2:
            raise ValueError("the journals' limit must be at least 2 bytes")
        self.limit = limit
        # What the journals' segments hold (each journal adds and takes off its own).
        self.used = 0
        self.journals: set[Journal] = set()

    def fit(self) -> None:
        """Drop the oldest segments of the biggest journals until all fit in the limit."""
        while self.used > self.limit:
            biggest = max(self.journals, key=lambda j: j.size, default=None)
            if biggest is None or not biggest.drop_oldest():
                return

    def __repr__(self) -> str:
        return f"<JournalSpace {self.used} of {self.limit} bytes, {len(self.journals)} journals>"


def default_limit(dir_fd: int) -> int:
    """How much the journals in the directory ``dir_fd`` may hold together by default:
    :data:`JOURNALS_BYTES`, and no more than a quarter of the filesystem's size (a tmpfs
    such as ``/run`` is often a tenth of the RAM)."""
    try:
        st = os.fstatvfs(dir_fd)
    except OSError:
        return JOURNALS_BYTES
    size = st.f_blocks * st.f_frsize
    return min(JOURNALS_BYTES, size // 4) if size else JOURNALS_BYTES


class Journal:
    """Every event body of one session, on disk; see the module docstring."""

    def __init__(self, directory: str | int, session_id: str, *, max_bytes: int = JOURNAL_BYTES,
                 space: JournalSpace | None = None) -> None:
        """``directory``: a path, or a descriptor of the directory (not closed here).
        ``space``: the cap it shares with the other journals (it keeps no more than that either)."""
        if space is not None:
            max_bytes = min(max_bytes, space.limit)
        if max_bytes < 2:
            raise ValueError("max_bytes must be at least 2")
        self.directory = directory
        # Segment names are relative to this descriptor, or paths when there is none.
        self._dir_fd = directory if isinstance(directory, int) else None
        self.session_id = session_id
        self.max_bytes = max_bytes
        self._segments: list[_Segment] = []
        # What the newest segment has not written yet: bodies, and their ends for the index.
        self._buffer = bytearray()
        self._index = bytearray()
        self._next_segment = 0
        self._last_seq = 0
        self._broken = False
        self._space = space
        if space is not None:
            space.journals.add(self)

    # ------------------------------------------------------------------ state

    @property
    def first_seq(self) -> int:
        """The oldest seq still readable; ``last_seq + 1`` when none is."""
        if self._broken or not self._segments:
            return self._last_seq + 1
        return self._segments[0].first_seq

    @property
    def last_seq(self) -> int:
        """The newest seq appended (0 if none)."""
        return self._last_seq

    @property
    def size(self) -> int:
        """Bytes kept (on disk and buffered)."""
        return sum(s.size for s in self._segments)

    # ---------------------------------------------------------------- writing

    def append(self, seq: int, body) -> None:
        """Record event ``seq`` (the one after :attr:`last_seq`); never raises."""
        if self._broken:
            self._last_seq = seq
            return
        if seq != self._last_seq + 1 and self._last_seq:
            # A bug upstream; a journal with a hole would break replay's promise.
            self._fail(f"seq {seq} does not follow {self._last_seq}")
            self._last_seq = seq
            return
        try:
            segment = self._segments[-1] if self._segments else None
            if segment is None or segment.size >= self.max_bytes // 2:
                segment = self._rotate(seq)
            self._buffer += body
            segment.data_size += len(body)
            self._index += _END.pack(segment.data_size)
            if self._space is not None:
                self._space.used += len(body) + _END.size
            segment.last_seq = seq
            self._last_seq = seq
            if len(self._buffer) >= WRITE_BLOCK:
                self._flush()
        except OSError as e:
            self._last_seq = seq
            self._fail(e.strerror or str(e))
            return
        if self._space is not None:
            self._space.fit()  # last: it may drop segments of this journal too

    def _rotate(self, first_seq: int) -> _Segment:
        self._flush()
        name = f"{self.session_id}.{self._next_segment}"
        self._next_segment += 1
        path, ident = self._create(name + SUFFIX)
        try:
            index_path, index_ident = self._create(name + INDEX_SUFFIX)
        except OSError:
            self._unlink(path, ident)
            raise
        self._segments.append(_Segment(path, index_path, ident, index_ident, first_seq))
        while len(self._segments) > 2:
            self._drop(self._segments.pop(0))
        return self._segments[-1]

    def _create(self, name: str) -> tuple[str, tuple[int, int]]:
        """A new empty file ``name`` in the directory: its path and identity."""
        path = name if self._dir_fd is not None else os.path.join(self.directory, name)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            fd = os.open(path, flags, 0o600, dir_fd=self._dir_fd)
        except FileExistsError:
            # Left over under this name (a reset that could not remove it): replace the
            # entry, whatever it is, without writing through it.
            os.unlink(path, dir_fd=self._dir_fd)
            fd = os.open(path, flags, 0o600, dir_fd=self._dir_fd)
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        return path, (st.st_dev, st.st_ino)

    def _open(self, path: str, ident: tuple[int, int], flags: int) -> int:
        """A descriptor of ``path``, which must still be the file we made (``ident``)."""
        fd = os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=self._dir_fd)
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != ident:
                raise OSError(0, f"{path} was replaced")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _flush(self) -> None:
        if not self._buffer and not self._index:
            return
        segment = self._segments[-1]
        # Bodies first: the index never names bytes that are not on disk.
        for path, ident, buffer in ((segment.path, segment.ident, self._buffer),
                                    (segment.index_path, segment.index_ident, self._index)):
            fd = self._open(path, ident, os.O_WRONLY | os.O_APPEND)
            view = memoryview(buffer)
            try:
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
            finally:
                view.release()
                os.close(fd)
            buffer.clear()

    # ---------------------------------------------------------------- reading

    def read(self, seq: int, max_events: int, max_bytes: int) -> Block | None:
        """Events ``seq``, ``seq + 1``, ... (at most ``max_events``, and about ``max_bytes``
        of bodies: each event is taken while fewer than ``max_bytes`` were, so always at
        least one) from one segment; None when ``seq`` is not in ``[first_seq, last_seq]``."""
        if self._broken or not (self.first_seq <= seq <= self._last_seq) or max_events < 1:
            return None
        try:
            self._flush()
            segment = next(s for s in self._segments if s.last_seq >= seq)
            return self._read_segment(segment, seq, min(max_events, segment.last_seq - seq + 1), max_bytes)
        except OSError as e:
            self._fail(e.strerror or str(e))
            return None

    def _read_segment(self, segment: _Segment, seq: int, count: int, max_bytes: int) -> Block:
        k = seq - segment.first_seq
        # The ends of events seq - 1 (where seq's body starts; 0 for a segment's first) .. the last wanted.
        before = 1 if k else 0
        fd = self._open(segment.index_path, segment.index_ident, os.O_RDONLY)
        try:
            raw = os.pread(fd, (count + before) * _END.size, (k - before) * _END.size)
        finally:
            os.close(fd)
        if len(raw) != (count + before) * _END.size:
            raise OSError(0, f"the index of events {seq}.. is cut short")
        ends = array.array("Q")
        ends.frombytes(raw)
        if sys.byteorder != "little":
            ends.byteswap()
        base = ends[0] if before else 0
        if before:
            del ends[0]
        # Event i is taken while the ones before it hold fewer than max_bytes.
        count = min(count, bisect.bisect_left(ends, base + max_bytes) + 1)
        del ends[count:]
        size = ends[-1] - base
        fd = self._open(segment.path, segment.ident, os.O_RDONLY)
        try:
            data = os.pread(fd, size, base)
        finally:
            os.close(fd)
        if len(data) != size:
            raise OSError(0, f"events {seq}..{seq + count - 1} are cut short")
        return Block(seq, [data], ends, base)

    # ---------------------------------------------------------------- ending

    def close(self, *, delete: bool = True) -> None:
        """Stop journaling; remove the files unless ``delete`` is false."""
        if not delete and not self._broken:
            try:
                self._flush()
            except OSError:
                pass
        self._buffer.clear()
        self._index.clear()
        for segment in self._segments:
            self._drop(segment, delete=delete)
        self._segments.clear()
        self._broken = True
        if self._space is not None:
            self._space.journals.discard(self)
            self._space = None

    def drop_oldest(self) -> bool:
        """Drop the oldest segment (for the cap on all journals); False when there is none.
        The readable range then starts after it; the newest one too can go, and the next
        append starts a new one."""
        if not self._segments:
            return False
        segment = self._segments.pop(0)
        if not self._segments:  # the newest: what waits to be written is its
            self._buffer.clear()
            self._index.clear()
        _throttle("warning", "session journals at their cap: the oldest events of the biggest one dropped",
                  session=self.session_id, first=segment.first_seq, last=segment.last_seq,
                  limit=self._space.limit if self._space is not None else self.max_bytes)
        self._drop(segment)
        return True

    def _drop(self, segment: _Segment, *, delete: bool = True) -> None:
        if self._space is not None:
            self._space.used -= segment.size
        if delete:
            self._unlink(segment.path, segment.ident)
            self._unlink(segment.index_path, segment.index_ident)

    def _unlink(self, path: str, ident: tuple[int, int]) -> None:
        try:
            st = os.stat(path, dir_fd=self._dir_fd, follow_symlinks=False)
            if (st.st_dev, st.st_ino) == ident:  # still the file we made
                os.unlink(path, dir_fd=self._dir_fd)
        except OSError:
            pass

    def _fail(self, why: str) -> None:
        log.warning("session journal turned off; replay is limited to the memory log",
                    session=self.session_id, error=why)
        self.close()

    def __repr__(self) -> str:
        return f"<Journal {self.session_id} [{self.first_seq}, {self.last_seq}] {self.size} bytes>"


def reset_directory(path: str, *, dir_fd: int | None = None) -> int:
    """Make ``path`` (relative to ``dir_fd`` if given) a directory (0700), remove the journal
    files a previous daemon left in it and return a descriptor of it (the caller closes it).

    An existing ``path`` must be a directory of ours, not a symlink (OSError otherwise).
    Only the entries directly in it are removed, relative to its descriptor: unlinking
    never follows a link or enters a subdirectory or another filesystem.
    """
    try:
        os.mkdir(path, 0o700, dir_fd=dir_fd)
    except FileExistsError:
        pass
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid():
            raise OSError(0, f"{path} belongs to uid {st.st_uid}")
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.fchmod(fd, 0o700)  # ours, through the descriptor: not through a link
        with os.scandir(fd) as entries:
            names = [e.name for e in entries if e.name.endswith((SUFFIX, INDEX_SUFFIX)) and not e.is_dir(follow_symlinks=False)]
        for name in names:
            try:
                os.unlink(name, dir_fd=fd)
            except OSError:
                pass
    except BaseException:
        os.close(fd)
        raise
    return fd
