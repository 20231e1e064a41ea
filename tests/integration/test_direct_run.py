"""Direct runs: a local ``sluice run`` hands the daemon its own stdio (run.sock), and the
sandboxed command writes to it itself. Real daemon, real sandbox, real processes."""

from __future__ import annotations

import array
import json
import os
import pathlib
import random
import signal
import socket
import stat
import subprocess

import pytest

from broker.wire import direct
from tests.support.harness import SANDBOX_PYTHON, live_processes, reap, wait_for

# What the command's fds 0-2 are, as it sees them: "pipe:[inode]", a path, ...
_FDS = "import os\nfor fd in (0, 1, 2):\n    print(fd, os.readlink(f'/proc/self/fd/{fd}'), flush=True)\n"


@pytest.fixture
def sluice_run(module_daemon, sluice, tmp_path):
    """sluice_run(*args, **subprocess_kw): ``sluice run --cwd TMP ARGS`` against the module's daemon."""

    def run(*args, **kw):
        kw.setdefault("timeout", 60)
        return subprocess.run([*sluice, "run", "--cwd", str(tmp_path), *args], env=module_daemon.env, **kw)

    return run


def _fds(text: str) -> dict[int, str]:
    return {int(fd): what for fd, what in (line.split(" ", 1) for line in text.splitlines())}


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _executors_connected(daemon, sluice) -> bool:
    p = subprocess.run([*sluice, "daemon", "status", "--json"], env=daemon.env, capture_output=True, timeout=30)
    return p.returncode == 0 and bool(json.loads(p.stdout)["executors"])


@pytest.mark.timeout(60)
def test_the_command_writes_to_pipes_of_sluice_runs_never_ours(module_daemon, sluice, sluice_run):
    # Its stderr is compared whole: not with a note that the run waits for an executor.
    wait_for(lambda: _executors_connected(module_daemon, sluice), timeout=30, what="an executor to connect")
    r_out, w_out = os.pipe()
    r_err, w_err = os.pipe()
    try:
        names = (os.readlink(f"/proc/self/fd/{w_out}"), os.readlink(f"/proc/self/fd/{w_err}"))
        script = _FDS + "import sys; print('to stderr', file=sys.stderr)"
        with open(os.devnull, "rb") as null:
            p = sluice_run("--", SANDBOX_PYTHON, "-c", script, stdin=null, stdout=w_out, stderr=w_err)
        os.close(w_out)
        os.close(w_err)
        w_out = w_err = -1
        out, err = _read_all(r_out).decode(), _read_all(r_err).decode()
    finally:
        for fd in (r_out, r_err, w_out, w_err):
            if fd >= 0:
                os.close(fd)
    assert p.returncode == 0, err
    fds = _fds(out)
    assert fds[1].startswith("pipe:") and fds[2].startswith("pipe:") and fds[1] != fds[2]
    assert not {fds[1], fds[2]} & set(names)  # sluice run's, spliced into ours
    assert fds[0] == "/dev/null"
    assert err == "to stderr\n"


@pytest.mark.timeout(60)
def test_via_broker_the_output_comes_through_the_daemon(sluice_run):
    p = sluice_run("--via-broker", "--", SANDBOX_PYTHON, "-c", _FDS, capture_output=True)
    assert p.returncode == 0, p.stderr
    ours = os.fstat(1)  # unrelated: the command's pipe is the executor's
    fds = _fds(p.stdout.decode())
    assert fds[1].startswith("pipe:") and fds[1] != f"pipe:[{ours.st_ino}]"


