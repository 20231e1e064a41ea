"""broker.daemon.journal: appends, reads from any seq, rotation keeps a contiguous range, failures."""

from __future__ import annotations

import os

import pytest

from broker.daemon import journal as J

pytestmark = pytest.mark.timeout(60)


def body(seq: int) -> bytes:
    # Sizes vary, some records are big enough to span read blocks.
    return (b"%d:" % seq) * (1 + seq % 7) + (b"x" * (J.READ_BLOCK + 3) if seq % 500 == 0 else b"")


def test_read_from_any_seq(tmp_path):
    j = J.Journal(str(tmp_path), "s1")
    assert (j.first_seq, j.last_seq) == (1, 0)
    assert j.read(1, 10, 1 << 20) == []
    for seq in range(1, 2001):
        j.append(seq, body(seq))
    assert (j.first_seq, j.last_seq) == (1, 2000)
    for start in (1, 2, 63, 64, 65, 499, 500, 501, 1999, 2000):
        got = j.read(start, 100, 1 << 30)
        assert [s for s, _ in got] == list(range(start, min(start + 100, 2001)))
        assert all(b == body(s) for s, b in got)
    assert j.read(0, 10, 1 << 20) == [] and j.read(2001, 10, 1 << 20) == []
    # max_bytes bounds a batch, but a batch has at least one event.
    assert len(j.read(500, 100, 1)) == 1
    j.close()
    assert os.listdir(tmp_path) == []


def test_memoryview_and_whole_scan(tmp_path):
    j = J.Journal(str(tmp_path), "s2")
    for seq in range(1, 10_001):
        j.append(seq, memoryview(b"e%06d" % seq))
    seen = []
    seq = 1
    while batch := j.read(seq, 4096, 1 << 20):
        seen.extend(batch)
        seq = batch[-1][0] + 1
    assert [s for s, _ in seen] == list(range(1, 10_001))
    assert seen[-1][1] == b"e010000"


def test_rotation_keeps_a_contiguous_newest_range(tmp_path):
    j = J.Journal(str(tmp_path), "s3", max_bytes=64 * 1024)
    for seq in range(1, 5001):
        j.append(seq, b"y" * 100)
        assert j.size <= 64 * 1024 + 200
    first = j.first_seq
    assert 1 < first < 5000 and j.last_seq == 5000
    assert j.size >= 32 * 1024
    assert j.read(first - 1, 10, 1 << 20) == []
    got = []
    seq = first
    while batch := j.read(seq, 333, 1 << 20):
        got.extend(s for s, _ in batch)
        seq = batch[-1][0] + 1
    assert got == list(range(first, 5001))
    assert len(os.listdir(tmp_path)) <= 2


def test_a_failing_disk_turns_the_journal_off(tmp_path):
    j = J.Journal(str(tmp_path / "missing"), "s4")
    j.append(1, b"a")  # the directory does not exist: off, not an exception
    j.append(2, b"b")
    assert j.last_seq == 2 and j.first_seq == 3
    assert j.read(1, 10, 100) == []


def test_a_hole_turns_the_journal_off(tmp_path):
    j = J.Journal(str(tmp_path), "s5")
    j.append(1, b"a")
    j.append(3, b"c")
    assert j.first_seq == j.last_seq + 1 == 4
    assert os.listdir(tmp_path) == []


def test_reset_directory(tmp_path):
    d = tmp_path / "journal"
    os.close(J.reset_directory(str(d)))
    (d / "old.0.events").write_bytes(b"x")
    (d / "keep.txt").write_bytes(b"x")
    os.close(J.reset_directory(str(d)))
    assert sorted(os.listdir(d)) == ["keep.txt"]
    assert (d.stat().st_mode & 0o777) == 0o700


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd to count descriptors")
def test_idle_journals_hold_no_descriptors(tmp_path):
    before = _open_fds()
    journals = [J.Journal(str(tmp_path), f"s{i}", max_bytes=4096) for i in range(300)]
    for j in journals:
        for seq in range(1, 120):  # rotates, so each has two segments on disk
            j.append(seq, b"z" * 40)
        assert [s for s, _ in j.read(100, 5, 1 << 20)] == [100, 101, 102, 103, 104]
    assert _open_fds() == before
    for j in journals:
        j.close()
    assert os.listdir(tmp_path) == []


def test_a_segment_replaced_under_the_journal_turns_it_off(tmp_path):
    j = J.Journal(str(tmp_path), "s6")
    j.append(1, b"a")
    assert j.read(1, 1, 100) == [(1, b"a")]
    (name,) = os.listdir(tmp_path)
    os.rename(tmp_path / name, tmp_path / "moved")  # kept, so its inode is not reused by the link
    os.symlink("/etc/passwd", tmp_path / name)
    j.append(2, b"b")
    assert j.read(1, 10, 100) == []  # the flush before the read found the link: off
    assert j.first_seq == j.last_seq + 1
    assert os.readlink(tmp_path / name) == "/etc/passwd"  # a link it did not make is left alone
    os.unlink(tmp_path / name)
    os.unlink(tmp_path / "moved")
