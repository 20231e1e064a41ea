"""Shared fixtures: short runtime dirs and real daemons that are always stopped.

- ``runtime_dir``: a fresh, empty runtime dir (a :class:`RuntimeDir`) under /tmp; any
  daemon left running in it is stopped at teardown and the dir removed.
- ``daemon_factory``: ``start(executors=None, args=(), env=None) -> DaemonHandle``; every
  daemon it started is stopped at teardown, and the test errors if any of its processes
  (executors, sandboxed commands) outlive it.
- ``daemon``: one fresh daemon for the test. ``module_daemon``: one shared by a module.
- ``sluice``: the argv prefix that runs the real command line (the installed ``sluice``
  script if there is one next to this Python, else ``python -m broker``).
- ``dmn``, ``work``, ``fe``: a module's daemon for frontend tests, an empty workspace, and
  the command line against that daemon and ``server`` (tests/support/frontends.py).
- ``as_user``, ``nobody_env``, ``open_tmp``, ``workdir``, ``outside``: the sandbox
  harness's (tests/support/sandbox_harness.py), for running commands as root and as nobody.

Runtime dirs are made with ``tempfile.mkdtemp(prefix="sl-", dir="/tmp")`` because an ipc
socket path must fit in ~107 bytes; pytest's ``tmp_path`` is too deep.

The whole session runs with ``SLUICE_RUNTIME_DIR`` pointing at a private dir, so no test
can touch (or start) the daemon of the person running the tests, and with ``SLUICE_HOME``
pointing at another (daemons and executors create sluice's home when it is missing), so
none touches the real ``~/.sluice``.
"""

from __future__ import annotations

import compileall
import os
import shutil
import signal
import sys

import psutil
import pytest

from broker.net.runtime import RuntimeDir
from tests.support.fake_model import FakeModelServer
from tests.support.harness import (
    ROOT,
    TEMPDIRS,
    DaemonHandle,
    daemons,
    describe_process,
    processes_using,
    short_tempdir,
    sluice_argv,
    stop_runtime_daemon,
)
from tests.support.frontends import dmn, fe, work  # noqa: F401 (fixtures)
from tests.support.sandbox_harness import as_user, nobody_env, open_tmp, outside, workdir  # noqa: F401 (fixtures)

# pytest keeps its rewritten test modules as bytecode next to them (__pycache__, ignored by
# git); under PYTHONDONTWRITEBYTECODE it would not, and every worker of every run would
# rewrite all of them again: 15 s of a core each here, 5 s with the cache.
sys.dont_write_bytecode = False


def pytest_configure(config: pytest.Config) -> None:
    """Once a run, before any worker starts: this checkout's bytecode, written. The daemons,
    executors, agents and command lines the tests start import sluice from here
    (PYTHONPATH), and under PYTHONDONTWRITEBYTECODE none would write it: each would compile
    what it imports (test_cli.py and test_daemon_view.py took 66-74 s so, 54 s with it)."""
    if not hasattr(config, "workerinput"):
        for package in ("broker", "agent", "executor", "landlock_helper"):
            compileall.compile_dir(os.path.join(ROOT, package), quiet=1)


# Several workers (-n): the lock that gives ``alone`` tests the machine (tests/support/parallel.py).
pytest_plugins = ("tests.support.parallel",)


@pytest.fixture(scope="session", autouse=True)
def _nothing_left_behind():
    """At the session's end: no process of sluice's that a test started is still running
    (every daemon, executor, agent and command of the tests runs for a runtime dir or a home
    made by short_tempdir, and says so in its command line or environment), and those dirs
    are removed. A leftover is killed and fails the session."""
    yield
    leftovers = []
    for p in processes_using(TEMPDIRS):
        # Described before it is killed; one that exited by itself between the listing and
        # the kill (the last test's processes on their way out) was not left behind.
        described = f"{p.pid} {describe_process(p)}"
        try:
            p.kill()
        except psutil.NoSuchProcess:
            continue
        except psutil.Error:
            pass
        leftovers.append(described)
    for path in TEMPDIRS:
        shutil.rmtree(path, ignore_errors=True)
    if leftovers:
        pytest.fail("processes left behind by the tests: " + "; ".join(leftovers), pytrace=False)


@pytest.fixture(autouse=True)
def _signal_mask_kept():
    """Each test finds the signal mask as the session began: one that leaves a signal
    blocked in this process (it survives fork and exec) would hand it, blocked, to every
    process a later test starts."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@pytest.fixture(scope="session", autouse=True)
def _private_default_runtime_dir():
    """Point the default runtime dir somewhere private for the whole session."""
    path = short_tempdir("sl-default-")
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("SLUICE_RUNTIME_DIR", path)
            try:
                yield path
            finally:
                stop_runtime_daemon(RuntimeDir(path))
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _one_executor_by_default():
    """Daemons started without ``--executors`` (those ``sluice run`` starts by itself, most
    of the suite's) run one executor, not one per CPU: the tests that need more say so,
    and each executor more is a process and its warm sandboxes started for nothing.
    ``test_daemon_view`` checks the default without it."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SLUICE_EXECUTORS", "1")
        yield


@pytest.fixture(scope="session", autouse=True)
def _private_sluice_home():
    """Point sluice's home somewhere private (and initially missing) for the whole session."""
    base = short_tempdir("sl-home-")
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("SLUICE_HOME", os.path.join(base, "home"))
            yield os.environ["SLUICE_HOME"]
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def runtime_dir():
    """A fresh runtime dir with no daemon; whatever daemon ends up in it is stopped."""
    path = short_tempdir()
    runtime = RuntimeDir(path)
    try:
        yield runtime
    finally:
        stop_runtime_daemon(runtime)
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def daemon_factory():
    with daemons() as factory:
        yield factory


@pytest.fixture
def daemon(daemon_factory) -> DaemonHandle:
    """A fresh daemon (default executors) in its own runtime dir."""
    return daemon_factory.start()


@pytest.fixture(scope="module")
def module_daemon():
    """A daemon shared by the tests of one module (faster; do not kill it in a test)."""
    with daemons() as factory:
        yield factory.start()


@pytest.fixture(scope="session")
def sluice() -> list[str]:
    return sluice_argv()


@pytest.fixture
def server():
    """A scripted model server on loopback (tests/support/fake_model.py)."""
    with FakeModelServer() as s:
        yield s
