"""Unix sockets and setuid bits: two ways out of the sandbox, tested shut.

The threat: a unix socket is a door to whatever listens on it. A sandboxed command that
reaches the user's tmux server runs anything unsandboxed (``tmux -S sock send-keys``);
the same for ssh-agent, the Docker socket, D-Bus or X11. Landlock (up to ABI 8) does not
govern ``connect`` to a socket file, and a read-only mount does not stop it either; so
every ``connect`` of the command is performed by the sandbox's init, which keeps the
connection only if the listener lives inside the sandbox (landlock_helper.unix_guard).
A hostile command attacks that: it swaps the address under the init's feet from another
thread, swaps the fd with ``dup2``, tries abstract names, datagram sockets that name any
path on every send, taking the listener from the init, or a listener of its own.

Second door: a root command (or any user's) that leaves a setuid or setgid file in the
workspace has planted a privilege escalation for whoever runs it later. Setting either
bit fails inside the sandbox, through every call that takes a mode.

Every test runs real commands through ``python -m landlock_helper`` on the real kernel,
as root and (where marked) as ``nobody``, and checks what reached the other side.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import uuid

import pytest

from landlock_helper import _libc
from tests.support.harness import reap, wait_for
from tests.support.sandbox_harness import INNER_PYTHON, NOBODY, sandbox, start_sandbox

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox"),
              pytest.mark.timeout(90)]


class UnixServer:
    """A unix stream server outside the sandbox that records every byte that reaches it."""

    def __init__(self, address, *, mode: int = 0o777) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(address)
        if isinstance(address, str):
            os.chmod(address, mode)  # so that a refusal is the sandbox's, not the file mode's
        self.sock.listen(64)
        self.sock.settimeout(0.1)
        self.received = b""
        self.connections = 0
        self._stop = False
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        conns: list[socket.socket] = []
        while not self._stop:
            with contextlib.suppress(OSError):
                c, _ = self.sock.accept()
                c.settimeout(0.05)
                conns.append(c)
                self.connections += 1
            # A connection its peer closed (as every refused connect's is) is dropped once
            # read to its end: the race tests make thousands, and reading each of them again
            # after every accept made those tests quadratic (3,000 connects: 7 s, not 1).
            still_open = []
            for c in conns:
                try:
                    data = c.recv(4096)
                except TimeoutError:  # nothing yet
                    still_open.append(c)
                    continue
                except OSError:
                    data = b""
                self.received += data
                if data:
                    still_open.append(c)
                else:
                    c.close()
            conns = still_open
        for c in conns:
            c.close()

    def close(self) -> None:
        self._stop = True
        self._thread.join(5)
        self.sock.close()
        if isinstance(self.address, str):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.address)


@pytest.fixture
def servers():
    made: list[UnixServer] = []

    def make(address, **kw) -> UnixServer:
        s = UnixServer(address, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def _python(user, nobody) -> str:
    """A Python for inside the sandbox (the probes use the standard library only)."""
    if user == "nobody":
        # The sandbox's user namespace maps no one else: a Python under a private home
        # (pyenv in /root) may be unreachable inside even where setpriv reached it outside.
        return "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else nobody[0]
    return INNER_PYTHON


def run_python(code: str, *, cwd, user="root", nobody=None, flags=(), name="probe.py"):
    """Run ``code`` with Python inside the sandbox; returns CompletedProcess."""
    path = os.path.join(str(cwd), name)
    with open(path, "w") as f:
        f.write(textwrap.dedent(code))
    os.chmod(path, 0o644)
    return sandbox(f"{_python(user, nobody)} {name}", cwd=cwd, flags=flags, user=user, nobody=nobody)


def results(r) -> dict[str, str]:
    """``name value`` lines printed by a probe."""
    out = {}
    for line in r.stdout.splitlines():
        key, _, value = line.partition(" ")
        out[key] = value
    return out


CLIENT = """
import errno, socket, sys
def attempt(name, addr, kind=socket.SOCK_STREAM):
    c = socket.socket(socket.AF_UNIX, kind)
    try:
        c.connect(addr)
    except OSError as e:
        print(name, errno.errorcode[e.errno])
        return
    c.sendall(b"escaped from " + name.encode())
    print(name, "connected")
