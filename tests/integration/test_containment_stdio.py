"""What a command can do with the descriptors it is handed as stdin, stdout and stderr.

On each path that hands a command its stdio (a direct ``sluice run``, ``sluice sandbox``,
``python -m landlock_helper``), as root and as ``nobody``: each attack of
tests/support/stdio_attacks.py is first run unsandboxed by the same user on the same
kind of descriptors, where it works, then through sluice, where the caller's pipes and
files come out as they went in (the command gets pipes of sluice's own,
landlock_helper/relay.py). Then byte-exactness of what the relay moves, and run.sock
refusing descriptors that are not pipe ends of the right direction.
"""

from __future__ import annotations

import array
import json
import os
import pathlib
import shutil
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile

import pytest

from broker.wire import direct
from tests.support import stdio_attacks
from tests.support.harness import ROOT, SANDBOX_PYTHON, subprocess_env
from tests.support.sandbox_harness import NOBODY

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox")

DRIVER = stdio_attacks.__file__
WAYS = ("run", "sandbox", "helper")
ATTACKS = ("inject", "steal", "nonblock", "files")
# Nobody's interpreter: the system's, with this checkout and the venv's packages (the
# venv's own interpreter may lie under a home nobody cannot enter).
NOBODY_PYTHON = "/usr/bin/python3"


def _as_nobody(argv: list[str]) -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]


@pytest.fixture(scope="module")
def nobody(tmp_path_factory):
    """A home, a runtime dir and a running daemon of nobody's; the env to reach them."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None or not os.access(NOBODY_PYTHON, os.X_OK):
        pytest.skip("needs root, setpriv and /usr/bin/python3 to act as an unprivileged user")
    base = tempfile.mkdtemp(prefix="sl-stdio-", dir="/tmp")
    os.chmod(base, 0o755)
    own = os.path.join(base, "u")
    os.mkdir(own, 0o700)
    os.chown(own, NOBODY, NOBODY)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent",
           "PYTHONPATH": os.pathsep.join([ROOT, sysconfig.get_paths()["purelib"]]),
           "SLUICE_HOME": os.path.join(own, "home"), "SLUICE_RUNTIME_DIR": os.path.join(own, "rt")}
    sluice = [NOBODY_PYTHON, "-m", "broker"]
    probe = subprocess.run(_as_nobody([NOBODY_PYTHON, "-c", "import zmq, msgspec, structlog, psutil"]), env=env,
                           capture_output=True)
    if probe.returncode != 0:
        shutil.rmtree(base)
        pytest.skip(f"{NOBODY_PYTHON} cannot import sluice's dependencies: {probe.stderr.decode()[-200:]}")
    try:
        started = subprocess.run(_as_nobody([*sluice, "daemon", "start", "--executors", "1"]), env=env,
                                 capture_output=True, text=True, timeout=60)
        assert started.returncode == 0, started.stderr
        yield env, sluice
    finally:
        subprocess.run(_as_nobody([*sluice, "daemon", "stop"]), env=env, capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(params=["root", "nobody"])
def user(request):
    return request.param


@pytest.fixture
def attack(request, user, open_tmp, outside, sluice):
    """attack(NAME, WAY): the driver's report of attack NAME run by ``user``, unsandboxed
    (WAY None) or through WAY."""

    def run(name: str, way: str | None) -> dict:
        cwd = str(open_tmp)
        if user == "root":
            module_daemon = request.getfixturevalue("module_daemon")
            env = module_daemon.env
            cli, python, wrap = sluice, sys.executable, list
        else:
            env, cli = request.getfixturevalue("nobody")
            python, wrap = NOBODY_PYTHON, _as_nobody
        prefix = {None: [], "run": [*cli, "run", "--cwd", cwd, "--"], "sandbox": [*cli, "sandbox", "--cwd", cwd, "--"],
                  "helper": [python, "-m", "landlock_helper", "--cwd", cwd, "--"]}[way]
        where = tempfile.mkdtemp(dir=outside)  # outside every writable root
        os.chmod(where, 0o777)
        p = subprocess.run(wrap([python, DRIVER, name, where, SANDBOX_PYTHON, *prefix]), env=env,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    return run


@pytest.mark.timeout(180)
@pytest.mark.parametrize("way", WAYS)
def test_a_command_cannot_write_into_the_pipe_that_feeds_it(attack, way):
    """``... | sluice run -- CMD`` in a script read by a shell: reopening its stdin for
    writing, the command would type into that shell."""
    bare = attack("inject", None)
    assert bare["injected"] == "echo INJECTED\n", bare  # the attack, where it works
    got = attack("inject", way)
    assert got["code"] == 0 and got["injected"] == "", got


@pytest.mark.timeout(180)
@pytest.mark.parametrize("way", WAYS)
def test_a_command_cannot_read_what_others_write_to_its_stdout(attack, way):
    secret = stdio_attacks.SECRET.decode()
    bare = attack("steal", None)
    assert bare["left"] == "" and "stole" in bare["stderr"] and "another writer" in bare["stderr"], bare
    got = attack("steal", way)
    assert got["code"] == 0 and got["left"] == secret, got
    assert "another writer" not in got["stderr"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("way", WAYS)
def test_a_command_leaves_no_flag_on_the_callers_pipes(attack, way):
    bare = attack("nonblock", None)
    assert (bare["stdin_blocking"], bare["stdout_blocking"]) == (False, False), bare
    got = attack("nonblock", way)
    assert got["code"] == 0 and (got["stdin_blocking"], got["stdout_blocking"]) == (True, True), got


@pytest.mark.timeout(180)
@pytest.mark.parametrize("way", WAYS)
def test_a_command_cannot_change_the_files_given_as_its_stdio(attack, way):
    """``CMD < FILE >> FILE2``: mode, times and extended attributes stay the caller's."""
    bare = attack("files", None)
    for name in ("stdin", "stdout"):
        assert bare[name]["mode"] == "0o666" and bare[name]["mtime"] == 1_000_000_000, bare
        if bare[name]["xattr"] is not None:
            assert bare[name]["xattr"] == "changed", bare
    got = attack("files", way)
    assert got["code"] == 0, got
    for name in ("stdin", "stdout"):
        assert got[name] == {"mode": "0o600", "mtime": stdio_attacks.TIMES[1],
                             "xattr": None if bare[name]["xattr"] is None else "original"}, got


