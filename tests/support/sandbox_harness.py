"""The sandbox tests' harness: run a command under ``python -m landlock_helper`` as root
or as the unprivileged ``nobody``, in a project directory everyone may use, next to a
directory outside every writable root.

The fixtures reach every test module through tests/conftest.py.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOBODY = 65534


def _inner_python() -> str:
    """A Python a sandboxed command can run. The host's /tmp is not in a sandbox's view, so
    a virtual environment there (a checkout in /tmp) gives way to the interpreter it was
    made from (the standard library only), else to the system's."""
    for candidate in (sys.executable, os.path.realpath(sys.executable), "/usr/bin/python3"):
        seen_as = (os.path.abspath(candidate), os.path.realpath(candidate))
        if not any(path.startswith("/tmp/") for path in seen_as) and os.access(candidate, os.X_OK):
            return candidate
    return sys.executable


INNER_PYTHON = _inner_python()


def _python_for_nobody() -> str | None:
    """An interpreter an unprivileged user can execute, or None."""
    for candidate in (sys.executable, "/usr/bin/python3"):
        probe = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                                candidate, "-c", "import ctypes, resource"], capture_output=True)
        if probe.returncode == 0:
            return candidate
    return None


@pytest.fixture(scope="module")
def nobody_env(tmp_path_factory):
    """A copy of landlock_helper readable by nobody, and a Python that nobody can run."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to switch to an unprivileged user")
    python = _python_for_nobody()
    if python is None:
        pytest.skip("no Python interpreter executable by an unprivileged user")
    lib = tmp_path_factory.mktemp("lib")
    os.chmod(lib, 0o755)
    shutil.copytree(os.path.join(ROOT, "landlock_helper"), lib / "landlock_helper")
    for d, _, files in os.walk(lib):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)
    return python, str(lib)


@pytest.fixture(params=["root", "nobody"])
def as_user(request, nobody_env):
    return request.param


@pytest.fixture
def open_tmp():
    """A temp dir every user can traverse (pytest's own tmp_path is private to root)."""
    path = tempfile.mkdtemp(prefix="sl-test-", dir="/tmp")
    os.chmod(path, 0o755)
    yield pathlib.Path(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def workdir(open_tmp):
    """A project directory with a .git, writable by everyone (so nobody can use it too)."""
    base = open_tmp / "w"
    base.mkdir()
    proj = base / "proj"
    (proj / ".git").mkdir(parents=True)
    (proj / ".git" / "config").write_text("[core]\n")
    (proj / ".sluice").mkdir()
    for d in (base, proj, proj / ".git", proj / ".sluice"):
        os.chmod(d, 0o777)
    os.chmod(proj / ".git" / "config", 0o666)
    return proj


@pytest.fixture
def outside(tmp_path):
    """A directory outside every writable root (not under /tmp, which workspace-write allows)."""
    d = "/var/tmp" if os.access("/var/tmp", os.W_OK) else os.path.expanduser("~")
    path = os.path.join(d, f"sluice-outside-{os.getpid()}-{time.monotonic_ns()}")
    os.mkdir(path)
    os.chmod(path, 0o777)
    with open(os.path.join(path, "victim"), "w") as f:
        f.write("original\n")
    os.chmod(os.path.join(path, "victim"), 0o666)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _sandbox_argv(cmd: str | list[str], *, cwd, flags=(), user="root", nobody=None, env=None):
    command = ["sh", "-c", cmd] if isinstance(cmd, str) else cmd
    argv = [sys.executable, "-m", "landlock_helper", *flags, "--cwd", str(cwd), "--", *command]
    run_env = dict(os.environ if env is None else env)
    if user == "nobody":
        python, lib = nobody
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python, *argv[1:]]
        run_env["PYTHONPATH"] = lib
        run_env["HOME"] = "/nonexistent"
    return argv, run_env


def sandbox(cmd: str | list[str], *, cwd, flags=(), user="root", nobody=None, env=None, timeout=30):
    """Run ``sh -c cmd`` (or the argv ``cmd``) under the sandbox CLI; returns CompletedProcess (text)."""
    argv, run_env = _sandbox_argv(cmd, cwd=cwd, flags=flags, user=user, nobody=nobody, env=env)
    return subprocess.run(argv, capture_output=True, text=True, env=run_env, timeout=timeout)


def start_sandbox(cmd: str, *, cwd, flags=(), user="root", nobody=None, env=None, stderr=None) -> subprocess.Popen:
    """``sandbox`` started, not waited for: stdin and stdout are pipes (text, line-buffered),
    stderr goes to the test's unless ``stderr`` says where. The caller reaps it
    (``tests.support.harness.reap``)."""
    argv, run_env = _sandbox_argv(cmd, cwd=cwd, flags=flags, user=user, nobody=nobody, env=env)
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True, bufsize=1,
                            env=run_env)
