"""A session's events on disk, so a frontend can replay further back than the memory log.

The broker keeps the newest events of each session in memory (:mod:`broker.daemon.sessions`);
every event is also appended here, as the body frame it came in (msgpack, never decoded),
so ``attach --since 0`` and a frontend catching up after falling behind get a gap-free
stream however old the events they need. The journal lives in the daemon's runtime dir
(``journal/``, 0700, emptied at daemon start, hidden from sandboxed commands like the
rest of the runtime dir) and a session's files go when the session closes. Files are
made and removed relative to a descriptor of that directory, never through a link: a
segment is created new (``O_EXCL``) and only the file it still is gets unlinked.

Layout: one file per segment, ``<session id>.<n>.events``, a sequence of records
``[u32 body length][u64 seq][body]`` (little-endian). Seqs are consecutive. When the
newest segment passes half of ``max_bytes`` a new one is started and the one before the
previous is deleted, so a session keeps between half and all of ``max_bytes`` of its
newest events and the readable range is always one contiguous ``[first_seq, last_seq]``.

Appends are buffered in memory and written in blocks (and before every read), so the
broker's loop pays a memcpy per event, not a syscall. A read seeks through a sparse
index (one offset per :data:`INDEX_EVERY` records) and reads with ``pread``. A segment
is open only while it is written or read: a daemon hosting a thousand idle sessions
holds no descriptor for them (descriptors are what a flood of connections runs out of).
Reopening goes through the directory's descriptor with ``O_NOFOLLOW`` and must find the
file it made (same device and inode), or the journal turns itself off.

Disk trouble (full, unwritable) never reaches the caller: the journal logs once, deletes
what it wrote and turns itself off; ``first_seq`` then says nothing is readable, and
replay falls back to what the memory log holds.
"""

from __future__ import annotations

import os
import stat
import struct

import structlog

log = structlog.get_logger(component="journal")

# Per session: between half and all of this is kept.
JOURNAL_BYTES = 256 * 1024 * 1024
# One index entry per this many records.
INDEX_EVERY = 64
# Buffered appends are written out at this size.
WRITE_BLOCK = 256 * 1024
# A read pulls at least this much from disk at a time.
READ_BLOCK = 1024 * 1024

_RECORD = struct.Struct("<IQ")
SUFFIX = ".events"


class _Segment:
    __slots__ = ("path", "ident", "first_seq", "last_seq", "size", "index")

    def __init__(self, path: str, ident: tuple[int, int], first_seq: int) -> None:
        self.path = path
        self.ident = ident
        self.first_seq = first_seq
        self.last_seq = first_seq - 1
        # Bytes on disk plus bytes still in the journal's write buffer.
        self.size = 0
        # (seq, offset) of every INDEX_EVERY-th record, ascending.
        self.index: list[tuple[int, int]] = []


