"""The Linux sandbox, tested against the real kernel through ``python -m landlock_helper``.

Every test runs real commands and checks both what they report and what is left on
disk or in the process table. The same checks run as root (CI's user) and, where a
Python interpreter is reachable by an unprivileged user, as ``nobody``.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import zipfile

import psutil
import pytest

from landlock_helper import SandboxPolicy, landlock
from landlock_helper.spawn import SandboxError, spawn
from tests.support.harness import live_processes, subprocess_env, wait_for
from tests.support.sandbox_harness import INNER_PYTHON, sandbox

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox")

# --- filesystem --------------------------------------------------------------------


def test_write_outside_fails_and_creates_nothing(as_user, nobody_env, workdir, outside):
    r = sandbox(f"echo pwned > {outside}/new; echo pwned > {outside}/victim; mkdir {outside}/d; "
                f"rm -f {outside}/victim; echo done", cwd=workdir, user=as_user, nobody=nobody_env)
    assert r.stdout.strip() == "done", r.stderr
    assert any(m in r.stderr for m in ("Permission denied", "Operation not permitted", "Read-only file system"))
    assert sorted(os.listdir(outside)) == ["victim"]
    assert open(os.path.join(outside, "victim")).read() == "original\n"


def test_writes_inside_roots_succeed(as_user, nobody_env, workdir, outside):
    r = sandbox(f"echo a > inside && mkdir sub && echo b > sub/f && echo c > /tmp/sl-$$ && rm /tmp/sl-$$ && "
                f"echo d > {outside}/extra && cat inside sub/f {outside}/extra",
                cwd=workdir, flags=["--writable", outside], user=as_user, nobody=nobody_env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["a", "b", "d"]
    assert (workdir / "inside").read_text() == "a\n"


def test_read_only_mode_writes_nowhere(workdir):
    r = sandbox("echo x > f; echo y > /tmp/sl-ro-$$; cat /etc/hostname > /dev/null && echo readable",
                cwd=workdir, flags=["--sandbox", "read-only"])
    assert r.stdout.strip() == "readable"
    assert not (workdir / "f").exists()
    assert r.stderr.count("Permission denied") + r.stderr.count("Read-only file system") == 2


def test_git_and_sluice_stay_read_only(as_user, nobody_env, workdir):
    r = sandbox("echo x >> .git/config; echo h > .git/hooks-pre; rm -rf .git; mv .git moved; "
                "echo y > .sluice/config; echo ok > normal; echo end",
                cwd=workdir, user=as_user, nobody=nobody_env)
    assert r.stdout.strip() == "end", r.stderr
    assert (workdir / ".git" / "config").read_text() == "[core]\n"
    assert sorted(os.listdir(workdir / ".git")) == ["config"]
    assert os.listdir(workdir / ".sluice") == []
    assert not (workdir / "moved").exists()
    assert (workdir / "normal").read_text() == "ok\n"


def test_symlink_and_hardlink_escapes_fail(as_user, nobody_env, workdir, outside):
    r = sandbox(f"ln -s {outside}/victim sym; echo pwned > sym; echo pwned >> sym; "
                f"ln {outside}/victim hard; echo pwned > hard; "
                f"ln -s {outside} dirlink; echo pwned > dirlink/new; echo end",
                cwd=workdir, user=as_user, nobody=nobody_env)
    assert r.stdout.strip() == "end", r.stderr
    assert open(os.path.join(outside, "victim")).read() == "original\n"
    assert sorted(os.listdir(outside)) == ["victim"]
    assert os.stat(os.path.join(outside, "victim")).st_nlink == 1  # the hard link was never made
    assert "Invalid cross-device link" in r.stderr or "Operation not permitted" in r.stderr


def test_hidden_path_is_empty_and_unreadable(as_user, nobody_env, workdir, open_tmp):
    hidden = open_tmp / "runtime"
    hidden.mkdir(mode=0o700)
    (hidden / "token").write_text("s3cret")
    os.chmod(hidden, 0o755)  # even if readable by its mode, the sandbox must hide it
    r = sandbox(f"ls -A {hidden}; cat {hidden}/token; echo x > {hidden}/new; echo end",
                cwd=workdir, flags=["--hide", str(hidden)], user=as_user, nobody=nobody_env)
    assert "s3cret" not in r.stdout
    assert r.stdout.strip().endswith("end")
    assert sorted(os.listdir(hidden)) == ["token"]


def test_raw_devices_unreadable_but_basic_devices_work(workdir):
    disks = [d for d in os.listdir("/dev") if d.startswith(("vd", "sd", "nvme", "xvd"))]
    cmd = "echo x > /dev/null && head -c 4 /dev/urandom | wc -c && head -c 4 /dev/zero | wc -c"
    if disks:
        cmd += f"; head -c 1 /dev/{disks[0]} | wc -c"
    r = sandbox(cmd, cwd=workdir)
    lines = r.stdout.split()
    assert lines[:2] == ["4", "4"], r.stderr
    if disks:
        # The private /dev has no disks at all.
        assert lines[2] == "0" and "No such file or directory" in r.stderr


# --- processes and kernel interfaces -------------------------------------------------


def test_no_new_privs_seccomp_and_no_capabilities(as_user, nobody_env, workdir):
    r = sandbox("grep -E '^(NoNewPrivs|Seccomp|CapEff|CapBnd):' /proc/self/status", cwd=workdir,
                user=as_user, nobody=nobody_env)
    fields = dict(line.split(":\t") for line in r.stdout.splitlines())
    assert fields["NoNewPrivs"] == "1"
    assert fields["Seccomp"] == "2"
    assert int(fields["CapEff"], 16) == 0
    assert int(fields["CapBnd"], 16) == 0


def test_only_own_tree_visible_and_outside_processes_unreachable(workdir):
    victim = subprocess.Popen(["sleep", "300"])
    try:
        r = sandbox(f"ls /proc | grep -c '^[0-9]'; kill -TERM {victim.pid}; echo kill=$?; "
                    "cat /proc/1/environ > /dev/null; echo environ=$?; kill -TERM 1; echo init=$?", cwd=workdir)
        out = r.stdout.split()
        assert int(out[0]) <= 5  # init, sh, ls, grep (and maybe one more transient)
        assert "kill=1" in out and "environ=1" in out and "init=1" in out
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_ptrace_and_process_vm_denied(workdir):
    code = textwrap.dedent("""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        pid = os.fork()
        if pid == 0:
            import time; time.sleep(5); os._exit(0)
        print("ptrace", libc.ptrace(16, pid, 0, 0), ctypes.get_errno())   # PTRACE_ATTACH
        print("vm", libc.syscall(310, pid, 0, 0, 0, 0, 0), ctypes.get_errno())  # process_vm_readv
        print("uring", libc.syscall(425, 8, 0), ctypes.get_errno())
        os.kill(pid, 9)
    """)
    r = sandbox(f"{INNER_PYTHON} -c '{code}'", cwd=workdir)
    lines = dict((ln.split()[0], ln.split()[1:]) for ln in r.stdout.splitlines())
    assert lines["ptrace"] == ["-1", "1"], r.stderr
    assert lines["vm"] == ["-1", "1"]
    assert lines["uring"] == ["-1", "1"]


def test_secret_environment_dropped(as_user, nobody_env, workdir):
    env = dict(os.environ, OPENAI_API_KEY="sk-1", GITHUB_TOKEN="gh", DB_PASSWORD="pw", AWS_SECRET_ACCESS_KEY="a",
               SSH_AUTH_SOCK="/x", PLAIN_SETTING="visible", PASS_ME_TOKEN="passed")
    r = sandbox("env", cwd=workdir, flags=["--env", "PASS_ME_TOKEN"], env=env, user=as_user, nobody=nobody_env)
    names = {line.split("=", 1)[0] for line in r.stdout.splitlines()}
    assert "PLAIN_SETTING" in names and "PASS_ME_TOKEN" in names
    assert not names & {"OPENAI_API_KEY", "GITHUB_TOKEN", "DB_PASSWORD", "AWS_SECRET_ACCESS_KEY", "SSH_AUTH_SOCK"}
    for secret in ("sk-1", "=gh", "=pw"):
        assert secret not in r.stdout


# --- network -----------------------------------------------------------------------


class _Servers:
    """TCP (IPv4, IPv6) and UDP listeners on loopback that record what reaches them."""

    def __init__(self):
        self.hits: list[str] = []
        self.socks = []
        self.tcp4 = self._tcp(socket.AF_INET, "127.0.0.1")
        self.tcp6 = self._tcp(socket.AF_INET6, "::1") if socket.has_ipv6 else None
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.bind(("127.0.0.1", 0))
        u.settimeout(0.2)
        self.socks.append(u)
        self.udp = u.getsockname()[1]
        self._stop = False
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _tcp(self, family, host):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
            s.bind((host, 0))
        except OSError:
            return None
        s.listen()
        s.settimeout(0.2)
        self.socks.append(s)
        return s.getsockname()[1]

    def _loop(self):
        while not self._stop:
            for s in self.socks:
                try:
                    if s.type == socket.SOCK_DGRAM:
                        data, _ = s.recvfrom(100)
                        self.hits.append("udp:" + data.decode())
                    else:
                        c, _ = s.accept()
                        self.hits.append("tcp%d" % (6 if s.family == socket.AF_INET6 else 4))
                        c.close()
                except (TimeoutError, OSError):
                    pass

    def sentinels(self) -> list[str]:
        """Reach every listener from here, unsandboxed, and wait until each hit is
        recorded: each listener's queue is read in order, so a connection or datagram
        sent before (one a probe got out) has been recorded by then too. The hits sent."""
        sent = ["udp:sentinel"]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.sendto(b"sentinel", ("127.0.0.1", self.udp))
        for name, family, host, port in (("tcp4", socket.AF_INET, "127.0.0.1", self.tcp4),
                                         ("tcp6", socket.AF_INET6, "::1", self.tcp6)):
            if port is not None:
                socket.create_connection((host, port), 2).close()
                sent.append(name)
        wait_for(lambda: all(h in self.hits for h in sent), timeout=10, what="the sentinels to reach the listeners")
        return sent

    def close(self):
        self._stop = True
        self.thread.join()
        for s in self.socks:
            s.close()


@pytest.fixture
def servers():
    s = _Servers()
    yield s
    s.close()


def _net_probe(servers) -> str:
    lines = [
        "import socket",
        "def t(name, fn):",
        "    try: fn(); print(name, 'ok')",
        "    except OSError as e: print(name, 'denied', e.errno)",
        f"t('tcp4', lambda: socket.create_connection(('127.0.0.1', {servers.tcp4}), 2).close())",
        f"t('udp', lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', {servers.udp})))",
        "t('unixpair', lambda: [s.send(b'x') for s in socket.socketpair()])",
        "t('raw', lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))",
        "import ctypes; libc = ctypes.CDLL(None, use_errno=True)",
        "r = libc.syscall(41, ctypes.c_long(0x100000002), 1, 0)",  # AF_INET with high bits set
        "print('highbits', 'ok' if r >= 0 else 'denied')",
    ]
    if servers.tcp6:
        lines.append(f"t('tcp6', lambda: socket.create_connection(('::1', {servers.tcp6}), 2).close())")
    return "\n".join(lines)


def _run_probe(servers, workdir, flags):
    script = workdir / "probe.py"
    script.write_text(_net_probe(servers))
    r = sandbox(f"{INNER_PYTHON} probe.py", cwd=workdir, flags=flags)
    return {ln.split()[0]: ln.split()[1] for ln in r.stdout.splitlines()}, r


def test_network_denied_without_flag(servers, workdir):
    res, r = _run_probe(servers, workdir, [])
    assert res["tcp4"] == "denied" and res["udp"] == "denied", r.stderr
    assert res["unixpair"] == "ok"
    assert res["highbits"] == "denied"
    if servers.tcp6:
        assert res["tcp6"] == "denied"
    sent = servers.sentinels()  # once they are in, a connection that got out would be too
    assert sorted(servers.hits) == sorted(sent)


def test_network_allowed_with_flag(servers, workdir):
    res, r = _run_probe(servers, workdir, ["--network"])
    assert res["tcp4"] == "ok" and res["udp"] == "ok", r.stderr
    if servers.tcp6:
        assert res["tcp6"] == "ok"
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and len(servers.hits) < (3 if servers.tcp6 else 2):
        time.sleep(0.05)
    assert "tcp4" in servers.hits and "udp:x" in servers.hits


def test_unix_socket_in_workspace_works(workdir):
    code = ("import socket,os; s=socket.socket(socket.AF_UNIX); s.bind('s.sock'); s.listen(); "
            "c=socket.socket(socket.AF_UNIX); c.connect('s.sock'); c.send(b'hi'); a,_=s.accept(); print(a.recv(2))")
    r = sandbox(f"{INNER_PYTHON} -c \"{code}\"", cwd=workdir)
    assert r.stdout.strip() == "b'hi'", r.stderr


# --- everything the policy allows still works --------------------------------------


@pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None, reason="needs cc and make")
def test_compiler_make_and_pipes(workdir):
    (workdir / "hello.c").write_text('#include <stdio.h>\nint main(void){puts("compiled");return 0;}\n')
    (workdir / "Makefile").write_text("hello: hello.c\n\tcc -o hello hello.c\n")
    r = sandbox("make -s && ./hello | tr a-z A-Z | cat", cwd=workdir)
    assert r.stdout.strip() == "COMPILED", r.stderr


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_works_in_a_fresh_repo(tmp_path):
    proj = tmp_path / "repo"
    proj.mkdir()
    r = sandbox("git init -q && git config user.email a@b && git config user.name n && echo x > f && "
                "git add f && git commit -qm one && git log --oneline | wc -l", cwd=proj)
    assert r.stdout.strip() == "1", r.stderr


def _write_wheel(path: pathlib.Path) -> None:
    """A minimal pure-Python wheel, built by hand so the test needs no build backend."""
    files = {
        "tinypkg/__init__.py": b"VALUE = 42\n",
        "tinypkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
        "tinypkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                       b"Tag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + "tinypkg-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("tinypkg-1.0.dist-info/RECORD", record)


def test_python_and_pip_without_network(tmp_path):
    if subprocess.run([INNER_PYTHON, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        pytest.skip(f"{INNER_PYTHON} has no pip")
    _write_wheel(tmp_path / "tinypkg-1.0-py3-none-any.whl")
    r = sandbox(f"{INNER_PYTHON} -m pip install -q --no-index --target site tinypkg-1.0-py3-none-any.whl "
                f"&& PYTHONPATH=site {INNER_PYTHON} -c 'import tinypkg; print(tinypkg.VALUE)'",
                cwd=tmp_path, env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1"), timeout=120)
    assert r.stdout.strip().endswith("42"), r.stderr


# --- process lifetime and exit status ----------------------------------------------


def test_exit_codes_and_signals(workdir):
    assert sandbox("exit 3", cwd=workdir).returncode == 3
    assert sandbox("kill -9 $$", cwd=workdir).returncode == 128 + 9
    r = sandbox("exec no-such-command-xyz", cwd=workdir)
    assert r.returncode == 127


def test_command_not_found_is_reported(workdir):
    r = subprocess.run([sys.executable, "-m", "landlock_helper", "--cwd", str(workdir), "--", "no-such-cmd-q"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 127
    assert "command not found: no-such-cmd-q" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.alone
def test_background_processes_die_with_the_command(workdir):
    marker = "313.%d" % (time.monotonic_ns() % 100000)
    r = sandbox(f"sleep {marker} & setsid sleep {marker} & (sleep {marker} &) ; echo started", cwd=workdir)
    assert r.stdout.strip() == "started"
    deadline = time.monotonic() + 2
    while live_processes(["sleep", marker]) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert live_processes(["sleep", marker]) == []


def test_terminate_kills_whole_tree(workdir):
    marker = "314.%d" % (time.monotonic_ns() % 100000)
    r, w = os.pipe()
    proc = spawn(["sh", "-c", f"sleep {marker} & setsid sleep {marker} & echo up; wait"], cwd=str(workdir),
                 env=dict(os.environ), policy=SandboxPolicy.from_mode("workspace-write"), stdout=w, stderr=w)
    os.close(w)
    assert os.read(r, 10) == b"up\n"
    deadline = time.monotonic() + 5
    while len(live_processes(["sleep", marker])) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)  # "up" can come before both sleeps have exec'd
    assert len(live_processes(["sleep", marker])) == 2
    t0 = time.monotonic()
    proc.terminate()
    outcome = proc.wait(10)
    elapsed = time.monotonic() - t0
    proc.close()
    os.close(r)
    assert outcome.signal == signal.SIGTERM
    assert live_processes(["sleep", marker]) == []
    assert elapsed < 5


def test_kill_tears_down_namespace_even_when_sigterm_ignored(workdir):
    marker = "315.%d" % (time.monotonic_ns() % 100000)
    proc = spawn(["sh", "-c", f"trap '' TERM; sleep {marker} & wait"], cwd=str(workdir), env=dict(os.environ),
                 policy=SandboxPolicy.from_mode("workspace-write"), stdout=1, stderr=2)
    deadline = time.monotonic() + 5
    while not live_processes(["sleep", marker]) and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.terminate()
    assert proc.wait(0.3) is None  # ignored SIGTERM: still running
    proc.kill()
    outcome = proc.wait(10)
    proc.close()
    assert outcome.signal == signal.SIGKILL
    assert live_processes(["sleep", marker]) == []


def test_many_quick_commands_all_report_their_status(workdir):
    """Fast commands finish before their supervisor reports the init's pid; none may be lost."""
    pol = SandboxPolicy.from_mode("workspace-write")
    procs = [spawn(["sh", "-c", f"exit {i % 7}"], cwd=str(workdir), env={"PATH": os.environ["PATH"]},
                   policy=pol, stdout=1, stderr=2) for i in range(150)]
    codes = []
    for p in procs:
        codes.append(p.wait(30).exit_code)
        p.close()
    assert codes == [i % 7 for i in range(150)]