# -- what the relay moves, exactly --------------------------------------------------------


@pytest.fixture
def through(request, sluice, tmp_path):
    """through(WAY, ARGV, **popen): ARGV run through WAY (as root)."""

    def run(way: str, argv: list[str], **kw):
        if way == "run":
            env = request.getfixturevalue("module_daemon").env
            prefix = [*sluice, "run", "--cwd", str(tmp_path), "--"]
        elif way == "sandbox":
            env = subprocess_env(request.getfixturevalue("runtime_dir"))
            prefix = [*sluice, "sandbox", "--cwd", str(tmp_path), "--"]
        else:
            env = subprocess_env()
            prefix = [sys.executable, "-m", "landlock_helper", "--cwd", str(tmp_path), "--"]
        return subprocess.run([*prefix, *argv], env=env, timeout=120, **kw)

    return run


@pytest.mark.timeout(180)
@pytest.mark.parametrize("way", WAYS)
def test_files_and_dev_null_get_exactly_the_bytes(through, way, tmp_path):
    data = os.urandom(3 * 1024 * 1024 + 7)
    src = tmp_path / "src"
    src.write_bytes(data)
    out, appended, err = tmp_path / "out", tmp_path / "appended", tmp_path / "err"
    appended.write_bytes(b"before\n")
    # stdin from a file, stdout into a file (spliced) and appended to one (O_APPEND: copied).
    for target, mode, before in ((out, "wb", b""), (appended, "ab", b"before\n")):
        with open(src, "rb") as stdin, open(target, mode) as stdout:
            p = through(way, ["cat"], stdin=stdin, stdout=stdout, stderr=subprocess.PIPE)
        assert p.returncode == 0, p.stderr
        assert target.read_bytes() == before + data
    # Into /dev/null, with stderr beside it exact: the command gets the sandbox's own.
    script = ("import os, sys\nsys.stderr.write(os.readlink('/proc/self/fd/1'))\n"
              "sys.stdout.buffer.write(sys.stdin.buffer.read())\n")
    with open(src, "rb") as stdin, open(os.devnull, "wb") as null, open(err, "wb") as stderr:
        p = through(way, [SANDBOX_PYTHON, "-c", script], stdin=stdin, stdout=null, stderr=stderr)
    assert (p.returncode, err.read_text()) == (0, "/dev/null")