"""


def _chmod_dirs_open(path: str) -> None:
    """Every directory from ``path`` up must be traversable by nobody for a fair test."""
    d = os.path.dirname(path)
    while d not in ("/", ""):
        st = os.stat(d)
        if not st.st_mode & 0o001:
            os.chmod(d, st.st_mode | 0o011)
        d = os.path.dirname(d)


# --- unix sockets outside the sandbox -------------------------------------------------


@pytest.mark.parametrize("where", ["tmp", "outside", "workspace"])
def test_unix_server_outside_is_unreachable_and_gets_nothing(where, as_user, nobody_env, workdir, outside,
                                                             open_tmp, servers):
    base = {"tmp": str(open_tmp), "outside": outside, "workspace": str(workdir)}[where]
    path = os.path.join(base, "daemon.sock")
    _chmod_dirs_open(path)
    server = servers(path)
    os.symlink(path, workdir / "link.sock") if where != "workspace" else None
    code = CLIENT + f"""
attempt("absolute", {path!r})
attempt("seqpacket", {path!r}, socket.SOCK_SEQPACKET)
attempt("relative", {os.path.relpath(path, workdir)!r})
"""
    if where != "workspace":
        code += 'attempt("symlink", "link.sock")\n'
    r = run_python(code, cwd=workdir, user=as_user, nobody=nobody_env)
    res = results(r)
    # The host's /tmp is not even visible (the sandbox's /tmp is its own); elsewhere the
    # socket is there to see, and the listener check refuses it.
    refused = "ENOENT" if where == "tmp" else "EACCES"
    assert res.get("absolute") == refused, r.stdout + r.stderr
    assert res["relative"] == refused
    assert res["seqpacket"] in (refused, "EPROTOTYPE", "ECONNREFUSED")  # a stream listener
    if where != "workspace":
        assert res["symlink"] == refused
    assert server.received == b""


# --- abstract unix socket names ----------------------------------------------------------
#
# Abstract names (``@name``) are not files: no mount or Landlock path rule reaches them, and
# they live per network namespace. Without network the sandbox has a network namespace of
# its own, so its names are its own both ways; with network it shares the host's, and the
# init refuses a command's listen on an abstract name and every connect that leads out.

NETWORK = pytest.mark.parametrize("network", [False, True], ids=["no-network", "network"])


def _abstract_name() -> bytes:
    return b"\0sluice-test-%d-%s" % (os.getpid(), uuid.uuid4().hex[:8].encode())


def _flags(network: bool) -> tuple[str, ...]:
    return ("--network",) if network else ()


def test_abstract_socket_outside_is_unreachable(as_user, nobody_env, workdir, servers):
    # Where it should, the connect works: the same probe, unsandboxed.
    reachable = servers(_abstract_name())
    r = subprocess.run([sys.executable, "-c", CLIENT + f"attempt('abstract', {reachable.address!r})\n"],
                       capture_output=True, text=True, timeout=30)
    assert results(r).get("abstract") == "connected", r.stdout + r.stderr
    wait_for(lambda: reachable.received, what="the unsandboxed client's bytes")
    for network in (False, True):
        server = servers(_abstract_name())
        r = run_python(CLIENT + f"attempt('abstract', {server.address!r})\n", cwd=workdir, user=as_user,
                       nobody=nobody_env, flags=_flags(network))
        # Without network the name does not exist in the sandbox's namespace; with it, the
        # init finds the listener outside and refuses it.
        assert results(r).get("abstract") == ("EACCES" if network else "ECONNREFUSED"), (network, r.stdout,
                                                                                          r.stderr)
        assert server.received == b""


LISTENER = """
import errno, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.bind(NAME)
    s.listen(8)
except OSError as e:
    print("listen", errno.errorcode[e.errno], flush=True)
    sys.exit(0)
print("listen ok", flush=True)
sys.stdin.readline()  # the other side has tried
s.setblocking(False)
got = b""
while True:
    try:
        c, _ = s.accept()
    except BlockingIOError:
        break
    c.settimeout(10)
    while chunk := c.recv(4096):
        got += chunk
