"""The reasoning settings: model_reasoning_effort / model_reasoning_summary go to the model
as the Responses API's ``reasoning``, show_raw_agent_reasoning lets the raw reasoning text
through as events, hide_agent_reasoning keeps reasoning off a person's screen.

The session runs in-process against the scripted model server; what ``sluice exec``
shows of the reasoning is tested through the real daemon in tests/integration/test_exec.py.
"""

from __future__ import annotations

import asyncio

import pytest

from broker.cli.config import ConfigError, load_config
from agent.model_client import reasoning_param
from broker.wire.protocol import (
    ConfigureSession,
    ReasoningEffort,
    ReasoningSummary,
    decode_submission_json,
    encode_json,
)
from tests.support.fake_model import FakeRunner, Harness, assistant, response, sse, sse_frame

pytestmark = pytest.mark.timeout(60)


def run(test):
    return asyncio.run(test())


# -- which models get which settings --------------------------------------------------


@pytest.mark.parametrize(
    ("model", "effort", "summary", "expected"),
    [
        ("o4-mini", None, None, {"effort": "medium", "summary": "auto"}),
        ("o3", "high", "detailed", {"effort": "high", "summary": "detailed"}),
        ("codex-mini-latest", "low", None, {"effort": "low", "summary": "auto"}),
        ("gpt-5", None, "concise", {"effort": "medium", "summary": "concise"}),
        ("gpt-5", "minimal", "none", {"effort": "minimal"}),
        ("o4-mini", "none", "detailed", None),
        ("gpt-4.1", "high", "detailed", None),
        ("test-model", None, None, None),
    ],
)
def test_reasoning_param_follows_the_model_and_the_settings(model, effort, summary, expected):
    assert reasoning_param(model, effort, summary) == expected


# -- the request the model gets --------------------------------------------------------


def _one_turn(server, tmp_path, **configure):
    server.script(response(assistant("ok")))

    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        await h.configure(**configure)
        await h.done(await h.say("hi"))
        return h

    run(main)
    return server.requests[-1]["json"]


def test_a_reasoning_model_gets_the_configured_effort_and_summary(server, tmp_path):
    body = _one_turn(server, tmp_path, model="o4-mini", model_reasoning_effort=ReasoningEffort.HIGH,
                     model_reasoning_summary=ReasoningSummary.DETAILED)
    assert body["reasoning"] == {"effort": "high", "summary": "detailed"}


def test_a_reasoning_model_gets_the_defaults(server, tmp_path):
    assert _one_turn(server, tmp_path, model="o4-mini")["reasoning"] == {"effort": "medium", "summary": "auto"}


def test_effort_none_and_other_models_send_no_reasoning(server, tmp_path):
    assert "reasoning" not in _one_turn(server, tmp_path, model="o4-mini", model_reasoning_effort=ReasoningEffort.NONE)
    assert "reasoning" not in _one_turn(server, tmp_path, model="gpt-4.1",
                                        model_reasoning_effort=ReasoningEffort.HIGH)


# -- raw reasoning events --------------------------------------------------------------


def _raw_reasoning_response():
    item = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "**Plan**"}],
            "content": [{"type": "reasoning_text", "text": "first I look"}]}
    frames = [sse_frame({"type": "response.created", "response": {"id": "r1"}}),
              sse_frame({"type": "response.reasoning_text.delta", "delta": "first I look"}),
              sse_frame({"type": "response.output_item.done", "item": item}),
              sse_frame({"type": "response.output_item.done", "item": assistant("done")}),
              sse_frame({"type": "response.completed", "response": {"id": "r1"}})]
    return sse(frames)


@pytest.mark.parametrize("show_raw", [False, True])
def test_raw_reasoning_events_only_when_asked(server, tmp_path, show_raw):
    server.script(_raw_reasoning_response())

    async def main():
        h = Harness(server, FakeRunner(), tmp_path)
        await h.configure(model="o4-mini", **({"show_raw_agent_reasoning": True} if show_raw else {}))
        await h.done(await h.say("hi"))
        return h

    h = run(main)
    assert [m.text for m in h.of("agent_reasoning")] == ["**Plan**"]  # the summary, always
    raw = [m.text for m in h.of("agent_reasoning_raw_content")]
    deltas = [m.delta for m in h.of("agent_reasoning_raw_content_delta")]
    if show_raw:
        assert raw == ["first I look"] and deltas == ["first I look"]
    else:
        assert raw == [] and deltas == []


# -- configuration and protocol --------------------------------------------------------


def test_config_takes_the_settings_and_refuses_unknown_values(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text('model_reasoning_effort = "high"\nmodel_reasoning_summary = "concise"\n'
                                      "hide_agent_reasoning = true\nshow_raw_agent_reasoning = true\n")
    config = load_config(env={"SLUICE_HOME": str(home)})
    assert (config.model_reasoning_effort, config.model_reasoning_summary) == ("high", "concise")
    assert config.hide_agent_reasoning and config.show_raw_agent_reasoning
    (home / "config.toml").write_text('model_reasoning_effort = "extreme"\n')
    with pytest.raises(ConfigError, match="model_reasoning_effort must be one of minimal, low, medium, high, none"):
        load_config(env={"SLUICE_HOME": str(home)})


def test_configure_session_carries_the_settings_only_when_set():
    data = (b'{"id":"0","op":{"type":"configure_session","provider":{"name":"p","base_url":"http://x",'
            b'"wire_api":"responses"},"model":"o3","model_reasoning_effort":"low",'
            b'"model_reasoning_summary":"none","approval_policy":"never",'
            b'"sandbox_policy":{"permissions":[]},"cwd":"/w","show_raw_agent_reasoning":true}}')
    sub = decode_submission_json(data)
    assert isinstance(sub.op, ConfigureSession)
    assert sub.op.model_reasoning_effort is ReasoningEffort.LOW
    assert sub.op.model_reasoning_summary is ReasoningSummary.NONE
    assert sub.op.show_raw_agent_reasoning is True
    encoded = encode_json(sub)
    assert b'"model":"o3","model_reasoning_effort":"low","model_reasoning_summary":"none",' in encoded
    assert encoded.endswith(b'"show_raw_agent_reasoning":true}}')
    unset = data.replace(b'"model_reasoning_effort":"low","model_reasoning_summary":"none",', b"")
    unset = unset.replace(b',"show_raw_agent_reasoning":true', b"")
    assert b"reasoning" not in encode_json(decode_submission_json(unset))
    with pytest.raises(ValueError, match="extreme"):
        decode_submission_json(data.replace(b'"low"', b'"extreme"'))
