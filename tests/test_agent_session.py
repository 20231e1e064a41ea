"""agent.session: the Codex session loop driven in-process.

A scripted model server on loopback (``tests/fake_model.py``) answers the model requests;
a fake runner answers the commands. Each test submits Codex submissions and checks the
emitted events (their ``type`` tags and key fields) and what the model was sent.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agent.instructions import PROJECT_DOC_SEPARATOR
from agent.rollout import read_rollout
from agent.session import NO_SESSION, TURN_INTERRUPTED, Session
from agent.turn import COMPACT_DONE, START_SUMMARIZATION, SUMMARIZATION_PROMPT
from broker.protocol import (
    AddToHistory,
    AskForApproval,
    Compact,
    ConfigureSession,
    Event,
    ExecApproval,
    GetHistoryEntryRequest,
    Interrupt,
    ModelProviderInfo,
    PatchApproval,
    ReviewDecision,
    Shutdown,
    Submission,
    TextInput,
    UserInput,
    WireApi,
    encode_json,
    sandbox_policy_from_mode,
)
from tests.fake_model import (
    FakeExec,
    FakeModelServer,
    FakeRunner,
    assistant,
    call,
    gated,
    local_shell_call,
    reasoning,
    response,
    status,
    usage,
)

pytestmark = pytest.mark.timeout(30)

API_KEY = "sk-session-test-5f2c9e1d"


def tag(event: Event) -> str:
    return type(event.msg).__struct_config__.tag


class Harness:
    """One Session over ``server`` and ``runner``, with its events collected."""

    def __init__(self, server: FakeModelServer, runner: FakeRunner, tmp_path: Path, **kwargs: Any) -> None:
        self.server = server
        self.runner = runner
        self.home = tmp_path / "home"
        self.cwd = tmp_path / "work"
        self.cwd.mkdir(exist_ok=True)
        self.events: list[Event] = []
        self.session = Session(self.events.append, runner, home=self.home, env={}, backoff_base=0.001, **kwargs)
        self._next = 0

    def configure_op(self, **overrides: Any) -> ConfigureSession:
        fields: dict[str, Any] = {
            "provider": ModelProviderInfo(name="fake", base_url=self.server.base_url, env_key="FAKE_KEY",
                                          wire_api=WireApi.RESPONSES),
            "model": "test-model",
            "approval_policy": AskForApproval.ON_REQUEST,
            "sandbox_policy": sandbox_policy_from_mode("workspace-write"),
            "cwd": str(self.cwd),
            "api_key": API_KEY,
        }
        fields.update(overrides)
        return ConfigureSession(**fields)

    async def submit(self, op: Any, sub_id: str | None = None) -> str:
        if sub_id is None:
            self._next += 1
            sub_id = f"s{self._next}"
        await self.session.submit(Submission(sub_id, op))
        return sub_id

    async def configure(self, **overrides: Any) -> Event:
        sub_id = await self.submit(self.configure_op(**overrides))
        return self.last(sub_id)

    async def say(self, text: str) -> str:
        return await self.submit(UserInput([TextInput(text)]))

    async def until(self, predicate: str | Callable[[Event], bool], timeout: float = 10.0, after: int = 0) -> Event:
        """The first event (from index ``after``) with that tag / matching, waiting for it."""
        check = (lambda e: tag(e) == predicate) if isinstance(predicate, str) else predicate
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            for event in self.events[after:]:
                if check(event):
                    return event
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"no {predicate} event; got {self.tags()}")
            await asyncio.sleep(0.002)

    async def done(self, sub_id: str, timeout: float = 10.0) -> Event:
        """The task's final event: task_complete, turn_aborted or an error."""
        return await self.until(
            lambda e: e.id == sub_id and tag(e) in ("task_complete", "turn_aborted", "error"), timeout)

    def last(self, sub_id: str) -> Event:
        return [e for e in self.events if e.id == sub_id][-1]

    def tags(self, sub_id: str | None = None, *, deltas: bool = True) -> list[str]:
        out = [tag(e) for e in self.events if sub_id is None or e.id == sub_id]
        if not deltas:
            out = [t for t in out if not t.endswith("_delta")]
        return out

    def of(self, kind: str, sub_id: str | None = None) -> list[Any]:
        return [e.msg for e in self.events if tag(e) == kind and (sub_id is None or e.id == sub_id)]

    def request(self, index: int) -> dict[str, Any]:
        return self.server.requests[index]["json"]


