"""Parsing the Codex ``apply_patch`` format, and spotting ``apply_patch`` in a command line.

The format (the grammar Codex gives the model)::

    *** Begin Patch
    *** Add File: PATH           then the new file's lines, each prefixed "+"
    *** Delete File: PATH
    *** Update File: PATH
    *** Move to: NEWPATH         optional, right after "Update File"
    @@ [CONTEXT LINE]            one or more chunks; "@@" alone is a bare chunk header
     context line               " " context, "-" removed, "+" added
    *** End of File              optional: the chunk sits at the end of the file
    *** End Patch

Parsing is as lenient as Codex's: the text is trimmed; the Begin/End markers and the
file headers may carry surrounding whitespace; a ``<<'EOF'`` / ``<<EOF`` / ``<<"EOF"``
heredoc wrapper around the whole patch (what a model writes when it thinks a shell
will read ``["apply_patch", "<<'EOF'\\n...\\nEOF\\n"]``) is unwrapped; the first chunk of
an update may omit its ``@@``; blank lines between chunks are skipped; an empty line
inside a chunk is an empty context line; CRLF line ends are accepted. Errors are
:class:`PatchError` with Codex's wording, e.g. ``invalid hunk at line 3, ...``.

:func:`parse_apply_patch_argv` recognises ``["apply_patch", PATCH]``,
``["applypatch", PATCH]`` and ``[bash|sh|zsh, -lc|-c, "apply_patch <<'EOF'\\n...\\nEOF\\n"]``
(a heredoc with any delimiter word, quoted or not, as the whole script). Anything else
(a ``cd DIR &&`` prefix, a pipe, a trailing command) is not an apply_patch invocation
and runs as an ordinary command.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

BEGIN_PATCH = "*** Begin Patch"
END_PATCH = "*** End Patch"
ADD_FILE = "*** Add File: "
DELETE_FILE = "*** Delete File: "
UPDATE_FILE = "*** Update File: "
MOVE_TO = "*** Move to: "
END_OF_FILE = "*** End of File"
CHUNK_HEADER = "@@"

APPLY_PATCH_COMMANDS = ("apply_patch", "applypatch")
_SHELLS = ("bash", "sh", "zsh")
_SHELL_FLAGS = ("-lc", "-c")
_HEREDOC_WRAPPERS = ("<<EOF", "<<'EOF'", '<<"EOF"')


class PatchError(Exception):
    """A patch that cannot be parsed or applied. ``str()`` is what the model is told:
    a one-line ``message``, then ``detail`` (e.g. the lines that were not found) if any."""

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail

    def __str__(self) -> str:
        return self.message if self.detail is None else f"{self.message}\n{self.detail}"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PatchError):
            return NotImplemented
        return (self.message, self.detail) == (other.message, other.detail)

    __hash__ = Exception.__hash__

    def __repr__(self) -> str:
        return f"PatchError({str(self)!r})"


def _invalid_patch(message: str) -> PatchError:
    return PatchError(f"invalid patch: {message}")


def _invalid_hunk(line_number: int, message: str) -> PatchError:
    return PatchError(f"invalid hunk at line {line_number}, {message}")


@dataclass(frozen=True)
class UpdateChunk:
    """One ``@@`` chunk: replace ``old_lines`` (found after ``change_context``, if
    given) by ``new_lines``; ``is_end_of_file`` anchors ``old_lines`` at the file's end."""

    change_context: str | None
    old_lines: tuple[str, ...]
    new_lines: tuple[str, ...]
    is_end_of_file: bool = False


@dataclass(frozen=True)
class AddFile:
    path: str
    contents: str


@dataclass(frozen=True)
class DeleteFile:
    path: str


@dataclass(frozen=True)
class UpdateFile:
    path: str
    move_path: str | None
    chunks: tuple[UpdateChunk, ...]


Hunk = AddFile | DeleteFile | UpdateFile


@dataclass(frozen=True)
class ParsedPatch:
    """A parsed patch. ``patch`` is its text without any heredoc wrapper; ``cwd`` is the
    directory its relative paths are resolved against (``None`` until known)."""

    hunks: tuple[Hunk, ...]
    patch: str
    cwd: str | None = field(default=None)


def _split_lines(text: str) -> list[str]:
    # Like Rust's str::lines(): split on "\n" only, drop one "\r" before it.
    if not text:
        return []
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


def parse_patch(text: str, cwd: str | os.PathLike[str] | None = None) -> ParsedPatch:
    """Parse patch text (leniently, as Codex does); raise :class:`PatchError`."""
    lines = _split_lines(text.strip())
    patch_lines, body = _patch_boundaries(lines)
    hunks: list[Hunk] = []
    line_number = 2  # 1-based number of body[0] in the patch
    while body:
        hunk, used = _parse_one_hunk(body, line_number)
        hunks.append(hunk)
        line_number += used
        body = body[used:]
    return ParsedPatch(
        tuple(hunks), "\n".join(patch_lines), None if cwd is None else os.fspath(cwd)
    )


def _patch_boundaries(lines: list[str]) -> tuple[list[str], list[str]]:
    try:
        return _strict_boundaries(lines)
    except PatchError as err:
        first_error = err
    if (
        len(lines) >= 4
        and lines[0] in _HEREDOC_WRAPPERS
        and lines[-1].endswith("EOF")
    ):
        return _strict_boundaries(lines[1:-1])
    raise first_error


def _strict_boundaries(lines: list[str]) -> tuple[list[str], list[str]]:
    if not lines or lines[0].strip() != BEGIN_PATCH:
        raise _invalid_patch(f"The first line of the patch must be '{BEGIN_PATCH}'")
    if len(lines) < 2 or lines[-1].strip() != END_PATCH:
        raise _invalid_patch(f"The last line of the patch must be '{END_PATCH}'")
    return lines, lines[1:-1]


