"""Driving agent sessions through the client library: a configure_session for the scripted
model, and collecting a session's events until one that matters."""

from __future__ import annotations

import time

from broker.wire.protocol import AskForApproval, ConfigureSession, ModelProviderInfo, WireApi
from landlock_helper.policy import SandboxPolicy
from tests.support.fake_model import FakeModelServer, tag

KEY = "sk-sessions-test-7c1d0e"


def configure_op(server: FakeModelServer, cwd: str, **fields) -> ConfigureSession:
    values = {
        "provider": ModelProviderInfo(name="fake", base_url=server.base_url, env_key="FAKE_KEY",
                                      wire_api=WireApi.RESPONSES, stream_max_retries=2, request_max_retries=2),
        "model": "test-model",
        "approval_policy": AskForApproval.NEVER,
        "sandbox_policy": SandboxPolicy.from_mode("workspace-write"),
        "cwd": cwd,
        "api_key": KEY,
    }
    values.update(fields)
    return ConfigureSession(**values)


def collect(session, until, timeout: float = 20.0) -> list:
    """Events until one matches ``until`` (a tag or a predicate), that one included."""
    check = (lambda e: tag(e) == until) if isinstance(until, str) else until
    events = []
    deadline = time.monotonic() + timeout
    while True:
        event = session.next_event(max(0.0, deadline - time.monotonic()))
        if event is None:
            raise AssertionError(f"no {until}; got {[tag(e) for e in events]}: {events[-3:]}")
        events.append(event)
        if check(event):
            return events
