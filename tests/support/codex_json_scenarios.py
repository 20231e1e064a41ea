"""The scripted scenarios behind tests/golden/codex_json: one model script each, played to Codex
0.169's ``codex exec --json`` (tests/golden/codex_json/record.py) and to ``sluice exec
--json=codex`` (tests/integration/test_exec_codex_json.py), and :func:`normalise`, which
keeps of their JSON lines all that does not vary from run to run.

Both get the same answers from the model, the same files in their workspace and the same MCP
server (tests/support/fake_mcp_server.py, with only its ``add`` tool listed); the one thing
the model says differently is an MCP call's name: Codex offers a server's tools in a
namespace (``add`` in ``mcp__fake``), sluice as ``fake__add``. Codex runs with the plan
tool on (``tools.update_plan``, off by default in 0.169's ``exec``) and the MCP server's
calls approved (``default_tools_approval_mode``: ``exec`` runs under ``never``, where Codex
refuses an MCP call that needs approval); sluice offers Codex's tools
(``unified_exec = "codex"``) and runs under ``-a never``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.fake_model import Step, assistant, call, reasoning, response, sse, sse_frame
from tests.support.harness import SANDBOX_PYTHON

CODEX_VERSION = "0.169.0"
MCP_SOURCE = (Path(__file__).resolve().parent / "fake_mcp_server.py").read_text()
MCP_ENV = {"FAKE_MCP_TOOLS": "add"}
PROMPT = "Do what the script says."


def answer(*items: dict[str, Any]) -> Step:
    # No text deltas: Codex wants an output_item.added before them; the items are what counts.
    return response(*items, deltas=[])


def exec_command(cmd: str, call_id: str) -> dict[str, Any]:
    # Not a login shell: the machine's profile scripts would speak in the output.
    return call("exec_command", {"cmd": cmd, "login": False}, call_id)


def plan(call_id: str, *steps: tuple[str, str]) -> dict[str, Any]:
    return call("update_plan", {"plan": [{"step": step, "status": status} for step, status in steps]}, call_id)


def mcp_call(implementation: str, server: str, tool: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    if implementation == "codex":
        return {**call(tool, arguments, call_id), "namespace": f"mcp__{server}"}
    return call(f"{server}__{tool}", arguments, call_id)


def refused(message: str) -> Step:
    """A ``response.failed`` that no retry can cure: the turn fails with ``message``."""
    return sse([sse_frame({"type": "response.created", "response": {"id": "resp_f"}}),
                sse_frame({"type": "response.failed",
                           "response": {"id": "resp_f", "error": {"code": "invalid_prompt", "message": message}}})])


PATCH = """apply_patch <<'EOF'
*** Begin Patch
*** Add File: hello.txt
+hello
*** Update File: notes.txt
@@
 one
-two
+2
*** Delete File: old.txt
*** End Patch
EOF
"""


@dataclass(frozen=True)
class Scenario:
    name: str
    script: Callable[[str], list[Step]]
    """The model's answers, for ``codex`` or ``sluice``."""
    exit_code: int
    files: dict[str, str] = field(default_factory=dict)
    """The workspace before; :attr:`after`, the same after (None: gone)."""
    after: dict[str, str | None] = field(default_factory=dict)
    mcp: bool = False


def _shell(implementation: str) -> list[Step]:
    return [
        answer(reasoning("**Looking around**", "One greeting, one file to read."),
               plan("p1", ("Greet", "in_progress"), ("Read missing.txt", "pending"))),
        answer(exec_command("echo hello", "c1")),
        answer(exec_command("cat missing.txt", "c2")),
        answer(plan("p2", ("Greet", "completed"), ("Read missing.txt", "completed"))),
        answer(assistant("Said hello; missing.txt does not exist.")),
    ]


def _apply_patch(implementation: str) -> list[Step]:
    return [answer(exec_command(PATCH, "c1")), answer(assistant("Patched."))]


def _mcp(implementation: str) -> list[Step]:
    return [answer(mcp_call(implementation, "fake", "add", {"a": 1, "b": 2}, "m1")), answer(assistant("1 + 2 = 3."))]


def _failed_turn(implementation: str) -> list[Step]:
    return [answer(plan("p1", ("Ask the model", "in_progress"))), refused("the prompt was refused, scripted")]


SCENARIOS = {
    s.name: s for s in (
        Scenario("shell", _shell, 0),
        Scenario("apply_patch", _apply_patch, 0, files={"notes.txt": "one\ntwo\n", "old.txt": "old\n"},
                 after={"hello.txt": "hello\n", "notes.txt": "one\n2\n", "old.txt": None}),
        Scenario("mcp", _mcp, 0, mcp=True),
        Scenario("failed_turn", _failed_turn, 1),
    )
}


def mcp_table(**extra: str) -> str:
    """The ``[mcp_servers.fake]`` table, for Codex's config.toml and for sluice's; ``extra``
    keys are TOML values."""
    env = ", ".join(f'{key} = "{value}"' for key, value in MCP_ENV.items())
    lines = ["[mcp_servers.fake]", f'command = "{SANDBOX_PYTHON}"',
             "args = ['-c', '''" + MCP_SOURCE + "''']", f"env = {{ {env} }}"]
    lines += [f"{key} = {value}" for key, value in extra.items()]
    return "\n".join(lines) + "\n"


def make_workspace(scenario: Scenario, path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for name, text in scenario.files.items():
        (path / name).write_text(text)


def workspace_state(scenario: Scenario, path: Path) -> dict[str, str | None]:
    return {name: (path / name).read_text() if (path / name).exists() else None for name in scenario.after}


# -- what varies ------------------------------------------------------------------------

# Codex's own note for a model it has no metadata for (the scripted one): not the scenario's.
_METADATA_NOTE = "Model metadata for `"


def normalise(stdout: str, cwd: Path) -> list[dict[str, Any]]:
    """The JSON lines of one run without what varies: the thread id (``<thread_id>``), the
    workspace's path (``<cwd>``), the order of a patch's files (Codex lists them in hash
    order), and Codex's note about the scripted model's metadata; item ids are numbered
    again from ``item_0`` once that note is gone."""
    paths = sorted({str(cwd), os.path.realpath(cwd)}, key=len, reverse=True)
    events = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    events = [e for e in events if not _is_metadata_note(e)]
    ids: dict[str, str] = {}
    for event in events:
        if "thread_id" in event:
            event["thread_id"] = "<thread_id>"
        item = event.get("item")
        if item is None:
            continue
        item["id"] = ids.setdefault(item["id"], f"item_{len(ids)}")
        if item.get("type") == "file_change":
            item["changes"].sort(key=lambda change: change["path"])
    return [_replace_paths(event, paths) for event in events]


def _is_metadata_note(event: dict[str, Any]) -> bool:
    item = event.get("item") or {}
    return item.get("type") == "error" and str(item.get("message", "")).startswith(_METADATA_NOTE)


def _replace_paths(value: Any, paths: list[str]) -> Any:
    if isinstance(value, str):
        for path in paths:
            value = value.replace(path, "<cwd>")
        return value
    if isinstance(value, list):
        return [_replace_paths(v, paths) for v in value]
    if isinstance(value, dict):
        return {k: _replace_paths(v, paths) for k, v in value.items()}
    return value


def encode_lines(events: list[dict[str, Any]]) -> str:
    """One compact JSON object per line, as serde_json writes them."""
    return "".join(json.dumps(e, ensure_ascii=False, separators=(",", ":")) + "\n" for e in events)


def golden_path(name: str) -> Path:
    return Path(__file__).resolve().parents[1] / "golden" / "codex_json" / f"{name}.codex.jsonl"