print("got", len(got), flush=True)
"""


def _host_connect(name: bytes) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        try:
            c.connect(name)
        except OSError as e:
            return errno.errorcode[e.errno]
        c.sendall(b"x")
        return "connected"


def _host_bind(name: bytes) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.bind(name)
        except OSError as e:
            return errno.errorcode[e.errno]
        return "bound"


def _start_listener(name: bytes, *, cwd, sandboxed: bool, network: bool = False, user="root", nobody=None):
    """LISTENER on ``name``, sandboxed or not; returns (process, its first line)."""
    code = f"NAME = {name!r}\n" + LISTENER
    if not sandboxed:
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, bufsize=1)
    else:
        path = os.path.join(str(cwd), "listener.py")
        with open(path, "w") as f:
            f.write(code)
        os.chmod(path, 0o644)
        proc = start_sandbox(f"{_python(user, nobody)} listener.py", cwd=cwd, flags=_flags(network), user=user,
                             nobody=nobody)
    return proc, proc.stdout.readline().strip()


def _finish_listener(proc) -> str:
    """Tell the listener the other side has tried; what reached it ("got N", bytes)."""
    try:
        out, _ = proc.communicate("done\n", timeout=30)
        return out.strip()
    finally:
        reap(proc)


@NETWORK
def test_a_host_process_cannot_reach_a_name_the_command_listens_on(network, as_user, nobody_env, workdir):
    # Where it should, it works: the same listener, unsandboxed, is reached from here, and
    # holds its name (nobody else may bind it).
    name = _abstract_name()
    proc, first = _start_listener(name, cwd=workdir, sandboxed=False)
    try:
        assert first == "listen ok"
        assert _host_bind(name) == "EADDRINUSE"
        assert _host_connect(name) == "connected"
        assert _finish_listener(proc) == "got 1"
    finally:
        reap(proc)
    name = _abstract_name()
    proc, first = _start_listener(name, cwd=workdir, sandboxed=True, network=network, user=as_user,
                                  nobody=nobody_env)
    try:
        # Without network the command listens in a namespace of its own; with network the
        # init refuses to listen on an abstract name at all.
        assert first == ("listen EACCES" if network else "listen ok"), first
        assert _host_connect(name) == "ECONNREFUSED"
        if not network:
            assert _host_bind(name) == "bound"  # the host's name is still free: nothing squatted
            assert _finish_listener(proc) == "got 0"
    finally:
        reap(proc)


@NETWORK
def test_two_sandboxes_cannot_reach_each_other_by_abstract_name(network, as_user, nobody_env, workdir):
    # (That an abstract listener is reachable where nothing stands between is shown above.)
    name = _abstract_name()
    proc, first = _start_listener(name, cwd=workdir, sandboxed=True, network=network, user=as_user,
                                  nobody=nobody_env)
    try:
        assert first == ("listen EACCES" if network else "listen ok"), first
        r = run_python(CLIENT + f"attempt('abstract', {name!r})\n", cwd=workdir, user=as_user, nobody=nobody_env,
                       flags=_flags(network))
        assert results(r).get("abstract") == "ECONNREFUSED", r.stdout + r.stderr
        assert _finish_listener(proc) == ("" if network else "got 0")
    finally:
        reap(proc)


def _tmux(sock: str, *args: str, user: str = "root", nobody=None, check: bool = True):
    argv = ["tmux", "-f", "/dev/null", "-S", sock, *args]
    env = dict(os.environ)
    env.pop("TMUX", None)
    # The server's panes run $SHELL; without it, tmux takes the user's login shell, and
    # nobody's is nologin: the pane, its session and the server would end at once.
    env["SHELL"] = "/bin/sh"
    if user == "nobody":
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]
        env["HOME"] = "/nonexistent"
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=20)
    assert not check or r.returncode == 0, f"tmux {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}"
    return r


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_tmux_server_outside_cannot_be_driven(as_user, nobody_env, workdir, outside):
    """The real thing: a tmux server (of the same user) outside, driven from inside."""
    sock = os.path.join(outside, "tmux.sock")
    owned = NOBODY if as_user == "nobody" else 0
    os.chown(outside, owned, owned)
    _tmux(sock, "new-session", "-d", "-s", "victim", "sh", user=as_user, nobody=nobody_env)
    try:
        marker, window_marker, done = (os.path.join(outside, n) for n in ("pwned", "pwned-window", "done"))
        r = sandbox(f"tmux -f /dev/null -S {sock} send-keys -t victim 'touch {marker}' Enter; echo send=$?; "
                    f"tmux -f /dev/null -S {sock} new-window -t victim 'touch {window_marker}'; echo new=$?",
                    cwd=workdir, user=as_user, nobody=nobody_env, env=dict(os.environ, TMUX=""))
        assert "send=0" not in r.stdout and "new=0" not in r.stdout, r.stdout + r.stderr
        assert "send=" in r.stdout and "new=" in r.stdout
        # tmux handles its clients in order: once a later command of ours has run, anything
        # the sandboxed one had managed to queue would have run too.
        _tmux(sock, "new-window", "-t", "victim", f"touch {done}", user=as_user, nobody=nobody_env)
        wait_for(lambda: os.path.exists(done), what="tmux to run a command from outside")
        _tmux(sock, "send-keys", "-t", "victim:0", f"touch {done}-keys", "Enter", user=as_user, nobody=nobody_env)
        wait_for(lambda: os.path.exists(done + "-keys"), what="tmux to type into the pane from outside")
        assert not os.path.exists(marker) and not os.path.exists(window_marker)
    finally:
        _tmux(sock, "kill-server", user=as_user, nobody=nobody_env, check=False)


# --- attacks on the check itself ------------------------------------------------------

RACE_C = r"""
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static struct sockaddr_un addr;   /* the address connect() reads; flipped by a thread */
static const char *inside, *outside_path;
static volatile int stop;
static int swapped_fd = 100, sa, sb;

