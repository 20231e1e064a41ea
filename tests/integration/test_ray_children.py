"""The processes sluice's Ray actors start die with the actor (broker.ray.children, no
Ray needed): Ray kills an actor's process outright, and what it started must not outlive it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from tests.support.harness import ROOT, subprocess_env

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