# -- run.sock checks what it is handed --------------------------------------------------------


@pytest.mark.timeout(120)
def test_run_sock_takes_only_pipe_ends_of_the_right_direction(module_daemon, tmp_path, outside):
    """A client of the same user speaking run.sock itself (the CLI's choice of fds is no
    boundary): a file, a named FIFO or a pipe's wrong end is refused with one error line,
    and nothing runs. The same client with pipe ends runs the command."""
    path = os.path.join(module_daemon.runtime.path, direct.SOCKET_NAME)
    token = module_daemon.runtime.read_token()
    marker = tmp_path / "ran"
    script = f"import os\nopen({str(marker)!r}, 'w').close()\nos.fchmod(1, 0o6777)\n"

    def ask(fds: list[int], stdin: bool = False, null: tuple[str, ...] = ()) -> dict:
        run = {"argv": [SANDBOX_PYTHON, "-c", script], "cwd": str(tmp_path),
               "sandbox": {"permissions": ["disk-full-read-access", "disk-write-cwd"]}, "stdin": stdin,
               "stdio_null": list(null)}
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.connect(path)
            s.sendmsg([json.dumps({"run": run, "call": "c1", "token": token}).encode()],
                      [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            s.settimeout(60)
            while True:
                message, got = direct.receive(s)
                direct.close_all(got)
                if message is None or "exit" in message or "error" in message:
                    return message

    victim = pathlib.Path(outside) / "victim"
    os.chmod(victim, 0o644)
    fifo = pathlib.Path(outside) / "fifo"
    os.mkfifo(fifo)
    r, w = os.pipe()
    f_read = os.open(victim, os.O_RDONLY)
    fifo_rw = os.open(fifo, os.O_RDWR)
    try:
        # What a file's descriptor allows to whoever holds it: read-only, it still changes mode.
        os.fchmod(f_read, 0o640)
        os.fchmod(f_read, 0o644)
        for fds, stdin, null, what in (([f_read, w], False, (), "stdout sent is not a pipe"),
                                       ([w, fifo_rw], False, (), "stderr sent is not a pipe"),
                                       ([r, w], False, (), "stdout sent is not a pipe's write end"),
                                       ([w, w, w], True, (), "stdin sent is not a pipe's read end"),
                                       ([f_read], False, ("stdout",), "stderr sent is not a pipe"),
                                       ([w, w], False, ("stdout",), "sends 1 file descriptors (stderr), got 2")):
            answer = ask(fds, stdin, null)
            assert what in answer.get("error", ""), (what, answer)
            assert not marker.exists()
            assert stat.S_IMODE(os.stat(victim).st_mode) == 0o644
        assert "exit" in ask([w, w])  # the right ends: it runs
        assert marker.exists()
        marker.unlink()
        assert "exit" in ask([w], null=("stdout",))  # stdout the sandbox's /dev/null: fchmod fails there
        assert marker.exists()
    finally:
        for fd in (r, w, f_read, fifo_rw):
            os.close(fd)
