"""The ``apply_patch`` tool: verify a Codex patch in memory, then write it to disk.

The patch format and how it is parsed are described in :mod:`agent.patch_parse`; in
short::

    *** Begin Patch
    *** Add File: hello.txt
    +Hello, world!
    *** Update File: src/app.py
    *** Move to: src/main.py
    @@ def greet():
    -print("Hi")
    +print("Hello, world!")
    *** Delete File: obsolete.txt
    *** End Patch

How an update applies (Codex's semantics). The file is split into lines. Chunks apply in
order, each searching forward from where the previous one ended: a chunk's ``@@ LINE``
context first moves the search to just after the next line matching LINE; then its old
lines (context and ``-`` lines) are looked for, trying an exact match, then ignoring
trailing whitespace, then ignoring leading and trailing whitespace, then also treating
typographic dashes, quotes and spaces as their ASCII forms. A chunk marked
``*** End of File`` is tried at the end of the file first. If the old lines end with an
empty line that the file does not have, the match is retried without it. A chunk with no
old lines inserts its lines right after its ``@@`` context line, or at the end of the
file if it has none. The result always ends with a newline; a file that used CRLF line
ends throughout keeps them.

The agent touches no file itself: what verification needs is read, and the change is
made, by a batch of file operations run in the session's sandbox
(:mod:`agent.sandbox_files`). This module is the pure part: which paths to read
(:func:`paths_to_read`), the verification over what was read, the batch that makes the
change (:func:`change_ops`) and the report of how it went (:func:`outcome_of`).

What is verified before anything is written (:func:`verify_patch`). Every hunk is
applied, in order, to an in-memory view of the files (as the sandbox read them), so a
later hunk sees what an earlier one did: paths are resolved against the cwd; an Update or Delete target must
exist, be a regular file, and (for an update) be UTF-8 text; every chunk must apply; an
Add target or Move destination must not be a directory, nor lie beneath a file. An Add
of an existing file overwrites it, as a Move onto an existing file does. A patch with no
hunks is refused. The result is an :class:`ApplyPatchAction`: the net change of every
path as ``broker.wire.protocol`` :class:`FileChange` values (what
``apply_patch_approval_request`` and ``patch_apply_begin`` carry) and the final contents.

The change (:func:`change_ops`, carried out in the sandbox by
:mod:`landlock_helper.fileops`) makes the disk match: it first checks no target changed
since verification (compare-and-swap, where the write happens), writes every new file's
contents to a temporary file beside it (keeping an existing file's permissions, writing
through a symlink to its target), and only when all are written renames them into place
and deletes what the patch deletes. :func:`outcome_of` reports as Codex does:
``Success. Updated the following files:`` then ``A``/``M``/``D`` lines; a write the
sandbox refuses is a failed patch that says so.

:func:`paths_outside` and :func:`grant_root_for` decide whether a patch writes outside
the session's writable roots and which directory to propose as ``grant_root``.
:class:`TurnDiffTracker` remembers each file as it was before the turn first patched it
(as verification read it) and renders the git-style diff of everything the turn changed (the ``turn_diff`` event).
"""

from __future__ import annotations

import difflib
import errno
import hashlib
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

from agent.patch_parse import (
    AddFile,
    DeleteFile,
    ParsedPatch,
    PatchError,
    UpdateChunk,
    parse_apply_patch_argv,
    parse_patch,
)
from agent.sandbox_files import FileState
from broker.wire.protocol import AddFileChange, DeleteFileChange, FileChange, UpdateFileChange
from landlock_helper import fileops
from landlock_helper.policy import is_beneath, write_allowed

__all__ = [
    "ApplyOutcome",
    "ApplyPatchAction",
    "FileOp",
    "ParsedPatch",
    "PatchError",
    "TurnDiffTracker",
    "apply_chunks",
    "change_ops",
    "grant_root_for",
    "maybe_parse_apply_patch",
    "maybe_parse_apply_patch_verified",
    "outcome_of",
    "parse_patch",
    "paths_outside",
    "paths_to_read",
    "seek_sequence",
    "summary",
    "unified_diff",
    "verify_patch",
]

