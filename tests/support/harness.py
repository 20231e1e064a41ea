"""The one test harness: real daemons that are always stopped, short runtime dirs, and
waiting for a condition with a deadline.

- :class:`DaemonFactory` / :func:`daemons`: ``start(executors=None, args=(), env=None)``
  gives a :class:`DaemonHandle`; every daemon started is stopped at the end, and a daemon
  whose processes (executors, sandboxed commands) outlive it fails the test. The daemon's
  own tests start it their way (``argv``), in a runtime dir they share between daemons
  (``runtime``), without waiting for it (``ready=False``), and check how it stops
  (:meth:`DaemonHandle.terminate`). The benchmarks use the same (tests/bench/common.py).
- :func:`short_tempdir`: a dir under /tmp (an ipc socket path must fit in ~107 bytes;
  pytest's ``tmp_path`` is too deep), removed at the session's end.
- :func:`wait_for`: poll a condition until it holds, or fail after a deadline; never a
  fixed sleep before an assert.
- :func:`subprocess_env`, :func:`sluice_argv`: how child processes run this checkout.
- :data:`SANDBOX_PYTHON`: the interpreter a sandboxed test command can run.
"""


from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import psutil
import pytest

from broker.net.runtime import RuntimeDir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


# The Python a sandboxed test command runs: the system's, else the interpreter this
# virtual environment is made from. Never the venv's own path: a checkout under /tmp is
# out of sight in a workspace-write sandbox, whose /tmp is its own.
SANDBOX_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else os.path.realpath(sys.executable)


def _look(predicate, deadline: float, timeout: float, what: str):
    """One poll of :func:`wait_for` and :func:`await_for`: ``predicate``'s value if true,
    else None; fails once ``deadline`` has passed."""
    value = predicate()
    if value:
        return value
    if time.monotonic() > deadline:
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
    return None


def wait_for(predicate, timeout: float = 10.0, what: str = "the condition", interval: float = 0.01):
    """Poll ``predicate`` until it returns something true (returned), or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (value := _look(predicate, deadline, timeout, what)):
        time.sleep(interval)
    return value


async def await_for(predicate, timeout: float = 10.0, what: str = "the condition", interval: float = 0.01):
    """:func:`wait_for` inside an event loop: polls without blocking it."""
    deadline = time.monotonic() + timeout
    while not (value := _look(predicate, deadline, timeout, what)):
        await asyncio.sleep(interval)
    return value


def at_niceness(nice: int, *, privileged: bool) -> tuple[list[str], object]:
    """How to start a process at niceness ``nice`` with RLIMIT_NICE 0: an argv prefix and a
    ``preexec_fn``. Unless ``privileged``, the prefix drops CAP_SYS_NICE from the bounding
    set, so (root as it is) it cannot go below ``nice`` again. Skips the test unless this
    process is root (and has ``setpriv``) and ``nice`` is a niceness."""
    if os.geteuid() != 0:
        pytest.skip("needs root: to go back up, and to take the privilege away")
    if not privileged and shutil.which("setpriv") is None:
        pytest.skip("needs setpriv to take the privilege away")
    if nice > 19:
        pytest.skip(f"this process already runs at niceness {os.getpriority(os.PRIO_PROCESS, 0)}")

    def preexec() -> None:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        resource.setrlimit(resource.RLIMIT_NICE, (0, 0))

    return ([] if privileged else ["setpriv", "--bounding-set=-sys_nice", "--"]), preexec


def reap(proc: subprocess.Popen) -> None:
    """The end of a test's child process, whatever the test came to: SIGKILLed if it still
    runs, waited for, and its pipes closed."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def live_processes(cmdline: list[str]) -> list[psutil.Process]:
    """Processes running exactly ``cmdline`` (zombies count as dead: only not reaped yet)."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.info["cmdline"] == cmdline and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(p)
    return found


# Every directory short_tempdir made; whatever a test left of them goes at the session's end
# (tests/conftest.py removes them).
TEMPDIRS: list[str] = []


def short_tempdir(prefix: str = "sl-") -> str:
    path = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    os.chmod(path, 0o700)
    TEMPDIRS.append(path)
    return path


def subprocess_env(runtime: RuntimeDir | None = None, **extra: str) -> dict[str, str]:
    """os.environ, plus PYTHONPATH for this checkout and the runtime dir, for child processes."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if runtime is not None:
        env["SLUICE_RUNTIME_DIR"] = runtime.path
    env.update(extra)
    return env


