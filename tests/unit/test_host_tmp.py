"""What a person is told, before a command runs, about the host's /tmp and the sandbox's
(landlock_helper.host_tmp), and the roots config.toml adds to a run (broker.cli.base)."""

from __future__ import annotations

import os
import shutil
import tempfile
from types import SimpleNamespace

import pytest

from broker.cli.base import ConfigError, config_roots, run_roots
from landlock_helper import host_tmp


@pytest.fixture
def host_tool():
    """A tool unpacked in the host's /tmp: DIR/tool/bin/hello."""
    base = tempfile.mkdtemp(prefix="sl-hosttmp-", dir="/tmp")
    hello = os.path.join(base, "tool", "bin", "hello")
    os.makedirs(os.path.dirname(hello))
    with open(hello, "w") as f:
        f.write("#!/bin/sh\n")
    os.chmod(hello, 0o755)
    yield base
    shutil.rmtree(base)


def test_a_program_in_the_host_tmp_that_would_not_be_shown_is_named_with_the_flag(host_tool):
    hello = f"{host_tool}/tool/bin/hello"
    line = host_tmp.hidden_program(hello, "/", {}, ["/"])
    assert line.startswith(f"{hello} lies in the host's /tmp") and line.endswith(f"--readable {host_tool}/tool")
    # Found on PATH, as a venv's bin puts it there.
    line = host_tmp.hidden_program("hello", "/", {"PATH": f"/usr/bin:{host_tool}/tool/bin"}, ["/"])
    assert line.startswith(f"hello is {hello}, which lies in the host's /tmp")
    # Relative to the command's directory.
    assert host_tmp.hidden_program("./tool/bin/hello", host_tool, {}, []) is not None


def test_a_program_the_sandbox_shows_or_that_is_not_in_the_host_tmp_is_not_refused(host_tool):
    hello = f"{host_tool}/tool/bin/hello"
    for visible in ([f"{host_tool}/tool"], [host_tool]):  # a readable root, the command's directory
        assert host_tmp.hidden_program(hello, "/", {}, visible) is None
    # /tmp as a writable root is sluice's /tmp, not the host's: it shows nothing of it.
    assert host_tmp.hidden_program(hello, "/", {}, ["/tmp"]) is not None
    assert host_tmp.hidden_program("sh", "/", {"PATH": "/usr/bin:/bin"}, []) is None
    assert host_tmp.hidden_program("no-such-program-here", "/", {"PATH": f"{host_tool}/tool/bin"}, []) is None


def test_the_note_applies_when_the_directory_or_the_program_lies_in_the_host_tmp(host_tool):
    note = host_tmp.note("true", host_tool, {"PATH": "/usr/bin:/bin"})
    assert note.startswith(f"/tmp inside the sandbox is sluice's own ({host_tmp.scratch_path()} on the host)")
    assert host_tmp.note(f"{host_tool}/tool/bin/hello", "/", {}) == note
    assert host_tmp.note("true", "/", {"PATH": "/usr/bin:/bin"}) is None


def _config(tmp_path, monkeypatch, text: str) -> None:
    (tmp_path / "config.toml").write_text(text)
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path))


def test_config_roots_expand_the_home_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", "/home/someone")
    _config(tmp_path, monkeypatch, '[sandbox_workspace_write]\nwritable_roots = ["~/.npm", "/srv/out/"]\n'
                                   'readable_roots = ["/tmp/venv"]\n')
    assert config_roots() == (["/home/someone/.npm", "/srv/out"], ["/tmp/venv"])


@pytest.mark.parametrize("text", ['[sandbox_workspace_write]\nwritable_roots = "~/.npm"\n',
                                  '[sandbox_workspace_write]\nreadable_roots = ["venv"]\n',
                                  'sandbox_workspace_write = 1\nreadable_roots = 1\n'])
def test_bad_config_roots_are_one_line_errors(tmp_path, monkeypatch, text):
    _config(tmp_path, monkeypatch, text)
    with pytest.raises(ConfigError) as e:
        config_roots()
    assert str(e.value).startswith(str(tmp_path / "config.toml")) and "\n" not in str(e.value)


def test_a_run_takes_the_configured_writable_roots_under_workspace_write_only_and_those_that_exist(tmp_path,
                                                                                                   monkeypatch):
    (tmp_path / "cache").mkdir()
    _config(tmp_path, monkeypatch, f'[sandbox_workspace_write]\nwritable_roots = ["{tmp_path}/cache", "/nonexistent"]\n'
                                   f'readable_roots = ["{tmp_path}", "/nonexistent"]\n')
    args = SimpleNamespace(sandbox="workspace-write", writable=["/flag"], readable=[])
    assert run_roots(args) == (["/flag", f"{tmp_path}/cache"], [str(tmp_path)])
    assert run_roots(args, local=False) == (["/flag", f"{tmp_path}/cache", "/nonexistent"],
                                            [str(tmp_path), "/nonexistent"])
    args.sandbox = "read-only"
    assert run_roots(args) == (["/flag"], [str(tmp_path)])
