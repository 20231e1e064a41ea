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
next module whole, in the running order, and an ``alone`` test as a unit of its own. A
module's tests on one worker set up its module fixtures (a shared daemon) once, where
handing out single tests set them up on every worker (a balanced run that way used 44%
more worker time and ended no sooner); xdist's default, ``load``, hands out long runs of
consecutive tests that no other worker can take back (one worker was still busy 190 s
after the other three had finished). The Ray tests go first: one simulated cluster serves
their module, which is the longest chain of tests in the suite. The other modules follow
longest first, by what each took in an earlier run (:data:`SECONDS_FILE`, which
``--record-module-seconds`` writes): a long module handed out last ends the run alone
(the browser tests' 70 s did, and the simulated end of the run came 24 s sooner in this
order).

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
# Seconds each module's tests took in a parallel run (``--record-module-seconds``); a
# module missing from it runs after those in it. Refresh it when modules come and go.
SECONDS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "module_seconds.json")


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


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def in_running_order(items: list[pytest.Item], seconds: dict[str, float]) -> None:
    """The Ray tests first; the other modules longest first by ``seconds`` (those it lacks
    after those it has); ``alone`` tests last. Ties keep the order collected (every worker
    collects the same, so every worker sorts the same)."""

    def key(item: pytest.Item) -> tuple[int, float]:
        if goes_first(item):
            return (0, 0.0)
        if is_alone(item):
            return (2, 0.0)
        return (1, -seconds.get(module_of(item.nodeid), 0.0))

    items.sort(key=key)  # stable: a module's tests stay together, in their order


def read_seconds(path: str) -> dict[str, float]:
    """Module -> seconds, from ``path`` (none if it is missing or is no such map)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class SecondsRecorder:
    """What each module's tests took, set-up and tear-down included (``alone`` tests apart:
    they do not run with their module), written to ``path`` as the run ends. In a parallel
    run the controller sees every worker's reports."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if MARKER not in report.keywords:
            module = module_of(report.nodeid)
            self.seconds[module] = self.seconds.get(module, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        with open(f"{self.path}.tmp", "w") as f:
            json.dump({m: round(s, 1) for m, s in sorted(self.seconds.items())}, f, indent=1)
            f.write("\n")
        os.replace(f"{self.path}.tmp", self.path)


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


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-module-seconds", metavar="FILE", default=None,
                     help="write how long each module's tests took to FILE (JSON); a parallel run hands out "
                          "the modules longest first by tests/support/module_seconds.json")


def pytest_configure(config: pytest.Config) -> None:
    directory = _lock_dir_of_worker(config)
    if directory:
        config.stash[_LOCK] = MachineLock(directory)
    record = config.getoption("record_module_seconds")
    if record and not hasattr(config, "workerinput"):
        config.pluginmanager.register(SecondsRecorder(os.path.abspath(record)), "sluice-module-seconds")


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
        in_running_order(items, read_seconds(SECONDS_FILE))
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