def maybe_parse_apply_patch(
    argv: list[str] | tuple[str, ...], cwd: str | os.PathLike[str]
) -> ParsedPatch | PatchError | None:
    """Parse an argv that invokes apply_patch: the patch, the error in it, or None if
    ``argv`` is not an apply_patch invocation (run it as an ordinary command)."""
    return parse_apply_patch_argv(argv, _absolute_cwd(cwd))


# Reads the paths verification needs (:func:`paths_to_read`): ``(reads, stats)`` -> each
# path's state.
FileReader = Callable[[list[str], list[str]], Mapping[str, FileState]]


def maybe_parse_apply_patch_verified(
    argv: list[str] | tuple[str, ...], cwd: str | os.PathLike[str], read: FileReader
) -> ApplyPatchAction | PatchError | None:
    """:func:`maybe_parse_apply_patch` then :func:`verify_patch` over what ``read`` gives."""
    parsed = maybe_parse_apply_patch(argv, cwd)
    if parsed is None or isinstance(parsed, PatchError):
        return parsed
    try:
        return verify_patch(parsed, read(*paths_to_read(parsed)))
    except PatchError as err:
        return err


def _absolute_cwd(cwd: str | os.PathLike[str]) -> str:
    cwd = os.fspath(cwd)
    if not os.path.isabs(cwd):
        raise ValueError(f"cwd must be an absolute path, got {cwd!r}")
    return os.path.normpath(cwd)


# -- verification ---------------------------------------------------------------------


@dataclass(frozen=True)
class FileOp:
    """One hunk, resolved: ``kind`` is "add", "delete" or "update"; ``path`` and
    ``move_path`` are absolute, ``display``/``move_display`` as the patch wrote them."""

    kind: str
    path: str
    display: str
    move_path: str | None = None
    move_display: str | None = None


@dataclass
class ApplyPatchAction:
    """A verified patch, ready to show, approve and apply.

    ``changes``: absolute path -> the net :class:`FileChange` of that path (a move is an
    update keyed by its source, ``move_path`` its destination), in the order the patch
    first touched them. ``final``: absolute path -> contents after the patch, ``None`` if
    the path will not exist. ``original``: the same paths as they were (bytes, None if
    no readable file) when verified, and ``states`` as the sandbox saw them then.
    ``ops``: the hunks in order, resolved."""

    patch: str
    cwd: str
    ops: list[FileOp]
    changes: dict[str, FileChange]
    final: dict[str, str | None]
    original: dict[str, bytes | None]
    states: dict[str, FileState] = field(default_factory=dict)

    def written_paths(self) -> list[str]:
        """Every path the patch creates, overwrites or deletes (move sources included)."""
        return list(self.final)


def _resolver(base: str) -> Callable[[str], str]:
    return lambda p: os.path.normpath(os.path.join(base, p))


def paths_to_read(parsed: ParsedPatch, cwd: str | os.PathLike[str] | None = None) -> tuple[list[str], list[str]]:
    """What :func:`verify_patch` needs to know of the disk: every path the patch touches
    (read: its contents), and every directory above a path it creates (stat: is it a
    directory, a file, nothing)."""
    resolve = _resolver(_absolute_cwd(cwd if cwd is not None else (parsed.cwd or "")))
    reads: dict[str, None] = {}
    stats: dict[str, None] = {}
    for hunk in parsed.hunks:
        targets = [resolve(hunk.path)]
        reads[targets[0]] = None
        move = getattr(hunk, "move_path", None)
        if move is not None:
            targets.append(resolve(move))
            reads[targets[1]] = None
        for target in targets[0 if isinstance(hunk, AddFile) else 1:]:
            parent = os.path.dirname(target)
            while parent and parent not in stats:
                stats[parent] = None
                if parent == os.path.dirname(parent):
                    break
                parent = os.path.dirname(parent)
    return list(reads), [p for p in stats if p not in reads]


_UNKNOWN = FileState("none", error="No such file or directory")


