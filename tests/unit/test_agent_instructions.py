"""agent.instructions (AGENTS.md, environment) and agent.notify (the turn-complete hook)."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

from agent.instructions import (
    BASE_INSTRUCTIONS,
    PROJECT_DOC_SEPARATOR,
    full_instructions,
)
from agent.instructions import project_doc as _project_doc
from agent.instructions import user_instructions as _user_instructions
from agent.notify import spawn_notifier, turn_complete_payload
from agent.sandbox_files import SandboxFiles
from broker.wire.protocol import AskForApproval
from landlock_helper.policy import SandboxPolicy
from tests.support.fake_model import FakeRunner

pytestmark = pytest.mark.timeout(20)


# The docs are read by a batch of file operations in the session's sandbox (see
# tests/integration/test_containment_agent.py); here the batch runs in this process.
def _files() -> SandboxFiles:
    return SandboxFiles(FakeRunner(), SandboxPolicy.from_mode("workspace-write"), "/")


def project_doc(cwd, **kwargs) -> str | None:
    return asyncio.run(_project_doc(_files(), cwd, **kwargs))


def user_instructions(configured, cwd) -> str | None:
    return asyncio.run(_user_instructions(configured, cwd, _files()))


def test_project_doc_from_git_root_and_cwd(tmp_path) -> None:
    repo = tmp_path / "repo"
    sub = repo / "pkg" / "sub"
    sub.mkdir(parents=True)
    (repo / ".git").mkdir()
    assert project_doc(sub) is None
    (repo / "AGENTS.md").write_text("root rules")
    assert project_doc(sub) == "root rules"
    (sub / "AGENTS.md").write_text("sub rules")
    assert project_doc(sub) == "root rules\n\nsub rules"
    assert project_doc(repo) == "root rules"
    # An intermediate directory's file is not read; an empty file is skipped.
    (repo / "pkg" / "AGENTS.md").write_text("not me")
    (sub / "AGENTS.md").write_text("  \n")
    assert project_doc(sub) == "root rules"


def test_project_doc_without_git_is_cwd_only_and_capped(tmp_path) -> None:
    (tmp_path / "AGENTS.md").write_text("x" * 100)
    inner = tmp_path / "inner"
    inner.mkdir()
    assert project_doc(inner) is None
    assert project_doc(tmp_path, max_bytes=10) == "x" * 10


def test_project_doc_is_a_regular_file_or_nothing(tmp_path) -> None:
    os.mkfifo(tmp_path / "AGENTS.md")  # nobody writes it: reading must not wait
    assert project_doc(tmp_path) is None
    os.unlink(tmp_path / "AGENTS.md")
    (tmp_path / "AGENTS.md").mkdir()
    assert project_doc(tmp_path) is None
    os.rmdir(tmp_path / "AGENTS.md")
    (tmp_path / "real.md").write_text("through a link")
    os.symlink("real.md", tmp_path / "AGENTS.md")
    assert project_doc(tmp_path) == "through a link"


def test_user_instructions_joins_configured_and_project(tmp_path) -> None:
    assert user_instructions(None, tmp_path) is None
    assert user_instructions("be brief", tmp_path) == "be brief"
    (tmp_path / "AGENTS.md").write_text("use tabs")
    assert user_instructions(None, tmp_path) == "use tabs"
    assert user_instructions("be brief", tmp_path) == "be brief" + PROJECT_DOC_SEPARATOR + "use tabs"


def test_full_instructions_has_base_user_and_environment(tmp_path) -> None:
    policy = SandboxPolicy.from_mode("workspace-write")
    text = full_instructions("be brief", str(tmp_path), AskForApproval.ON_REQUEST, policy)
    assert text.startswith(BASE_INSTRUCTIONS)
    assert "\n\nbe brief\n\n" in text
    assert f"- working directory: {tmp_path}" in text and "- approval policy: on-request" in text
    assert str(tmp_path) in text.split("- sandbox: ")[1] and "- network access: restricted" in text
    full = full_instructions(None, "/", AskForApproval.NEVER, SandboxPolicy.from_mode("danger-full-access"))
    assert "no sandbox" in full and "network access: enabled" in full


def test_notify_payload_is_codex_shaped() -> None:
    assert turn_complete_payload("3", ["fix it"], None) == (
        '{"type":"agent-turn-complete","turn-id":"3","input-messages":["fix it"],"last-assistant-message":null}'
    )


def test_notify_spawns_with_the_json_argument(tmp_path) -> None:
    out = tmp_path / "got.json"
    script = "import sys, pathlib; pathlib.Path(sys.argv[1]).write_text(sys.argv[2])"

    async def main():
        payload = turn_complete_payload("7", ["a", "b"], "done")
        process = await spawn_notifier([sys.executable, "-c", script, str(out)], payload)
        assert process is not None
        await asyncio.wait_for(process.wait(), 10)
        assert await spawn_notifier(["/no/such/notifier"], payload) is None
        assert await spawn_notifier([], payload) is None

    asyncio.run(main())
    assert json.loads(out.read_text()) == {
        "type": "agent-turn-complete", "turn-id": "7", "input-messages": ["a", "b"], "last-assistant-message": "done",
    }
