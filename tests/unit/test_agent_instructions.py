"""agent.instructions (AGENTS.md, the instructions per tool mode, the environment context) and agent.notify (the turn-complete hook)."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

from agent.instructions import (
    BASE_INSTRUCTIONS,
    PROJECT_DOC_SEPARATOR,
    EnvironmentContext,
    base_instructions,
    full_instructions,
    is_environment_context,
    user_shell,
)
from agent.instructions import project_doc as _project_doc
from agent.instructions import user_instructions as _user_instructions
from agent.notify import spawn_notifier, turn_complete_payload
from agent.sandbox_files import SandboxFiles
from broker.wire.protocol import AskForApproval
from agent.tools import tools_for
from landlock_helper.policy import WRITE_FOLDER, Permission, SandboxPolicy
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


def test_full_instructions_are_the_base_then_the_users() -> None:
    assert full_instructions("be brief") == BASE_INSTRUCTIONS + "\n\nbe brief"
    assert full_instructions(None, base="You are X.") == "You are X."


@pytest.mark.parametrize(("mode", "described", "not_described"), [
    ("off", ["`shell`"], ["`unified_exec`", "`exec_command`", "`write_stdin`"]),
    ("seed", ["`shell`", "`unified_exec`"], ["`exec_command`", "`write_stdin`"]),
    ("codex", ["`exec_command`", "`write_stdin`"], ["`shell`", "argv array", "`unified_exec`"]),
])
def test_each_tool_mode_describes_the_tools_it_offers(mode, described, not_described) -> None:
    text = base_instructions(mode)
    offered = {t["name"] for t in tools_for(AskForApproval.ON_REQUEST, SandboxPolicy.from_mode("workspace-write"), mode)}
    assert {f"`{name}`" for name in offered} == {d for d in described} | {"`apply_patch`", "`update_plan`"}
    for name in [*described, "`apply_patch`", "`update_plan`"]:
        assert f"- {name} " in text, name
    for words in not_described:
        assert words not in text, words
    assert "<environment_context>" in text and BASE_INSTRUCTIONS == base_instructions("seed")


def test_environment_context_is_codexs_xml() -> None:
    policy = SandboxPolicy.from_mode("workspace-write")
    context = EnvironmentContext.of("/repo", AskForApproval.ON_REQUEST, policy, "bash")
    assert context.serialize() == (
        "<environment_context>\n"
        "  <cwd>/repo</cwd>\n"
        "  <approval_policy>on-request</approval_policy>\n"
        "  <sandbox_mode>workspace-write</sandbox_mode>\n"
        "  <network_access>restricted</network_access>\n"
        "  <shell>bash</shell>\n"
        "</environment_context>")
    assert context.item() == {"type": "message", "role": "user",
                              "content": [{"type": "input_text", "text": context.serialize()}]}
    assert is_environment_context(context.item()) and not is_environment_context(
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]})
    # The roots the policy names beyond the workspace's own are listed; full access has network.
    wider = SandboxPolicy.of([*policy.permissions, Permission(WRITE_FOLDER, "/data"), Permission(WRITE_FOLDER, "/c")])
    assert EnvironmentContext.of("/repo", AskForApproval.NEVER, wider, "zsh").serialize() == (
        "<environment_context>\n  <cwd>/repo</cwd>\n  <approval_policy>never</approval_policy>\n"
        "  <sandbox_mode>workspace-write</sandbox_mode>\n  <network_access>restricted</network_access>\n"
        "  <writable_roots>\n    <root>/data</root>\n    <root>/c</root>\n  </writable_roots>\n"
        "  <shell>zsh</shell>\n</environment_context>")
    full = EnvironmentContext.of("/", AskForApproval.UNTRUSTED, SandboxPolicy.from_mode("danger-full-access"), "sh")
    assert "  <sandbox_mode>danger-full-access</sandbox_mode>\n  <network_access>enabled</network_access>\n" \
        in full.serialize() and "<approval_policy>untrusted</approval_policy>" in full.serialize()
    read_only = EnvironmentContext.of("/", AskForApproval.ON_FAILURE, SandboxPolicy.from_mode("read-only"), "sh")
    assert "<sandbox_mode>read-only</sandbox_mode>" in read_only.serialize()


def test_environment_context_diff_names_what_changed() -> None:
    policy = SandboxPolicy.from_mode("workspace-write")
    before = EnvironmentContext.of("/repo", AskForApproval.ON_REQUEST, policy, "bash")
    assert before.diff(before) is None
    moved = EnvironmentContext.of("/elsewhere", AskForApproval.ON_REQUEST, policy, "bash")
    assert moved.diff(before).serialize() == (
        "<environment_context>\n  <cwd>/elsewhere</cwd>\n  <shell>bash</shell>\n</environment_context>")
    opened = EnvironmentContext.of("/repo", AskForApproval.NEVER, SandboxPolicy.from_mode("danger-full-access"), "bash")
    assert opened.diff(before).serialize() == (
        "<environment_context>\n  <approval_policy>never</approval_policy>\n"
        "  <sandbox_mode>danger-full-access</sandbox_mode>\n  <network_access>enabled</network_access>\n"
        "  <shell>bash</shell>\n</environment_context>")


def test_user_shell_is_a_name_codex_knows() -> None:
    assert user_shell() in ("bash", "zsh", "sh")


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