static void *flip_address(void *arg) {
    (void)arg;
    while (!stop) {
        strcpy(addr.sun_path, outside_path);
        strcpy(addr.sun_path, inside);
    }
    return NULL;
}

static void *flip_fd(void *arg) {
    (void)arg;
    while (!stop) { dup2(sa, swapped_fd); dup2(sb, swapped_fd); }
    return NULL;
}

int main(int argc, char **argv) {
    inside = argv[1]; outside_path = argv[2];
    int rounds = atoi(argv[3]), ok = 0, refused = 0, other = 0;
    addr.sun_family = AF_UNIX;
    strcpy(addr.sun_path, inside);
    pthread_t t;
    if (!strcmp(argv[4], "address")) {
        pthread_create(&t, NULL, flip_address, NULL);
        for (int i = 0; i < rounds; i++) {
            int c = socket(AF_UNIX, SOCK_STREAM, 0);
            if (connect(c, (struct sockaddr *)&addr, sizeof addr) == 0) {
                ok++;
                send(c, "escaped", 7, MSG_NOSIGNAL);
            } else if (errno == EACCES) refused++; else other++;
            close(c);
        }
    } else {  /* fd: connect fd 100 to the outside while it is swapped between two sockets */
        sa = socket(AF_UNIX, SOCK_STREAM, 0);
        sb = socket(AF_UNIX, SOCK_SEQPACKET, 0);
        struct sockaddr_un out = {.sun_family = AF_UNIX};
        strcpy(out.sun_path, outside_path);
        dup2(sa, swapped_fd);
        pthread_create(&t, NULL, flip_fd, NULL);
        for (int i = 0; i < rounds; i++) {
            if (connect(swapped_fd, (struct sockaddr *)&out, sizeof out) == 0) {
                ok++;
                send(swapped_fd, "escaped", 7, MSG_NOSIGNAL);
                sa = socket(AF_UNIX, SOCK_STREAM, 0);  /* connected now: use fresh ones */
                sb = socket(AF_UNIX, SOCK_SEQPACKET, 0);
            } else if (errno == EACCES) refused++; else other++;
        }
    }
    stop = 1;
    pthread_join(t, NULL);
    printf("ok %d\nrefused %d\nother %d\n", ok, refused, other);
    return 0;
}
"""


@pytest.fixture(scope="module")
def race_binary():
    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler")
    d = tempfile.mkdtemp(prefix="sl-race-", dir="/var/tmp")  # the host's /tmp is not in the sandbox's view
    os.chmod(d, 0o755)  # nobody runs it too
    src, exe = os.path.join(d, "race.c"), os.path.join(d, "race")
    with open(src, "w") as f:
        f.write(RACE_C)
    subprocess.run(["cc", "-O1", "-pthread", "-o", exe, src], check=True, timeout=60)
    os.chmod(exe, 0o755)
    yield exe
    shutil.rmtree(d, ignore_errors=True)


def test_swapping_the_address_during_connect_never_reaches_outside(race_binary, as_user, nobody_env, workdir,
                                                                   outside, servers):
    out_path = os.path.join(outside, "d.sock")
    server = servers(out_path)
    # An inside listener that accepts (and drops) whatever reaches it.
    wrapper = f"""
import socket, subprocess, threading
srv = socket.socket(socket.AF_UNIX)
srv.bind("in.sock")
srv.listen(128)
def drain():
    while True:
        srv.accept()[0].close()