class Journal:
    """Every event body of one session, on disk; see the module docstring."""

    def __init__(self, directory: str | int, session_id: str, *, max_bytes: int = JOURNAL_BYTES) -> None:
        """``directory``: a path, or a descriptor of the directory (not closed here)."""
        if max_bytes < 2:
            raise ValueError("max_bytes must be at least 2")
        self.directory = directory
        # Segment names are relative to this descriptor, or paths when there is none.
        self._dir_fd = directory if isinstance(directory, int) else None
        self.session_id = session_id
        self.max_bytes = max_bytes
        self._segments: list[_Segment] = []
        self._buffer = bytearray()
        self._next_segment = 0
        self._last_seq = 0
        self._broken = False

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
            size = len(body)
            if (seq - segment.first_seq) % INDEX_EVERY == 0:
                segment.index.append((seq, segment.size))
            self._buffer += _RECORD.pack(size, seq)
            self._buffer += body
            segment.size += _RECORD.size + size
            segment.last_seq = seq
            self._last_seq = seq
            if len(self._buffer) >= WRITE_BLOCK:
                self._flush()
        except OSError as e:
            self._last_seq = seq
            self._fail(e.strerror or str(e))

    def _rotate(self, first_seq: int) -> _Segment:
        self._flush()
        path = f"{self.session_id}.{self._next_segment}{SUFFIX}"
        if self._dir_fd is None:
            path = os.path.join(self.directory, path)
        self._next_segment += 1
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
        self._segments.append(_Segment(path, (st.st_dev, st.st_ino), first_seq))
        while len(self._segments) > 2:
            self._drop(self._segments.pop(0))
        return self._segments[-1]

    def _open(self, segment: _Segment, flags: int) -> int:
        """A descriptor of ``segment``'s file, which must still be the one we made."""
        fd = os.open(segment.path, flags | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=self._dir_fd)
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != segment.ident:
                raise OSError(0, f"{segment.path} was replaced")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _flush(self) -> None:
        if not self._buffer:
            return
        fd = self._open(self._segments[-1], os.O_WRONLY | os.O_APPEND)
        view = memoryview(self._buffer)
        try:
            while view:
                n = os.write(fd, view)
                view = view[n:]
        finally:
            view.release()
            os.close(fd)
        self._buffer.clear()

    # ---------------------------------------------------------------- reading

    def read(self, seq: int, max_events: int, max_bytes: int) -> list[tuple[int, bytes]]:
        """Events ``seq``, ``seq + 1``, ... (at most ``max_events``, and about ``max_bytes``
        of bodies but always at least one); [] when ``seq`` is not in ``[first_seq, last_seq]``."""
        if self._broken or not (self.first_seq <= seq <= self._last_seq) or max_events < 1:
            return []
        try:
            self._flush()
            out: list[tuple[int, bytes]] = []
            taken = 0
            for segment in self._segments:
                if segment.last_seq < seq:
                    continue
                taken = self._read_segment(segment, seq, max_events, max_bytes, out, taken)
                if not out or len(out) >= max_events or taken >= max_bytes:
                    break
                seq = out[-1][0] + 1
            return out
        except OSError as e:
            self._fail(e.strerror or str(e))
            return []

    def _read_segment(self, segment: _Segment, seq: int, max_events: int, max_bytes: int, out: list, taken: int) -> int:
        fd = self._open(segment, os.O_RDONLY)
        try:
            return self._read_from(fd, segment, seq, max_events, max_bytes, out, taken)
        finally:
            os.close(fd)

    @staticmethod
    def _read_from(fd: int, segment: _Segment, seq: int, max_events: int, max_bytes: int, out: list, taken: int) -> int:
        offset = 0
        for entry_seq, entry_offset in segment.index:
            if entry_seq > seq:
                break
            offset = entry_offset
        # ``block[pos:]`` is the file from ``offset`` on.
        block = b""
        pos = 0
        while len(out) < max_events and (taken < max_bytes or not out):
            if len(block) - pos < _RECORD.size:
                block, pos = os.pread(fd, READ_BLOCK, offset), 0
                if len(block) < _RECORD.size:
                    break
            size, record_seq = _RECORD.unpack_from(block, pos)
            need = _RECORD.size + size
            if len(block) - pos < need:
                block, pos = os.pread(fd, max(need, READ_BLOCK), offset), 0
                if len(block) < need:
                    raise OSError(0, f"record {record_seq} is cut short")
            if record_seq >= seq:
                out.append((record_seq, bytes(block[pos + _RECORD.size : pos + need])))
                taken += size
            pos += need
            offset += need
            if record_seq >= segment.last_seq:
                break
        return taken

    # ---------------------------------------------------------------- ending

    def close(self, *, delete: bool = True) -> None:
        """Stop journaling; remove the files unless ``delete`` is false."""
        if not delete and not self._broken:
            try:
                self._flush()
            except OSError:
                pass
        self._buffer.clear()
        for segment in self._segments:
            self._drop(segment, delete=delete)
        self._segments.clear()
        self._broken = True

    def _drop(self, segment: _Segment, *, delete: bool = True) -> None:
        if delete:
            try:
                st = os.stat(segment.path, dir_fd=self._dir_fd, follow_symlinks=False)
                if (st.st_dev, st.st_ino) == segment.ident:  # still the file we made
                    os.unlink(segment.path, dir_fd=self._dir_fd)
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
            names = [e.name for e in entries if e.name.endswith(SUFFIX) and not e.is_dir(follow_symlinks=False)]
        for name in names:
            try:
                os.unlink(name, dir_fd=fd)
            except OSError:
                pass
    except BaseException:
        os.close(fd)
        raise
    return fd
