"""broker.daemon.journal: appends, reads from any seq, rotation keeps a contiguous range, failures."""

from __future__ import annotations

import os

import pytest

from broker.daemon import journal as J

pytestmark = pytest.mark.timeout(60)


BIG = 1024 * 1024 + 3


def body(seq: int) -> bytes:
    # Sizes vary, some bodies are big.
    return (b"%d:" % seq) * (1 + seq % 7) + (b"x" * BIG if seq % 500 == 0 else b"")


def read(j: J.Journal, seq: int, max_events: int, max_bytes: int) -> list[tuple[int, bytes]]:
    """What the journal reads from ``seq`` on, as (seq, body) pairs ([] for nothing)."""
    block = j.read(seq, max_events, max_bytes)
    return [] if block is None else block.events()


def test_read_from_any_seq(tmp_path):
    j = J.Journal(str(tmp_path), "s1")
    assert (j.first_seq, j.last_seq) == (1, 0)
    assert read(j, 1, 10, 1 << 20) == []
    for seq in range(1, 2001):
        j.append(seq, body(seq))
    assert (j.first_seq, j.last_seq) == (1, 2000)
    for start in (1, 2, 63, 64, 65, 499, 500, 501, 1999, 2000):
        got = read(j, start, 100, 1 << 30)
        assert [s for s, _ in got] == list(range(start, min(start + 100, 2001)))
        assert all(b == body(s) for s, b in got)
    assert read(j, 0, 10, 1 << 20) == [] and read(j, 2001, 10, 1 << 20) == []
    # max_bytes bounds a batch, but a batch has at least one event.
    assert len(read(j, 500, 100, 1)) == 1
    # Each event is taken while fewer than max_bytes were: the one that crosses it is the last.
    sizes = [len(body(s)) for s in range(10, 20)]
    assert len(read(j, 10, 100, sum(sizes[:3]))) == 3
    assert len(read(j, 10, 100, sum(sizes[:3]) + 1)) == 4
    block = j.read(10, 4, 1 << 20)
    assert (block.first, block.count, block.last, block.nbytes, block.last_size) == (10, 4, 13, sum(sizes[:4]), sizes[3])
    assert b"".join(block.parts) == b"".join(body(s) for s in range(10, 14))  # the bodies as stored, back to back
    j.close()
    assert os.listdir(tmp_path) == []


def test_memoryview_and_whole_scan(tmp_path):
    j = J.Journal(str(tmp_path), "s2")
    for seq in range(1, 10_001):
        j.append(seq, memoryview(b"e%06d" % seq))
    seen = []
    seq = 1
    while batch := read(j, seq, 4096, 1 << 20):
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
    assert read(j, first - 1, 10, 1 << 20) == []
    got = []
    seq = first
    while batch := read(j, seq, 333, 1 << 20):
        got.extend(s for s, _ in batch)
        seq = batch[-1][0] + 1
    assert got == list(range(first, 5001))
    assert len(os.listdir(tmp_path)) <= 4  # two segments, each its bodies and its index


def test_a_read_stops_at_the_end_of_a_segment(tmp_path):
    j = J.Journal(str(tmp_path), "s7", max_bytes=2000)
    for seq in range(1, 101):
        j.append(seq, b"%03d" % seq * 10)
    first = j.first_seq
    block = j.read(first, 1000, 1 << 20)
    assert block.first == first and block.last < 100  # the older segment's events only
    rest = j.read(block.last + 1, 1000, 1 << 20)
    assert rest.first == block.last + 1 and rest.last == 100
    assert [b for _, b in block.events() + rest.events()] == [b"%03d" % s * 10 for s in range(first, 101)]


def test_a_failing_disk_turns_the_journal_off(tmp_path):
    j = J.Journal(str(tmp_path / "missing"), "s4")
    j.append(1, b"a")  # the directory does not exist: off, not an exception
    j.append(2, b"b")
    assert j.last_seq == 2 and j.first_seq == 3
    assert read(j, 1, 10, 100) == []


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
    (d / "old.0.index").write_bytes(b"x")
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
        assert [s for s, _ in read(j, 100, 5, 1 << 20)] == [100, 101, 102, 103, 104]
    assert _open_fds() == before
    for j in journals:
        j.close()
    assert os.listdir(tmp_path) == []


def test_a_segment_replaced_under_the_journal_turns_it_off(tmp_path):
    j = J.Journal(str(tmp_path), "s6")
    j.append(1, b"a")
    assert read(j, 1, 1, 100) == [(1, b"a")]
    (name,) = [n for n in os.listdir(tmp_path) if n.endswith(J.SUFFIX)]
    os.rename(tmp_path / name, tmp_path / "moved")  # kept, so its inode is not reused by the link
    os.symlink("/etc/passwd", tmp_path / name)
    j.append(2, b"b")
    assert read(j, 1, 10, 100) == []  # the flush before the read found the link: off
    assert j.first_seq == j.last_seq + 1
    assert os.readlink(tmp_path / name) == "/etc/passwd"  # a link it did not make is left alone
    os.unlink(tmp_path / name)
    os.unlink(tmp_path / "moved")
    assert os.listdir(tmp_path) == []  # its index went with it


def _on_disk(path) -> int:
    return sum(entry.stat().st_size for entry in os.scandir(path))


def _readable(j: J.Journal) -> list[int]:
    seqs = []
    seq = j.first_seq
    while batch := read(j, seq, 1000, 1 << 20):
        seqs.extend(s for s, _ in batch)
        seq = batch[-1][0] + 1
    return seqs


def test_journals_together_stay_within_their_space_the_biggest_losing_its_oldest_first(tmp_path):
    space = J.JournalSpace(64 * 1024)
    loud = J.Journal(str(tmp_path), "loud", space=space)
    quiet = J.Journal(str(tmp_path), "quiet", space=space)
    assert loud.max_bytes == 64 * 1024  # none may keep more than all of them together
    for seq in range(1, 101):
        quiet.append(seq, b"q" * 100)
    for seq in range(1, 3001):
        loud.append(seq, b"l" * 100)
        assert space.used == loud.size + quiet.size <= space.limit
    assert _on_disk(tmp_path) <= space.limit
    # The quiet one kept everything; the loud one its newest events, in one contiguous range.
    assert _readable(quiet) == list(range(1, 101))
    assert 1 < loud.first_seq and _readable(loud) == list(range(loud.first_seq, 3001))
    assert loud.size >= (space.limit - quiet.size) // 4

    loud.close()
    assert space.used == quiet.size and space.journals == {quiet}


def test_the_cap_may_take_a_journals_newest_segment_and_the_journal_goes_on(tmp_path):
    space = J.JournalSpace(4096)
    big = J.Journal(str(tmp_path), "big", space=space)
    small = J.Journal(str(tmp_path), "small", space=space)
    big.append(1, b"b" * 3000)
    small.append(1, b"s" * 1000)
    small.append(2, b"s" * 100)  # over: the biggest journal's only segment goes
    assert space.used <= space.limit
    assert (big.first_seq, big.last_seq) == (2, 1) and read(big, 1, 10, 1 << 20) == []
    big.append(2, b"b" * 10)
    assert _readable(big) == [2] and _readable(small) == [1, 2]
    assert space.used == big.size + small.size
