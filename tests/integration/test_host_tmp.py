"""The host's /tmp and the sandbox's own, as a person meets them.

Inside, /tmp is sluice's (it closes other daemons' runtime dirs, repositories with
plantable hooks and other users' files there), so a tool or a virtual environment in the
host's /tmp is not there. What must hold:

- ``--readable DIR`` (and ``readable_roots`` in config.toml) shows a directory of the
  host's /tmp read-only at its own path, and nothing else of the host's /tmp; as root
  and as an unprivileged user.
- It never shows what sluice keeps private: the whole host /tmp, sluice's own /tmp, a
  runtime dir, a hidden path, nor a directory in the host's /tmp around one; a symlink is
  resolved once, to what it names then.
- A program in the host's /tmp that the sandbox would not show is refused before it runs,
  with a line naming ``--readable`` (``sluice sandbox``, ``sluice run`` direct and through
  the broker socket); with the flag it runs.
- On a terminal, one line says whose /tmp the command sees, once, when its directory or
  program lies in the host's /tmp; never elsewhere, never into a pipe.

Each containment test first shows the thing it guards against, outside the sandbox.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tempfile

import pytest

from landlock_helper import host_tmp
from tests.support.harness import short_tempdir, subprocess_env
from tests.support.sandbox_harness import sandbox
from tests.support.terminal import OnTerminal

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox"),
              pytest.mark.timeout(120)]

NOTE = b"/tmp inside the sandbox is sluice's own"


def _tree(path: pathlib.Path, files: dict[str, str]) -> None:
    """Files (an executable ``bin/*``) in directories everyone may read."""
    for rel, text in files.items():
        f = path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
        f.chmod(0o755 if rel.startswith("bin/") else 0o644)
    for d in (path, *[p for p in path.rglob("*") if p.is_dir()]):
        d.chmod(0o755)


@pytest.fixture
def tool(open_tmp):
    """A tool unpacked in the host's /tmp, next to the workspace (open_tmp/w/proj) and a
    sibling the command was never given."""
    _tree(open_tmp / "tool", {"bin/hello": "#!/bin/sh\necho hello from the tool\n", "README": "tool readme\n"})
    _tree(open_tmp / "sibling", {"secret": "sibling secret\n"})
    return open_tmp / "tool"


# --- what --readable shows ----------------------------------------------------------------


def test_readable_shows_a_host_tmp_directory_read_only_at_its_path(as_user, nobody_env, workdir, tool):
    sibling = tool.parent / "sibling"
    cmd = (f"cat {tool}/README; {tool}/bin/hello; echo x > {tool}/planted && echo wrote; "
           f"cat {sibling}/secret; echo end")
    # Without it, the host's /tmp is not there: the tool cannot be read or run.
    r = sandbox(cmd, cwd=workdir, user=as_user, nobody=nobody_env)
    assert r.stdout.splitlines() == ["end"], r.stderr
    assert f"{tool}/README: No such file" in r.stderr and "hello: not found" in r.stderr, r.stderr
    r = sandbox(cmd, cwd=workdir, flags=["--readable", str(tool)], user=as_user, nobody=nobody_env)
    assert r.stdout.splitlines() == ["tool readme", "hello from the tool", "end"], r.stderr
    assert "Read-only file system" in r.stderr
    assert not (tool / "planted").exists()
    assert "sibling secret" not in r.stdout  # the rest of the host's /tmp stays out of sight


def test_readable_root_inside_the_workspace_or_outside_tmp_changes_nothing_there(workdir, tool, outside):
    # Outside /tmp the view shows it anyway (read-only); in a writable root it stays writable.
    (workdir / "sub").mkdir()
    r = sandbox(f"cat {outside}/victim; echo y > sub/f && echo wrote", cwd=workdir,
                flags=["--readable", outside, "--readable", str(workdir / "sub")])
    assert r.stdout.splitlines() == ["original", "wrote"], r.stderr


def _hidden_dir(under: str, name: str = "token") -> str:
    path = tempfile.mkdtemp(prefix="sl-hidden-", dir=under)
    pathlib.Path(path, name).write_text("daemon token\n")
    return path


@pytest.mark.parametrize("what", ["whole tmp", "sluice tmp", "hidden", "around hidden", "link to hidden",
                                  "in hidden"])
def test_readable_never_shows_what_sluice_keeps_private(workdir, open_tmp, what):
    hidden = _hidden_dir(str(open_tmp))
    token = os.path.join(hidden, "token")
    (open_tmp / "link").symlink_to(hidden)
    os.mkdir(os.path.join(hidden, "inner"))
    readable = {"whole tmp": "/tmp", "sluice tmp": host_tmp.scratch_path(), "hidden": hidden,
                "around hidden": str(open_tmp), "link to hidden": str(open_tmp / "link"),
                "in hidden": os.path.join(hidden, "inner")}[what]
    # What it would show: the daemon's token is there to read, outside the sandbox.
    assert pathlib.Path(token).read_text() == "daemon token\n"
    r = sandbox(f"cat {token}; echo ran", cwd=workdir, flags=["--hide", hidden, "--readable", readable])
    assert r.returncode == 2 and "ran" not in r.stdout, r.stdout
    assert "refusing to show" in r.stderr and "\n" not in r.stderr.strip()


def test_a_readable_link_is_resolved_once_to_what_it_names(workdir, tool):
    link = tool.parent / "tool-link"
    link.symlink_to(tool)
    r = sandbox(f"cat {tool}/README; cat {link}/README", cwd=workdir, flags=["--readable", str(link)])
    # Shown at the path it resolved to; the link itself is the host's and not in sluice's /tmp.
    assert r.stdout == "tool readme\n", r.stderr
    assert "No such file" in r.stderr


# --- the command line ---------------------------------------------------------------------

MODES = {"sandbox": ["sandbox"], "run": ["run"], "run --via-broker": ["run", "--via-broker"]}


@pytest.fixture(params=list(MODES))
def cli(request, sluice):
    """``sluice sandbox`` or ``sluice run`` (direct, through the broker socket): the argv
    prefix and the environment."""
    env = subprocess_env()
    if MODES[request.param][0] == "run":
        env.update(request.getfixturevalue("module_daemon").env_for_children())
    return [*sluice, *MODES[request.param]], env


def test_a_program_in_the_host_tmp_is_refused_naming_the_flag_and_runs_with_it(cli, tool, open_tmp):
    argv, env = cli
    hello = f"{tool}/bin/hello"
    # Outside the sandbox it runs.
    assert subprocess.run([hello], capture_output=True, text=True).stdout == "hello from the tool\n"
    ws = open_tmp / "w"
    ws.mkdir()
    for program, path in ((hello, env["PATH"]), ("hello", f"{tool}/bin:{env['PATH']}")):
        r = subprocess.run([*argv, "--cwd", str(ws), "--", program], capture_output=True, text=True,
                           env={**env, "PATH": path}, timeout=60)
        assert r.returncode == 127, r
        assert r.stderr.startswith("sluice: error: ") and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.rstrip().endswith(f"show it read-only with --readable {tool}"), r.stderr
        r = subprocess.run([*argv, "--cwd", str(ws), "--readable", str(tool), "--", program], capture_output=True,
                           text=True, env={**env, "PATH": path}, timeout=60)
        assert (r.returncode, r.stdout) == (0, "hello from the tool\n"), r.stderr
        assert NOTE.decode() not in r.stderr  # not on a terminal: nothing more is said


def test_readable_roots_in_config_toml_show_it_for_every_run(sluice, tool, open_tmp):
    home = short_tempdir("sl-home-")
    pathlib.Path(home, "config.toml").write_text(
        f'[sandbox_workspace_write]\nreadable_roots = ["{tool}", "/tmp/sl-no-such-dir"]\n')
    r = subprocess.run([*sluice, "sandbox", "--cwd", str(open_tmp), "--", f"{tool}/bin/hello"], capture_output=True,
                       text=True, env=subprocess_env(SLUICE_HOME=home), timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, "hello from the tool\n", "")


def _on_terminal(argv, env, cwd=None) -> bytes:
    with OnTerminal(argv, env=env, cwd=cwd) as term:
        term.wait(60)
        return bytes(term.output)


def test_on_a_terminal_one_line_says_whose_tmp_it_is_when_it_applies(cli, tool, open_tmp, outside):
    argv, env = cli
    scratch = f"({host_tmp.scratch_path()} on the host)".encode()
    # The command's directory in the host's /tmp: said once, with where sluice's /tmp is.
    out = _on_terminal([*argv, "--cwd", str(open_tmp), "--", "echo", "done"], env)
    assert out.count(NOTE) == 1 and scratch in out and b"done" in out, out
    # Its program there (shown with --readable), from elsewhere: said too.
    out = _on_terminal([*argv, "--cwd", outside, "--readable", str(tool), "--", f"{tool}/bin/hello"], env)
    assert out.count(NOTE) == 1 and b"hello from the tool" in out, out
    # Neither: nothing is said.
    out = _on_terminal([*argv, "--cwd", outside, "--", "echo", "plain"], env)
    assert NOTE not in out and b"plain" in out, out


def test_a_virtual_environment_in_the_host_tmp_runs_with_readable(sluice, open_tmp, outside):
    venv = open_tmp / "venv"
    base = os.path.realpath(sys.executable)  # the interpreter our own venv (if any) was made from
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = subprocess.run([venv / "bin" / "python", "-c", "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    pathlib.Path(site, "sluice_marker.py").write_text("WHERE = 'the venv'\n")
    probe = ["python", "-c", "import sys, sluice_marker; print(sys.prefix, sluice_marker.WHERE)"]
    env = subprocess_env(PATH=f"{venv}/bin:{os.environ['PATH']}", VIRTUAL_ENV=str(venv))
    # Activated, as a person does: outside the sandbox it is the venv's Python.
    assert subprocess.run(probe, capture_output=True, text=True, env=env).stdout == f"{venv} the venv\n"
    r = subprocess.run([*sluice, "sandbox", "--cwd", outside, "--", *probe], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 127 and f"--readable {venv}" in r.stderr, r.stderr  # not another python, silently
    r = subprocess.run([*sluice, "sandbox", "--cwd", outside, "--readable", str(venv), "--", *probe],
                       capture_output=True, text=True, env=env, timeout=60)
    assert (r.returncode, r.stdout) == (0, f"{venv} the venv\n"), r.stderr
