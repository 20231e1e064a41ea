"""Small faults, each as a user met it: ``sluice run`` with stdout or stderr closed, a
daemon stopped under running commands, a request over the size limit, polling a
session with ``timeout=0``, a timeout while the caller's stdout is blocked, and a
terminal session printing with nobody attached (the journals' cap across sessions).

Real daemons, real sandboxes, real processes.
"""

from __future__ import annotations

import os
import shlex
import subprocess

import pytest

pytestmark = pytest.mark.timeout(120)

# A command that says something on each stream and exits 3.
BOTH_STREAMS = ["sh", "-c", "echo out; echo err >&2; exit 3"]


@pytest.fixture
def shell_run(module_daemon, sluice, tmp_path):
    """shell_run(redirect, *args): ``sluice run --cwd TMP ARGS REDIRECT`` as a shell runs it
    (``>&-`` closes our stdout), against the module's daemon."""

    def run(redirect: str, *args: str) -> subprocess.CompletedProcess:
        line = shlex.join([*sluice, "run", "--cwd", str(tmp_path), *args]) + " " + redirect
        return subprocess.run(["sh", "-c", line], env=module_daemon.env, capture_output=True, timeout=60)

    return run


@pytest.mark.parametrize("path", [[], ["--via-broker"]], ids=["direct", "via-broker"])
def test_closed_stdout_or_stderr_loses_that_output_and_nothing_else(shell_run, path) -> None:
    closed_out = shell_run(">&-", *path, "--", *BOTH_STREAMS)
    assert (closed_out.returncode, closed_out.stdout, closed_out.stderr) == (3, b"", b"err\n")

    closed_err = shell_run("2>&-", *path, "--", *BOTH_STREAMS)
    assert (closed_err.returncode, closed_err.stdout, closed_err.stderr) == (3, b"out\n", b"")

    # The daemon was not written to in their place: it still serves.
    assert shell_run("", *path, "--", "echo", "still here").stdout == b"still here\n"