threading.Thread(target=drain, daemon=True).start()
print(subprocess.run([{race_binary!r}, "in.sock", {out_path!r}, "3000", "address"],
                     capture_output=True, text=True).stdout)
"""
    (workdir / "wrapper.py").write_text(wrapper)
    script = f"{_python(as_user, nobody_env)} wrapper.py"
    r = sandbox(script, cwd=workdir, user=as_user, nobody=nobody_env, timeout=80)
    res = results(r)
    assert int(res["ok"]) + int(res["refused"]) + int(res["other"]) == 3000, r.stdout + r.stderr
    assert int(res["ok"]) > 0 and int(res["refused"]) > 0  # both addresses were really tried
    assert server.received == b""


def test_swapping_the_fd_during_connect_never_reaches_outside(race_binary, as_user, nobody_env, workdir, outside,
                                                              servers):
    out_path = os.path.join(outside, "d.sock")
    server = servers(out_path)
    r = sandbox(f"{race_binary} unused {out_path} 2000 fd", cwd=workdir, user=as_user, nobody=nobody_env, timeout=80)
    res = results(r)
    assert res.get("ok") == "0", r.stdout + r.stderr
    assert int(res["refused"]) + int(res["other"]) == 2000
    assert int(res["refused"]) > 0  # the stream socket was really tried against the outside
    assert server.received == b""


def test_the_command_cannot_take_the_listener_or_install_its_own(as_user, nobody_env, workdir):
    """Whoever holds the notification listener decides every connect: it must stay the init's."""
    code = """
    import ctypes, errno, os
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    def err(ret):
        return "ok" if ret >= 0 else errno.errorcode[ctypes.get_errno()]
    pidfd = libc.syscall(434, 1, 0)                       # pidfd_open(init)
    print("pidfd", "ok" if pidfd >= 0 else "bad")
    taken = [err(libc.syscall(438, pidfd, fd, 0)) for fd in range(3, 64)]  # pidfd_getfd
    print("getfd", ",".join(sorted(set(taken))))
    opened = []
    for fd in range(64):
        try:
            os.close(os.open("/proc/1/fd/%d" % fd, os.O_RDONLY)); opened.append("ok")
        except OSError as e:
            opened.append(errno.errorcode[e.errno])
    print("procfd", ",".join(sorted(set(opened))))
    print("kill", err(libc.kill(1, 15)))
    # A filter of our own with a listener (it would answer our connects): refused.
    class F(ctypes.Structure): _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8),
                                           ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]
    class P(ctypes.Structure): _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(F))]
    allow = (F * 1)(F(0x06, 0, 0, 0x7FFF0000))
    prog = P(1, ctypes.cast(allow, ctypes.POINTER(F)))
    print("listener", err(libc.syscall(NR_SECCOMP, 1, 8, ctypes.byref(prog))))  # NEW_LISTENER
    """
    code = code.replace("NR_SECCOMP", str(_libc.nr("seccomp")))
    r = run_python(code, cwd=workdir, user=as_user, nobody=nobody_env)
    res = results(r)
    assert res.get("pidfd") == "ok", r.stdout + r.stderr
    assert res["getfd"] == "EPERM"
    assert "ok" not in res["procfd"].split(",")
    assert res["kill"] == "EPERM"
    assert res["listener"] == "EBUSY"


# --- what a command does with its own sockets still works -------------------------------