def run(test: Callable[..., Any]) -> Any:
    return asyncio.run(test())


@pytest.fixture
def server():
    with FakeModelServer() as s:
        yield s


def user_item(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def outputs_of(request: dict[str, Any]) -> dict[str, str]:
    return {i["call_id"]: i["output"] for i in request["input"] if i["type"] == "function_call_output"}


# -- configure ------------------------------------------------------------------------


def test_configure_answers_session_configured(server, tmp_path) -> None:
    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        event = await h.configure()
        assert tag(event) == "session_configured"
        assert event.msg.session_id == h.session.session_id and isinstance(event.msg.session_id, uuid.UUID)
        assert (event.msg.model, event.msg.history_log_id, event.msg.history_entry_count) == ("test-model", 0, 0)
        text = encode_json(event).decode()
        assert text == (f'{{"id":"s1","msg":{{"type":"session_configured","session_id":"{h.session.session_id}",'
                        '"model":"test-model","history_log_id":0,"history_entry_count":0}}')

    run(main)


def test_relative_cwd_and_ops_before_configure_are_errors(server, tmp_path) -> None:
    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        for op in (UserInput([TextInput("hi")]), Interrupt(), Compact(),
                   ExecApproval("x", ReviewDecision.APPROVED), PatchApproval("x", ReviewDecision.DENIED)):
            sub_id = await h.submit(op)
            assert tag(h.last(sub_id)) == "error" and h.last(sub_id).msg.message == NO_SESSION
        sub_id = await h.submit(h.configure_op(cwd="relative/dir"))
        assert h.last(sub_id).msg.message == "cwd is not absolute: 'relative/dir'"
        sub_id = await h.submit(h.configure_op(cwd=str(tmp_path / "missing")))
        assert tag(h.last(sub_id)) == "error" and "not a directory" in h.last(sub_id).msg.message
        assert h.session.config is None and not server.requests
        assert tag(await h.configure()) == "session_configured"

    run(main)


# -- a task ---------------------------------------------------------------------------


def test_user_input_runs_a_task_with_text_tokens_and_instructions(server, tmp_path) -> None:
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "AGENTS.md").write_text("Always run the tests.")
    server.script(response(reasoning("**Looking**"), assistant("Hello there."), deltas=["Hello ", "there."],
                           reasoning_deltas=["**Look", "ing**"]))

    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        await h.configure(instructions="Be brief.")
        sub_id = await h.say("hi")
        done = await h.done(sub_id)
        assert tag(done) == "task_complete" and done.msg.last_agent_message == "Hello there."
        assert h.tags(sub_id) == [
            "task_started", "agent_reasoning_delta", "agent_reasoning_delta", "agent_message_delta",
            "agent_message_delta", "agent_reasoning", "agent_message", "token_count", "task_complete",
        ]
        assert [m.delta for m in h.of("agent_message_delta")] == ["Hello ", "there."]
        assert h.of("agent_reasoning")[0].text == "**Looking**"
        tokens = h.of("token_count")[0]
        assert (tokens.input_tokens, tokens.cached_input_tokens, tokens.output_tokens,
                tokens.reasoning_output_tokens, tokens.total_tokens) == (12, 4, 7, 2, 19)
        assert not h.session.running
        return h

    h = run(main)
    (request,) = server.requests
    assert request["path"] == "/v1/responses"
    assert request["headers"]["authorization"] == f"Bearer {API_KEY}"
    body = request["json"]
    assert body["model"] == "test-model" and body["stream"] is True
    assert body["input"] == [user_item("hi")]
    assert "Be brief." + PROJECT_DOC_SEPARATOR + "Always run the tests." in body["instructions"]
    assert f"working directory: {tmp_path / 'work'}" in body["instructions"]
    assert [t["name"] for t in body["tools"]] == ["shell", "apply_patch", "update_plan"]
    shell = body["tools"][0]["parameters"]["properties"]
    assert "with_escalated_permissions" in shell and "justification" in shell  # on-request offers escalation
    # The reasoning and the assistant message join the conversation, without their ids.
    assert h.session.history == [
        user_item("hi"),
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "**Looking**"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello there."}]},
    ]
