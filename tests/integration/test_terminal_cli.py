"""``sluice run -t`` and ``sluice sandbox -t`` on a real terminal (a pty made by the test,
the CLI its foreground job): keys reach the program (Ctrl-C as a key), window changes
reach it, ``vi`` edits and saves a file, the caller's terminal is raw while the program
runs and is given back as it was on every way out; ``~.`` after Enter ends the command.
``-i`` forwards lines typed on a terminal and passes Ctrl-C to the command; without
``-t`` the command sees no terminal. Both commands behave the same:
every test runs for each."""

from __future__ import annotations

import os
import signal
import subprocess
import termios

import psutil
import pytest

from broker.client import UsageError
from tests.support.harness import SANDBOX_PYTHON, reap, wait_for
from tests.support.terminal import OnTerminal

pytestmark = pytest.mark.timeout(90)

# It waits in short sleeps: a signal that lands after Python's last check for one and before
# a long sleep has begun runs its handler only when that sleep ends (seen as a lost SIGWINCH).
PROBE = r"""
import os, signal, sys, time
signal.signal(signal.SIGWINCH, lambda *_: os.write(1, f"winch {os.get_terminal_size()}\n".encode()))
print("size", os.get_terminal_size(), os.isatty(0), os.isatty(1), os.isatty(2), flush=True)
try:
    print("read", input(), flush=True)
    for _ in range(1200):
        time.sleep(0.05)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


@pytest.fixture(params=["sandbox", "run"])
def cli(request, sluice, tmp_path):
    """How the test runs sluice: ``argv(*flags, "--", *cmd)`` and the environment, for
    ``sluice sandbox`` (no daemon) and ``sluice run`` (a daemon shared by the module)."""
    env = dict(os.environ, TERM="xterm")
    if request.param == "run":
        env.update(request.getfixturevalue("module_daemon").env_for_children())
        env["TERM"] = "xterm"
        return _Cli("run", [*sluice, "run", "--cwd", str(tmp_path)], env, tmp_path)
    return _Cli("sandbox", [*sluice, "sandbox", "--cwd", str(tmp_path)], env, tmp_path)


class _Cli:
    def __init__(self, name, prefix, env, cwd) -> None:
        self.name, self.prefix, self.env, self.cwd = name, prefix, env, cwd

    def argv(self, *args: str) -> list[str]:
        return [*self.prefix, *args]

    def terminal(self, *args: str, rows: int = 24, cols: int = 80) -> OnTerminal:
        return OnTerminal(self.argv(*args), env=self.env, cwd=str(self.cwd), rows=rows, cols=cols)


def test_keys_window_changes_and_ctrl_c_reach_the_program(cli):
    with cli.terminal("-t", "--", SANDBOX_PYTHON, "-c", PROBE, rows=30, cols=100) as term:
        term.expect(b"size os.terminal_size(columns=100, lines=30) True True True")
        assert term.is_raw()
        term.type(b"hello\r")  # Enter is a carriage return on a terminal
        at = term.expect(b"read hello")
        term.resize(45, 140)
        at = term.expect(b"winch os.terminal_size(columns=140, lines=45)", since=at)
        term.type(b"\x03")  # raw mode: a byte for the program's terminal, which makes it SIGINT
        term.expect(b"interrupted", since=at)
        assert term.wait() == 0
        assert term.attrs() == term.initial_attrs


def test_vi_edits_and_saves_a_file_in_the_workspace(cli):
    with cli.terminal("-t", "--", "vi", "notes.txt", rows=30, cols=100) as term:
        term.expect(b"notes.txt")  # vi has drawn its screen
        term.type(b"ihello from vi\x1b:wq\r")
        assert term.wait() == 0, bytes(term.output)[-500:]
        assert term.attrs() == term.initial_attrs
    assert (cli.cwd / "notes.txt").read_text() == "hello from vi\n"


KILLABLE = r"""
import os, signal
print("ready", flush=True)
input()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_terminal_is_restored_when_the_program_is_killed(cli):
    with cli.terminal("-t", "--", SANDBOX_PYTHON, "-c", KILLABLE) as term:
        term.expect(b"ready")
        assert term.is_raw() and term.attrs() != term.initial_attrs
        term.type(b"\r")
        assert term.wait() == 128 + signal.SIGKILL
        assert term.attrs() == term.initial_attrs


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_the_terminal_is_restored_when_sluice_is_told_to_stop(cli, signum):
    with cli.terminal("-t", "--", SANDBOX_PYTHON, "-c", PROBE) as term:
        term.expect(b"size")
        assert term.is_raw()
        term.signal(signum)
        assert term.wait() == 128 + signum, bytes(term.output)
        assert term.attrs() == term.initial_attrs