INSIDE = """
import errno, fcntl, os, socket, threading

def result(name, fn):
    try:
        print(name, fn())
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, e.errno))

def pair(kind, address):
    srv = socket.socket(socket.AF_UNIX, kind)
    srv.bind(address)
    srv.listen(64)
    c = socket.socket(socket.AF_UNIX, kind)
    c.connect(address)
    a, _ = srv.accept()
    c.sendall(b"ping")
    got = a.recv(4)
    a.sendall(b"pong")
    back = c.recv(4)
    ok = got == b"ping" and back == b"pong" and c.getpeername() == srv.getsockname()
    for s in (srv, c, a):
        s.close()
    return "ok" if ok else "bad"

result("stream", lambda: pair(socket.SOCK_STREAM, "stream.sock"))
result("seqpacket", lambda: pair(socket.SOCK_SEQPACKET, "seq.sock"))
result("absolute", lambda: pair(socket.SOCK_STREAM, os.path.abspath("abs.sock")))
result("abstract", lambda: pair(socket.SOCK_STREAM, b"\\0sluice-inside-%d" % os.getpid()))

def many():
    srv = socket.socket(socket.AF_UNIX)
    srv.bind("many.sock")
    srv.listen(16)
    for _ in range(300):
        c = socket.socket(socket.AF_UNIX)
        c.connect("many.sock")
        a, _ = srv.accept()
        c.sendall(b"x")
        assert a.recv(1) == b"x"
        c.close(); a.close()
    return "ok"
result("many", many)

def nonblocking():
    srv = socket.socket(socket.AF_UNIX)
    srv.bind("nb.sock")
    srv.listen()
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
    c.connect("nb.sock")
    a, _ = srv.accept()
    return "ok" if not c.getblocking() and c.getpeername() else "bad"
result("nonblocking", nonblocking)

def with_timeout():  # what socket.create_connection does: settimeout, then connect
    srv = socket.socket(socket.AF_UNIX)
    srv.bind("to.sock")
    srv.listen()
    c = socket.socket(socket.AF_UNIX)
    c.settimeout(5)
    c.connect("to.sock")
    c.sendall(b"t")
    a, _ = srv.accept()
    return "ok" if a.recv(1) == b"t" else "bad"
result("timeout", with_timeout)

def flags():
    srv = socket.socket(socket.AF_UNIX)
    srv.bind("fl.sock")
    srv.listen()
    keep = socket.socket(socket.AF_UNIX)                  # Python: close-on-exec
    keep.connect("fl.sock")
    inherit = socket.socket(socket.AF_UNIX)
    os.set_inheritable(inherit.fileno(), True)
    inherit.connect("fl.sock")
    cloexec = lambda s: bool(fcntl.fcntl(s.fileno(), fcntl.F_GETFD) & fcntl.FD_CLOEXEC)
    return "ok" if cloexec(keep) and not cloexec(inherit) and keep.getblocking() else "bad"
result("flags", flags)

def backlog_full():  # a blocking connect waits for room, as without the sandbox
    srv = socket.socket(socket.AF_UNIX)
    srv.bind("bl.sock")
    srv.listen(0)
    first = socket.socket(socket.AF_UNIX)
    first.connect("bl.sock")
    second = socket.socket(socket.AF_UNIX)
    done = []
    t = threading.Thread(target=lambda: done.append(second.connect("bl.sock")))
    t.start()
    t.join(0.3)
    waited = t.is_alive()
    srv.accept()
    t.join(10)
    return "ok" if waited and done == [None] else "bad %s %s" % (waited, done)
result("backlog", backlog_full)

def isconn():
    a, b = socket.socketpair()
    a.connect("stream.sock")
result("isconn", isconn)

def bound_first():
    srv = socket.socket(socket.AF_UNIX)
    srv.bind("bf.sock")
    srv.listen()
    c = socket.socket(socket.AF_UNIX)
    c.bind("client.sock")
    c.connect("bf.sock")
result("bound", bound_first)
result("missing", lambda: socket.socket(socket.AF_UNIX).connect("nothing.sock"))

def peer_pid():  # the init makes the connection: the server sees pid 1, the client sees the server
    import struct
    srv = socket.socket(socket.AF_UNIX)
    srv.bind("pp.sock")
    srv.listen()
    c = socket.socket(socket.AF_UNIX)
    c.connect("pp.sock")
    a, _ = srv.accept()
    ucred = lambda s: struct.unpack("iII", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return "%d %d" % (ucred(a)[0], ucred(c)[0] == os.getpid())
result("peerpid", peer_pid)

def socketpair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.sendall(b"s")
    return "ok" if b.recv(1) == b"s" else "bad"
result("socketpair", socketpair)
result("dgram", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM))
result("dgram_nonblock", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC))
result("dgram_pair", lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM))
result("raw", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_RAW))
"""


def test_own_unix_sockets_work_and_datagram_sockets_cannot_be_made(as_user, nobody_env, workdir):
    r = run_python(INSIDE, cwd=workdir, user=as_user, nobody=nobody_env)
    res = results(r)
    for name in ("stream", "seqpacket", "absolute", "abstract", "many", "nonblocking", "timeout", "flags",
                 "backlog", "socketpair"):
        assert res.get(name) == "ok", (name, r.stdout, r.stderr)
    assert res["isconn"] == "EISCONN"
    assert res["bound"] in ("EOPNOTSUPP", "ENOTSUP")  # one number on Linux  # documented: a socket bound before connect cannot be handed over
    assert res["missing"] == "ENOENT"
    assert res["peerpid"] == "1 1"
    for name in ("dgram", "dgram_nonblock", "dgram_pair", "raw"):
        assert res[name] == "EPERM", name


