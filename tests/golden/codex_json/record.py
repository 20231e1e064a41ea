"""Record Codex's ``codex exec --json`` for each scenario of tests/support/codex_json_scenarios.py
into ``<scenario>.codex.jsonl`` here, normalised: the references ``sluice exec --json=codex``
is compared with (tests/integration/test_exec_codex_json.py). Not a test; run it by hand::

    npm install --prefix /some/dir @openai/codex@0.169.0
    python -m tests.golden.codex_json.record --codex /some/dir/node_modules/.bin/codex

Each run gets a fresh workspace, CODEX_HOME and HOME of its own and the scripted model on
loopback (a custom model provider, ``-c model_providers.fake.base_url=...``). A Codex of
another version is refused unless ``--any-version``. Prints, per scenario, whether the file
changed; exits 1 if Codex did not end as the scenario expects.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.codex_json_scenarios import (
    CODEX_VERSION,
    PROMPT,
    SCENARIOS,
    Scenario,
    encode_lines,
    golden_path,
    make_workspace,
    mcp_table,
    normalise,
    workspace_state,
)
from tests.support.fake_model import FakeModelServer

TIMEOUT_S = 120


def codex_argv(codex: str, server: FakeModelServer, work: Path) -> list[str]:
    provider = "model_providers.fake"
    return [
        codex, "exec", "--json", "--skip-git-repo-check", "-C", str(work), "-s", "workspace-write",
        "-m", "test-model", "-c", "model_provider=fake",
        "-c", f'{provider}.name="scripted"', "-c", f'{provider}.base_url="{server.base_url}"',
        "-c", f'{provider}.env_key="FAKE_KEY"', "-c", f'{provider}.wire_api="responses"',
        "-c", f"{provider}.request_max_retries=0", "-c", f"{provider}.stream_max_retries=0",
        "-c", "tools.update_plan={enabled=true}",
        PROMPT,
    ]


def record(codex: str, scenario: Scenario) -> bool:
    with tempfile.TemporaryDirectory(prefix="sl-codex-golden-") as tmp:
        root = Path(tmp)
        work, home = root / "work", root / "home"
        make_workspace(scenario, work)
        (home / ".codex").mkdir(parents=True)
        if scenario.mcp:
            (home / ".codex" / "config.toml").write_text(mcp_table(default_tools_approval_mode='"approve"'))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
               "CODEX_HOME": str(home / ".codex"), "FAKE_KEY": "sk-golden", "LANG": "C.UTF-8"}
        with FakeModelServer() as server:
            server.script(*scenario.script("codex"))
            done = subprocess.run(codex_argv(codex, server, work), env=env, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=TIMEOUT_S)
        ok = done.returncode == scenario.exit_code and workspace_state(scenario, work) == scenario.after
        if not ok:
            print(f"{scenario.name}: codex exited {done.returncode} (expected {scenario.exit_code}), "
                  f"workspace {workspace_state(scenario, work)}\n{done.stderr[-2000:]}", file=sys.stderr)
        lines = encode_lines(normalise(done.stdout, work))
    path = golden_path(scenario.name)
    before = path.read_text() if path.exists() else None
    path.write_text(lines)
    print(f"{scenario.name}: {'unchanged' if before == lines else 'written'} {path}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description="Record Codex's exec --json output for the golden scenarios.")
    parser.add_argument("--codex", required=True, help="the codex executable")
    parser.add_argument("--any-version", action="store_true", help=f"accept a Codex other than {CODEX_VERSION}")
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO", help=f"of {', '.join(SCENARIOS)} (default: all)")
    args = parser.parse_args()
    unknown = [name for name in args.scenarios if name not in SCENARIOS]
    if unknown:
        parser.error(f"no scenario {', '.join(unknown)}")
    version = subprocess.run([args.codex, "--version"], capture_output=True, text=True).stdout.strip()
    if version != f"codex-cli {CODEX_VERSION}" and not args.any_version:
        print(f"error: {args.codex} is {version!r}, not codex-cli {CODEX_VERSION} (--any-version to accept it)",
              file=sys.stderr)
        return 2
    results = [record(args.codex, SCENARIOS[name]) for name in args.scenarios or SCENARIOS]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
