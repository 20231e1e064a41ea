"""Tools that write under the home directory, run as a person runs them.

The home directory is read-only in the sandbox and can never be a writable root (it holds
the shell's start-up files, ssh and git config, sluice's own home). What must hold:

- ``npm cache add`` (and so ``npm install``) fails in ``~/.npm``, and ``pip install
  --user`` in ``~/.local``; on a terminal, one line after the failure names the directory
  to allow, with ``--writable`` and with ``writable_roots`` in config.toml.
- Allowed once in config.toml (``[sandbox_workspace_write] writable_roots = ["~/.npm"]``),
  the same command works for every ``sluice sandbox`` and ``sluice run``, and writes
  only there; ``npm config get cache`` inside says where.
- ``--writable ~`` and ``writable_roots = ["~"]`` stay refused.

The home directory is one of the test's own, outside /tmp (the sandbox's /tmp is not the
host's: a home there would not be the one the tools see).
"""

from __future__ import annotations

import io
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

import pytest

from tests.support.harness import short_tempdir, subprocess_env
from tests.support.terminal import OnTerminal

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox"),
              pytest.mark.timeout(180)]

HINT = b"(your home directory is read-only in the sandbox): allow"


@pytest.fixture
def home():
    parent = "/var/tmp" if os.access("/var/tmp", os.W_OK) else None
    if parent is None:
        pytest.skip("needs a writable directory outside /tmp for a home directory")
    path = tempfile.mkdtemp(prefix="sl-home-", dir=parent)
    yield pathlib.Path(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def env(home):
    """Our environment with that home, and a sluice home of its own (its config.toml)."""
    return subprocess_env(HOME=str(home), SLUICE_HOME=short_tempdir("sl-cfg-"))


def _config(env, text: str) -> None:
    pathlib.Path(env["SLUICE_HOME"], "config.toml").write_text(text)


def _npm_package(where: pathlib.Path) -> pathlib.Path:
    """A local package tarball, as ``npm pack`` makes one (made here: npm would write ~/.npm)."""
    data = b'{"name": "sluice-tiny", "version": "1.0.0"}'
    path = where / "sluice-tiny-1.0.0.tgz"
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("package/package.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


def _wheel(where: pathlib.Path) -> pathlib.Path:
    """A wheel of one module, in a directory of its own (for ``pip --no-index --find-links``)."""
    wheels = where / "wheels"
    wheels.mkdir()
    files = {"sluice_tiny.py": "VALUE = 42\n",
             "sluice_tiny-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: sluice-tiny\nVersion: 1.0\n",
             "sluice_tiny-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                "Tag: py3-none-any\n"}
    record = "".join(f"{name},,\n" for name in (*files, "sluice_tiny-1.0.dist-info/RECORD"))
    with zipfile.ZipFile(wheels / "sluice_tiny-1.0-py3-none-any.whl", "w") as z:
        for name, text in {**files, "sluice_tiny-1.0.dist-info/RECORD": record}.items():
            z.writestr(name, text)
    return wheels


def _on_terminal(argv, env) -> tuple[int, bytes]:
    with OnTerminal(argv, env=env) as term:
        code = term.wait(120)
        return code, bytes(term.output)


@pytest.fixture(params=["sandbox", "run"])
def cli(request, sluice):
    """``sluice sandbox`` or ``sluice run`` (through a daemon of the module)."""
    if request.param == "run":
        daemon_env = request.getfixturevalue("module_daemon").env_for_children()
        return [*sluice, "run"], {"SLUICE_RUNTIME_DIR": daemon_env["SLUICE_RUNTIME_DIR"]}
    return [*sluice, "sandbox"], {}


@pytest.mark.skipif(shutil.which("npm") is None, reason="needs npm")
def test_npm_cache_fails_with_a_hint_then_works_once_allowed_in_config(cli, env, home, tmp_path):
    argv, extra = cli
    env = {**env, **extra}
    package = _npm_package(tmp_path)
    add = [*argv, "--cwd", str(tmp_path), "--", "npm", "cache", "add", "--offline", str(package)]
    (home / ".npm").mkdir()  # as any earlier npm command outside the sandbox leaves it
    # In a pipe: npm's own error only.
    r = subprocess.run(add, capture_output=True, env=env, timeout=120)
    assert r.returncode != 0 and f"{home}/.npm/_cacache".encode() in r.stderr and HINT not in r.stderr, r.stderr
    assert not list((home / ".npm").iterdir())
    # On a terminal: one line naming the directory and both ways to allow it.
    code, out = _on_terminal(add, env)
    assert code != 0 and out.count(HINT) == 1, out
    assert f"allow ~/.npm with --writable {home}/.npm, or for every run with".encode() in out, out
    config = f"{env['SLUICE_HOME']}/config.toml"
    assert f'writable_roots = ["~/.npm"] in [sandbox_workspace_write] of {config}'.encode() in out, out

    # The ready list's entries, once: those that do not exist (here) are left out until they do.
    _config(env, '[sandbox_workspace_write]\nwritable_roots = ["~/.npm", "~/.cache/pip", "~/.cargo", "~/go"]\n')
    r = subprocess.run([*argv, "--cwd", str(tmp_path), "--", "npm", "config", "get", "cache"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.stdout == f"{home}/.npm\n", r.stderr
    r = subprocess.run(add, capture_output=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert list((home / ".npm").glob("_cacache/index-v5/*")), "npm's cache index was not written"
    assert sorted(p.name for p in home.iterdir()) == [".npm"]  # nothing else of the home changed


# The interpreter a venv was made from: ``pip install --user`` is not for a venv.
BASE_PYTHON = os.path.realpath(sys.executable)


def test_pip_user_install_from_a_local_wheel_fails_with_a_hint_then_works_once_allowed(sluice, env, home, tmp_path):
    usage = subprocess.run([BASE_PYTHON, "-m", "pip", "install", "--help"], capture_output=True, text=True)
    if usage.returncode:
        pytest.skip("needs pip")
    wheels = _wheel(tmp_path)
    install = [*sluice, "sandbox", "--cwd", str(tmp_path), "--", BASE_PYTHON, "-m", "pip", "install", "--user",
               "--no-index", "--find-links", str(wheels), "--no-warn-script-location", "sluice-tiny"]
    if "--break-system-packages" in usage.stdout:
        install.append("--break-system-packages")  # a system Python that forbids it otherwise (PEP 668)
    code, out = _on_terminal(install, env)
    assert code != 0 and b"Read-only file system" in out, out
    assert f"--writable {home}/.local (make it first: mkdir -p {home}/.local)".encode() in out, out
    (home / ".local").mkdir()
    _config(env, '[sandbox_workspace_write]\nwritable_roots = ["~/.local"]\n')
    r = subprocess.run(install, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert list((home / ".local").glob("lib/python*/site-packages/sluice_tiny.py"))


def test_the_home_directory_itself_stays_refused(sluice, env, home, tmp_path):
    r = subprocess.run([*sluice, "sandbox", "--cwd", str(tmp_path), "--writable", str(home), "--", "true"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and f"refusing to make {home} writable" in r.stderr, r.stderr
    _config(env, '[sandbox_workspace_write]\nwritable_roots = ["~"]\n')
    r = subprocess.run([*sluice, "sandbox", "--cwd", str(tmp_path), "--", "touch", f"{home}/x"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and f"refusing to make {home} writable" in r.stderr, r.stderr
    assert not (home / "x").exists()
