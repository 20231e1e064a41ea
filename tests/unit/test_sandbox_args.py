"""``sluice sandbox``'s command line read without argparse (broker.cli.sandbox.quick_args):
each plain form means what the parser makes of it, and everything else is left to the
parser (None), which words the help and every error."""

from __future__ import annotations

import pytest

from broker.cli.main import _parser
from broker.cli.sandbox import quick_args

FIELDS = ("sandbox", "cwd", "writable", "readable", "env", "network", "env_report", "tty", "interactive", "command")

PLAIN = [
    ["--", "true"],
    ["true"],
    ["ls", "-l", "--network"],
    ["--network", "--", "sh", "-c", "exit 3"],
    ["--sandbox", "read-only", "--cwd", "/tmp", "--", "pwd"],
    ["--sandbox=danger-full-access", "--cwd=/", "true"],
    ["--writable", "/a", "--writable=/b", "--env", "X", "--env=Y", "--env-report", "--", "env"],
    ["--readable", "/tmp/venv", "--readable=/tmp/tool", "--", "python"],
    ["-t", "--", "bash"],
    ["-it", "bash"],
    ["-ti", "--", "bash"],
    ["-i", "--tty", "--interactive", "--", "cat"],
    ["--sandbox=", "--", "true"],
    ["-"],
    ["--cwd", "/", "--", "--", "x"],
]

NOT_PLAIN = [
    [],
    ["--network"],
    ["-h"],
    ["--help"],
    ["--net", "--", "true"],
    ["--bogus", "--", "true"],
    ["--cwd"],
    ["--cwd", "--", "true"],
    ["--cwd", "-1", "--", "true"],
    ["--network=yes", "--", "true"],
    ["-x", "true"],
    ["-itx", "true"],
]


@pytest.mark.parametrize("argv", PLAIN)
def test_a_plain_command_line_means_what_argparse_makes_of_it(argv):
    quick = quick_args(argv)
    assert quick is not None
    full = _parser(["sandbox", *argv]).parse_args(["sandbox", *argv])
    assert {f: getattr(quick, f) for f in FIELDS} == {f: getattr(full, f) for f in FIELDS}


@pytest.mark.parametrize("argv", NOT_PLAIN)
def test_anything_else_is_left_to_argparse(argv):
    assert quick_args(argv) is None