class _Overlay:
    """The files as the patch has left them so far; as the sandbox read them underneath."""

    def __init__(self, disk: Mapping[str, FileState]) -> None:
        self.disk = disk
        self.final: dict[str, str | None] = {}
        self.original: dict[str, bytes | None] = {}
        self.states: dict[str, FileState] = {}

    def on_disk(self, path: str) -> FileState:
        return self.disk.get(path, _UNKNOWN)

    def _snapshot(self, path: str) -> None:
        if path in self.original:
            return
        state = self.on_disk(path)
        self.states[path] = state
        # None also for what is not a readable file (a directory, say); the hunk that
        # needs it reports why.
        self.original[path] = state.data if state.is_file and not state.truncated else None

    def read_text(self, path: str, display: str, purpose: str) -> str:
        """Current text of ``path``; ``purpose`` completes "Failed to read file to ..."."""
        self._snapshot(path)
        if path in self.final:
            content = self.final[path]
            if content is None:
                raise PatchError(
                    f"Failed to read file to {purpose} {display}: No such file or directory"
                )
            return content
        state = self.on_disk(path)
        reason = state.not_a_file_reason()
        if reason is not None or state.data is None:
            raise PatchError(f"Failed to read file to {purpose} {display}: {reason or 'unreadable'}")
        try:
            return state.data.decode("utf-8")
        except UnicodeDecodeError:
            raise PatchError(
                f"Failed to read file to {purpose} {display}: stream did not contain valid UTF-8"
            ) from None

    def not_a_file_reason(self, path: str) -> str | None:
        if path in self.final:
            return None if self.final[path] is not None else "No such file or directory"
        return self.on_disk(path).not_a_file_reason()

    def exists_as_file(self, path: str) -> bool:
        if path in self.final:
            return self.final[path] is not None
        return self.on_disk(path).is_file

    def check_writable_target(self, path: str, display: str) -> None:
        """A file can be written at ``path``: not a directory, no file above it."""
        if path not in self.final and self.on_disk(path).is_dir:
            raise PatchError(f"Failed to write file {display}: Is a directory")
        parent = os.path.dirname(path)
        while parent and parent != os.path.dirname(parent):
            # A file the patch deletes still blocks: files are written before deletes.
            if self.exists_as_file(parent) or self.on_disk(parent).is_file:
                raise PatchError(
                    f"Failed to create parent directories for {display}: Not a directory"
                )
            if self.on_disk(parent).is_dir:
                break
            parent = os.path.dirname(parent)

    def write(self, path: str, content: str | None) -> None:
        self._snapshot(path)
        self.final[path] = content


def verify_patch(
    parsed: ParsedPatch, disk: Mapping[str, FileState], cwd: str | os.PathLike[str] | None = None
) -> ApplyPatchAction:
    """Apply ``parsed`` in memory against the files under ``cwd`` (default: the cwd it
    was parsed with) as ``disk`` gives them (what :func:`paths_to_read` names, read in the
    sandbox); raise :class:`PatchError` if any hunk would not apply."""
    base = _absolute_cwd(cwd if cwd is not None else (parsed.cwd or ""))
    if not parsed.hunks:
        raise PatchError("No files were modified.")
    overlay = _Overlay(disk)
    ops: list[FileOp] = []
    last_writer: dict[str, str] = {}
    origin: dict[str, str] = {}  # move destination -> the file it came from
    resolve = _resolver(base)

    for hunk in parsed.hunks:
        path = resolve(hunk.path)
        if isinstance(hunk, AddFile):
            overlay.check_writable_target(path, hunk.path)
            overlay.write(path, hunk.contents)
            last_writer[path] = "add"
            origin.pop(path, None)
            ops.append(FileOp("add", path, hunk.path))
        elif isinstance(hunk, DeleteFile):
            reason = overlay.not_a_file_reason(path)
            if reason is not None:
                raise PatchError(f"Failed to read file to delete {hunk.path}: {reason}")
            overlay.write(path, None)
            last_writer[path] = "delete"
            origin.pop(path, None)
            ops.append(FileOp("delete", path, hunk.path))
        else:
            old_text = overlay.read_text(path, hunk.path, "update")
            new_text = apply_chunks(old_text, hunk.chunks, hunk.path)
            if hunk.move_path is not None:
                dest = resolve(hunk.move_path)
                if dest != path:
                    overlay.check_writable_target(dest, hunk.move_path)
                    overlay.write(path, None)
                    last_writer[path] = "delete"
                    came_from = origin.pop(path, path)
                    origin[dest] = came_from
                else:
                    origin.pop(dest, None)
                overlay.write(dest, new_text)
                last_writer[dest] = "update"
                ops.append(FileOp("update", path, hunk.path, dest, hunk.move_path))
            else:
                overlay.write(path, new_text)
                last_writer[path] = "update"
                ops.append(FileOp("update", path, hunk.path))

    changes = _net_changes(overlay, last_writer, origin)
    return ApplyPatchAction(
        patch=parsed.patch,
        cwd=base,
        ops=ops,
        changes=changes,
        final=dict(overlay.final),
        original=dict(overlay.original),
        states=dict(overlay.states),
    )


