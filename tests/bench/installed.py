"""The ``sluice`` command as a user runs it: the console script of a non-editable install.

The README installs with ``pip install .``. A development venv usually has an editable
install instead (``pip install -e .``), whose import hook costs about 12 ms at every
start of ``sluice``; timing that would blame sluice for the developer's set-up. So the
rows that time the CLI as a whole process (``cli-true``, ``sandbox-true``, ``bulk-1g``,
``chatty``, ``bench_mcp.py``'s) run the ``sluice`` of a throw-away venv,
``$SLUICE_BENCH_CACHE/venvs/DIGEST`` (default ``~/.cache/sluice-bench/venvs/DIGEST``),
into which this checkout is installed with ``pip install --no-deps`` of a wheel built
from a copy of its sources (nothing is built in the checkout). The dependencies are not
installed again: a ``.pth`` file in that venv points at the site-packages of the
interpreter running the benchmark (a plain path entry: the ``.pth`` files there, such
as an editable install's hook, are not run). The install is redone only when the
checkout's sources change: the venv is named by a digest of them, so one made is never
changed (another run may be timing it), and venvs unused for two days go.

The script runs without ``PYTHONPATH`` (:meth:`SluiceCli.env`), so it imports the
installed copy, checked by :func:`sluice_cli`. When the venv cannot be made, the rows fall back to
the console script next to this interpreter, or ``python -m broker``, and say so.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass

from common import ROOT, log
from peers import cache_dir

PACKAGES = ("broker", "executor", "landlock_helper", "agent")
PROJECT_FILES = ("pyproject.toml", "README.md", "LICENSE")
# A venv of sources no run has used for this long is removed.
KEEP_S = 2 * 24 * 3600


@dataclass(frozen=True)
class SluiceCli:
    argv: list[str]
    kind: str  # what was measured, for the rows' notes
    installed: bool  # the throw-away venv's script (run without PYTHONPATH)

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` for running it: the installed script without PYTHONPATH (which would
        put a checkout first), a fallback with it (so it runs this checkout)."""
        return cli_env(base) if self.installed else dict(base)


def source_digest() -> str:
    """A digest of what ``pip install .`` of the checkout would install."""
    h = hashlib.sha256()
    for name in PROJECT_FILES:
        path = os.path.join(ROOT, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                h.update(name.encode() + b"\0" + f.read())
    for package in PACKAGES:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, package)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                if name.endswith((".pyc", ".pyo")):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, "rb") as f:
                    h.update(os.path.relpath(path, ROOT).encode() + b"\0" + f.read())
    return h.hexdigest()


def dependency_paths() -> list[str]:
    """This interpreter's site-packages directories (where sluice's dependencies are)."""
    paths = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        paths.append(site.getusersitepackages())
    return list(dict.fromkeys(p for p in paths if os.path.isdir(p)))


def cli_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for the installed script: without PYTHONPATH, which would put a checkout first."""
    return {k: v for k, v in env.items() if k != "PYTHONPATH"}


def _make_venv(venv: str, digest: str) -> None:
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, capture_output=True)
    python = os.path.join(venv, "bin", "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    with open(os.path.join(purelib, "sluice-bench-deps.pth"), "w", encoding="utf-8") as f:
        f.write("".join(p + "\n" for p in dependency_paths()))
    with tempfile.TemporaryDirectory(prefix="sluice-src-") as src:
        for name in PROJECT_FILES:
            if os.path.isfile(os.path.join(ROOT, name)):
                shutil.copy2(os.path.join(ROOT, name), src)
        for package in PACKAGES:
            shutil.copytree(os.path.join(ROOT, package), os.path.join(src, package),
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        wheel = _build_wheel(src)
        proc = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
                               "--no-index", wheel], capture_output=True, text=True, env=cli_env(dict(os.environ)),
                              check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"pip install of the wheel failed: {proc.stderr.strip()[-300:]}")
    with open(os.path.join(venv, "sluice-source-digest"), "w", encoding="ascii") as f:
        f.write(digest)


def _build_wheel(src: str) -> str:
    """A wheel of the sources in ``src``: with this interpreter's setuptools if it can
    (offline), else in pip's isolated build environment (which fetches setuptools)."""
    out = os.path.join(src, "wheel")
    for isolation in (["--no-build-isolation"], []):
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", out, src],
                              capture_output=True, text=True, env=cli_env(dict(os.environ)), check=False)
        built = [f for f in os.listdir(out) if f.endswith(".whl")] if os.path.isdir(out) else []
        if proc.returncode == 0 and built:
            return os.path.join(out, built[0])
    raise RuntimeError(f"pip wheel of the checkout failed: {proc.stderr.strip()[-300:]}")


def _installed_copy(script: str) -> str:
    """Where the script's interpreter imports ``broker`` from (run as the rows run it)."""
    python = os.path.join(os.path.dirname(script), "python")
    proc = subprocess.run([python, "-c", "import broker; print(broker.__file__)"], capture_output=True, text=True,
                          env=cli_env(dict(os.environ)), cwd="/", check=False)
    return proc.stdout.strip() if proc.returncode == 0 else ""


@functools.cache
def sluice_cli() -> SluiceCli:
    """The ``sluice`` the CLI rows run, the venv made first if this checkout has none."""
    venvs = os.path.join(cache_dir(), "venvs")
    try:
        os.makedirs(venvs, exist_ok=True)
        with open(os.path.join(venvs, "lock"), "w") as lock:  # two runs at once: one installs, the other waits
            fcntl.flock(lock, fcntl.LOCK_EX)
            return _venv_cli(venvs)
    except (OSError, subprocess.SubprocessError, RuntimeError) as e:
        log(f"could not install this checkout into a venv in {venvs} ({e}); timing the development install instead")
    beside = os.path.join(os.path.dirname(sys.executable), "sluice")
    if os.access(beside, os.X_OK):
        return SluiceCli([beside], f"{beside} (development install: editable if made with pip install -e)", False)
    return SluiceCli([sys.executable, "-m", "broker"], "python -m broker from the checkout", False)


def _venv_cli(venvs: str) -> SluiceCli:
    """The script of the venv of these sources (named by their digest, never changed once
    made, so a run going on with it is not disturbed), made if missing; venvs unused for
    :data:`KEEP_S` go."""
    digest = source_digest()
    venv = os.path.join(venvs, digest[:16])
    script = os.path.join(venv, "bin", "sluice")
    if not os.path.exists(os.path.join(venv, "sluice-source-digest")):
        log(f"installing this checkout (not editable) into {venv}")
        _make_venv(venv, digest)
    os.utime(venv)
    for name in os.listdir(venvs):
        old = os.path.join(venvs, name)
        if name != "lock" and old != venv and time.time() - os.stat(old).st_mtime > KEEP_S:
            shutil.rmtree(old, ignore_errors=True)
    where = _installed_copy(script)
    if not where.startswith(venv + os.sep):
        raise RuntimeError(f"its interpreter imports broker from {where or 'nowhere'}")
    return SluiceCli([script], f"non-editable install of this checkout ({venv})", True)