def test_the_terminal_is_restored_when_the_daemon_goes_away(daemon_factory, sluice, tmp_path):
    d = daemon_factory.start(executors=1)
    env = dict(d.env_for_children(), TERM="xterm")
    with OnTerminal([*sluice, "run", "--cwd", str(tmp_path), "-t", "--", SANDBOX_PYTHON, "-c", PROBE],
                    env=env, cwd=str(tmp_path)) as term:
        term.expect(b"size")
        assert term.is_raw()
        os.kill(d.pid, signal.SIGKILL)
        assert term.wait() == 125
        assert term.attrs() == term.initial_attrs
        assert b"sluice: error:" in term.output


@pytest.mark.parametrize("command", ["sandbox", "run"])
def test_t_needs_a_terminal_on_stdin(command, sluice, module_daemon, tmp_path):
    env = module_daemon.env_for_children() if command == "run" else None
    r = subprocess.run([*sluice, command, "--cwd", str(tmp_path), "-t", "--", "true"], input=b"", env=env,
                       capture_output=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.count(b"\n") == 1 and b"not a terminal" in r.stderr, r.stderr


def test_i_forwards_lines_typed_on_a_terminal(cli):
    script = "test -t 0 || echo stdin-is-not-a-terminal; while read line; do echo got-$line; done; echo eof"
    with cli.terminal("-i", "--", "sh", "-c", script) as term:
        at = term.expect(b"stdin-is-not-a-terminal")
        assert not term.is_raw()  # the terminal stays ours: it echoes and edits the line
        term.type(b"first\n")
        at = term.expect(b"got-first", since=at)
        term.type(b"second\n")
        at = term.expect(b"got-second", since=at)
        term.type(b"\x04")  # Ctrl-D at the start of a line: end of file
        term.expect(b"eof", since=at)
        assert term.wait() == 0


CATCHES_CTRL_C = """
import sys, time
try:
    print("ready", flush=True)
    time.sleep(60)
except KeyboardInterrupt:
    print("caught KeyboardInterrupt", flush=True)
    sys.exit(7)
"""


def test_i_passes_ctrl_c_to_the_command_as_docker_does(cli):
    """Ctrl-C on our terminal is SIGINT for sluice; with -i the command gets it and decides."""
    with cli.terminal("-i", "--", SANDBOX_PYTHON, "-c", CATCHES_CTRL_C) as term:
        term.expect(b"ready")
        term.type(b"\x03")
        term.expect(b"caught KeyboardInterrupt")
        assert term.wait() == 7


def test_i_three_ctrl_c_end_a_command_that_ignores_it(cli):
    script = "trap 'echo got-INT' INT; echo ready; while :; do sleep 0.1; done"
    with cli.terminal("-i", "--", "sh", "-c", script) as term:
        at = term.expect(b"ready")
        term.type(b"\x03")
        at = term.expect(b"got-INT", since=at)  # passed: the trap ran, the command goes on
        term.type(b"\x03")
        term.expect(b"got-INT", since=at)
        term.type(b"\x03")  # the third within 2 s: sluice ends it, tree and all
        assert term.wait() == 130


IGNORES_EVERYTHING = """
import signal, sys, time
for s in (signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP):
    signal.signal(s, signal.SIG_IGN)
print("ready", flush=True)
for line in sys.stdin:
    print("read", line.strip(), flush=True)
"""


def test_t_tilde_dot_after_enter_ends_a_command_that_ignores_every_key(cli):
    with cli.terminal("-t", "--", SANDBOX_PYTHON, "-c", IGNORES_EVERYTHING) as term:
        at = term.expect(b"ready")
        term.type(b"\x03\x1c")  # Ctrl-C, Ctrl-\: ignored by the program
        term.type(b"a~b\r")  # a ~ inside a line is the program's
        at = term.expect(b"read a~b", since=at)
        term.type(b"~~x\r")  # ~~ types one ~
        at = term.expect(b"read ~x", since=at)
        term.type(b"~?")
        at = term.expect(b"escapes (after Enter): ~. end the command", since=at)
        assert term.is_raw()
        term.type(b"\r~.")
        term.expect(b"sluice: ~. typed: ending the command and its processes", since=at)
        assert term.wait() == 129  # as if its terminal hung up
        assert term.attrs() == term.initial_attrs


def test_t_escape_char_none_gives_every_key_to_the_command(cli):
    with cli.terminal("-t", "--escape-char", "none", "--", SANDBOX_PYTHON, "-c", IGNORES_EVERYTHING) as term:
        at = term.expect(b"ready")
        term.type(b"~.\r")
        at = term.expect(b"read ~.", since=at)
        term.type(b"\x04")  # Ctrl-D: end of file for the program's terminal
        assert term.wait() == 0


@pytest.mark.parametrize("value", ["ab", "", " ", "\u00e9"])
def test_a_bad_escape_char_is_a_usage_error(value, sluice, module_daemon, tmp_path):
    for command in ("sandbox", "run"):
        r = subprocess.run([*sluice, command, "--cwd", str(tmp_path), "--escape-char", value, "--", "true"],
                           input=b"", env=module_daemon.env_for_children(), capture_output=True, timeout=60)
        assert r.returncode == 2
        assert r.stderr.count(b"\n") == 1 and b"--escape-char must be one printable character" in r.stderr


def test_without_t_the_command_sees_no_terminal(cli):
    script = "for fd in 0 1 2; do test -t $fd && echo $fd-is-a-terminal; done; cat; echo done"
    with cli.terminal("--", "sh", "-c", script) as term:
        # Stdin, a terminal, is not forwarded without -i: cat reads /dev/null and ends.
        term.expect(b"done")
        assert term.wait() == 0
        assert b"is-a-terminal" not in term.output
        assert term.attrs() == term.initial_attrs


def test_the_client_library_runs_a_command_on_a_terminal(module_daemon, tmp_path):
    """``submit(tty=(rows, cols), stdin=True, interactive=True)``, keys by ``write_stdin``,
    ``resize`` before the command started (sent once it has) and after."""
    client = module_daemon.client()
    output = bytearray()

    def until(needle: bytes) -> None:
        wait_for(lambda: client.poll(0.05) >= 0 and needle in output, timeout=20, what=repr(needle))

    def type_(keys: bytes) -> None:
        while keys:
            client.poll(0.02)
            keys = keys[client.write_stdin(call, keys):]

    call = client.submit(["sh", "-c", "read line; echo got-$line; stty size"], cwd=str(tmp_path), tty=(30, 100),
                         stdin=True, interactive=True, on_output=lambda call, stream, chunk: output.extend(chunk))
    client.resize(call, 33, 111)  # not started yet: kept, and sent once it has (before any key)
    type_(b"first\r")
    until(b"got-first\r\n33 111\r\n")
    assert client.wait(call, timeout=20).exit_code == 0

    output.clear()
    call = client.submit([SANDBOX_PYTHON, "-c", PROBE], cwd=str(tmp_path), tty=(30, 100), stdin=True, interactive=True,
                         on_output=lambda call, stream, chunk: output.extend(chunk))
    until(b"size os.terminal_size(columns=100, lines=30) True True True")
    type_(b"typed\r")
    until(b"read typed")
    client.resize(call, 40, 120)
    until(b"winch os.terminal_size(columns=120, lines=40)")
    type_(b"\x03")
    until(b"interrupted")
    assert client.wait(call, timeout=20).exit_code == 0
    with pytest.raises(UsageError, match="no terminal to resize"):
        client.resize(client.submit(["true"], cwd=str(tmp_path)), 24, 80)
    with pytest.raises(UsageError, match="rows must be"):
        client.resize(call, 0, 80)


def test_raw_mode_comes_back_after_sluice_is_stopped_and_continued(cli):
    """A shell gives the terminal its own modes while a job is stopped; on SIGCONT sluice
    makes it raw again (and the window size is sent again)."""
    with cli.terminal("-t", "--", SANDBOX_PYTHON, "-c", PROBE) as term:
        term.expect(b"size")
        assert term.is_raw()
        term.signal(signal.SIGSTOP)
        termios.tcsetattr(term.slave, termios.TCSANOW, term.initial_attrs)  # what the shell does
        term.signal(signal.SIGCONT)
        wait_for(term.is_raw, timeout=20, what="raw mode again")
        term.type(b"after\r")
        term.expect(b"read after")
        term.type(b"\x03")
        term.expect(b"interrupted")
        assert term.wait() == 0
        assert term.attrs() == term.initial_attrs


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_sandbox_told_to_stop_exits_as_run_does(sluice, tmp_path, signum):
    """130, 143, 129: the command's tree ended, as `sluice run` says it."""
    proc = subprocess.Popen([*sluice, "sandbox", "--cwd", str(tmp_path), "--", "sh", "-c", "echo ready; exec sleep 60"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"ready\n"
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == 128 + signum
    finally:
        reap(proc)


def test_ctrl_z_stops_a_job_of_an_interactive_shell(cli):
    """``-it -- bash -i``: job control works on the command's own terminal (Ctrl-Z, fg, Ctrl-C)."""
    def sleeper(status: str | None = None):
        for p in psutil.process_iter(["cmdline", "status"]):
            if p.info["cmdline"] == ["sleep", "97.25"] and (status is None or p.info["status"] == status):
                return p
        return None

    with cli.terminal("-it", "--", "bash", "--norc", "--noprofile", "-i") as term:
        term.type(b"echo ready-$((6*7))\r")
        at = term.expect(b"ready-42")
        term.type(b"sleep 97.25\r")
        wait_for(sleeper, timeout=20, what="sleep to run in the foreground")
        term.type(b"\x1a")
        at = term.expect(b"Stopped", since=at)
        wait_for(lambda: sleeper(psutil.STATUS_STOPPED), timeout=20, what="sleep to be stopped")
        term.type(b"fg\r")
        wait_for(lambda: sleeper(psutil.STATUS_SLEEPING), timeout=20, what="sleep to run again")
        term.type(b"\x03")
        at = term.expect(b"\n", since=term.expect(b"^C", since=at))
        term.type(b"echo status-$?\r")
        term.expect(b"status-130", since=at)
        term.type(b"exit 3\r")
        assert term.wait() == 3
        assert term.attrs() == term.initial_attrs


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_shell_that_ignores_sigterm_still_ends_when_sluice_is_told_to_stop(cli, signum):
    """An interactive bash ignores SIGTERM: its tree is killed after a short grace."""
    with cli.terminal("-t", "--", "bash", "--norc", "--noprofile", "-i") as term:
        term.type(b"echo ready-$((6*7))\r")
        term.expect(b"ready-42")
        term.signal(signum)
        assert term.wait() == 128 + signum
        assert term.attrs() == term.initial_attrs
