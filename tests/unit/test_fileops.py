"""landlock_helper.fileops, run in this process: the batch format, reads (regular files
only, bounded, never blocking), the all-or-nothing change with its compare-and-swap, and
the refusal to create .git/.sluice. (Inside the sandbox it is the same code, run as a
builtin: tests/integration/test_containment_agent.py.)"""

from __future__ import annotations

import os
import stat
import threading

import pytest

from landlock_helper import fileops
from landlock_helper.fileops import BatchError, decode, delete_op, digest, encode, file_data, read_op, stat_op, write_op

pytestmark = pytest.mark.timeout(10)


def run(*ops):
    # Through the encoding, as it crosses the pipe.
    return decode(encode(fileops.run(decode(encode({"ops": list(ops)})))))


def test_reads_say_what_is_there(tmp_path):
    (tmp_path / "f").write_bytes(b"hello\xff")
    os.chmod(tmp_path / "f", 0o640)
    os.symlink("f", tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")  # nobody writes it: the read must not wait
    got = run(read_op(str(tmp_path / "f")), read_op(str(tmp_path / "link")), read_op(str(tmp_path)),
              read_op(str(tmp_path / "fifo")), read_op(str(tmp_path / "none")), stat_op(str(tmp_path / "f")))
    f, link, directory, fifo, none, st = got["results"]
    assert f["kind"] == "file" and f["mode"] == 0o640 and file_data(f) == b"hello\xff" and not f["truncated"]
    assert link["link"] == "f" and file_data(link) == b"hello\xff"
    assert directory["kind"] == "dir" and file_data(directory) is None
    assert fifo["kind"] == "other" and "data" not in fifo
    assert none == {"kind": "none", "error": "No such file or directory", "errno": 2}
    assert st == {"kind": "file", "mode": 0o640}
    assert got["failed"] is None


def test_a_read_is_bounded(tmp_path):
    (tmp_path / "big").write_bytes(b"x" * 100)
    (result,) = run(read_op(str(tmp_path / "big"), 10))["results"]
    assert result["truncated"] and file_data(result) == b"x" * 10


def test_a_change_writes_atomically_and_keeps_modes(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("old\n")
    os.chmod(script, 0o750)
    gone = tmp_path / "gone.txt"
    gone.write_text("bye\n")
    got = run(write_op(str(script), b"new\n", b"old\n"), write_op(str(tmp_path / "a/b/new.txt"), b"n", None),
              delete_op(str(gone), b"bye\n"))
    assert got == {"results": [{}, {}, {}], "failed": None}
    assert script.read_text() == "new\n" and stat.S_IMODE(script.stat().st_mode) == 0o750
    assert (tmp_path / "a/b/new.txt").read_text() == "n" and not gone.exists()
    assert sorted(os.listdir(tmp_path)) == ["a", "run.sh"]  # no temporary file left


def test_a_file_changed_since_it_was_read_refuses_the_whole_change(tmp_path):
    (tmp_path / "f").write_text("now\n")
    got = run(write_op(str(tmp_path / "new"), b"x", None), write_op(str(tmp_path / "f"), b"y", b"then\n"))
    assert got["failed"] == {"path": str(tmp_path / "f"), "stage": "check", "error": "changed since it was read",
                             "errno": 0}
    assert sorted(os.listdir(tmp_path)) == ["f"] and (tmp_path / "f").read_text() == "now\n"
    # A path that held no file must still hold none.
    got = run(write_op(str(tmp_path / "f"), b"y", None))
    assert got["failed"]["stage"] == "check"


@pytest.mark.parametrize("path", ["src/.git/HEAD", ".git", "sub/.sluice/config.toml", "a/.sluice"])
def test_no_git_or_sluice_is_created(tmp_path, path):
    got = run(write_op(str(tmp_path / "ok.txt"), b"x", None), write_op(str(tmp_path / path), b"x", None))
    name = ".git" if ".git" in path else ".sluice"
    assert got["failed"]["stage"] == "write" and got["failed"]["errno"] == 1
    assert got["failed"]["error"] == f"Operation not permitted (a patch may not create {name})"
    assert os.listdir(tmp_path) == []  # nothing of the change stays, made directories included


def test_an_existing_git_file_inside_is_written_as_any_file(tmp_path):
    # What is already there is the sandbox's to protect (it binds .git read-only).
    config = tmp_path / "deep/er/.git/config"
    config.parent.mkdir(parents=True)
    config.write_text("a")
    assert run(write_op(str(config), b"b", b"a"))["failed"] is None and config.read_text() == "b"


def test_a_write_fails_cleanly(tmp_path):
    (tmp_path / "file").write_text("x")
    got = run(write_op(str(tmp_path / "fine"), b"x", None), write_op(str(tmp_path / "file/under"), b"x", None))
    # (Verification says "Not a directory" first; here the make of the parent fails.)
    assert got["failed"]["stage"] == "write" and got["failed"]["error"] in ("File exists", "Not a directory")
    assert sorted(os.listdir(tmp_path)) == ["file"]


@pytest.mark.parametrize("batch, message", [
    ({}, "'ops' must be a list"),
    ({"ops": [{"op": "read"}]}, "each with a path"),
    ({"ops": [{"op": "read", "path": "a\0b"}]}, "each with a path"),
    ({"ops": [{"op": "chmod", "path": "/x"}]}, "unknown operation 'chmod'"),
    ({"ops": [{"op": "write", "path": "/x", "data": "!!"}]}, "base64"),
    ({"ops": [{"op": "read", "path": "/x", "max": -1}]}, "non-negative"),
    ({"ops": [{"op": "delete", "path": "/x", "expect": 3}]}, "SHA-256"),
])
def test_bad_batches_are_one_line(batch, message):
    with pytest.raises(BatchError, match=message):
        fileops.run(batch)


def test_decode_refuses_what_is_not_an_object():
    for data in (b"[]", b"{", b"\xff", b"[" * 100_000):
        with pytest.raises(BatchError):
            decode(data)


def test_serve_over_pipes(tmp_path):
    (tmp_path / "f").write_text("hi")
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        os.write(in_w, encode({"ops": [read_op(str(tmp_path / "f"))]}))
        os.close(in_w)
        assert fileops.serve(in_r, out_w, err_w) == 0
        os.close(out_w)
        assert file_data(decode(os.read(out_r, 1 << 16))["results"][0]) == b"hi"
        in_r2, in_w2 = os.pipe()
        os.write(in_w2, b"nonsense")
        os.close(in_w2)
        assert fileops.serve(in_r2, err_w, err_w) == 2
        os.close(in_r2)
        os.close(err_w)
        assert os.read(err_r, 4096).startswith(b"sluice-fileops: not a JSON object")
    finally:
        for fd in (in_r, out_r, err_r):
            os.close(fd)


def test_serve_answers_batch_after_batch_until_end_of_file(tmp_path):
    # A conversation: a read, then a write made from its answer, in one run. The write
    # is sent only after the read's answer came, as the agent does, so a thread writes.
    target = tmp_path / "f"
    target.write_text("old")
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    served = []
    server = threading.Thread(target=lambda: served.append(fileops.serve(in_r, out_w, out_w)))
    server.start()
    try:
        os.write(in_w, encode({"ops": [read_op(str(target))]}) + b"\n")
        with os.fdopen(os.dup(out_r), "rb", buffering=0) as answers:
            first = decode(answers.readline())
            seen = file_data(first["results"][0])
            assert seen == b"old"
            os.write(in_w, encode({"ops": [write_op(str(target), b"new", seen)]}) + b"\n")
            second = decode(answers.readline())
            assert second["failed"] is None and target.read_text() == "new"
            os.close(in_w)
            in_w = -1
            server.join(timeout=10)
            assert served == [0]
    finally:
        server.join(timeout=10)
        for fd in (in_r, out_r, out_w, in_w):
            if fd >= 0:
                os.close(fd)


def test_digest_of_nothing_differs_from_empty():
    assert digest(None) == "" and digest(b"") != "" and len(digest(b"x")) == 64
