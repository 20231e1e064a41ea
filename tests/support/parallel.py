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

Which worker runs what: the suite runs with ``--dist loadgroup`` (pyproject.toml's addopts),
where a worker is handed one test at a time as it runs low, so that none is left with a long
run of slow tests while the others idle (xdist's default, ``load``, hands out runs of
consecutive tests: one worker was still busy 190 s after the other three had finished). A
module whose tests share something that must exist once (the Ray tests' simulated cluster)
marks them ``xdist_group``: they go to one worker, in file order, and go first, since they
are the longest chain of tests that cannot be spread.

What else the workers could share is each one's own: runtime dirs and sluice's home
(tests/conftest.py; short_tempdir's names are unique), the processes a test looks for
(markers made unique, or the descendants of its own daemon), the leftovers checked at the
session's end (those of this worker's directories), ports (the kernel's, port 0). The MCP
servers' cache is shared and installed under a file lock (tests/support/mcp_servers.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile

import pytest

MARKER = "alone"
WORKER_INPUT_KEY = "sluice_lock_dir"


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


def in_group(item: pytest.Item) -> bool:
    return item.get_closest_marker("xdist_group") is not None


def in_running_order(items: list[pytest.Item]) -> None:
    """Grouped tests first, ``alone`` tests last, each in their order (every worker
    collects the same, so every worker sorts the same)."""
    rank = {id(i): 0 if in_group(i) else 2 if is_alone(i) else 1 for i in items}
    items.sort(key=lambda i: rank[id(i)])  # stable: the order within each rank is kept


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


def pytest_configure(config: pytest.Config) -> None:
    directory = getattr(config, "workerinput", {}).get(WORKER_INPUT_KEY)
    if directory:
        config.stash[_LOCK] = MachineLock(directory)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _LOCK in config.stash:
        config.stash[_LOCK].close()
    if _LOCK_DIR in config.stash:
        shutil.rmtree(config.stash[_LOCK_DIR], ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _LOCK in config.stash:
        in_running_order(items)


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