def _decode(data: bytes | None) -> str | None:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _net_changes(
    overlay: _Overlay, last_writer: dict[str, str], origin: dict[str, str]
) -> dict[str, FileChange]:
    final, original = overlay.final, overlay.original
    changes: dict[str, FileChange] = {}
    consumed: set[str] = set()
    moves: dict[str, str] = {}  # source -> destination
    for dest, source in origin.items():
        if (
            source != dest
            and final.get(source, "") is None
            and final.get(dest) is not None
            and _decode(original.get(source)) is not None
        ):
            moves[source] = dest
            consumed.add(dest)
    for path, content in final.items():
        if path in consumed:
            continue
        before = original.get(path)
        if path in moves:
            dest = moves[path]
            diff = unified_diff(_decode(before) or "", final[dest] or "", context=1)
            changes[path] = UpdateFileChange(diff, dest)
        elif content is None:
            if before is not None:
                changes[path] = DeleteFileChange()
        elif before is None or last_writer.get(path) == "add" or _decode(before) is None:
            changes[path] = AddFileChange(content)
        else:
            changes[path] = UpdateFileChange(
                unified_diff(_decode(before) or "", content, context=1), None
            )
    return changes


# -- applying chunks to text --------------------------------------------------------------


def apply_chunks(text: str, chunks: Iterable[UpdateChunk], display: str) -> str:
    """``text`` with every chunk applied; raise :class:`PatchError` naming ``display``."""
    crlf = _uses_crlf(text)
    lines = text.split("\r\n" if crlf else "\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline is not a line of its own
    replacements = _compute_replacements(lines, list(chunks), display)
    for start, length, new_lines in reversed(replacements):
        lines[start:start + length] = new_lines
    if not lines:
        return ""
    newline = "\r\n" if crlf else "\n"
    return newline.join(lines) + newline


def _uses_crlf(text: str) -> bool:
    newlines = text.count("\n")
    return newlines > 0 and text.count("\r\n") == newlines


def _compute_replacements(
    lines: list[str], chunks: list[UpdateChunk], display: str
) -> list[tuple[int, int, list[str]]]:
    replacements: list[tuple[int, int, list[str]]] = []
    line_index = 0
    for chunk in chunks:
        if chunk.change_context is not None:
            found = seek_sequence(lines, [chunk.change_context], line_index, eof=False)
            if found is None:
                raise PatchError(
                    f"Failed to find context '{chunk.change_context}' in {display}"
                )
            line_index = found + 1

        if not chunk.old_lines:
            if chunk.change_context is not None:
                insert_at = line_index
            elif lines and lines[-1] == "":
                insert_at = len(lines) - 1
            else:
                insert_at = len(lines)
            replacements.append((insert_at, 0, list(chunk.new_lines)))
            continue

        pattern = list(chunk.old_lines)
        new_lines = list(chunk.new_lines)
        found = seek_sequence(lines, pattern, line_index, chunk.is_end_of_file)
        if found is None and pattern[-1] == "":
            # The trailing empty line stands for the file's final newline.
            pattern = pattern[:-1]
            if new_lines and new_lines[-1] == "":
                new_lines = new_lines[:-1]
            found = seek_sequence(lines, pattern, line_index, chunk.is_end_of_file)
        if found is None:
            raise PatchError(
                f"Failed to find expected lines in {display}:", "\n".join(chunk.old_lines)
            )
        replacements.append((found, len(pattern), new_lines))
        line_index = found + len(pattern)

    replacements.sort(key=lambda r: r[0])  # stable: same-index inserts stay first
    return replacements


_PUNCTUATION = str.maketrans(
    {
        **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212", "-"),
        **dict.fromkeys("\u2018\u2019\u201a\u201b", "'"),
        **dict.fromkeys("\u201c\u201d\u201e\u201f", '"'),
        **dict.fromkeys(
            "\u00a0\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000",
            " ",
        ),
    }
)


def _normalise(line: str) -> str:
    return line.strip().translate(_PUNCTUATION)


_MATCHERS = (
    lambda line: line,
    str.rstrip,
    str.strip,
    _normalise,
)


def seek_sequence(lines: list[str], pattern: list[str], start: int, eof: bool) -> int | None:
    """Index at or after ``start`` where ``pattern`` occurs in ``lines``, trying ever
    looser comparisons; with ``eof``, the end of the file is tried first."""
    if not pattern:
        return start
    last = len(lines) - len(pattern)
    if last < 0:
        return None
    starts = ([last] if eof and last >= start else []) + list(range(start, last + 1))
    for key in _MATCHERS:
        wanted = [key(p) for p in pattern]
        for i in starts:
            if all(key(lines[i + k]) == wanted[k] for k in range(len(pattern))):
                return i
    return None


# -- writing --------------------------------------------------------------------------


class ApplyOutcome(NamedTuple):
    stdout: str
    stderr: str
    success: bool


def summary(action: ApplyPatchAction) -> str:
    """Codex's success report: added, then modified, then deleted, in patch order."""
    groups: dict[str, list[str]] = {"A": [], "M": [], "D": []}
    for op in action.ops:
        letter, shown = {
            "add": ("A", op.display),
            "delete": ("D", op.display),
            "update": ("M", op.move_display or op.display),
        }[op.kind]
        if shown not in groups[letter]:
            groups[letter].append(shown)
    lines = ["Success. Updated the following files:"]
    for letter, paths in groups.items():
        lines.extend(f"{letter} {p}" for p in paths)
    return "\n".join(lines) + "\n"


def _display(action: ApplyPatchAction, path: str) -> str:
    try:
        rel = os.path.relpath(path, action.cwd)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def change_ops(action: ApplyPatchAction) -> list[dict]:
    """The batch (:mod:`landlock_helper.fileops`) that makes the disk match ``action``:
    each write and delete refused if its file is no longer what verification read."""
    return [
        fileops.delete_op(path, action.original.get(path)) if content is None
        else fileops.write_op(path, content.encode("utf-8"), action.original.get(path))
        for path, content in action.final.items()
    ]


# What the sandbox's refusals mean, for the model: it should not retry the same write.
_REFUSED = (errno.EROFS, errno.EACCES, errno.EPERM)


def outcome_of(action: ApplyPatchAction, failed: Mapping | None) -> ApplyOutcome:
    """The report of a change batch whose answer's ``failed`` is ``failed``."""
    if not failed:
        return ApplyOutcome(summary(action), "", True)
    if not isinstance(failed, Mapping):
        failed = {"error": "the sandbox's answer is unreadable"}
    shown = _display(action, str(failed.get("path", "")))
    reason = str(failed.get("error") or "failed")
    if failed.get("errno") in _REFUSED:
        reason += " (the session's sandbox does not allow this write)"
    stage = failed.get("stage")
    if stage == "check":
        text = f"{shown} changed on disk after the patch was checked; read it again and redo the patch\n"
    elif stage == "update":
        text = f"Failed to update {shown}: {reason} (the patch was partly applied)\n"
    else:
        text = f"Failed to write file {shown}: {reason}\n"
    return ApplyOutcome("", text, False)


# -- writable roots -------------------------------------------------------------------


def _real(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(os.fspath(path))


def paths_outside(action: ApplyPatchAction, writable_roots: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The paths ``action`` writes that no writable root allows (symlinks resolved;
    ``.git`` and ``.sluice`` directly inside a root are not writable through it)."""
    roots = [_real(r) for r in writable_roots]
    return [Path(path) for path in action.written_paths() if not write_allowed(_real(path), roots)]


def grant_root_for(paths: Iterable[str | os.PathLike[str]]) -> Path | None:
    """The directory to propose as ``grant_root``: the nearest existing directory that
    contains every path's parent (creating or deleting a file writes to its parent)."""
    parents = [os.path.dirname(os.path.normpath(os.fspath(p))) for p in paths]
    if not parents:
        return None
    common = os.path.commonpath(parents)
    while not os.path.isdir(common) and common != os.path.dirname(common):
        common = os.path.dirname(common)
    return Path(common)


# -- diffs ----------------------------------------------------------------------------


def _split_keep_ends(text: str) -> list[str]:
    lines = text.split("\n")
    out = [line + "\n" for line in lines[:-1]]
    if lines[-1]:
        out.append(lines[-1])
    return out


def _range(start: int, length: int) -> str:
    first = start + 1
    if length == 1:
        return f"{first}"
    if length == 0:
        first -= 1
    return f"{first},{length}"


def unified_diff(
    old: str, new: str, context: int = 3, header: tuple[str, str] | None = None
) -> str:
    """A unified diff of two texts ("" if equal); ``header`` gives the ``---``/``+++``
    names. A last line without a newline is marked ``\\ No newline at end of file``."""
    a, b = _split_keep_ends(old), _split_keep_ends(new)
    out: list[str] = []

    def emit(prefix: str, line: str) -> None:
        if line.endswith("\n"):
            out.append(prefix + line)
        else:
            out.append(prefix + line + "\n\\ No newline at end of file\n")

    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for group in matcher.get_grouped_opcodes(context):
        if not out and header is not None:
            out.append(f"--- {header[0]}\n+++ {header[1]}\n")
        first, last = group[0], group[-1]
        out.append(
            f"@@ -{_range(first[1], last[2] - first[1])} "
            f"+{_range(first[3], last[4] - first[3])} @@\n"
        )
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                for line in a[i1:i2]:
                    emit(" ", line)
                continue
            for line in a[i1:i2]:
                emit("-", line)
            for line in b[j1:j2]:
                emit("+", line)
    return "".join(out)


ZERO_OID = "0" * 40


@dataclass(frozen=True)
class _Blob:
    data: bytes
    mode: str

    @property
    def oid(self) -> str:
        return hashlib.sha1(b"blob %d\0" % len(self.data) + self.data).hexdigest()


def _blob(state: FileState | None) -> _Blob | None:
    """What git would store for a path in ``state`` (a symlink as its target's name)."""
    if state is None:
        return None
    if state.link is not None:
        return _Blob(os.fsencode(state.link), "120000")
    if not state.is_file or state.data is None or state.truncated:
        return None
    return _Blob(state.data, "100755" if (state.mode or 0) & 0o111 else "100644")


@dataclass
class _Tracked:
    baseline_path: str
    baseline: _Blob | None
    current_path: str | None


def _is_repository(dot_git: str) -> bool:
    """Whether ``dot_git`` is a repository git would take, by git's own rules: a
    ``gitdir:`` file, or a directory holding ``HEAD``, ``objects`` and ``refs``, owned
    by this user (git's ``safe.directory`` check). A stray empty ``/tmp/.git`` or one
    another user planted above the cwd is not the user's repository, and must not turn
    every path of the diff into one relative to it."""
    try:
        st = os.lstat(dot_git)
    except OSError:
        return False
    if st.st_uid != os.geteuid():
        return False
    if stat.S_ISREG(st.st_mode):
        try:
            with open(dot_git, "rb") as f:
                return f.read(8) == b"gitdir: "
        except OSError:
            return False
    return (stat.S_ISDIR(st.st_mode) and os.path.isfile(os.path.join(dot_git, "HEAD"))
            and all(os.path.isdir(os.path.join(dot_git, d)) for d in ("objects", "refs")))


@dataclass
class TurnDiffTracker:
    """The net diff of the files a turn's patches touched.

    Call :meth:`on_patch_begin` with each action just before it is applied: a file's
    snapshot is what verification read of it the first time the turn touched it. A move
    carries the file's identity to its new path. :meth:`get_unified_diff` compares every
    snapshot with the files as they are now, read (in the sandbox) from the paths
    :meth:`current_paths` names. Paths are shown relative to their git root (the nearest
    directory above holding a repository git itself would use, see :func:`_is_repository`),
    else to ``cwd``, else absolute."""

    cwd: str | None = None
    _by_path: dict[str, _Tracked] = field(default_factory=dict)
    _all: list[_Tracked] = field(default_factory=list)
    _git_roots: dict[str, str | None] = field(default_factory=dict)

    def _track(self, path: str, state: FileState | None) -> _Tracked:
        tracked = self._by_path.get(path)
        if tracked is None:
            tracked = _Tracked(path, _blob(state), path)
            self._by_path[path] = tracked
            self._all.append(tracked)
        return tracked

    def on_patch_begin(self, action: ApplyPatchAction) -> None:
        # Snapshot every path first, move destinations and sources included.
        for path in action.written_paths():
            self._track(os.path.normpath(path), action.states.get(path))
        for raw_path, change in action.changes.items():
            path = os.path.normpath(os.fspath(raw_path))
            source = self._track(path, None)
            if isinstance(change, UpdateFileChange) and change.move_path is not None:
                dest = os.path.normpath(change.move_path)
                if dest == path:
                    continue
                replaced = self._track(dest, None)
                if replaced is not source:
                    replaced.current_path = None  # whatever was there is overwritten
                source.current_path = dest
                del self._by_path[path]
                self._by_path[dest] = source

    def _git_root(self, path: str) -> str | None:
        directory = os.path.dirname(path)
        seen: list[str] = []
        root: str | None = None
        while True:
            if directory in self._git_roots:
                root = self._git_roots[directory]
                break
            seen.append(directory)
            if _is_repository(os.path.join(directory, ".git")):
                root = directory
                break
            parent = os.path.dirname(directory)
            if parent == directory:
                break
            directory = parent
        for d in seen:
            self._git_roots[d] = root
        return root

    def display_path(self, path: str) -> str:
        """``path`` as the diff names it: relative to its git root (else the cwd); a path
        outside both loses its leading slash, as the ``a/`` and ``b/`` prefixes give it one."""
        root = self._git_root(path)
        if root is None and self.cwd is not None and is_beneath(path, self.cwd):
            root = self.cwd
        if root is None:
            return path.lstrip("/")
        return os.path.relpath(path, root)

    @property
    def tracks_anything(self) -> bool:
        return bool(self._all)

    def current_paths(self) -> list[str]:
        """The paths whose contents :meth:`get_unified_diff` compares with the snapshots."""
        return [t.current_path for t in self._all if t.current_path is not None]

    def get_unified_diff(self, now: Mapping[str, FileState]) -> str | None:
        """The diff of everything the turn changed, or None if nothing differs; ``now``
        holds the files of :meth:`current_paths` as they are now."""
        entries = []
        for tracked in self._all:
            shown = tracked.current_path or tracked.baseline_path
            entries.append((self.display_path(shown), tracked))
        entries.sort(key=lambda e: e[0])
        parts = [self._render(tracked, now) for _, tracked in entries]
        text = "".join(p if p.endswith("\n") else p + "\n" for p in parts if p)
        return text or None

    def _render(self, tracked: _Tracked, now: Mapping[str, FileState]) -> str:
        left = tracked.baseline
        right = _blob(now.get(tracked.current_path)) if tracked.current_path else None
        left_name = self.display_path(tracked.baseline_path)
        right_name = (
            self.display_path(tracked.current_path) if tracked.current_path else left_name
        )
        if left is None and right is None:
            return ""
        if left is None or right is None:
            right_name = left_name if right is None else right_name
            left_name = right_name if left is None else left_name
        if left == right and left_name == right_name:
            return ""

        out = [f"diff --git a/{left_name} b/{right_name}\n"]
        if left is None:
            out.append(f"new file mode {right.mode}\n")
        elif right is None:
            out.append(f"deleted file mode {left.mode}\n")
        else:
            if left.mode != right.mode:
                out.append(f"old mode {left.mode}\nnew mode {right.mode}\n")
            if left_name != right_name:
                out.append(f"rename from {left_name}\nrename to {right_name}\n")
            if left.data == right.data:
                return "".join(out)
        out.append(f"index {left.oid if left else ZERO_OID}..{right.oid if right else ZERO_OID}\n")
        old_header = f"a/{left_name}" if left else "/dev/null"
        new_header = f"b/{right_name}" if right else "/dev/null"
        old_text = _decode(left.data) if left else ""
        new_text = _decode(right.data) if right else ""
        if old_text is None or new_text is None:
            out.append(f"Binary files {old_header} and {new_header} differ\n")
        else:
            out.append(unified_diff(old_text, new_text, 3, (old_header, new_header)))
        return "".join(out)
