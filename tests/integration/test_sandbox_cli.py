"""``sluice sandbox`` as a process tree: it is the sandbox's supervisor itself (one-shot
spawn), so below it there are only the sandbox's init and the command; it keeps the
host's view of the filesystem; and the sandbox dies with it, however it dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from tests.support.harness import reap, subprocess_env, wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox")


@pytest.mark.timeout(60)
def test_sandbox_is_supervised_by_sluice_itself_and_dies_with_it(sluice, runtime_dir, tmp_path):
    env = subprocess_env(runtime_dir)
    proc = subprocess.Popen([*sluice, "sandbox", "--cwd", str(tmp_path), "--", "sh", "-c", "echo up; exec sleep 61.5"],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"up\n"
        cli = psutil.Process(proc.pid)
        init = wait_for(lambda: cli.children(), what="the sandbox's init")
        assert [p.name() for p in init] == ["sluice-init"]
        command = wait_for(lambda: init[0].children(), what="the command")
        assert command[0].cmdline() == ["sleep", "61.5"]
        # sluice stays in the host's mount namespace (it quarantines planted .git files
        # there); the init has one of its own.
        host_mnt = os.readlink("/proc/self/ns/mnt")
        assert os.readlink(f"/proc/{proc.pid}/ns/mnt") == host_mnt
        assert os.readlink(f"/proc/{init[0].pid}/ns/mnt") != host_mnt
        proc.kill()  # no handler runs: the kernel ends the sandbox (the init dies with its parent)
        proc.wait(timeout=10)
        wait_for(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in (*init, *command)),
                 what="the sandbox to die with sluice")
    finally:
        reap(proc)


@pytest.mark.timeout(60)
def test_sandbox_reports_exit_codes_and_signals(sluice, runtime_dir, tmp_path):
    env = subprocess_env(runtime_dir)
    for script, code in (("exit 3", 3), ("kill -TERM $$", 128 + signal.SIGTERM), ("kill -KILL $$", 128 + signal.SIGKILL)):
        p = subprocess.run([*sluice, "sandbox", "--cwd", str(tmp_path), "--", "sh", "-c", script], env=env,
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        assert p.returncode == code, (script, p.stderr)
