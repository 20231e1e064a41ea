"""A login shell keeps the caller's PATH: ``bash -lc`` in a sandbox finds the venv the
caller activated, though /etc/profile sets PATH outright (Debian's does). Real venvs,
real shells, real sandbox; as root and as an unprivileged user, and through every route
a command takes: ``sluice run`` (direct and via the broker), ``sluice mcp``'s ``run``,
and the agent's ``shell`` tool."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from tests.support.fake_model import assistant, call, outputs_of, response
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


def _activated(venv: str, base=None, **extra: str) -> dict[str, str]:
    """The environment ``base`` (default ours) has in a shell where ``. venv/bin/activate`` ran."""
    env = dict(os.environ if base is None else base, **extra)
    env.update(VIRTUAL_ENV=venv, PATH=f"{venv}/bin:{env.get('PATH', '/usr/bin:/bin')}")
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
def home(tmp_path) -> str:
    """A home of the test's own: no login script of this machine's user runs."""
    path = tmp_path / "home"
    path.mkdir()
    return str(path)


@pytest.fixture
def ws(tmp_path):
    """A workspace beside that home (never above it: sluice refuses to make that writable)."""
    path = tmp_path / "ws"
    path.mkdir()
    return path


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
def test_sluice_run_bash_lc_finds_the_venv(route, module_daemon, sluice, ws, home):
    venv = _venv(SANDBOX_PYTHON, ws / ".venv")
    _login_scripts_reset_path(venv, home)
    env = _activated(venv, module_daemon.env, HOME=home)
    p = subprocess.run([*sluice, "run", "--cwd", str(ws), *route, "--", "bash", "-lc", PROBE, "zero", "one"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [f"{venv}/bin/python", venv, "zero one"], p.stderr


@pytest.mark.timeout(120)
def test_sluice_mcp_run_command_finds_the_venv(module_daemon, sluice, ws, home):
    """``sluice mcp``'s ``run`` runs a ``command`` with ``bash -lc``: the venv of the
    client that started the server is the one found."""
    mcp = pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install '.[test]')")
    anyio = pytest.importorskip("anyio")
    from mcp.client.stdio import stdio_client

    venv = _venv(SANDBOX_PYTHON, ws / ".venv")
    _login_scripts_reset_path(venv, home)
    env = _activated(venv, module_daemon.env_for_children(), HOME=home)
    params = mcp.StdioServerParameters(command=sluice[0], args=[*sluice[1:], "mcp", "--cwd", str(ws)],
                                       env=env, cwd=str(ws))

    async def main():
        async with stdio_client(params) as (read, write), mcp.ClientSession(read, write) as session:
            await session.initialize()
            r = await session.call_tool("run", {"command": "command -v python"})
            return r.structured_content

    out = anyio.run(main)
    assert out["exit_code"] == 0 and out["stdout"] == f"{venv}/bin/python\n", out


@pytest.mark.timeout(120)
def test_the_agents_shell_tool_bash_lc_finds_the_venv(module_daemon, sluice, server, tmp_path, ws, home):
    """The model asks for ``bash -lc`` (as Codex's instructions teach it to): the venv of
    the ``sluice exec`` that started the session is the one found."""
    venv = _venv(SANDBOX_PYTHON, ws / ".venv")
    _login_scripts_reset_path(venv, home)
    sluice_home = tmp_path / "sluice-home"
    sluice_home.mkdir()
    (sluice_home / "config.toml").write_text(
        f'model = "m"\nmodel_provider = "fake"\n[model_providers.fake]\nname = "scripted"\n'
        f'base_url = "{server.base_url}"\nenv_key = "FAKE_KEY"\nwire_api = "responses"\n')
    server.script(response(call("shell", {"command": ["bash", "-lc", "command -v python"]}, "c1")),
                  response(assistant("done")))
    env = _activated(venv, module_daemon.env_for_children(), SLUICE_HOME=str(sluice_home), HOME=home,
                     FAKE_KEY="sk-login-shell-test")
    p = subprocess.run([*sluice, "exec", "--sandbox", "workspace-write", "--approval-policy", "never", "--cd",
                        str(ws), "which python"], env=env, capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stderr
    output = json.loads(outputs_of(server.requests[1]["json"])["c1"])
    assert output["output"] == f"{venv}/bin/python\n", output