@pytest.mark.timeout(60)
def test_a_file_is_relayed_never_handed_to_the_command(sluice_run, tmp_path, outside):
    """Only anonymous pipes go to the sandbox: given our file, a command could fchmod it
    (setuid, for one) though it lies outside every writable root."""
    target = pathlib.Path(outside) / f"out-{random.randint(0, 1 << 30)}.txt"
    target.write_bytes(b"")
    os.chmod(target, 0o644)
    script = _FDS + "import os\ntry:\n    os.fchmod(1, 0o6777)\nexcept OSError as e:\n    print('fchmod', e.errno)\n"
    try:
        with open(target, "wb") as out:
            p = sluice_run("--", SANDBOX_PYTHON, "-c", script, stdout=out, stderr=subprocess.PIPE)
        assert p.returncode == 0, p.stderr
        fds = _fds(target.read_text().split("fchmod")[0])
        assert fds[1].startswith("pipe:"), fds  # a pipe of sluice run's, relayed into the file
        assert stat.S_IMODE(os.stat(target).st_mode) == 0o644
    finally:
        target.unlink()


@pytest.mark.timeout(60)
def test_stdin_a_pipe_or_a_file(sluice_run, tmp_path):
    p = sluice_run("--", "cat", input=b"through a pipe\n", capture_output=True)
    assert (p.returncode, p.stdout) == (0, b"through a pipe\n"), p.stderr
    big = tmp_path / "big"
    big.write_bytes(os.urandom(3 * 1024 * 1024 + 7))
    with open(big, "rb") as f:
        p = sluice_run("--", "wc", "-c", stdin=f, capture_output=True)
    assert (p.returncode, p.stdout.split()[0]) == (0, str(3 * 1024 * 1024 + 7).encode()), p.stderr


