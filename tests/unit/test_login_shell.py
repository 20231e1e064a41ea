"""Which commands get their login shell's PATH put back (landlock_helper.login_shell),
and which are left exactly as given. What it does to a real shell: test_login_shell in
tests/integration."""

from __future__ import annotations

import pytest

from landlock_helper.login_shell import keep_path

ENV = {"PATH": "/p/venv/bin:/usr/bin"}
SET = "export PATH=/p/venv/bin:/usr/bin; "


@pytest.mark.parametrize("argv, script_at", [
    (["bash", "-lc", "pytest -q"], 2),
    (["/bin/bash", "-cl", "pytest -q"], 2),
    (["bash", "-l", "-c", "pytest -q"], 3),
    (["bash", "--login", "-c", "pytest -q", "zero", "one"], 3),
    (["bash", "--noprofile", "-lc", "pytest -q"], 3),
    (["sh", "-lc", "pytest -q"], 2),
    (["zsh", "-lc", "pytest -q"], 2),
    (["/usr/bin/dash", "-elc", "pytest -q"], 2),
    (["bash", "-c", "-l", "pytest -q"], 3),
    (["bash", "-lc", "--", "pytest -q", "zero"], 3),
    (["sh", "-lc", "-", "pytest -q"], 3),
])
def test_a_login_shell_script_starts_from_the_callers_path(argv, script_at):
    got = keep_path(argv, ENV)
    assert got == [*argv[:script_at], SET + argv[script_at], *argv[script_at + 1:]]


@pytest.mark.parametrize("argv", [
    ["bash", "-c", "pytest -q"],                   # not a login shell
    ["bash", "-l"],                                # no script: an interactive login is the user's
    ["bash", "-l", "script.sh"],                   # a script file, not -c
    ["bash", "-o", "pipefail", "-lc", "x"],        # an option with an argument: not parsed, left alone
    ["python3", "-lc", "x"],                       # not a shell
    ["fish", "-lc", "x"],                          # not POSIX syntax
    ["env", "bash", "-lc", "x"],                   # what a program starts is its own business
    ["bash", "-lc", "--"],                         # no script after the options' end
])
def test_everything_else_is_left_as_given(argv):
    assert keep_path(argv, ENV) is argv


def test_no_path_nothing_to_keep():
    assert keep_path(["bash", "-lc", "x"], {}) == ["bash", "-lc", "x"]


def test_the_path_is_quoted_for_the_shell():
    got = keep_path(["bash", "-lc", "x"], {"PATH": "/a b/'q';$(x):/usr/bin"})
    assert got[2] == "export PATH='/a b/'\"'\"'q'\"'\"';$(x):/usr/bin'; x"
