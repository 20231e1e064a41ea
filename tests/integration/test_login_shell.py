"""A login shell keeps the caller's PATH: ``bash -lc`` in a sandbox finds the venv the
caller activated, though /etc/profile sets PATH outright (Debian's does). Real venvs,
real shells, real sandbox; as root and as an unprivileged user, and through ``sluice run``
both ways (direct and via the broker)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.support.harness import SANDBOX_PYTHON
from tests.support.sandbox_harness import sandbox

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

# What a user types to see which python a login shell gets, and its arguments kept.
PROBE = 'command -v python; python -c "import sys; print(sys.prefix)"; echo "$0 $1"'


def _venv(python: str, where) -> str:
    """A real venv (no pip: nothing here needs it), readable by everyone."""
    subprocess.run([python, "-m", "venv", "--without-pip", str(where)], check=True, capture_output=True, timeout=120)
    for d, dirs, files in os.walk(where):
        os.chmod(d, 0o755)
    return str(where)


def _activated(venv: str, **extra: str) -> dict[str, str]:
    """The environment of a shell where ``. venv/bin/activate`` ran."""
    env = dict(os.environ, VIRTUAL_ENV=venv, PATH=f"{venv}/bin:{os.environ.get('PATH', '/usr/bin:/bin')}", **extra)
    env.pop("PYTHONHOME", None)
    return env


def _login_scripts_reset_path(venv: str, home: str) -> None:
    """The trap, shown where it should be: unsandboxed, this machine's login scripts
    take the venv off PATH (else there is nothing here to test)."""
    r = subprocess.run(["bash", "-lc", "command -v python"], capture_output=True, text=True, timeout=30,
                       env=_activated(venv, HOME=home))
    if r.stdout.startswith(f"{venv}/"):
        pytest.skip("this machine's login scripts keep PATH as it was")


@pytest.fixture
def project(open_tmp):
    ws = open_tmp / "proj"
    ws.mkdir()
    os.chmod(ws, 0o777)
    return ws


def test_a_login_shell_keeps_the_venv(as_user, nobody_env, project):
    venv = _venv(SANDBOX_PYTHON, project / ".venv")
    home = str(project.parent / "home")
    os.mkdir(home, 0o755)
    _login_scripts_reset_path(venv, home)
    env = _activated(venv, HOME=home)
    r = sandbox(["bash", "-lc", PROBE, "zero", "one"], cwd=project, user=as_user, nobody=nobody_env, env=env)
    assert r.stdout.splitlines() == [f"{venv}/bin/python", venv, "zero one"], r.stderr
    # sh (dash here) reads /etc/profile as a login shell too; the same holds.
    r = sandbox(["sh", "-l", "-c", "command -v python"], cwd=project, user=as_user, nobody=nobody_env, env=env)
    assert r.stdout == f"{venv}/bin/python\n", r.stderr


def test_bash_c_and_other_programs_get_path_as_given(as_user, nobody_env, project):
    """Nothing but a login shell's script is touched: bash -c sees PATH as the caller had
    it, byte for byte, and so does any other program."""
    path = f"/opt/odd 'quoted' dir:{os.environ.get('PATH', '/usr/bin:/bin')}"
    env = dict(os.environ, PATH=path)
    r = sandbox(["bash", "-c", 'printf %s "$PATH"'], cwd=project, user=as_user, nobody=nobody_env, env=env)
    assert r.stdout == path, r.stderr
    r = sandbox(["env"], cwd=project, user=as_user, nobody=nobody_env, env=env)
    assert f"PATH={path}" in r.stdout.splitlines(), r.stderr
    # The login shell gets that same PATH, quotes and all.
    r = sandbox(["bash", "-lc", 'printf %s "$PATH"'], cwd=project, user=as_user, nobody=nobody_env, env=env)
    assert r.stdout == path, r.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("route", [(), ("--via-broker",)], ids=["direct", "via-broker"])
def test_sluice_run_bash_lc_finds_the_venv(route, module_daemon, sluice, tmp_path):
    venv = _venv(SANDBOX_PYTHON, tmp_path / ".venv")
    _login_scripts_reset_path(venv, str(tmp_path))
    env = _activated(venv, **{k: v for k, v in module_daemon.env.items() if k.startswith("SLUICE_")})
    p = subprocess.run([*sluice, "run", "--cwd", str(tmp_path), *route, "--", "bash", "-lc", PROBE, "zero", "one"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [f"{venv}/bin/python", venv, "zero one"], p.stderr



@pytest.mark.timeout(120)
def test_sluice_mcp_run_command_finds_the_venv(module_daemon, sluice, tmp_path):
    """``sluice mcp``'s ``run`` runs a ``command`` with ``bash -lc``: the venv of the
    client that started the server is the one found."""
    mcp = pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install '.[test]')")
    anyio = pytest.importorskip("anyio")
    from mcp.client.stdio import stdio_client

    venv = _venv(SANDBOX_PYTHON, tmp_path / ".venv")
    _login_scripts_reset_path(venv, str(tmp_path))
    env = _activated(venv, **{k: v for k, v in module_daemon.env_for_children().items() if k.startswith("SLUICE_")})
    params = mcp.StdioServerParameters(command=sluice[0], args=[*sluice[1:], "mcp", "--cwd", str(tmp_path)],
                                       env=env, cwd=str(tmp_path))

    async def main():
        async with stdio_client(params) as (read, write), mcp.ClientSession(read, write) as session:
            await session.initialize()
            r = await session.call_tool("run", {"command": "command -v python"})
            return r.structured_content

    out = anyio.run(main)
    assert out["exit_code"] == 0 and out["stdout"] == f"{venv}/bin/python\n", out
