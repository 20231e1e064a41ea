"""A model server that misbehaves inside a stream: a ``data:`` line that is not JSON is
skipped (and logged) and the turn completes; nothing of it reaches the user as an error.

Real processes: a daemon with its agent, ``sluice exec``, the scripted model on loopback
(tests/support/fake_model.py). How the SSE decoder copes with cuts and sizes is in
tests/unit/test_sse.py.
"""

from __future__ import annotations

import pytest

from tests.support.fake_model import sse, sse_frame
from tests.support.frontends import Frontends, json_events, tag

pytestmark = pytest.mark.timeout(90)


def test_a_data_line_that_is_not_json_mid_stream_is_skipped_and_the_turn_completes(daemon_factory, server,
                                                                                  tmp_path) -> None:
    handle = daemon_factory.start(executors=1)
    message = {"type": "message", "id": "msg_1", "role": "assistant",
               "content": [{"type": "output_text", "text": "Still here.", "annotations": []}]}
    server.script(sse([
        sse_frame({"type": "response.created", "response": {"id": "r1"}}),
        sse_frame({"type": "response.output_text.delta", "delta": "Still "}),
        b"event: response.output_text.delta\ndata: {this is not json\n\n",
        sse_frame({"type": "response.output_text.delta", "delta": "here."}),
        sse_frame({"type": "response.output_item.done", "item": message}),
        sse_frame({"type": "response.completed", "response": {"id": "r1"}}),
    ]))
    fe = Frontends(handle.runtime, server, tmp_path / "fe-home")
    work = tmp_path / "work"
    work.mkdir()
    p = fe.run("exec", "--json", "--approval-policy", "never", "-C", str(work), "hello", timeout=60)
    assert p.returncode == 0, p.stderr
    events = json_events(p.stdout)
    tags = [tag(e) for e in events]
    assert "task_complete" in tags and "error" not in tags, tags
    assert [e.msg.delta for e in events if tag(e) == "agent_message_delta"] == ["Still ", "here."]
    assert len(server.requests) == 1  # not retried: the stream was fine but for that line
