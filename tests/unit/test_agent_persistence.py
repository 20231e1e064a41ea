"""agent.history and agent.rollout: the files a session leaves behind."""

from __future__ import annotations

import asyncio
import datetime as dt
import fcntl
import json
import os
import stat
import threading
import uuid

import pytest

from agent import history
from agent.rollout import RolloutError, RolloutRecorder, read_rollout, rollout_path
from broker.wire.protocol import HistoryEntry

pytestmark = pytest.mark.timeout(20)

SID = uuid.UUID("67e55044-10b1-426f-9247-bb680e5fe0c8")


# -- history --------------------------------------------------------------------------


def test_history_append_metadata_lookup(tmp_path) -> None:
    path = tmp_path / "home" / "history.jsonl"
    assert history.history_metadata(path) == (0, 0)
    history.append_entry("first", str(SID), path, now=100)
    history.append_entry("second\nline", str(SID), path, now=101)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    log_id, count = history.history_metadata(path)
    assert log_id == path.stat().st_ino and count == 2
    assert path.read_text().splitlines()[0] == f'{{"session_id":"{SID}","ts":100,"text":"first"}}'
    assert history.lookup(log_id, 1, path) == HistoryEntry(str(SID), 101, "second\nline")
    assert history.lookup(log_id, 2, path) is None
    assert history.lookup(log_id + 1, 0, path) is None  # another file
    assert history.lookup(log_id, -1, path) is None


def test_history_file_is_narrowed_to_0600(tmp_path) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text("")
    os.chmod(path, 0o644)
    history.append_entry("x", "s", path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_history_append_waits_for_the_lock(tmp_path) -> None:
    path = tmp_path / "history.jsonl"
    history.append_entry("a", "s", path)
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    timer = threading.Timer(0.25, lambda: fcntl.flock(fd, fcntl.LOCK_UN))
    timer.start()
    try:
        history.append_entry("b", "s", path)  # retried until the holder let go
    finally:
        timer.join()
        os.close(fd)
    assert history.history_metadata(path)[1] == 2


def test_history_path_honours_sluice_home(tmp_path) -> None:
    assert history.history_path({"SLUICE_HOME": str(tmp_path)}) == tmp_path / "history.jsonl"
    assert history.history_path({"HOME": str(tmp_path)}) == tmp_path / ".sluice" / "history.jsonl"


# -- rollout --------------------------------------------------------------------------


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def test_rollout_written_private_redacted_and_resumed(tmp_path) -> None:
    when = dt.datetime(2025, 5, 7, 17, 24, 21, 123456, tzinfo=dt.timezone.utc)
    key = "sk-very-secret-key-123"

    async def main():
        rec = await RolloutRecorder.create(SID, instructions="be brief", root=tmp_path / "sessions",
                                           secrets=[key], now=when)
        rec.record_items([
            user("hi"),
            {"type": "function_call", "name": "shell", "arguments": '{"command":["env"]}', "call_id": "c1"},
            {"type": "function_call_output", "call_id": "c1", "output": f"OPENAI_API_KEY={key}\n\"{key}\""},
            {"type": "web_search_call"},  # not part of the conversation: not kept
        ])
        await rec.flush()
        on_disk = rec.path.read_text()
        rec.record_items([{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]}])
        await rec.shutdown()
        return rec.path, on_disk

    path, flushed = asyncio.run(main())
    assert path == rollout_path(SID, when, tmp_path / "sessions")
    assert path.name == f"rollout-2025-05-07T17-24-21-{SID}.jsonl"
    assert path.parent == tmp_path / "sessions" / "2025" / "05" / "07"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "sessions").stat().st_mode) == 0o700
    assert len(flushed.splitlines()) == 4  # flush put everything recorded so far on disk
    text = path.read_text()
    assert key not in text and "[redacted]" in text
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines[0] == {"id": str(SID), "timestamp": "2025-05-07T17:24:21.123Z", "instructions": "be brief"}
    assert [line["type"] for line in lines[1:]] == ["message", "function_call", "function_call_output", "message"]

    saved = read_rollout(path)
    assert saved.session_id == SID and len(saved.items) == 4

    async def resume():
        rec, saved = await RolloutRecorder.resume(path)
        rec.record_compaction([saved.items[-1]])
        rec.record_items([user("next")])
        await rec.shutdown()
        return saved

    assert asyncio.run(resume()).items == saved.items
    after = read_rollout(path)
    assert [i["type"] for i in after.items] == ["message", "message"]
    assert after.items[0]["role"] == "assistant" and after.items[1]["content"][0]["text"] == "next"


