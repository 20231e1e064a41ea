"""What a command run through the real daemon can reach of the daemon itself: nothing."""

from __future__ import annotations

import os
import sys

import psutil
import pytest

from tests.support.sandbox_harness import INNER_PYTHON

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox")


@pytest.fixture
def dmn(daemon_factory):
    return daemon_factory.start(executors=1)


def _run(dmn, script: str, **kw):
    client = dmn.client()
    return client.run(["sh", "-c", script], cwd="/tmp", **kw)


def _daemon_pids(dmn) -> list[int]:
    # The daemon and its executors: not the processes an executor forks for a while (its
    # spawn helpers), which may be gone by the time they are looked for.
    return [dmn.pid, *dmn.executor_pids()]


def test_runtime_dir_is_unreachable(dmn):
    rt = dmn.runtime
    assert os.path.exists(rt.token_path) and os.path.exists(rt.socket_path)
    probe = (f"import socket\ns = socket.socket(socket.AF_UNIX)\n"
             f"try:\n    s.connect({rt.socket_path!r}); print('connected')\n"
             f"except OSError as e:\n    print('refused', e.errno)\n")
    r = _run(dmn, f"ls -A {rt.path}; echo listed=$?; cat {rt.token_path}; echo read=$?; "
                  f"{INNER_PYTHON} -c \"{probe}\"")
    out = r.stdout.decode()
    token = rt.read_token()
    assert token and token not in out and token not in r.stderr.decode()
    assert "listed=0" not in out or out.split("listed=")[0].strip() == ""
    assert "read=1" in out
    assert "refused" in out and "connected" not in out


def test_daemon_processes_cannot_be_signalled_or_inspected(dmn):
    pids = _daemon_pids(dmn)
    assert len(pids) >= 2
    script = "; ".join(f"kill -0 {pid}; echo kill{pid}=$?; cat /proc/{pid}/environ >/dev/null; echo env{pid}=$?"
                       for pid in pids)
    r = _run(dmn, script)
    out = r.stdout.decode()
    for pid in pids:
        assert f"kill{pid}=1" in out and f"env{pid}=1" in out
    for pid in pids:
        assert psutil.pid_exists(pid)


def test_token_not_in_argv_or_environment_of_any_process(dmn):
    token = dmn.runtime.read_token()
    r = _run(dmn, "env; cat /proc/1/cmdline")
    assert token not in r.stdout.decode()
    for p in [psutil.Process(dmn.pid), *dmn.descendants()]:
        try:
            assert token not in " ".join(p.cmdline())
            assert all(token not in v for v in p.environ().values())
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            pass  # a sandbox that just ended


def test_secret_in_callers_environment_does_not_reach_the_command(dmn):
    env = dict(os.environ, MY_SERVICE_API_KEY="sk-not-for-commands", HARMLESS="yes")
    r = _run(dmn, "env", env=env)
    out = r.stdout.decode()
    assert "HARMLESS=yes" in out
    assert "sk-not-for-commands" not in out
