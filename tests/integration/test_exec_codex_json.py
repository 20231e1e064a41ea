"""``sluice exec --json=codex`` prints what Codex 0.169's ``codex exec --json`` prints: each
scenario of tests/support/codex_json_scenarios.py (a shell command with a plan and reasoning,
an apply_patch, an MCP call, a failed turn) through the real daemon and the scripted model,
compared line for line and field for field with Codex's own output on the same script
(tests/golden/codex_json/<scenario>.codex.jsonl, recorded by record.py there), both sides
normalised alike and only for what varies (thread id, workspace path, the order of a
patch's files, Codex's note about the scripted model's metadata); and ``sluice attach
--json=codex`` to a detached task prints the same; ``sluice exec --session`` opens with the
thread it continues.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.integration.test_exec import Frontend
from tests.support.codex_json_scenarios import (
    PROMPT,
    SCENARIOS,
    answer,
    encode_lines,
    golden_path,
    make_workspace,
    mcp_table,
    normalise,
    workspace_state,
)
from tests.support.fake_model import assistant
from tests.support.harness import daemons, sluice_argv

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def dmn():
    with daemons() as factory:
        yield factory.start(executors=2)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_exec_json_codex_prints_what_codex_prints(dmn, server, tmp_path, name) -> None:
    scenario = SCENARIOS[name]
    work = tmp_path / "work"
    make_workspace(scenario, work)
    config = 'unified_exec = "codex"\n' + (mcp_table() if scenario.mcp else "")
    fe = Frontend(dmn.runtime, server, tmp_path / "fe-home", extra_config=config)
    server.script(*scenario.script("sluice"))

    p = fe.run("--json=codex", "-s", "workspace-write", "-a", "never", "-C", str(work), PROMPT, timeout=60)

    assert p.returncode == scenario.exit_code, p.stderr
    assert encode_lines(normalise(p.stdout, work)).splitlines() == golden_path(name).read_text().splitlines()
    assert workspace_state(scenario, work) == scenario.after


def test_json_seed_spells_the_default_seed_events(dmn, server, tmp_path) -> None:
    scenario = SCENARIOS["shell"]
    outputs = {}
    for spelling in ("--json", "--json=seed"):
        work = tmp_path / spelling / "work"
        make_workspace(scenario, work)
        fe = Frontend(dmn.runtime, server, tmp_path / spelling / "fe-home", extra_config='unified_exec = "codex"\n')
        server.script(*scenario.script("sluice"))
        p = fe.run(spelling, "-s", "workspace-write", "-a", "never", "-C", str(work), PROMPT, timeout=60)
        assert p.returncode == 0, p.stderr
        types = [json.loads(line)["msg"]["type"] for line in p.stdout.splitlines()]
        outputs[spelling] = [t for t in types if not t.endswith("_delta")]  # output comes in chunks as it may
    assert outputs["--json"] == outputs["--json=seed"]
    assert outputs["--json"][0] == "session_configured"
    assert "exec_command_end" in outputs["--json"]


def test_attach_json_codex_prints_the_same_for_a_detached_task(dmn, server, tmp_path) -> None:
    scenario = SCENARIOS["shell"]
    work = tmp_path / "work"
    make_workspace(scenario, work)
    fe = Frontend(dmn.runtime, server, tmp_path / "fe-home", extra_config='unified_exec = "codex"\n')
    server.script(*scenario.script("sluice"))
    detached = fe.run("--detach", "-s", "workspace-write", "-a", "never", "-C", str(work), PROMPT)
    assert detached.returncode == 0, detached.stderr
    session_id = detached.stdout.strip()

    p = subprocess.run([*sluice_argv(), "attach", session_id, "--json=codex", "--until-idle"], env=fe.env,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)

    assert p.returncode == 0, p.stderr
    assert encode_lines(normalise(p.stdout, work)).splitlines() == golden_path("shell").read_text().splitlines()


def test_exec_session_json_codex_opens_with_the_thread_it_continues(dmn, server, tmp_path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    fe = Frontend(dmn.runtime, server, tmp_path / "fe-home")
    server.script(answer(assistant("first")), answer(assistant("second")))
    detached = fe.run("--detach", "-a", "never", "-C", str(work), "the first task")
    assert detached.returncode == 0, detached.stderr
    session_id = detached.stdout.strip()
    idle = subprocess.run([*sluice_argv(), "attach", session_id, "--until-idle"], env=fe.env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert idle.returncode == 0, idle.stderr

    p = fe.run("--session", session_id, "--json=codex", "the second task")

    assert p.returncode == 0, p.stderr
    assert [json.loads(line) for line in p.stdout.splitlines()] == [
        {"type": "thread.started", "thread_id": session_id},
        {"type": "turn.started"},
        {"type": "item.completed", "item": {"id": "item_0", "type": "agent_message", "text": "second"}},
        # This run's token counts (fake_model.USAGE), not the first task's.
        {"type": "turn.completed", "usage": {"input_tokens": 12, "cached_input_tokens": 4,
                                             "cache_write_input_tokens": 0, "output_tokens": 7,
                                             "reasoning_output_tokens": 2}},
    ]
