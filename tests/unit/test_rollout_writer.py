"""agent.rollout's writer: every item on disk when recorded, synced at a turn's end, and a
write that fails (a full disk, EIO) said once while the session goes on. No processes:
failures come from /dev/full and from a patched ``os.write`` / ``os.fsync``."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import threading
import uuid
from pathlib import Path

import pytest

from agent import rollout as rollout_module
from agent.rollout import RolloutError, RolloutRecorder, failure_message, read_rollout
from broker.cli.turns import rollout_failed, turn_end
from broker.wire.protocol import ErrorEvent, Event, Shutdown, is_rollout_error
from tests.support.fake_model import FakeRunner, Harness, assistant, call, conversation, response, tag, user_item

pytestmark = pytest.mark.timeout(20)

SID = uuid.UUID("67e55044-10b1-426f-9247-bb680e5fe0c8")


def run(coro_fn):
    return asyncio.run(coro_fn())


def lines_of(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    assert not text or text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def full_disk_after(monkeypatch, whole_writes: int, partial: int = 0) -> None:
    """``os.write`` in the recorder: ``whole_writes`` calls go through, then one writes
    ``partial`` bytes (if any), then every call fails with ENOSPC."""
    real_write = os.write
    calls = {"n": 0, "partial_done": False}

    def write(fd, data):
        calls["n"] += 1
        if calls["n"] <= whole_writes:
            return real_write(fd, data)
        if partial and not calls["partial_done"]:
            calls["partial_done"] = True
            return real_write(fd, bytes(data[:partial]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(rollout_module.os, "write", write)


def test_every_item_is_in_the_file_as_soon_as_it_is_recorded(tmp_path) -> None:
    async def main():
        rec = await RolloutRecorder.create(SID, root=tmp_path)
        assert len(lines_of(rec.path)) == 1  # the session line, before anything else
        for n in range(3):
            rec.record_items([user_item(f"m{n}")])
            # No await, no flush: another reader sees it at once.
            assert lines_of(rec.path)[-1] == user_item(f"m{n}")
        rec.record_items([{"type": "web_search_call"}])  # not conversation: not written
        assert len(lines_of(rec.path)) == 4
        rec.close()  # as a SIGKILL would: no sync, no shutdown
        return rec.path

    path = run(main)
    assert read_rollout(path).items == [user_item(f"m{n}") for n in range(3)]


def test_sync_fsyncs_only_what_is_new(tmp_path, monkeypatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(rollout_module.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))

    async def main():
        rec = await RolloutRecorder.create(SID, root=tmp_path)
        await rec.sync()
        assert len(synced) == 1
        await rec.sync()  # nothing new
        assert len(synced) == 1
        rec.record_items([user_item("x")])
        await rec.shutdown()
        assert len(synced) == 2
        await rec.shutdown()  # twice is fine
        rec.record_items([user_item("after")])  # closed: dropped, no error
        assert rec.failure is None

    run(main)


def test_shutdown_waits_for_a_sync_whose_caller_was_cancelled(tmp_path, monkeypatch) -> None:
    entered, gate = threading.Event(), threading.Event()
    fds_ok: list[bool] = []
    real_fsync = os.fsync

    def slow_fsync(fd):
        entered.set()
        gate.wait(10)
        try:
            os.fstat(fd)
            fds_ok.append(True)
        except OSError:
            fds_ok.append(False)
        real_fsync(fd)

    async def main():
        rec = await RolloutRecorder.create(SID, root=tmp_path)
        rec.record_items([user_item("x")])
        monkeypatch.setattr(rollout_module.os, "fsync", slow_fsync)
        turn_end = asyncio.ensure_future(rec.sync())
        deadline = asyncio.get_running_loop().time() + 10
        while not entered.is_set():
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.001)
        turn_end.cancel()  # an interrupted turn: its sync goes on in the thread
        closing = asyncio.ensure_future(rec.shutdown())
        for _ in range(20):
            await asyncio.sleep(0)
        assert not closing.done()  # waiting for the fsync, the file still open
        gate.set()
        await closing
        assert turn_end.cancelled()

    run(main)
    assert fds_ok == [True]


def test_enospc_cuts_the_partial_line_and_is_said_once(tmp_path, monkeypatch) -> None:
    said: list[str] = []

    async def main():
        rec = await RolloutRecorder.create(SID, root=tmp_path)
        rec.on_failure = said.append
        rec.record_items([user_item("fits")])
        full_disk_after(monkeypatch, whole_writes=0, partial=7)
        rec.record_items([user_item("too big " * 100)])  # 7 bytes written, then ENOSPC
        rec.record_items([user_item("later"), user_item("and later")])
        rec.record_compaction([user_item("summary")])
        await rec.sync()
        await rec.shutdown()
        return rec

    rec = run(main)
    message = f"rollout: no space left on device: {rec.path}"
    assert said == [message] and rec.failure == message
    assert lines_of(rec.path)[1:] == [user_item("fits")]  # whole lines only
    assert read_rollout(rec.path).items == [user_item("fits")]


def test_dev_full_is_a_full_disk(tmp_path) -> None:
    said: list[str] = []
    path = tmp_path / "rollout.jsonl"

    async def main():
        rec = RolloutRecorder(path, os.open("/dev/full", os.O_WRONLY | os.O_CLOEXEC))
        rec.on_failure = said.append
        rec.record_items([user_item("x"), user_item("y")])
        await rec.shutdown()

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    run(main)
    assert said == [f"rollout: no space left on device: {path}"]


def test_eio_on_sync_is_said_once_and_stops_the_writing(tmp_path, monkeypatch) -> None:
    said: list[str] = []

    def fsync(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    async def main():
        rec = await RolloutRecorder.create(SID, root=tmp_path)
        rec.on_failure = said.append
        rec.record_items([user_item("one")])
        monkeypatch.setattr(rollout_module.os, "fsync", fsync)
        await rec.sync()
        rec.record_items([user_item("two")])
        await rec.shutdown()
        return rec.path

    path = run(main)
    assert said == [f"rollout: input/output error: {path}"]
    assert read_rollout(path).items == [user_item("one")]


def test_create_on_a_full_disk_raises_the_message_and_leaves_no_file(tmp_path, monkeypatch) -> None:
    full_disk_after(monkeypatch, whole_writes=0)
    with pytest.raises(RolloutError) as caught:
        run(lambda: RolloutRecorder.create(SID, root=tmp_path / "sessions"))
    assert str(caught.value).startswith(f"rollout: no space left on device: {tmp_path / 'sessions'}")
    assert is_rollout_error(str(caught.value))
    assert not list((tmp_path / "sessions").rglob("*.jsonl"))


def test_create_where_no_directory_can_be_made(tmp_path) -> None:
    blocker = tmp_path / "sessions"
    blocker.write_text("a file where the sessions dir should be")
    with pytest.raises(RolloutError, match=r"^rollout: not a directory: "):
        run(lambda: RolloutRecorder.create(SID, root=blocker))


def test_failure_message_is_one_line_for_a_person() -> None:
    assert failure_message(OSError(errno.ENOSPC, "No space left on device"), "/x/r.jsonl") == \
        "rollout: no space left on device: /x/r.jsonl"
    assert failure_message(OSError("odd"), "/p") == "rollout: odd: /p"


def test_resume_drops_a_partly_written_last_line(tmp_path) -> None:
    path = tmp_path / "r.jsonl"
    whole = json.dumps({"id": str(SID)}) + "\n" + json.dumps(user_item("kept")) + "\n"
    path.write_text(whole + '{"type":"message","role":"assis')  # killed mid-write

    async def main():
        rec, saved = await RolloutRecorder.resume(path)
        assert saved.items == [user_item("kept")]
        rec.record_items([user_item("next")])
        await rec.shutdown()

    run(main)
    assert path.read_text().startswith(whole)
    assert read_rollout(path).items == [user_item("kept"), user_item("next")]


def test_frontends_do_not_end_a_turn_on_a_rollout_error() -> None:
    event = Event(id="1", msg=ErrorEvent("rollout: no space left on device: /h/s/r.jsonl"))
    assert rollout_failed(event) and turn_end(event) is None
    other = Event(id="1", msg=ErrorEvent("stream disconnected"))
    assert not rollout_failed(other) and turn_end(other) == 1


# -- in a session ---------------------------------------------------------------------


def test_session_goes_on_when_the_rollout_fills_up_mid_turn(server, tmp_path, monkeypatch) -> None:
    server.script(response(call("shell", {"command": ["ls"]}, "c1")), response(assistant("Listed.")),
                  response(assistant("Still answering.")))

    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        await h.configure()
        # The session line and the user's message fit; the model's call does not.
        full_disk_after(monkeypatch, whole_writes=1)
        sub_id = await h.say("list")
        await h.until(lambda e: e.id == sub_id and tag(e) == "task_complete")
        errors = h.of("error")
        assert len(errors) == 1 and errors[0].message.startswith("rollout: no space left on device: ")
        assert [e.id for e in h.events if tag(e) == "error"] == [sub_id]
        # It came before the call's events, and the task went on past it.
        tags = h.tags(sub_id, deltas=False)
        assert tags.index("error") < tags.index("exec_command_begin") < tags.index("task_complete")
        later = await h.say("more")
        assert tag(await h.done(later)) == "task_complete"
        assert len(h.of("error")) == 1  # said once
        await h.submit(Shutdown())
        assert tag(h.events[-1]) == "shutdown_complete"

    run(main)
    # The conversation went on in memory: the model saw all of it.
    assert [i["type"] for i in conversation(server.requests[-1]["json"]["input"])] == [
        "message", "function_call", "function_call_output", "message", "message"]
    (path,) = (tmp_path / "home" / "sessions").rglob("rollout-*.jsonl")
    items = read_rollout(path).items  # the environment (told at configure), then the message that fit
    assert len(items) == 2 and conversation(items) == [user_item("list")]


def test_session_without_a_rollout_says_so_after_configured(server, tmp_path) -> None:
    server.script(response(assistant("Hi.")))

    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        (h.home).mkdir(parents=True)
        (h.home / "sessions").write_text("not a directory")
        sub_id = await h.submit(h.configure_op())
        assert h.tags(sub_id) == ["session_configured", "error"]
        assert h.last(sub_id).msg.message.startswith("rollout: not a directory: ")
        assert tag(await h.done(await h.say("hi"))) == "task_complete"
        assert len(h.of("error")) == 1

    run(main)


def test_turn_end_syncs_before_task_complete(server, tmp_path, monkeypatch) -> None:
    server.script(response(assistant("Done.")))
    order: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(rollout_module.os, "fsync", lambda fd: (order.append("fsync"), real_fsync(fd)))

    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        h.session._emit = lambda event: (order.append(tag(event)), h.events.append(event))
        await h.configure()
        await h.done(await h.say("go"))

    run(main)
    assert order.index("fsync") < order.index("task_complete")
    assert order.index("fsync") > order.index("agent_message")