def sluice_argv() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "sluice")
    if os.access(script, os.X_OK):
        return [script]
    return [sys.executable, "-m", "broker"]


def _kill_tree(procs: list[psutil.Process]) -> list[psutil.Process]:
    """SIGKILL what is still alive of ``procs``; returns the ones that were."""
    alive = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
                p.kill()
    psutil.wait_procs(alive, timeout=5)
    return alive


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children()
    except psutil.Error:
        return []


def _gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Those of ``procs`` still alive (and not zombies) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for p in procs:
            with contextlib.suppress(psutil.Error):
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.02)


def stop_runtime_daemon(runtime: RuntimeDir) -> None:
    """Stop whatever daemon runs in ``runtime`` (autostarted ones included), with its children."""
    from broker.client import daemon_status, stop_daemon

    status = daemon_status(runtime)
    if not status.running:
        return
    children = _descendants(status.pid)
    with contextlib.suppress(Exception):
        stop_daemon(runtime, timeout=STOP_TIMEOUT_S)
    _kill_tree(_gone(children, 5.0))


@dataclass
class DaemonHandle:
    runtime: RuntimeDir
    proc: subprocess.Popen
    env: dict[str, str]
    log_path: str
    _clients: list = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def client(self, timeout: float = 10.0):
        """A connected :class:`broker.client.connection.Client` (closed at teardown)."""
        from broker.client import Client

        c = Client.connect(self.runtime, autostart=False, timeout=timeout)
        self._clients.append(c)
        return c

    def log(self) -> str:
        text = ""
        for path in (self.log_path, self.runtime.log_path):
            with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as f:
                text += f.read()
        return text

    def descendants(self) -> list[psutil.Process]:
        return _descendants(self.proc.pid)

    def env_for_children(self) -> dict[str, str]:
        """Our environment pointed at this daemon, for child processes such as the CLI."""
        return subprocess_env(self.runtime)

    def agent_pids(self) -> list[int]:
        """The daemon's agent process (``python -m agent ...``), as a list to unpack."""
        pids = []
        for p in self.descendants():
            with contextlib.suppress(psutil.Error):  # a command that ends while we look
                if p.cmdline()[1:3] == ["-m", "agent"]:
                    pids.append(p.pid)
        return pids

    def executor_pids(self) -> list[int]:
        """The executors the daemon runs (its children that were given the token file)."""
        pids = []
        for child in _children(self.proc.pid):
            with contextlib.suppress(psutil.Error):
                if "--token-file" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                    pids.append(child.pid)
        return pids

    def terminate(self, timeout: float = 10.0) -> int:
        """SIGTERM the daemon and return its exit status; a daemon that ignores SIGTERM is
        killed and fails the test."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"daemon ignored SIGTERM:\n{self.log()}") from None

    def stop(self) -> list[psutil.Process]:
        """SIGTERM the daemon, wait; returns processes of its tree that outlived it (killed)."""
        for c in self._clients:
            with contextlib.suppress(Exception):
                c.close()
        self._clients.clear()
        children = self.descendants()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return _kill_tree(_gone(children, 5.0))


def _die_with_us() -> None:
    """In the daemon, before exec: SIGTERM when the process that started it dies without
    stopping it (a test run or a benchmark killed), so no daemon outlives its user."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _preexec(nofile: int | None):
    def preexec() -> None:
        _die_with_us()
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    return preexec


