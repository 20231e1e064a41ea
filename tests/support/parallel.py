"""The suite on several workers (pytest-xdist, ``-n``): a test marked ``alone`` runs while
no other test does.

Such a test needs the machine to itself: it holds a latency to a bound of a second or so,
or makes a load on purpose and holds it to a deadline. Every worker holds the
run's lock shared while it runs a test (its set-up and tear-down included) and an
``alone`` test holds it exclusively: it waits for the tests in flight to end and the
others wait for it. A gate in front of the lock lets a waiting ``alone`` test in first,
since tests that take the lock shared one after another could otherwise keep it out
for good. ``alone`` tests are also run last (:func:`in_running_order`), where they cost the
other workers no waiting.

Which worker runs what (:class:`ModuleScheduling`, asked for by ``--dist loadscope
--no-loadscope-reorder`` in pyproject.toml's addopts): a worker that runs low is handed the
next module whole, in the order collected, and an ``alone`` test as a unit of its own. A
module's tests on one worker set up its module fixtures (a shared daemon) once, where
handing out single tests set them up on every worker (a balanced run that way used 44%
more worker time and ended no sooner); xdist's default, ``load``, hands out long runs of
consecutive tests that no other worker can take back (one worker was still busy 190 s
after the other three had finished). The Ray tests go first: one simulated cluster serves
their module, which is the longest chain of tests in the suite.

What else the workers could share is each one's own: runtime dirs and sluice's home
(tests/conftest.py; short_tempdir's names are unique), the processes a test looks for
(markers made unique, or the descendants of its own daemon), the leftovers checked at the
session's end (those of this worker's directories), ports (the kernel's, port 0). The MCP
servers' cache is shared and installed under a file lock (tests/support/mcp_servers.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile

import pytest
from xdist.scheduler import LoadScopeScheduling

MARKER = "alone"
WORKER_INPUT_KEY = "sluice_lock_dir"
ALONE_FILE = "alone.json"


class MachineLock:
    """A readers-writer lock between the processes that open the same directory."""

    def __init__(self, directory: str) -> None:
        # Opened here, by the worker, and not inherited by the processes its tests start
        # (Python's descriptors are not inheritable).
        self._gate = open(os.path.join(directory, "gate"), "a")
        self._lock = open(os.path.join(directory, "lock"), "a")

    @contextlib.contextmanager
    def held(self, alone: bool):
        with self._through_gate():
            fcntl.flock(self._lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(self._lock, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def _through_gate(self):
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._gate, fcntl.LOCK_UN)

    def close(self) -> None:
        self._gate.close()
        self._lock.close()


def is_alone(item: pytest.Item) -> bool:
    return item.get_closest_marker(MARKER) is not None


def goes_first(item: pytest.Item) -> bool:
    return item.get_closest_marker("ray") is not None


def in_running_order(items: list[pytest.Item]) -> None:
    """The Ray tests first, ``alone`` tests last, each in their order (every worker
    collects the same, so every worker sorts the same)."""
    rank = {id(i): 0 if goes_first(i) else 2 if is_alone(i) else 1 for i in items}
    items.sort(key=lambda i: rank[id(i)])  # stable: the order within each rank is kept


def read_alone(path: str) -> frozenset[str]:
    """The ``alone`` tests' ids the workers wrote (none if they wrote nothing)."""
    try:
        with open(path) as f:
            return frozenset(json.load(f))
    except FileNotFoundError:
        return frozenset()


class ModuleScheduling(LoadScopeScheduling):
    """xdist's scheduling by scope, where a scope is a module, or an ``alone`` test by
    itself. The controller collects nothing; the workers name the ``alone`` tests in the
    run's lock directory before they report their collection (:func:`pytest_collection_modifyitems`),
    so the list is there when the scheduling starts (every worker has collected)."""

    def __init__(self, config: pytest.Config, log=None, *, alone_file: str) -> None:
        super().__init__(config, log)
        self._alone_file = alone_file
        self.alone: frozenset[str] = frozenset()

    def schedule(self) -> None:
        self.alone = read_alone(self._alone_file)
        super().schedule()

    def _split_scope(self, nodeid: str) -> str:
        return nodeid if nodeid in self.alone else nodeid.split("::", 1)[0]


# -- the hooks (a plugin of tests/conftest.py) ---------------------------------------------

_LOCK_DIR = pytest.StashKey[str]()
_LOCK = pytest.StashKey[MachineLock]()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """On the controller of a parallel run: one lock directory for all its workers."""
    stash = node.config.stash
    if _LOCK_DIR not in stash:
        stash[_LOCK_DIR] = tempfile.mkdtemp(prefix="sl-lock-", dir="/tmp")
    node.workerinput[WORKER_INPUT_KEY] = stash[_LOCK_DIR]


def _lock_dir_of_worker(config: pytest.Config) -> str | None:
    """The run's lock directory, in a worker of a parallel run (None elsewhere)."""
    return getattr(config, "workerinput", {}).get(WORKER_INPUT_KEY)


def pytest_configure(config: pytest.Config) -> None:
    directory = _lock_dir_of_worker(config)
    if directory:
        config.stash[_LOCK] = MachineLock(directory)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _LOCK in config.stash:
        config.stash[_LOCK].close()
    if _LOCK_DIR in config.stash:
        shutil.rmtree(config.stash[_LOCK_DIR], ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getoption("dist") == "loadscope" and _LOCK_DIR in config.stash:
        return ModuleScheduling(config, log, alone_file=os.path.join(config.stash[_LOCK_DIR], ALONE_FILE))
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    lock_dir = _lock_dir_of_worker(config)
    if lock_dir:
        in_running_order(items)
        # Every worker writes the same list; each replaces the file whole.
        path = os.path.join(lock_dir, ALONE_FILE)
        with open(f"{path}.{os.getpid()}", "w") as f:
            json.dump([i.nodeid for i in items if is_alone(i)], f)
        os.replace(f"{path}.{os.getpid()}", path)


# First, so that the wait for the lock is outside the test's timeout (pytest-timeout's
# wrapper of the same hook).
@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    lock = item.config.stash.get(_LOCK, None)
    if lock is None:
        yield
        return
    with lock.held(is_alone(item)):
        yield
