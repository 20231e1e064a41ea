"""apply_patch: parsing the Codex patch format, spotting it in a command line, verifying
it in memory, writing it to disk, the writable-root check and the turn diff."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from agent.apply_patch import (
    ApplyOutcome,
    ApplyPatchAction,
    TurnDiffTracker,
    change_ops,
    grant_root_for,
    maybe_parse_apply_patch,
    maybe_parse_apply_patch_verified,
    outcome_of,
    paths_outside,
    paths_to_read,
    seek_sequence,
    unified_diff,
    verify_patch,
)
from agent.patch_parse import (
    AddFile,
    DeleteFile,
    ParsedPatch,
    PatchError,
    UpdateChunk,
    UpdateFile,
    extract_heredoc_patch,
    parse_patch,
)
from agent.sandbox_files import read_ops, states_from
from broker.wire.protocol import AddFileChange, DeleteFileChange, UpdateFileChange
from landlock_helper import fileops

pytestmark = pytest.mark.timeout(30)


# The agent reads and writes through a sandboxed process (tested in
# tests/integration/test_containment_agent.py); here the same batches run in this process.


def read_here(reads, stats=()):
    ops = read_ops(reads, stats)
    return states_from(ops, fileops.run({"ops": ops}))


def apply_action(action: ApplyPatchAction) -> ApplyOutcome:
    return outcome_of(action, fileops.run({"ops": change_ops(action)})["failed"])


def diff_now(tracker: TurnDiffTracker) -> str | None:
    return tracker.get_unified_diff(read_here(tracker.current_paths()))


def wrap(body: str) -> str:
    return f"*** Begin Patch\n{body}\n*** End Patch"


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_bytes(text.encode())
    return path


def git_repo(path: Path) -> Path:
    """A repository as ``git init`` makes one (the turn diff takes nothing less)."""
    subprocess.run(["git", "init", "-q", str(path)], check=True, env={**os.environ, "GIT_CONFIG_GLOBAL": os.devnull})
    return path


def verified(tmp_path: Path, body: str) -> ApplyPatchAction:
    result = maybe_parse_apply_patch_verified(["apply_patch", wrap(body)], tmp_path, read_here)
    assert isinstance(result, ApplyPatchAction), result
    return result


def verify_error(tmp_path: Path, body: str) -> str:
    result = maybe_parse_apply_patch_verified(["apply_patch", wrap(body)], tmp_path, read_here)
    assert isinstance(result, PatchError), result
    return str(result)


def patched(tmp_path: Path, original: str, body: str, name: str = "f.txt") -> str:
    """Contents of ``name`` (holding ``original``) after applying an update ``body``."""
    write(tmp_path / name, original)
    action = verified(tmp_path, f"*** Update File: {name}\n{body}")
    outcome = apply_action(action)
    assert outcome.success, outcome
    return (tmp_path / name).read_bytes().decode()


# -- parsing --------------------------------------------------------------------------


def test_parse_every_operation():
    parsed = parse_patch(
        wrap(
            "*** Add File: path/add.py\n+abc\n+def\n"
            "*** Delete File: path/delete.py\n"
            "*** Update File: path/update.py\n*** Move to: path/update2.py\n"
            "@@ def f():\n-    pass\n+    return 123"
        )
    )
    assert parsed.hunks == (
        AddFile("path/add.py", "abc\ndef\n"),
        DeleteFile("path/delete.py"),
        UpdateFile(
            "path/update.py",
            "path/update2.py",
            (UpdateChunk("def f():", ("    pass",), ("    return 123",), False),),
        ),
    )


def test_parse_multiple_chunks_end_of_file_and_missing_first_header():
    parsed = parse_patch(
        wrap(
            "*** Update File: f.py\n"
            "\n"  # a blank line before a chunk is skipped
            " import foo\n+import bar\n"
            "@@ class A:\n     x = 1\n-    y = 2\n+    y = 3\n"
            "@@\n last\n+appended\n*** End of File\n"
            "*** Add File: other.py\n+content"
        )
    )
    update, add = parsed.hunks
    assert update == UpdateFile(
        "f.py",
        None,
        (
            UpdateChunk(None, ("import foo",), ("import foo", "import bar")),
            UpdateChunk("class A:", ("    x = 1", "    y = 2"), ("    x = 1", "    y = 3")),
            UpdateChunk(None, ("last",), ("last", "appended"), True),
        ),
    )
    assert add == AddFile("other.py", "content\n")


def test_parse_empty_line_inside_chunk_is_empty_context():
    parsed = parse_patch("*** Begin Patch\n*** Update File: f\n@@\n a\n\n-b\n*** End Patch")
    assert parsed.hunks[0].chunks == (UpdateChunk(None, ("a", "", "b"), ("a", "")),)


def test_parse_is_lenient_about_whitespace_around_markers():
    parsed = parse_patch(
        "\n  *** Begin Patch  \n   *** Add File: foo  \n+hi\n *** End Patch \n\n"
    )
    assert parsed.hunks == (AddFile("foo", "hi\n"),)


def test_parse_crlf_patch_text():
    text = "*** Begin Patch\r\n*** Update File: f\r\n@@\r\n-a\r\n+b\r\n*** End Patch\r\n"
    assert parse_patch(text).hunks == (UpdateFile("f", None, (UpdateChunk(None, ("a",), ("b",)),)),)


@pytest.mark.parametrize("opener", ["<<EOF", "<<'EOF'", '<<"EOF"'])
def test_parse_unwraps_heredoc_passed_as_argument(opener):
    argv = ["apply_patch", f"{opener}\n*** Begin Patch\n*** Add File: foo\n+hi\n*** End Patch\nEOF\n"]
    parsed = maybe_parse_apply_patch(argv, "/w")
    assert isinstance(parsed, ParsedPatch)
    assert parsed.hunks == (AddFile("foo", "hi\n"),)
    assert parsed.patch == "*** Begin Patch\n*** Add File: foo\n+hi\n*** End Patch"
    assert parsed.cwd == "/w"


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "invalid patch: The first line of the patch must be '*** Begin Patch'"),
        ("bad", "invalid patch: The first line of the patch must be '*** Begin Patch'"),
        ("*** Begin Patch\nbad", "invalid patch: The last line of the patch must be '*** End Patch'"),
        ("*** Begin Patch", "invalid patch: The last line of the patch must be '*** End Patch'"),
        (
            wrap("*** Add File: a\n+x\n*** Frobnicate File: b"),
            "invalid hunk at line 4, '*** Frobnicate File: b' is not a valid hunk header. "
            "Valid hunk headers: '*** Add File: {path}', '*** Delete File: {path}', "
            "'*** Update File: {path}'",
        ),
        (
            wrap("*** Add File: a\n+x\nstray"),
            "invalid hunk at line 4, 'stray' is not a valid hunk header. "
            "Valid hunk headers: '*** Add File: {path}', '*** Delete File: {path}', "
            "'*** Update File: {path}'",
        ),
        (
            wrap("*** Update File: test.py"),
            "invalid hunk at line 2, Update file hunk for path 'test.py' is empty",
        ),
        (
            wrap("*** Update File: t.py\n@@\n-a\nbad line"),
            "invalid hunk at line 5, Expected update hunk to start with a @@ context marker, "
            "got: 'bad line'",
        ),
        (
            wrap("*** Update File: t.py\n@@\nbad line"),
            "invalid hunk at line 4, Unexpected line found in update hunk: 'bad line'. Every "
            "line should start with ' ' (context line), '+' (added line), or '-' (removed line)",
        ),
        (
            wrap("*** Update File: t.py\n@@\n*** End of File"),
            "invalid hunk at line 4, Update hunk does not contain any lines",
        ),
    ],
)
def test_parse_errors(text, message):
    with pytest.raises(PatchError) as info:
        parse_patch(text)
    assert str(info.value) == message
    assert maybe_parse_apply_patch(["apply_patch", text], "/w") == PatchError(message)


def test_parse_line_numbers_count_the_begin_line():
    text = wrap("*** Add File: a\n+1\n+2\n*** Delete File: b\n*** Update File: c\n@@ x\nnope")
    with pytest.raises(PatchError, match=r"^invalid hunk at line 8, Unexpected line"):
        parse_patch(text)


# -- spotting apply_patch in a command line ---------------------------------------------

PATCH = "*** Begin Patch\n*** Add File: foo\n+hi\n*** End Patch"


@pytest.mark.parametrize("name", ["apply_patch", "applypatch"])
def test_direct_invocation(name):
    parsed = maybe_parse_apply_patch([name, PATCH + "\n"], "/w")
    assert isinstance(parsed, ParsedPatch)
    assert parsed.hunks == (AddFile("foo", "hi\n"),)


@pytest.mark.parametrize(
    "argv0, flag, script",
    [
        ("bash", "-lc", f"apply_patch <<'EOF'\n{PATCH}\nEOF\n"),
        ("bash", "-lc", f"apply_patch <<EOF\n{PATCH}\nEOF"),
        ("bash", "-lc", f'apply_patch <<"PATCH"\n{PATCH}\nPATCH\n'),
        ("bash", "-lc", f"applypatch << 'EOF'\n{PATCH}\nEOF\n"),
        ("bash", "-c", f"apply_patch<<'EOF'\n{PATCH}\nEOF\n"),
        ("/bin/bash", "-lc", f"\n  apply_patch <<'EOF'\n{PATCH}\nEOF\n  \n"),
        ("sh", "-c", f"apply_patch <<'EOF'\n{PATCH}\nEOF\n"),
        ("zsh", "-lc", f"apply_patch <<-'EOF'\n\t{PATCH.replace(chr(10), chr(10) + chr(9))}\n\tEOF\n"),
        ("bash", "-lc", f"apply_patch <<'EOF'\n{PATCH}\n"),  # no terminator: to the end
    ],
)
def test_shell_heredoc_invocation(argv0, flag, script):
    parsed = maybe_parse_apply_patch([argv0, flag, script], "/w")
    assert isinstance(parsed, ParsedPatch), parsed
    assert parsed.hunks == (AddFile("foo", "hi\n"),)
    assert parsed.patch == PATCH


@pytest.mark.parametrize(
    "argv",
    [
        ["bash", "-lc", f"cd foo && apply_patch <<'EOF'\n{PATCH}\nEOF\n"],
        ["bash", "-lc", f"apply_patch <<'EOF'\n{PATCH}\nEOF\necho done\n"],
        ["bash", "-lc", f"apply_patch <<'EOF' && echo done\n{PATCH}\nEOF\n"],
        ["bash", "-lc", f"apply_patch foo <<'EOF'\n{PATCH}\nEOF\n"],
        ["bash", "-lc", f"echo foo; apply_patch <<'EOF'\n{PATCH}\nEOF\n"],
        ["bash", "-lc", "ls -la"],
        ["bash", "-x", f"apply_patch <<'EOF'\n{PATCH}\nEOF\n"],
        ["python", "-c", f"apply_patch <<'EOF'\n{PATCH}\nEOF\n"],
        ["apply_patch"],
        ["apply_patch", PATCH, "extra"],
        ["/usr/bin/apply_patch", PATCH],
        ["ls", PATCH],
        [],
    ],
)
def test_not_an_invocation(argv):
    assert maybe_parse_apply_patch(argv, "/w") is None


def test_shell_heredoc_with_bad_patch_is_an_error():
    script = "apply_patch <<'EOF'\n*** Begin Patch\n*** Explode File: x\n*** End Patch\nEOF\n"
    result = maybe_parse_apply_patch(["bash", "-lc", script], "/w")
    assert isinstance(result, PatchError)
    assert str(result).startswith("invalid hunk at line 2, '*** Explode File: x' is not a valid")


def test_heredoc_body_is_taken_verbatim():
    body = extract_heredoc_patch("apply_patch <<EOF\n$HOME `id` \\n\nEOF\n")
    assert body == "$HOME `id` \\n"


def test_relative_cwd_is_refused():
    with pytest.raises(ValueError, match="absolute"):
        maybe_parse_apply_patch(["apply_patch", PATCH], "relative/dir")


# -- verification ---------------------------------------------------------------------


def test_verified_changes_are_protocol_values(tmp_path):
    write(tmp_path / "multi.txt", "foo\nbar\nbaz\nqux\n")
    write(tmp_path / "gone.txt", "bye\n")
    write(tmp_path / "src.txt", "line\n")
    action = verified(
        tmp_path,
        "*** Update File: multi.txt\n@@\n foo\n-bar\n+BAR\n@@\n baz\n-qux\n+QUX\n"
        "*** Add File: new.txt\n+n\n"
        "*** Delete File: gone.txt\n"
        "*** Update File: src.txt\n*** Move to: dst/moved.txt\n@@\n-line\n+line2",
    )
    root = str(tmp_path)
    assert action.cwd == root
    assert action.changes == {
        f"{root}/multi.txt": UpdateFileChange(
            "@@ -1,4 +1,4 @@\n foo\n-bar\n+BAR\n baz\n-qux\n+QUX\n", None
        ),
        f"{root}/new.txt": AddFileChange("n\n"),
        f"{root}/gone.txt": DeleteFileChange(),
        f"{root}/src.txt": UpdateFileChange("@@ -1 +1 @@\n-line\n+line2\n", f"{root}/dst/moved.txt"),
    }
    assert list(action.changes) == [f"{root}/{n}" for n in ("multi.txt", "new.txt", "gone.txt", "src.txt")]
    assert action.final == {
        f"{root}/multi.txt": "foo\nBAR\nbaz\nQUX\n",
        f"{root}/new.txt": "n\n",
        f"{root}/gone.txt": None,
        f"{root}/src.txt": None,
        f"{root}/dst/moved.txt": "line2\n",
    }
    # Verification touched nothing.
    assert (tmp_path / "multi.txt").read_text() == "foo\nbar\nbaz\nqux\n"
    assert (tmp_path / "gone.txt").exists() and not (tmp_path / "new.txt").exists()
    assert not (tmp_path / "dst").exists()


def test_update_diff_uses_one_line_of_context(tmp_path):
    write(tmp_path / "insert.txt", "foo\nbar\nbaz\n")
    action = verified(tmp_path, "*** Update File: insert.txt\n@@\n+quux\n*** End of File")
    assert action.changes[str(tmp_path / "insert.txt")] == UpdateFileChange(
        "@@ -3 +3,2 @@\n baz\n+quux\n", None
    )


@pytest.mark.parametrize(
    "setup, body, message",
    [
        (
            {},
            "*** Update File: missing.txt\n@@\n-a\n+b",
            "Failed to read file to update missing.txt: No such file or directory",
        ),
        (
            {},
            "*** Delete File: missing.txt",
            "Failed to read file to delete missing.txt: No such file or directory",
        ),
        (
            {"dir/inner.txt": "x\n"},
            "*** Delete File: dir",
            "Failed to read file to delete dir: Is a directory",
        ),
        (
            {"dir/inner.txt": "x\n"},
            "*** Update File: dir\n@@\n-a\n+b",
            "Failed to read file to update dir: Is a directory",
        ),
        (
            {"bin.dat": b"\xff\xfe\x00"},
            "*** Update File: bin.dat\n@@\n-a\n+b",
            "Failed to read file to update bin.dat: stream did not contain valid UTF-8",
        ),
        (
            {"foo.py": "def a():\n    pass\n"},
            "*** Update File: foo.py\n@@ def b():\n-    pass\n+    return 1",
            "Failed to find context 'def b():' in foo.py",
        ),
        (
            {"foo.py": "one\ntwo\n"},
            "*** Update File: foo.py\n@@\n one\n-three\n+four",
            "Failed to find expected lines in foo.py:\none\nthree",
        ),
        (
            {"dir/inner.txt": "x\n"},
            "*** Add File: dir\n+x",
            "Failed to write file dir: Is a directory",
        ),
        (
            {"plain": "x\n"},
            "*** Add File: plain/child.txt\n+x",
            "Failed to create parent directories for plain/child.txt: Not a directory",
        ),
        (
            {"plain": "x\n"},
            "*** Delete File: plain\n*** Add File: plain/child.txt\n+x",
            "Failed to create parent directories for plain/child.txt: Not a directory",
        ),
        (
            {"a.txt": "a\n", "dir/inner.txt": "x\n"},
            "*** Update File: a.txt\n*** Move to: dir\n@@\n-a\n+b",
            "Failed to write file dir: Is a directory",
        ),
        (
            {"a.txt": "a\n"},
            "*** Delete File: a.txt\n*** Update File: a.txt\n@@\n-a\n+b",
            "Failed to read file to update a.txt: No such file or directory",
        ),
    ],
)
def test_verification_failures(tmp_path, setup, body, message):
    for name, content in setup.items():
        write(tmp_path / name, content)
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert verify_error(tmp_path, body) == message
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before


def test_expected_lines_error_is_one_line_then_the_lines(tmp_path):
    write(tmp_path / "foo.py", "x\n")
    result = maybe_parse_apply_patch_verified(
        ["apply_patch", wrap("*** Update File: foo.py\n@@\n-y\n-z\n+w")], tmp_path, read_here
    )
    assert isinstance(result, PatchError)
    assert result.message == "Failed to find expected lines in foo.py:"
    assert result.detail == "y\nz"


def test_empty_patch_is_refused(tmp_path):
    result = maybe_parse_apply_patch_verified(
        ["apply_patch", "*** Begin Patch\n*** End Patch"], tmp_path, read_here
    )
    assert result == PatchError("No files were modified.")


def test_failing_later_hunk_writes_nothing(tmp_path):
    # Codex's own tool leaves created.txt behind here; verification first means no trace.
    result = maybe_parse_apply_patch_verified(
        ["apply_patch", wrap("*** Add File: created.txt\n+hello\n*** Update File: missing.txt\n@@\n-old\n+new")],
        tmp_path,
        read_here,
    )
    assert isinstance(result, PatchError)
    assert list(tmp_path.iterdir()) == []


# -- how chunks apply -----------------------------------------------------------------


def test_update_replaces_lines(tmp_path):
    assert patched(tmp_path, "foo\nbar\n", "@@\n foo\n-bar\n+baz") == "foo\nbaz\n"


def test_multiple_chunks_interleaved(tmp_path):
    body = "@@\n a\n-b\n+B\n@@\n c\n d\n-e\n+E\n@@\n f\n+g\n*** End of File"
    assert patched(tmp_path, "a\nb\nc\nd\ne\nf\n", body) == "a\nB\nc\nd\nE\nf\ng\n"


def test_context_header_seeks_forward(tmp_path):
    original = "def a():\n    return 1\n\ndef b():\n    return 1\n"
    body = "@@ def b():\n-    return 1\n+    return 2"
    assert patched(tmp_path, original, body) == "def a():\n    return 1\n\ndef b():\n    return 2\n"


def test_chunks_search_after_the_previous_chunk(tmp_path):
    original = "x = 1\ny = 0\nx = 1\n"
    body = "@@\n-x = 1\n+x = 2\n@@\n-x = 1\n+x = 3"
    assert patched(tmp_path, original, body) == "x = 2\ny = 0\nx = 3\n"


def test_end_of_file_anchor_prefers_the_last_occurrence(tmp_path):
    original = "end\nmiddle\nend\n"
    assert patched(tmp_path, original, "@@\n-end\n+END\n*** End of File") == "end\nmiddle\nEND\n"
    # Without the anchor the first occurrence is taken.
    assert patched(tmp_path, original, "@@\n-end\n+END", name="g.txt") == "END\nmiddle\nend\n"


def test_matching_ignores_trailing_then_surrounding_whitespace(tmp_path):
    # The matched region is replaced by the patch's lines, context lines included.
    assert patched(tmp_path, "foo   \nbar\t\n", "@@\n-foo\n+FOO\n bar") == "FOO\nbar\n"
    assert patched(tmp_path, "    foo\n", "@@\n-foo\n+    FOO", name="g.txt") == "    FOO\n"


def test_trailing_whitespace_match_is_tried_before_trimmed_match(tmp_path):
    assert patched(tmp_path, "  x\nx  \n", "@@\n-x\n+y") == "  x\ny\n"


def test_matching_normalises_typographic_punctuation(tmp_path):
    original = "import asyncio  # local import \u2013 avoids top\u2011level dep\n"
    body = "@@\n-import asyncio  # local import - avoids top-level dep\n+import asyncio  # HELLO"
    assert patched(tmp_path, original, body) == "import asyncio  # HELLO\n"


def test_exact_match_wins_over_loose_match(tmp_path):
    original = "  x\nx\n"
    assert patched(tmp_path, original, "@@\n-x\n+y") == "  x\ny\n"


def test_trailing_empty_context_line_stands_for_final_newline(tmp_path):
    assert patched(tmp_path, "foo\nbar\n", "@@\n foo\n-bar\n+BAR\n ") == "foo\nBAR\n"


def test_pure_addition_appends_at_end(tmp_path):
    original = "line1\nline2\n"
    assert patched(tmp_path, original, "@@\n+added 1\n+added 2") == "line1\nline2\nadded 1\nadded 2\n"


def test_pure_addition_after_context_header_inserts_there(tmp_path):
    original = "class A:\n    x = 1\nclass B:\n    y = 2\n"
    body = "@@ class B:\n+    z = 3"
    assert patched(tmp_path, original, body) == "class A:\n    x = 1\nclass B:\n    z = 3\n    y = 2\n"


def test_pure_addition_then_removal_in_one_update(tmp_path):
    body = "@@\n+after-context\n+second-line\n@@\n line1\n-line2\n-line3\n+line2-replacement"
    result = patched(tmp_path, "line1\nline2\nline3\n", body)
    assert result == "line1\nline2-replacement\nafter-context\nsecond-line\n"


def test_update_adds_missing_final_newline(tmp_path):
    assert patched(tmp_path, "a\nb", "@@\n-a\n+A") == "A\nb\n"


def test_deletion_only_update(tmp_path):
    assert patched(tmp_path, "a\nb\nc\n", "@@\n a\n-b\n c") == "a\nc\n"


def test_crlf_file_keeps_crlf(tmp_path):
    body = "@@\n a\n-b\n+B\n@@\n c\n+d\n*** End of File"
    assert patched(tmp_path, "a\r\nb\r\nc\r\n", body) == "a\r\nB\r\nc\r\nd\r\n"


def test_hunks_apply_in_sequence(tmp_path):
    action = verified(
        tmp_path,
        "*** Add File: f.txt\n+one\n+two\n"
        "*** Update File: f.txt\n@@\n one\n-two\n+TWO\n"
        "*** Update File: f.txt\n*** Move to: g.txt\n@@\n-one\n+ONE",
    )
    assert action.final == {str(tmp_path / "f.txt"): None, str(tmp_path / "g.txt"): "ONE\nTWO\n"}
    # A file that never existed and ends up moved is, in net, an added file.
    assert action.changes == {str(tmp_path / "g.txt"): AddFileChange("ONE\nTWO\n")}
    outcome = apply_action(action)
    assert outcome == ApplyOutcome(
        "Success. Updated the following files:\nA f.txt\nM f.txt\nM g.txt\n", "", True
    )
    assert sorted(os.listdir(tmp_path)) == ["g.txt"]


def test_chained_moves_are_one_move(tmp_path):
    write(tmp_path / "a.txt", "x\n")
    action = verified(
        tmp_path,
        "*** Update File: a.txt\n*** Move to: b.txt\n@@\n-x\n+y\n"
        "*** Update File: b.txt\n*** Move to: c.txt\n@@\n-y\n+z",
    )
    assert action.changes == {
        str(tmp_path / "a.txt"): UpdateFileChange("@@ -1 +1 @@\n-x\n+z\n", str(tmp_path / "c.txt"))
    }


def test_seek_sequence_edges():
    assert seek_sequence(["a"], [], 0, False) == 0
    assert seek_sequence(["a"], ["a", "b", "c"], 0, False) is None
    assert seek_sequence(["a", "b", "a"], ["a"], 1, False) == 2
    assert seek_sequence(["a", "b", "a"], ["a"], 0, True) == 2
    assert seek_sequence(["a", "b", "c"], ["a"], 0, True) == 0  # end first, then from start


# -- applying -------------------------------------------------------------------------


def test_apply_writes_moves_deletes_and_creates_directories(tmp_path):
    write(tmp_path / "modify.txt", "line1\nline2\n")
    write(tmp_path / "delete.txt", "obsolete\n")
    write(tmp_path / "old/name.txt", "from\n")
    write(tmp_path / "old/other.txt", "stays\n")
    action = verified(
        tmp_path,
        "*** Add File: nested/deeper/new.txt\n+created\n"
        "*** Delete File: delete.txt\n"
        "*** Update File: modify.txt\n@@\n-line2\n+changed\n"
        "*** Update File: old/name.txt\n*** Move to: renamed/dir/name.txt\n@@\n-from\n+to",
    )
    outcome = apply_action(action)
    assert outcome == ApplyOutcome(
        "Success. Updated the following files:\n"
        "A nested/deeper/new.txt\n"
        "M modify.txt\n"
        "M renamed/dir/name.txt\n"
        "D delete.txt\n",
        "",
        True,
    )
    files = {p.relative_to(tmp_path).as_posix(): p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    assert files == {
        "nested/deeper/new.txt": "created\n",
        "modify.txt": "line1\nchanged\n",
        "old/other.txt": "stays\n",
        "renamed/dir/name.txt": "to\n",
    }


def test_apply_overwrites_with_add_and_move(tmp_path):
    write(tmp_path / "dup.txt", "old\n")
    write(tmp_path / "a.txt", "a\n")
    write(tmp_path / "b.txt", "b\n")
    action = verified(
        tmp_path,
        "*** Add File: dup.txt\n+new\n*** Update File: a.txt\n*** Move to: b.txt\n@@\n-a\n+A",
    )
    assert action.changes[str(tmp_path / "dup.txt")] == AddFileChange("new\n")
    assert apply_action(action).success
    assert (tmp_path / "dup.txt").read_text() == "new\n"
    assert (tmp_path / "b.txt").read_text() == "A\n"
    assert not (tmp_path / "a.txt").exists()


def test_apply_absolute_paths_are_reported_as_written(tmp_path):
    target = tmp_path / "abs.txt"
    action = verified(tmp_path, f"*** Add File: {target}\n+x")
    assert apply_action(action).stdout == f"Success. Updated the following files:\nA {target}\n"


def test_apply_keeps_permissions_and_writes_through_symlinks(tmp_path):
    script = write(tmp_path / "run.sh", "echo a\n")
    script.chmod(0o775)
    real = write(tmp_path / "real.txt", "r\n")
    (tmp_path / "link.txt").symlink_to(real)
    action = verified(
        tmp_path,
        "*** Update File: run.sh\n@@\n-echo a\n+echo b\n*** Update File: link.txt\n@@\n-r\n+R",
    )
    old = os.umask(0o077)  # must not narrow an existing file's mode
    try:
        assert apply_action(action).success
    finally:
        os.umask(old)
    assert stat.S_IMODE(script.stat().st_mode) == 0o775
    assert (tmp_path / "link.txt").is_symlink()
    assert real.read_text() == "R\n"
    assert sorted(os.listdir(tmp_path)) == ["link.txt", "real.txt", "run.sh"]  # no temp files


def test_new_files_get_the_umask_mode(tmp_path):
    action = verified(tmp_path, "*** Add File: n.txt\n+x")
    old = os.umask(0o027)
    try:
        assert apply_action(action).success
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "n.txt").stat().st_mode) == 0o640


def test_apply_refuses_a_file_changed_since_verification(tmp_path):
    write(tmp_path / "f.txt", "a\n")
    action = verified(tmp_path, "*** Add File: new.txt\n+n\n*** Update File: f.txt\n@@\n-a\n+b")
    write(tmp_path / "f.txt", "edited meanwhile\n")
    outcome = apply_action(action)
    assert outcome == ApplyOutcome(
        "",
        "f.txt changed on disk after the patch was checked; read it again and redo the patch\n",
        False,
    )
    assert (tmp_path / "f.txt").read_text() == "edited meanwhile\n"
    assert not (tmp_path / "new.txt").exists()


def test_apply_failure_while_writing_leaves_nothing_behind(tmp_path):
    write(tmp_path / "keep.txt", "a\n")
    action = verified(
        tmp_path,
        "*** Update File: keep.txt\n@@\n-a\n+b\n*** Add File: sub/deep/x.txt\n+x",
    )
    write(tmp_path / "sub", "now a file\n")  # the directory can no longer be created
    outcome = apply_action(action)
    assert not outcome.success
    assert outcome.stdout == ""
    assert outcome.stderr.startswith("Failed to write file sub/deep/x.txt: ")
    assert (tmp_path / "keep.txt").read_text() == "a\n"
    assert sorted(os.listdir(tmp_path)) == ["keep.txt", "sub"]


# -- writable roots -------------------------------------------------------------------


def test_paths_outside_writable_roots(tmp_path):
    inside = tmp_path / "work"
    outside = tmp_path / "other"
    write(inside / "a.txt", "a\n")
    write(outside / "b.txt", "b\n")
    (inside / "escape").symlink_to(outside)
    action = verified(
        inside,
        "*** Update File: a.txt\n@@\n-a\n+A\n"
        "*** Add File: new/file.txt\n+n\n"
        f"*** Update File: {outside}/b.txt\n@@\n-b\n+B\n"
        "*** Add File: .git/hooks/pre-commit\n+x\n"
        "*** Add File: escape/c.txt\n+c",
    )
    assert paths_outside(action, [inside]) == [
        outside / "b.txt",
        inside / ".git/hooks/pre-commit",
        inside / "escape/c.txt",
    ]
    assert paths_outside(action, [inside, outside]) == [inside / ".git/hooks/pre-commit"]
    assert paths_outside(action, [inside, outside, inside / ".git/hooks"]) == []
    assert paths_outside(action, [tmp_path]) == []


def test_move_destination_and_source_both_need_write_access(tmp_path):
    write(tmp_path / "w/a.txt", "a\n")
    action = verified(tmp_path / "w", f"*** Update File: a.txt\n*** Move to: {tmp_path}/out/a.txt\n@@\n-a\n+a")
    assert paths_outside(action, [tmp_path / "w"]) == [tmp_path / "out/a.txt"]
    assert paths_outside(action, [tmp_path / "out"]) == [tmp_path / "w/a.txt"]


def test_grant_root_is_the_nearest_existing_common_parent(tmp_path):
    (tmp_path / "x/y").mkdir(parents=True)
    assert grant_root_for([tmp_path / "x/y/f.txt"]) == tmp_path / "x/y"
    assert grant_root_for([tmp_path / "x/y/f.txt", tmp_path / "x/g.txt"]) == tmp_path / "x"
    assert grant_root_for([tmp_path / "x/y/f.txt", tmp_path / "x/z/h.txt"]) == tmp_path / "x"
    # Directories the patch would create do not exist yet: grant where they are made.
    assert grant_root_for([tmp_path / "x/new/deeper/f.txt"]) == tmp_path / "x"
    assert grant_root_for([]) is None


# -- unified diffs --------------------------------------------------------------------


def test_unified_diff_text():
    assert unified_diff("a\nb\n", "a\nb\n") == ""
    assert unified_diff("", "x\ny\n", header=("/dev/null", "b/f")) == (
        "--- /dev/null\n+++ b/f\n@@ -0,0 +1,2 @@\n+x\n+y\n"
    )
    assert unified_diff("a\nb", "a\nc\n", context=1) == (
        "@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n"
    )


# -- the turn diff --------------------------------------------------------------------

OID = {
    "": "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391",
    "x\n": "587be6b4c3f93f93c489c0111bba5596147a26cb",
}


def test_turn_diff_pinned(tmp_path):
    repo = git_repo(tmp_path / "repo")
    write(repo / "src/mod.txt", "one\ntwo\nthree\n")
    write(repo / "gone.txt", "x\n")
    write(repo / "old.txt", "keep\n")
    cwd = repo / "src"  # paths show relative to the git root, not the cwd
    tracker = TurnDiffTracker(cwd=str(cwd))

    first = verified(cwd, "*** Update File: mod.txt\n@@\n one\n-two\n+TWO\n*** Add File: ../new.txt\n+hello")
    tracker.on_patch_begin(first)
    assert apply_action(first).success
    second = verified(
        cwd,
        "*** Update File: mod.txt\n@@\n-three\n+3\n*** Delete File: ../gone.txt\n"
        "*** Update File: ../old.txt\n*** Move to: ../moved.txt\n@@\n-keep\n+keep",
    )
    tracker.on_patch_begin(second)
    assert apply_action(second).success

    assert diff_now(tracker) == (
        "diff --git a/gone.txt b/gone.txt\n"
        "deleted file mode 100644\n"
        "index 587be6b4c3f93f93c489c0111bba5596147a26cb..0000000000000000000000000000000000000000\n"
        "--- a/gone.txt\n"
        "+++ /dev/null\n"
        "@@ -1 +0,0 @@\n"
        "-x\n"
        "diff --git a/old.txt b/moved.txt\n"
        "rename from old.txt\n"
        "rename to moved.txt\n"
        "diff --git a/new.txt b/new.txt\n"
        "new file mode 100644\n"
        "index 0000000000000000000000000000000000000000..ce013625030ba8dba906f756967f9e9ca394464a\n"
        "--- /dev/null\n"
        "+++ b/new.txt\n"
        "@@ -0,0 +1 @@\n"
        "+hello\n"
        "diff --git a/src/mod.txt b/src/mod.txt\n"
        "index 4cb29ea38f70d7c61b2a3a25b02e3bdf44905402..24781a198328c274692321e3b8fd5752ba3d3587\n"
        "--- a/src/mod.txt\n"
        "+++ b/src/mod.txt\n"
        "@@ -1,3 +1,3 @@\n"
        " one\n"
        "-two\n"
        "-three\n"
        "+TWO\n"
        "+3\n"
    )


def test_turn_diff_rename_with_changes_and_modes(tmp_path):
    git_repo(tmp_path)
    write(tmp_path / "a.sh", "echo 1\n").chmod(0o755)
    tracker = TurnDiffTracker()
    action = verified(tmp_path, "*** Update File: a.sh\n*** Move to: b.sh\n@@\n-echo 1\n+echo 2")
    tracker.on_patch_begin(action)
    assert apply_action(action).success
    assert stat.S_IMODE((tmp_path / "b.sh").stat().st_mode) != 0o755  # a new file
    assert diff_now(tracker) == (
        "diff --git a/a.sh b/b.sh\n"
        "old mode 100755\n"
        "new mode 100644\n"
        "rename from a.sh\n"
        "rename to b.sh\n"
        "index c3e9e049287befed8405d9816ed6e1ec4e3a1641..3b5545e7ade7b2ce518c938132b759e0780589cf\n"
        "--- a/a.sh\n"
        "+++ b/b.sh\n"
        "@@ -1 +1 @@\n"
        "-echo 1\n"
        "+echo 2\n"
    )


def test_turn_diff_paths_relative_to_cwd_without_git(tmp_path):
    if any((p / ".git" / "HEAD").exists() for p in [tmp_path, *tmp_path.parents]):
        pytest.skip("the temporary directory is inside a git checkout")
    write(tmp_path / "d/f.txt", "x\n")
    tracker = TurnDiffTracker(cwd=str(tmp_path))
    action = verified(tmp_path, "*** Delete File: d/f.txt")
    tracker.on_patch_begin(action)
    assert apply_action(action).success
    assert diff_now(tracker).startswith("diff --git a/d/f.txt b/d/f.txt\n")
    outside = TurnDiffTracker(cwd=str(tmp_path / "elsewhere"))
    write(tmp_path / "g.txt", "x\n")
    action = verified(tmp_path, "*** Delete File: g.txt")
    outside.on_patch_begin(action)
    assert apply_action(action).success
    # Outside any git root and the cwd: the absolute path, without a doubled slash.
    rel = str(tmp_path).lstrip("/")
    diff = diff_now(outside)
    assert diff.startswith(f"diff --git a/{rel}/g.txt b/{rel}/g.txt\n") and "a//" not in diff
    assert f"\n--- a/{rel}/g.txt\n+++ /dev/null\n" in diff


def test_turn_diff_takes_no_stray_or_foreign_git_above_the_cwd(tmp_path):
    # What any program may leave in a shared /tmp: an empty .git, or another user's
    # repository. Git itself would use neither; shown relative to one, every path of the
    # diff would name the user's project from somewhere they never opened.
    cwd = tmp_path / "stray" / "work"
    write(cwd / "f.txt", "x\n")
    (tmp_path / "stray" / ".git").mkdir()
    foreign = git_repo(tmp_path / "foreign")
    write(foreign / "work" / "f.txt", "x\n")
    if os.geteuid() == 0:
        os.chown(foreign / ".git", 65534, 65534)
    else:
        foreign = None
    for work in [cwd] + ([foreign / "work"] if foreign else []):
        tracker = TurnDiffTracker(cwd=str(work))
        action = verified(work, "*** Update File: f.txt\n@@\n-x\n+y")
        tracker.on_patch_begin(action)
        assert apply_action(action).success
        assert diff_now(tracker).startswith("diff --git a/f.txt b/f.txt\n")
    # The same directory made the user's own repository is the root (the test's control).
    shutil.rmtree(tmp_path / "stray" / ".git")
    git_repo(tmp_path / "stray")
    tracker = TurnDiffTracker(cwd=str(cwd))
    action = verified(cwd, "*** Update File: f.txt\n@@\n-y\n+z")
    tracker.on_patch_begin(action)
    assert apply_action(action).success
    assert diff_now(tracker).startswith("diff --git a/work/f.txt b/work/f.txt\n")


def test_turn_diff_takes_a_worktree_gitfile_as_a_root(tmp_path):
    write(tmp_path / ".git", "gitdir: /elsewhere/.git/worktrees/w\n")
    write(tmp_path / "sub" / "f.txt", "x\n")
    tracker = TurnDiffTracker(cwd=str(tmp_path / "sub"))
    action = verified(tmp_path / "sub", "*** Update File: f.txt\n@@\n-x\n+y")
    tracker.on_patch_begin(action)
    assert apply_action(action).success
    assert diff_now(tracker).startswith("diff --git a/sub/f.txt b/sub/f.txt\n")


def test_turn_diff_baseline_is_the_first_touch(tmp_path):
    tracker = TurnDiffTracker(cwd=str(tmp_path))
    write(tmp_path / "f.txt", "v1\n")
    for old, new in (("v1", "v2"), ("v2", "v3")):
        action = verified(tmp_path, f"*** Update File: f.txt\n@@\n-{old}\n+{new}")
        tracker.on_patch_begin(action)
        assert apply_action(action).success
    diff = diff_now(tracker)
    assert diff is not None and diff.endswith("@@ -1 +1 @@\n-v1\n+v3\n")


def test_turn_diff_add_then_delete_is_nothing(tmp_path):
    tracker = TurnDiffTracker(cwd=str(tmp_path))
    for body in ("*** Add File: t.txt\n+x", "*** Delete File: t.txt"):
        action = verified(tmp_path, body)
        tracker.on_patch_begin(action)
        assert apply_action(action).success
    assert diff_now(tracker) is None


def test_turn_diff_sees_later_edits_and_missing_newline(tmp_path):
    write(tmp_path / "f.txt", "a\n")
    tracker = TurnDiffTracker(cwd=str(tmp_path))
    action = verified(tmp_path, "*** Update File: f.txt\n@@\n-a\n+b")
    tracker.on_patch_begin(action)
    assert apply_action(action).success
    (tmp_path / "f.txt").write_text("b")  # e.g. a shell command later in the turn
    diff = diff_now(tracker)
    assert diff is not None
    assert diff.endswith("@@ -1 +1 @@\n-a\n+b\n\\ No newline at end of file\n")


def test_turn_diff_empty_file_oid(tmp_path):
    git_repo(tmp_path)
    tracker = TurnDiffTracker()
    action = verified(tmp_path, "*** Add File: empty.txt")
    tracker.on_patch_begin(action)
    assert apply_action(action).success
    assert diff_now(tracker) == (
        "diff --git a/empty.txt b/empty.txt\n"
        "new file mode 100644\n"
        f"index {'0' * 40}..{OID['']}\n"
    )


# -- what is read for verification, how a refused change is reported --------------------


def test_paths_to_read_are_the_targets_and_the_directories_above_new_files(tmp_path):
    parsed = maybe_parse_apply_patch(
        ["apply_patch", wrap("*** Add File: a/b/new.txt\n+x\n*** Update File: old.txt\n*** Move to: c/moved.txt\n"
                             "@@\n-x\n+y\n*** Delete File: gone.txt")], tmp_path)
    reads, stats = paths_to_read(parsed)
    assert reads == [str(tmp_path / p) for p in ("a/b/new.txt", "old.txt", "c/moved.txt", "gone.txt")]
    assert stats[:2] == [str(tmp_path / "a/b"), str(tmp_path / "a")] and str(tmp_path / "c") in stats
    assert "/" in stats and not set(reads) & set(stats)


def test_a_refused_change_is_a_failed_patch_that_says_why(tmp_path):
    write(tmp_path / "f.txt", "a\n")
    action = verified(tmp_path, "*** Update File: f.txt\n@@\n-a\n+b")
    path = str(tmp_path / "f.txt")
    refused = outcome_of(action, {"path": path, "stage": "write", "error": "Read-only file system", "errno": 30})
    assert refused == ApplyOutcome(
        "", "Failed to write file f.txt: Read-only file system (the session's sandbox does not allow this write)\n",
        False)
    changed = outcome_of(action, {"path": path, "stage": "check", "error": "changed since it was read", "errno": 0})
    assert changed.stderr == "f.txt changed on disk after the patch was checked; read it again and redo the patch\n"
    partly = outcome_of(action, {"path": path, "stage": "update", "error": "No space left on device", "errno": 28})
    assert partly.stderr == "Failed to update f.txt: No space left on device (the patch was partly applied)\n"
    assert outcome_of(action, None) == ApplyOutcome("Success. Updated the following files:\nM f.txt\n", "", True)
