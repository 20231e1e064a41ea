"""broker.net.logging.SafeSink: a log that cannot be written never raises, and says what it lost."""

from __future__ import annotations

import io
import os

from broker.net.logging import LogFile, SafeSink


def test_a_full_disk_loses_lines_quietly_and_says_so_once_it_writes_again(tmp_path):
    path = tmp_path / "log"
    with open(path, "w") as stream:
        sink = SafeSink(stream)
        sink.write('{"event": "first"}\n')
        saved = os.dup(stream.fileno())
        full = os.open("/dev/full", os.O_WRONLY)
        try:
            os.dup2(full, stream.fileno())  # the disk is full from here on
            for _ in range(3):
                sink.write('{"event": "lost"}\n')  # never raises
                sink.flush()
            assert sink.lost == 3
            os.dup2(saved, stream.fileno())
            sink.write('{"event": "back"}\n')
        finally:
            os.close(full)
            os.close(saved)
    lines = path.read_text().splitlines()
    assert lines[0] == '{"event": "first"}' and lines[-1] == '{"event": "back"}'
    assert "3 log lines lost: No space left on device" in lines[1] and len(lines) == 3


def test_a_stream_without_a_descriptor_is_written_through():
    out = io.StringIO()
    sink = SafeSink(out)
    sink.write("line\n")
    sink.flush()
    assert out.getvalue() == "line\n"


def test_a_line_cut_short_by_the_full_disk_is_ended_before_the_note(tmp_path, monkeypatch):
    path = tmp_path / "log"
    real_write = os.write
    state = {"full": False}

    def write(fd, data):
        if state["full"]:
            if len(data) > 5:
                return real_write(fd, bytes(data[:5]))  # part of it fits
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    with open(path, "w") as stream:
        sink = SafeSink(stream)
        monkeypatch.setattr(os, "write", write)
        state["full"] = True
        sink.write('{"event": "cut"}\n')
        state["full"] = False
        sink.write('{"event": "back"}\n')
    lines = path.read_text().splitlines()
    assert lines[0] == '{"event": "cut"' and "1 log lines lost" in lines[1] and lines[2] == '{"event": "back"}'


def test_a_log_file_rotates_by_size_and_keeps_so_many_old_ones(tmp_path):
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        sink = SafeSink(LogFile(dir_fd, "daemon.log", max_bytes=100, keep=2))
    finally:
        os.close(dir_fd)  # the log keeps its own
    for i in range(20):
        sink.write(f'{{"event": "line {i:02}"}}\n')  # 21 bytes each: four to a file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["daemon.log", "daemon.log.1", "daemon.log.2"]
    for name in ("daemon.log", "daemon.log.1", "daemon.log.2"):
        assert (tmp_path / name).stat().st_size <= 100
    assert (tmp_path / "daemon.log").read_text().splitlines()[-1] == '{"event": "line 19"}'
    assert (tmp_path / "daemon.log.2").read_text().splitlines()[0] == '{"event": "line 08"}'