def test_rollout_errors_are_one_line(tmp_path) -> None:
    with pytest.raises(RolloutError, match="cannot read rollout"):
        read_rollout(tmp_path / "missing.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(RolloutError, match="is empty"):
        read_rollout(empty)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"no":"id"}\n')
    with pytest.raises(RolloutError, match="session line"):
        read_rollout(bad)
    ok = tmp_path / "ok.jsonl"
    ok.write_text(json.dumps({"id": str(SID)}) + "\nnot json\n" + json.dumps(user("x")) + "\n"
                  + json.dumps({"record_type": "state"}) + "\n")
    assert read_rollout(ok).items == [user("x")]


def _rollout_bytes(*items: dict) -> list[bytes]:
    return [json.dumps({"id": str(SID)}).encode(), *(json.dumps(i, ensure_ascii=False).encode() for i in items)]


def test_a_last_line_cut_inside_a_utf8_character_is_dropped(tmp_path) -> None:
    path = tmp_path / "r.jsonl"
    lines = _rollout_bytes(user("kept"))
    cut = json.dumps(user("naïve €uro"), ensure_ascii=False).encode()
    cut = cut[:cut.index("€".encode()) + 1]  # killed in the middle of the euro sign
    path.write_bytes(b"\n".join(lines) + b"\n" + cut)
    with pytest.raises(UnicodeDecodeError):
        path.read_text(encoding="utf-8")  # what made the whole file unreadable
    saved = read_rollout(path)
    assert saved.items == [user("kept")] and saved.skipped == [] and saved.report(path) is None


@pytest.mark.parametrize(("at", "corrupt"), [(10, b"\xff"), (10, b"\x00"), (0, b"}")],
                         ids=["not-utf8", "nul", "not-json"])
def test_a_corrupt_middle_line_is_skipped_and_reported_with_its_number(tmp_path, at, corrupt) -> None:
    path = tmp_path / "r.jsonl"
    lines = _rollout_bytes(user("one"), user("two"), user("three"))
    lines[2] = lines[2][:at] + corrupt + lines[2][at + 1:]
    path.write_bytes(b"\n".join(lines) + b"\n")
    saved = read_rollout(path)
    assert saved.items == [user("one"), user("three")]
    assert saved.skipped == [3]
    assert saved.report(path) == (f"rollout {path}: line 3 not readable (corrupt), skipped; "
                                  "the conversation goes on without them")


def test_an_output_whose_call_was_lost_goes_too_and_the_report_says_so(tmp_path) -> None:
    path = tmp_path / "r.jsonl"
    call = {"type": "function_call", "name": "shell", "arguments": "{}", "call_id": "c1"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "hi"}
    lines = _rollout_bytes(user("run it"), call, output, user("next"))
    lines[2] = b"\xfe" + lines[2]
    lines += [b"[1, 2]"] * 12  # JSON, but no line sluice writes
    path.write_bytes(b"\n".join(lines) + b"\n")
    saved = read_rollout(path)
    assert saved.items == [user("run it"), user("next")] and saved.orphan_outputs == 1
    assert saved.skipped == [3, *range(6, 18)]
    assert saved.report(path) == (f"rollout {path}: lines 3, 6, 7, 8, 9, 10, 11, 12, 13, 14 and 3 more not readable "
                                  "(corrupt), skipped, with 1 tool output(s) whose call was on them; "
                                  "the conversation goes on without them")


def test_a_rollout_whose_first_line_is_corrupt_or_cut_is_refused(tmp_path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"id":"\xff"}\n' + json.dumps(user("x")).encode() + b"\n")
    with pytest.raises(RolloutError, match="does not start with a session line"):
        read_rollout(path)
    path.write_bytes(b'{"id":"67e55044-10b1-426f-92')
    with pytest.raises(RolloutError, match="is empty"):
        read_rollout(path)