# --- with --network -----------------------------------------------------------------


def test_network_reaches_tcp_but_not_outside_unix(workdir, outside, servers):
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(16)
    port = tcp.getsockname()[1]
    unix = servers(os.path.join(outside, "d.sock"))
    code = CLIENT + f"""
import select
def blocking():
    c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    c.connect(("127.0.0.1", {port}))
    c.sendall(b"b")
    return "ok"
def nonblocking():
    c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    c.setblocking(False)
    try:
        c.connect(("127.0.0.1", {port}))
    except BlockingIOError:
        pass
    select.select([], [c], [], 5)
    return "ok" if c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0 else "bad"
def refused():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close()
    c = socket.socket()
    try:
        c.connect(("127.0.0.1", p))
    except ConnectionRefusedError:
        return "ok"
for name, fn in (("blocking", blocking), ("nonblocking", nonblocking), ("refused", refused),
                 ("created", lambda: socket.create_connection(("127.0.0.1", {port}), 5) and "ok")):
    try:
        print(name, fn())
    except OSError as e:
        print(name, e)
attempt("unix", {unix.address!r})
"""
    try:
        r = run_python(code, cwd=workdir, flags=["--network"])
        res = results(r)
        for name in ("blocking", "nonblocking", "refused", "created"):
            assert res.get(name) == "ok", (name, r.stdout, r.stderr)
        assert res["unix"] == "EACCES"
        assert unix.received == b""
    finally:
        tcp.close()


# --- setuid and setgid bits ---------------------------------------------------------

SETID = """
import ctypes, errno, os, stat
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR_FCHMODAT, NR_FCHMODAT2 = {fchmodat}, {fchmodat2}
def result(name, fn):
    try:
        fn()
        print(name, "ok")
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, e.errno))
def raw(nr, *args):
    if libc.syscall(nr, *args) < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
open("f", "w").close()
os.chmod("f", 0o644)
result("chmod4755", lambda: os.chmod("f", 0o4755))
result("chmod2755", lambda: os.chmod("f", 0o2755))
fd = os.open("f", os.O_RDONLY)
result("fchmod", lambda: os.fchmod(fd, 0o6755))
result("fchmodat2", lambda: raw(NR_FCHMODAT2, -100, b"f", 0o4755, 0))
result("fchmodat", lambda: raw(NR_FCHMODAT, -100, b"f", 0o4755))
result("high_bits", lambda: raw(NR_FCHMODAT, -100, b"f", ctypes.c_ulong(0o4755 | (1 << 40))))
result("open_creat", lambda: os.close(os.open("g", os.O_CREAT | os.O_WRONLY, 0o4755)))
result("openat_creat", lambda: os.close(os.open("h", os.O_CREAT | os.O_WRONLY, 0o2755, dir_fd=os.open(".", os.O_RDONLY))))
result("mkdir", lambda: os.mkdir("d", 0o2755))
result("mknod", lambda: os.mknod("n", stat.S_IFREG | 0o4755))
result("mkfifo", lambda: os.mkfifo("p", 0o2644))
class How(ctypes.Structure): _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]
how = How(os.O_CREAT | os.O_WRONLY, 0o4755, 0)
result("openat2", lambda: raw(437, -100, b"o2", ctypes.byref(how), ctypes.sizeof(how)))
result("chmod755", lambda: os.chmod("f", 0o755))
result("chmod644", lambda: os.chmod("f", 0o644))
result("open_plain", lambda: os.close(os.open("plain", os.O_CREAT | os.O_WRONLY, 0o755)))
result("mkdir_plain", lambda: os.mkdir("plaindir", 0o755))
result("sticky_dir", lambda: os.chmod("plaindir", 0o1777))
"""


def _setid_files(root) -> list[str]:
    found = []
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(d, name)
            if os.lstat(p).st_mode & (stat.S_ISUID | stat.S_ISGID):
                found.append(p)
    return found


