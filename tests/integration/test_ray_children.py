"""The processes sluice's Ray actors start (broker.ray.children, no Ray needed) die with
the actor: Ray kills an actor's process outright, and what it started must not outlive
it. And they run at the raylet's niceness, not the actor's, where the kernel allows it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from tests.support.harness import ROOT, at_niceness, subprocess_env

# A stand-in for an actor: starts `sluice sandbox -- sleep 300` bound to itself, prints
# the child's pid, then waits to be killed.
ACTOR = """
import sys, time
from broker.ray.children import spawn_bound
child = spawn_bound(["sandbox", "--sandbox", "read-only", "--", "sleep", "300"])
print(child.pid, flush=True)
time.sleep(300)
"""


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def _start(tmp_path):
    actor = subprocess.Popen([sys.executable, "-c", ACTOR], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                             env=subprocess_env(SLUICE_HOME=str(tmp_path / "home")), start_new_session=True)
    child = int(actor.stdout.readline())
    sleeper = None
    deadline = time.monotonic() + 30
    while sleeper is None and time.monotonic() < deadline:
        sleeper = next((p.pid for p in psutil.Process(child).children(recursive=True)
                        if p.cmdline()[:2] == ["sleep", "300"]), None)
        time.sleep(0.05)
    assert sleeper is not None, "the sandboxed sleep did not start"
    return actor, child, sleeper


def test_the_child_and_its_command_die_with_a_killed_parent(tmp_path):
    actor, child, sleeper = _start(tmp_path)
    try:
        os.kill(actor.pid, signal.SIGKILL)
        actor.wait(10)
        assert _wait_gone(child, 15), "the bound child outlived its parent"
        assert _wait_gone(sleeper, 15), "the sandboxed command outlived its parent"
    finally:
        for pid in (sleeper, child, actor.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        actor.stdout.close()


def test_without_the_binding_the_child_would_outlive_its_parent(tmp_path):
    """The check above can fail: a child started plainly survives a parent killed so."""
    script = ("import subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
              "print(child.pid, flush=True)\n"
              "time.sleep(300)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    child = int(parent.stdout.readline())
    try:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        assert not _wait_gone(child, 1.0)
    finally:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
        parent.stdout.close()


# A stand-in for an actor that Ray started below its raylet (the test, its parent): starts
# a sandboxed command at the raylet's niceness, which prints its own.
NICE_ACTOR = """
from broker.ray.children import niceness, spawn_bound
services, tasks = niceness()
print(services, tasks, flush=True)
child = spawn_bound(["sandbox", "--sandbox", "read-only", "--", "cut", "-d", " ", "-f", "19", "/proc/self/stat"],
                    nice=services)
child.wait()
"""


def _below_us(privileged: bool):
    """Run NICE_ACTOR five steps below this process; without the privilege to go back up
    (CAP_SYS_NICE dropped from the bounding set, RLIMIT_NICE 0) unless ``privileged``."""
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    prefix, preexec = at_niceness(ours + 5, privileged=privileged)
    run = subprocess.run([*prefix, sys.executable, "-c", NICE_ACTOR], capture_output=True, text=True, cwd=ROOT,
                         env=subprocess_env(), preexec_fn=preexec, timeout=60, check=False)
    return ours, run


def test_the_child_runs_at_the_raylets_niceness():
    ours, run = _below_us(privileged=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(ours), str(ours + 5), str(ours)]
    assert run.stderr == ""


def test_without_the_privilege_the_child_stays_and_says_so():
    ours, run = _below_us(privileged=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(ours), str(ours + 5), str(ours + 5)]
    assert run.stderr == f"sluice: stays at niceness {ours + 5}, not {ours} as the raylet: Permission denied\n"