def _parse_one_hunk(lines: list[str], line_number: int) -> tuple[Hunk, int]:
    header = lines[0].strip()
    if header.startswith(ADD_FILE):
        contents: list[str] = []
        for line in lines[1:]:
            if not line.startswith("+"):
                break
            contents.append(line[1:] + "\n")
        return AddFile(header[len(ADD_FILE):], "".join(contents)), 1 + len(contents)

    if header.startswith(DELETE_FILE):
        return DeleteFile(header[len(DELETE_FILE):]), 1

    if header.startswith(UPDATE_FILE):
        path = header[len(UPDATE_FILE):]
        used = 1
        move_path = None
        if len(lines) > 1 and lines[1].startswith(MOVE_TO):
            move_path = lines[1][len(MOVE_TO):]
            used += 1
        chunks: list[UpdateChunk] = []
        while used < len(lines):
            line = lines[used]
            if not line.strip():
                used += 1  # blank lines between chunks
                continue
            if line.startswith("*"):
                break  # the next file header, or a stray marker it will reject
            chunk, chunk_lines = _parse_chunk(
                lines[used:], line_number + used, allow_missing_header=not chunks
            )
            chunks.append(chunk)
            used += chunk_lines
        if not chunks:
            raise _invalid_hunk(line_number, f"Update file hunk for path '{path}' is empty")
        return UpdateFile(path, move_path, tuple(chunks)), used

    raise _invalid_hunk(
        line_number,
        f"'{header}' is not a valid hunk header. Valid hunk headers: "
        f"'{ADD_FILE}{{path}}', '{DELETE_FILE}{{path}}', '{UPDATE_FILE}{{path}}'",
    )


def _parse_chunk(
    lines: list[str], line_number: int, allow_missing_header: bool
) -> tuple[UpdateChunk, int]:
    first = lines[0]
    if first == CHUNK_HEADER:
        context, start = None, 1
    elif first.startswith(CHUNK_HEADER + " "):
        context, start = first[len(CHUNK_HEADER) + 1:], 1
    elif allow_missing_header:
        context, start = None, 0
    else:
        raise _invalid_hunk(
            line_number,
            f"Expected update hunk to start with a @@ context marker, got: '{first}'",
        )
    if start >= len(lines):
        raise _invalid_hunk(line_number + 1, "Update hunk does not contain any lines")

    old: list[str] = []
    new: list[str] = []
    is_end_of_file = False
    parsed = 0
    for line in lines[start:]:
        if line == END_OF_FILE:
            if parsed == 0:
                raise _invalid_hunk(
                    line_number + start, "Update hunk does not contain any lines"
                )
            is_end_of_file = True
            parsed += 1
            break
        marker = line[:1]
        if marker == "":
            old.append("")
            new.append("")
        elif marker == " ":
            old.append(line[1:])
            new.append(line[1:])
        elif marker == "+":
            new.append(line[1:])
        elif marker == "-":
            old.append(line[1:])
        else:
            if parsed == 0:
                raise _invalid_hunk(
                    line_number + start,
                    f"Unexpected line found in update hunk: '{line}'. Every line should "
                    "start with ' ' (context line), '+' (added line), or '-' (removed line)",
                )
            break  # the start of the next chunk or file
        parsed += 1
    return UpdateChunk(context, tuple(old), tuple(new), is_end_of_file), start + parsed


# -- recognising an apply_patch command line -------------------------------------------

_HEREDOC_START = re.compile(
    r"""(?:apply_patch|applypatch)[ \t]*<<(?P<dash>-?)[ \t]*
        (?:'(?P<sq>[^'\n]+)'|"(?P<dq>[^"\n]+)"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))
        [ \t]*\n""",
    re.VERBOSE,
)


def extract_heredoc_patch(script: str) -> str | None:
    """The heredoc body of a script that is exactly ``apply_patch <<DELIM ... DELIM``
    (the delimiter quoted or not, ``<<-`` allowed), or None for any other script."""
    source = script.lstrip()
    match = _HEREDOC_START.match(source)
    if match is None:
        return None
    delimiter = match["sq"] or match["dq"] or match["bare"]
    strip_tabs = bool(match["dash"])
    rest = source[match.end():].split("\n")
    body: list[str] = []
    for index, line in enumerate(rest):
        candidate = line.lstrip("\t") if strip_tabs else line
        if candidate.rstrip("\r") == delimiter:
            if "".join(rest[index + 1:]).strip():
                return None  # more commands after the heredoc: not ours to interpret
            break
        body.append(candidate)
    # A missing terminator is what bash accepts too (with a warning): read to the end.
    return "\n".join(body).rstrip("\n")


def parse_apply_patch_argv(
    argv: list[str] | tuple[str, ...], cwd: str | os.PathLike[str] | None = None
) -> ParsedPatch | PatchError | None:
    """The patch an argv applies, a :class:`PatchError` if it is an apply_patch call
    with a bad patch, or None if the argv is not an apply_patch call."""
    argv = list(argv)
    if len(argv) == 2 and argv[0] in APPLY_PATCH_COMMANDS:
        body = argv[1]
    elif (
        len(argv) == 3
        and os.path.basename(argv[0]) in _SHELLS
        and argv[1] in _SHELL_FLAGS
    ):
        extracted = extract_heredoc_patch(argv[2])
        if extracted is None:
            return None
        body = extracted
    else:
        return None
    try:
        return parse_patch(body, cwd)
    except PatchError as err:
        return err