def test_setuid_and_setgid_bits_cannot_be_set(as_user, nobody_env, workdir):
    code = SETID.replace("{fchmodat}", str(_libc.nr("fchmodat"))).replace("{fchmodat2}", str(_libc.nr("fchmodat2")))
    r = run_python(code, cwd=workdir, user=as_user, nobody=nobody_env)
    res = results(r)
    for name in ("chmod4755", "chmod2755", "fchmod", "fchmodat2", "fchmodat", "high_bits", "open_creat", "openat_creat",
                 "mkdir", "mknod", "mkfifo"):
        assert res.get(name) == "EPERM", (name, r.stdout, r.stderr)
    assert res["openat2"] == "ENOSYS"  # libc falls back to openat, which the filter can read
    for name in ("chmod755", "chmod644", "open_plain", "mkdir_plain", "sticky_dir"):
        assert res[name] == "ok", name
    assert stat.S_IMODE(os.stat(workdir / "f").st_mode) == 0o644
    for name in ("g", "h", "d", "n", "p", "o2"):
        assert not os.path.lexists(workdir / name), name
    assert _setid_files(workdir) == []


def test_setuid_through_the_usual_tools_fails(as_user, nobody_env, workdir):
    r = sandbox("cp /bin/sh sh1 && cp /bin/sh sh2; chmod u+s sh1; echo us=$?; chmod 4755 sh2; echo oct=$?; "
                "chmod g+s sh1; echo gs=$?; install -m 4755 /bin/sh sh3; echo install=$?; "
                "mkdir -m 2755 sgdir; echo mkdir=$?; cp -p /bin/su su 2>/dev/null; "
                "chmod 755 sh1 && echo plain=$?", cwd=workdir, user=as_user, nobody=nobody_env)
    out = dict(line.split("=") for line in r.stdout.split())
    assert out["us"] != "0" and out["oct"] != "0" and out["gs"] != "0", r.stdout + r.stderr
    assert out["install"] != "0" and out["mkdir"] != "0"
    assert out["plain"] == "0"
    assert "Operation not permitted" in r.stderr
    assert stat.S_IMODE(os.stat(workdir / "sh1").st_mode) == 0o755
    assert _setid_files(workdir) == []


def test_init_keeps_forwarding_signals_while_a_connect_waits(workdir):
    """A blocking connect waits in a thread of the init; its loop still reaps and forwards."""
    import psutil

    from landlock_helper import SandboxPolicy
    from landlock_helper.spawn import spawn

    code = ("import socket, subprocess\n"
            "srv = socket.socket(socket.AF_UNIX); srv.bind('full.sock'); srv.listen(0)\n"
            "socket.socket(socket.AF_UNIX).connect('full.sock')\n"  # the backlog is full now
            "subprocess.run(['true'])\n"
            "print('up', flush=True)\n"
            "socket.socket(socket.AF_UNIX).connect('full.sock')\n"  # waits: nobody accepts
            "print('connected', flush=True)\n")
    r, w = os.pipe()
    proc = spawn([INNER_PYTHON, "-c", code], cwd=str(workdir), env=dict(os.environ),
                 policy=SandboxPolicy.from_mode("workspace-write"), stdout=w, stderr=2)
    os.close(w)
    try:
        out = b""
        while not out.endswith(b"\n"):
            chunk = os.read(r, 10)
            assert chunk, "the command ended early"
            out += chunk
        assert out == b"up\n"
        init = psutil.Process(proc.init_pid)
        wait_for(lambda: init.num_threads() >= 2, what="the init to wait for the connect in a thread")
        assert proc.poll() is None
        proc.terminate()
        outcome = proc.wait(10)
        assert outcome is not None and outcome.signal == signal.SIGTERM
        assert os.read(r, 100) == b""  # never connected
    finally:
        proc.kill()
        proc.wait(10)
        proc.close()
        os.close(r)


@pytest.mark.parametrize("machine", sorted(_libc._ARCH_TABLES))
def test_filter_builds_for_every_architecture(machine, monkeypatch):
    """The numbers table of each architecture gives a well-formed program (jumps in range)."""
    from landlock_helper import seccomp

    monkeypatch.setattr(_libc, "ARCH", _libc._ARCH_TABLES[machine])
    for network in (False, True):
        prog = seccomp.build(network)
        assert len(prog) < 4096
        for i, (code, jt, jf, k) in enumerate(prog):
            if code == seccomp.BPF_JA:
                assert i + 1 + k < len(prog)
            elif code & 0x07 == 0x05:  # BPF_JMP
                assert i + 1 + jt < len(prog) and i + 1 + jf < len(prog)
        assert prog[-1] == (seccomp.BPF_RET_K, 0, 0, seccomp.RET_ALLOW)