@pytest.mark.timeout(60)
def test_ctrl_c_kills_the_whole_tree_and_the_pipe_ends(module_daemon, sluice, tmp_path):
    marker = f"{random.randint(1000, 9999)}.{random.randint(100, 999)}"
    proc = subprocess.Popen(
        [*sluice, "run", "--cwd", str(tmp_path), "--", "sh", "-c",
         f"sleep {marker} & setsid sleep {marker} & echo started; wait"],
        env=module_daemon.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"started\n"

        wait_for(lambda: len(live_processes(["sleep", marker])) == 2, what="both sleeps")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 128 + signal.SIGINT
        assert proc.stdout.read() == b""  # its end came: nobody holds the pipe any more
        wait_for(lambda: not live_processes(["sleep", marker]), timeout=10, what="the tree to be gone")
        assert b"Traceback" not in proc.stderr.read()
    finally:
        reap(proc)


@pytest.mark.timeout(60)
def test_timeouts_and_exit_codes_are_the_daemons(sluice_run):
    p = sluice_run("--timeout-ms", "300", "--", "sleep", "30", capture_output=True)
    assert p.returncode == 124, p.stderr
    p = sluice_run("--", "sh", "-c", "exit 7", capture_output=True)
    assert p.returncode == 7
    p = sluice_run("--", "no-such-command-here", capture_output=True)
    assert p.returncode == 127 and b"command not found" in p.stderr


@pytest.mark.timeout(90)
def test_bad_clients_get_an_answer_and_leave_nothing_open(module_daemon, sluice_run):
    """Garbage, missing or extra fds, a second run: each gets one error line; the daemon
    keeps none of the fds it was sent, and serves the next run."""
    path = os.path.join(module_daemon.runtime.path, direct.SOCKET_NAME)
    token = module_daemon.runtime.read_token()
    assert sluice_run("--", "true").returncode == 0
    daemon = module_daemon.pid
    wait_for(lambda: _fd_count(daemon) == _fd_count(daemon), what="a steady count")
    before = _fd_count(daemon)

    def ask(payload: bytes, fds=()) -> dict | None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.connect(path)
            if fds:
                s.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            else:
                s.send(payload)
            s.settimeout(20)
            message, got = direct.receive(s)
            direct.close_all(got)
            return message

    r, w = os.pipe()
    try:
        assert "error" in ask(b"{not json")
        assert "error" in ask(b"[1, 2]")
        run = {"argv": ["true"], "cwd": "/", "sandbox": {"permissions": ["disk-full-read-access"]}, "stdin": False}

        def message(call: str, run: dict, token: str = token) -> bytes:
            return json.dumps({"run": run, "call": call, "token": token}).encode()

        assert ask(message("c0", run, "not-the-token"), [w, w])["error"] == "authentication failed"
        assert ask(b'{"run": {}, "call": "c0"}', [w, w])["error"] == "authentication failed"
        assert "file descriptors" in ask(message("c1", run))["error"]
        assert "file descriptors" in ask(message("c2", run), [w, w, w])["error"]
        assert "call id" in ask(message("../x", run), [w, w])["error"]
        assert "bad run request" in ask(message("c3", {"argv": 3}), [w, w])["error"]
    finally:
        os.close(w)
    # Every copy of the write end is closed: the daemon's too (else this read would hang).
    assert _read_all(r) == b""
    os.close(r)
    wait_for(lambda: _fd_count(daemon) <= before, timeout=10, what="the daemon to close what it was sent")
    assert sluice_run("--", "true").returncode == 0


@pytest.mark.timeout(120)
def test_runs_leave_no_fd_behind(module_daemon, sluice_run):
    daemon = module_daemon.pid
    assert sluice_run("--", "true").returncode == 0
    executors = module_daemon.executor_pids()
    before = {pid: _fd_count(pid) for pid in (daemon, *executors)}
    for args in (["true"], ["no-such-command-here"], ["sh", "-c", "echo x; exit 3"]):
        for _ in range(3):
            sluice_run("--", *args, capture_output=True)
    sluice_run("--timeout-ms", "100", "--", "sleep", "10", capture_output=True)

    def settled():
        return all(_fd_count(pid) <= n for pid, n in before.items())

    wait_for(settled, timeout=15, what="the daemon and its executors back to their fds")


@pytest.mark.timeout(60)
def test_a_sandboxed_command_cannot_reach_run_sock(module_daemon, sluice_run):
    """run.sock would run anything, its policy included: a command must not reach it,
    nor the token it asks for (the runtime dir is hidden, and a unix peer outside the
    sandbox is refused)."""
    rt = module_daemon.runtime.path
    probe = (
        "import socket, sys\n"
        f"rt = {rt!r}\n"
        "try: print('token', open(rt + '/token').read())\n"
        "except OSError as e: print('token refused', e.errno)\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        "try: s.connect(rt + '/run.sock'); print('run.sock connected')\n"
        "except OSError as e: print('run.sock refused', e.errno)\n"
    )
    token = module_daemon.runtime.read_token()
    for mode in ("workspace-write", "read-only"):
        p = sluice_run("--sandbox", mode, "--", SANDBOX_PYTHON, "-c", probe, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        assert "token refused" in p.stdout and "run.sock refused" in p.stdout, p.stdout
        assert token not in p.stdout


@pytest.mark.timeout(150)
def test_a_hung_daemon_is_given_up_on_and_its_command_cancelled_once_it_resumes(daemon_factory, sluice, tmp_path):
    d = daemon_factory.start(executors=1)
    marker = f"{random.randint(1000, 9999)}.{random.randint(100, 999)}"
    proc = subprocess.Popen([*sluice, "run", "--cwd", str(tmp_path), "--", "sleep", marker], env=d.env_for_children(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    try:
        wait_for(lambda: live_processes(["sleep", marker]), what="the command to run")
        os.kill(d.pid, signal.SIGSTOP)
        try:
            assert proc.wait(direct.SILENT_LIMIT_S + 30) == 125
        finally:
            os.kill(d.pid, signal.SIGCONT)
        err = proc.stderr.read().decode()
        assert "stopped answering" in err and "Traceback" not in err, err
        # Resumed, the daemon sees the caller gone and cancels its command.
        wait_for(lambda: not live_processes(["sleep", marker]), timeout=20, what="the command to be cancelled")
    finally:
        reap(proc)
