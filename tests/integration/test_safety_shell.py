"""The safety checks against real programs: bash splits scripts as the parser does, and a
real sandbox denial reads as one while a plain failure does not."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agent.safe_commands import parse_plain_script
from agent.safety import is_likely_sandbox_denied
from landlock_helper.policy import SandboxPolicy
from tests.support.sandbox_harness import INNER_PYTHON
from tests.support.shell_cases import PARSED

READ_ONLY = SandboxPolicy.from_mode("read-only")
WORKSPACE = SandboxPolicy.from_mode("workspace-write")


# Each command name becomes a function printing its name and words, so bash itself
# shows how it splits the script (functions take precedence over builtins).
_PRINTERS = "".join(
    f"{name}() {{ printf '%s\\0' {name} \"$@\"; printf '\\1'; }}\n"
    for name in ("ls", "pwd", "grep", "echo", "wc")
)


@pytest.mark.parametrize(
    "script", [s for s, _ in PARSED if "|" not in s.replace("'c|d'", "").replace('"c|d"', "")], ids=repr
)
def test_parse_plain_script_agrees_with_bash(script):
    out = subprocess.run(["bash", "-c", _PRINTERS + script], capture_output=True, check=True).stdout
    shell = [tuple(w.decode() for w in cmd.split(b"\0")[:-1]) for cmd in out.split(b"\1")[:-1]]
    assert shell == [c.argv for c in parse_plain_script(script)]


def test_real_false_is_not_a_denial():
    done = subprocess.run(["bash", "-c", "false"], capture_output=True)
    assert done.returncode == 1
    assert not is_likely_sandbox_denied(done.returncode, done.stdout, done.stderr, WORKSPACE)


@pytest.mark.timeout(30)
def test_real_sandbox_denial_is_detected(tmp_path):
    """Under the real sandbox a forbidden write looks denied; a plain `false` does not."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root}
    # read-only: tmp_path (under /tmp) is not writable, whoever we are.
    helper = [sys.executable, "-m", "landlock_helper", "--sandbox", "read-only", "--cwd", str(tmp_path), "--"]

    def run(script):
        return subprocess.run([*helper, "bash", "-c", script], capture_output=True, env=env, timeout=20)

    denied = run(f"echo hi > {tmp_path / 'x'}")
    if denied.returncode == 126:
        pytest.skip(f"no sandbox here: {denied.stderr.decode(errors='replace').strip()}")
    assert denied.returncode == 1, denied.stderr
    assert not (tmp_path / "x").exists()
    assert is_likely_sandbox_denied(denied.returncode, denied.stdout, denied.stderr, READ_ONLY)
    plain = run("false")
    assert plain.returncode == 1
    assert not is_likely_sandbox_denied(plain.returncode, plain.stdout, plain.stderr, READ_ONLY)
    offline = run(f"{INNER_PYTHON} -c 'import socket; socket.create_connection((\"192.0.2.1\", 80), 1)'")
    assert is_likely_sandbox_denied(offline.returncode, offline.stdout, offline.stderr, READ_ONLY)