class DaemonFactory:
    def __init__(self) -> None:
        self.handles: list[DaemonHandle] = []
        self.dirs: list[str] = []

    def start(self, executors: int | None = None, args=(), env: dict[str, str] | None = None, *,
              runtime: RuntimeDir | None = None, argv: list[str] | None = None, ready: bool = True,
              executors_ready: bool = True, nofile: int | None = None) -> DaemonHandle:
        """A daemon (``python -m broker daemon``, or ``argv``) in a runtime dir of its own, or
        in ``runtime`` (which several daemons may then share: each has its own log);
        with ``ready``, once it answers a client and (``executors_ready``: not for a test
        whose executors cannot start) its own executors are connected. ``nofile``: its
        descriptor limit, soft and hard (so it cannot raise it)."""
        path = short_tempdir()
        self.dirs.append(path)
        runtime = runtime or RuntimeDir(path)
        child_env = subprocess_env(runtime, **(env or {}))
        child_env.pop("SLUICE_LOG_LEVEL", None)  # tests read the daemon's info lines
        if argv is None:
            argv = [sys.executable, "-m", "broker", "daemon", *args]
            if executors is not None:
                argv += ["--executors", str(executors)]
        log_path = os.path.join(path, "fixture.log")
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(argv, env=child_env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    cwd="/", start_new_session=True, preexec_fn=_preexec(nofile))
        handle = DaemonHandle(runtime, proc, child_env, log_path)
        self.handles.append(handle)
        if ready:
            wait_ready(handle, executors=executors_ready)
        return handle

    def stop_all(self) -> list[str]:
        problems = []
        for h in self.handles:
            leaked = h.stop()
            if leaked:
                problems.append(
                    f"daemon {h.pid} left processes behind: "
                    + ", ".join(f"{p.pid} {describe_process(p)}" for p in leaked)
                )
            stop_runtime_daemon(h.runtime)
        self.handles.clear()
        for path in self.dirs:
            shutil.rmtree(path, ignore_errors=True)
        self.dirs.clear()
        return problems


def describe_process(p: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return " ".join(p.cmdline())[:120]
    return "?"


def processes_using(dirs: list[str]) -> list[psutil.Process]:
    """Live processes (other than us) whose command line or environment names one of
    ``dirs``: what the tests started for those runtime dirs and homes."""
    if not dirs:
        return []
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        if p.pid == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        with contextlib.suppress(psutil.Error):
            text = " ".join(p.info["cmdline"] or []) + " " + " ".join(p.environ().values())
            if any(d in text for d in dirs):
                found.append(p)
    return found


def wait_ready(handle: DaemonHandle, executors: bool = True) -> None:
    from broker.client import Client, DaemonError

    deadline = time.monotonic() + START_TIMEOUT_S
    last = None
    while time.monotonic() < deadline:
        if handle.proc.poll() is not None:
            raise RuntimeError(f"daemon exited at start with {handle.proc.returncode}:\n{handle.log()[-3000:]}")
        try:
            with Client.connect(handle.runtime, autostart=False, timeout=2.0) as client:
                # Its own executors connected too: a run sent before they are is told that
                # none is, on stderr (at once under load, where they take seconds to start).
                info = client.daemon_info() if executors else None
                if info is None or sum(not e.remote for e in info.executors) >= info.executors_wanted:
                    return
                last = f"{len(info.executors)} of {info.executors_wanted} executors connected"
        except DaemonError as e:
            last = e
        time.sleep(0.02)
    handle.stop()
    raise RuntimeError(f"daemon did not answer within {START_TIMEOUT_S} s ({last}):\n{handle.log()[-3000:]}")


@contextlib.contextmanager
def daemons():
    """A :class:`DaemonFactory` whose daemons are all stopped at the end; a daemon that
    left processes behind fails the test."""
    factory = DaemonFactory()
    try:
        yield factory
    finally:
        problems = factory.stop_all()
        if problems:
            pytest.fail("; ".join(problems), pytrace=False)