# --- refusing to run less contained than asked -------------------------------------


def test_refuses_below_minimum_landlock_abi(monkeypatch, workdir):
    monkeypatch.setattr(landlock, "_abi_cache", landlock.MIN_ABI - 1)
    with pytest.raises(SandboxError, match="below the minimum"):
        spawn(["true"], cwd=str(workdir), env={}, policy=SandboxPolicy.from_mode("workspace-write"),
              stdout=1, stderr=2)
    monkeypatch.setattr(landlock, "_abi_cache", 0)
    with pytest.raises(SandboxError, match="not available"):
        spawn(["true"], cwd=str(workdir), env={}, policy=SandboxPolicy.from_mode("read-only"), stdout=1, stderr=2)


def test_bad_cwd_and_mode_are_one_line_errors(tmp_path):
    r = subprocess.run([sys.executable, "-m", "landlock_helper", "--cwd", str(tmp_path / "nope"), "--", "true"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "no such directory" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "landlock_helper", "--sandbox", "bogus", "--", "true"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "unknown sandbox mode" in r.stderr and "Traceback" not in r.stderr


# --- the warm-sandbox pool ---------------------------------------------------------


def test_pool_runs_commands_and_survives_its_zygote_dying(workdir):
    from landlock_helper.spawn import Spawner

    pol = SandboxPolicy.from_mode("workspace-write")
    env = {"PATH": os.environ["PATH"]}
    sp = Spawner(pool=2)
    try:
        outcomes = []
        for i in range(6):
            p = sp.spawn(["sh", "-c", f"exit {i}"], cwd=str(workdir), env=env, policy=pol, stdout=1, stderr=2)
            outcomes.append(p.wait(30).exit_code)
            p.close()
        assert outcomes == list(range(6))
        old = psutil.Process(sp.zygote_pid)
        warm = old.children(recursive=True)
        os.kill(sp.zygote_pid, signal.SIGKILL)
        # Its warm sandboxes die with it (pdeathsig): once they have, the pool must notice.
        gone, alive = psutil.wait_procs([old, *warm], timeout=30)
        assert alive == [], alive
        # The pool notices, drops them, and gets new ones from a new zygote.
        for _ in range(4):
            p = sp.spawn(["true"], cwd=str(workdir), env=env, policy=pol, stdout=1, stderr=2)
            assert p.wait(30).exit_code == 0
            p.close()
    finally:
        zygote = psutil.Process(sp.zygote_pid)
        family = [zygote, *zygote.children(recursive=True)]
        sp.close()
    gone, alive = psutil.wait_procs(family, timeout=5)
    assert alive == []


# In a process of its own: it fills its descriptor table.
AT_THE_FD_LIMIT = textwrap.dedent("""
    import os, resource, sys
    from landlock_helper import SandboxPolicy
    from landlock_helper.spawn import SandboxError, Spawner

    pol, env = SandboxPolicy.from_mode("workspace-write"), {"PATH": os.environ["PATH"]}
    sp = Spawner(pool=1)
    # The pool's one sandbox is taken: the next comes with its descriptors, once we take it.
    sp.spawn(["true"], cwd=sys.argv[1], env=env, policy=pol, stdout=1, stderr=2).wait(30)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
    held = []
    try:
        while True:
            held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    try:
        sp.refill(block=True)  # what the executor does when the zygote's socket is readable
        print("taken at the limit")
    except SandboxError as e:
        print("refused:", e)
    for fd in held:
        os.close(fd)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    print("then:", sp.spawn(["sh", "-c", "exit 7"], cwd=sys.argv[1], env=env, policy=pol, stdout=1,
                            stderr=2).wait(30).exit_code)
    sp.close()
""")


def test_pool_at_its_descriptor_limit_refuses_in_one_line_and_recovers(workdir):
    """The kernel drops the descriptors of a sandbox handed to a process at its limit of
    open files: that sandbox is lost, a command waiting for it is refused with the reason,
    and the next, once descriptors are free, runs."""
    r = subprocess.run([sys.executable, "-c", AT_THE_FD_LIMIT, str(workdir)], capture_output=True, text=True,
                       timeout=60, env=subprocess_env())
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["refused: cannot take a sandbox from the zygote: too many open files",
                                     "then: 7"], r.stdout + r.stderr


def test_pool_gives_each_command_without_network_a_network_namespace_of_its_own(workdir):
    """Warm sandboxes have one; a command with network gets the host's, in a sandbox made
    for it (where its listen on an abstract name is refused)."""
    from landlock_helper.spawn import Spawner

    listen = (INNER_PYTHON + " -c \"import socket; s = socket.socket(socket.AF_UNIX); s.bind(b'\\0sl-pool-%d'); "
              "s.listen(1); print('listening')\"" % os.getpid())
    sp = Spawner(pool=2)
    try:
        seen = {}
        for network in (False, False, True):
            r, w = os.pipe()
            p = sp.spawn(["sh", "-c", f"readlink /proc/self/ns/net; {listen} 2>&1 | tail -1"], cwd=str(workdir),
                         env={"PATH": os.environ["PATH"]}, policy=SandboxPolicy.from_mode("workspace-write",
                                                                                         network=network),
                         stdout=w, stderr=w)
            os.close(w)
            assert p.wait(30).exit_code == 0
            p.close()
            with os.fdopen(r) as f:
                seen.setdefault(network, []).append(f.read().split("\n", 1))
    finally:
        sp.close()
    host = os.readlink("/proc/self/ns/net")
    (ns1, out1), (ns2, out2) = seen[False]
    assert host not in (ns1, ns2) and ns1 != ns2 and out1.strip() == out2.strip() == "listening"
    [(ns, out)] = seen[True]
    assert ns == host and "Permission denied" in out, out


def test_pool_sandboxes_are_separate(workdir, outside):
    """Two commands from one pool share neither a PID namespace nor writable roots."""
    from landlock_helper.spawn import Spawner

    sp = Spawner(pool=2)
    try:
        r1, w1 = os.pipe()
        p1 = sp.spawn(["sh", "-c", "sleep 2 & ls /proc | grep -c '^[0-9]'; wait"], cwd=outside,
                      env={"PATH": os.environ["PATH"]}, policy=SandboxPolicy.from_mode("workspace-write"),
                      stdout=w1, stderr=2)
        os.close(w1)
        p2 = sp.spawn(["sh", "-c", f"echo x > {outside}/from-other"], cwd=str(workdir),
                      env={"PATH": os.environ["PATH"]}, policy=SandboxPolicy.from_mode("workspace-write"),
                      stdout=1, stderr=2)
        assert p2.wait(30).exit_code != 0
        assert not os.path.exists(os.path.join(outside, "from-other"))
        count = int(os.read(r1, 100).split()[0])
        assert count <= 5  # init, sh, sleep, ls, grep: nothing of p2
        p1.kill()
        p1.wait(30)
        for p in (p1, p2):
            p.close()
        os.close(r1)
    finally:
        sp.close()
