"""The runtime dir cannot be squatted.

Threat: the runtime dir defaults to ``/tmp/sluice-<uid>``, a name in a world-writable
directory, so another local user can get there before the daemon does: make the dir
themselves (owned by them, or ours-looking but mode 0777), make it a symlink to a
directory of the victim's (``/etc`` when the victim is root), or plant symlinks and hard
links in it named like the daemon's files (``daemon.pid``, ``token``, ``daemon.log``,
``daemon.lock``, ``broker.sock``, ``journal/``) pointing at files of the victim's. A
daemon that followed them would write its pid or token over the victim file, append its
log to another, chmod a victim directory or delete files; a client that believed a pid
file there would signal whatever process it names, and one that believed a socket there
would send its commands to someone else's daemon.

Each test plants one such trap and checks that the daemon (or the client library)
refuses with one line and a non-zero exit, or goes around it, and that the victim is
untouched: content, mode, owner, link count, mtime and ctime. The last tests check that
a normal start, and a restart after a crash (stale socket and pid file), still work.

Not covered, by design: the same user's own sandboxed command, when /tmp is writable to
it, could make ``/tmp/sluice-<uid>`` itself with the right owner and mode before the
first daemon starts; ownership cannot tell that apart (a private /tmp for sandboxed
commands closes it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import time
from dataclasses import dataclass

import pytest

import broker.client as C
from broker.daemon.journal import Journal, reset_directory
from broker.net.runtime import (
    RuntimeDir,
    RuntimeDirError,
    RuntimeDirMissing,
    default_runtime_dir,
    open_dir,
    open_reused,
    read_file,
    remove,
    write_new,
)
from tests.support.harness import short_tempdir, stop_runtime_daemon, subprocess_env, wait_for

NOBODY = 65534
as_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root to make files owned by another user")


# ---------------------------------------------------------------- victims and traps


@dataclass
class Victim:
    """A file or directory of the user's that a trap points at."""

    path: str

    def snapshot(self) -> tuple:
        st = os.lstat(self.path)
        if stat.S_ISDIR(st.st_mode):
            content = sorted(os.listdir(self.path))
        else:
            with open(self.path, "rb") as f:
                content = f.read()
        return (content, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_nlink, st.st_mtime_ns, st.st_ctime_ns)


class Victims:
    def __init__(self) -> None:
        self.base = short_tempdir("sl-victim-")
        os.chmod(self.base, 0o755)
        self._taken: list[tuple[Victim, tuple]] = []

    def file(self, name: str = "precious", content: bytes = b"precious data\n", mode: int = 0o644) -> Victim:
        path = os.path.join(self.base, name)
        with open(path, "wb") as f:
            f.write(content)
        os.chmod(path, mode)
        os.utime(path, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
        return Victim(path)

    def directory(self, name: str = "precious-dir", mode: int = 0o755) -> Victim:
        path = os.path.join(self.base, name)
        os.mkdir(path)
        for entry in ("a.events", "daemon.pid", "token", "notes"):
            with open(os.path.join(path, entry), "wb") as f:
                f.write(b"keep me\n")
        os.chmod(path, mode)
        return Victim(path)

    def seal(self, *victims: Victim) -> None:
        """Record the victims as they are now (after the traps are planted)."""
        self._taken = [(v, v.snapshot()) for v in victims]

    def assert_untouched(self) -> None:
        for victim, before in self._taken:
            assert victim.snapshot() == before, f"{victim.path} was changed"


@pytest.fixture
def victims():
    v = Victims()
    try:
        yield v
    finally:
        shutil.rmtree(v.base, ignore_errors=True)


@pytest.fixture
def place():
    """A private, trusted directory (0700, ours) to make runtime dirs and traps in."""
    path = short_tempdir("sl-rd-")
    try:
        yield path
    finally:
        with contextlib.suppress(Exception):
            stop_runtime_daemon(RuntimeDir(os.path.join(path, "rt")))
        shutil.rmtree(path, ignore_errors=True)


def run_sluice(sluice, runtime: RuntimeDir, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([*sluice, *args], env=subprocess_env(runtime), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout, cwd="/tmp")


def assert_refused(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """Non-zero, one line on stderr naming the problem, no traceback."""
    assert proc.returncode != 0, proc
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


# ---------------------------------------------------------------- the directory itself


@pytest.mark.timeout(30)
@pytest.mark.parametrize("victim_mode", [0o755, 0o700])
def test_a_symlinked_runtime_dir_is_refused_and_its_target_untouched(place, victims, victim_mode):
    # 0700 too: a target that would pass every check on its own must still not be used.
    target = victims.directory(mode=victim_mode)
    rt = os.path.join(place, "rt")
    os.symlink(target.path, rt)
    victims.seal(target)
    for create in (True, False):
        with pytest.raises(RuntimeDirError, match="symbolic link"):
            open_dir(rt, create=create)
    with pytest.raises(C.DaemonError, match="symbolic link"):
        C.daemon_status(RuntimeDir(rt))
    with pytest.raises(C.DaemonError, match="symbolic link"):
        C.start_daemon(RuntimeDir(rt), timeout=5)
    with pytest.raises(C.DaemonError, match="symbolic link"):
        C.Client.connect(RuntimeDir(rt), timeout=5)
    victims.assert_untouched()
    assert os.path.islink(rt)


@as_root
@pytest.mark.timeout(30)
def test_a_dir_owned_by_another_user_is_refused_untouched(place):
    rt = os.path.join(place, "rt")
    os.mkdir(rt, 0o700)
    planted = os.path.join(rt, "daemon.pid")
    with open(planted, "w") as f:
        f.write("1\n")
    os.chown(planted, NOBODY, NOBODY)
    os.chown(rt, NOBODY, NOBODY)
    os.chmod(rt, 0o755)
    before = Victim(rt).snapshot(), Victim(planted).snapshot()
    with pytest.raises(RuntimeDirError, match=f"belongs to uid {NOBODY}, not to you"):
        open_dir(rt, create=True)
    with pytest.raises(C.DaemonError, match="not to you"):
        C.stop_daemon(RuntimeDir(rt))
    assert (Victim(rt).snapshot(), Victim(planted).snapshot()) == before


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o755, 0o770])
def test_a_dir_of_ours_with_another_mode_is_refused_not_chmodded(place, mode):
    rt = os.path.join(place, "rt")
    os.mkdir(rt)
    planted = os.path.join(rt, "token")
    os.symlink("/etc/passwd", planted)
    os.chmod(rt, mode)
    before = Victim(rt).snapshot()
    with pytest.raises(RuntimeDirError, match=f"mode {mode:04o}, not 0700"):
        open_dir(rt, create=True)
    with pytest.raises(C.DaemonError, match="not 0700"):
        C.start_daemon(RuntimeDir(rt), timeout=5)
    assert Victim(rt).snapshot() == before
    assert os.readlink(planted) == "/etc/passwd"


@as_root
@pytest.mark.timeout(30)
def test_a_symlink_on_the_way_owned_by_another_user_is_not_followed(place, victims):
    real = os.path.join(place, "real")
    os.mkdir(real, 0o700)
    os.mkdir(os.path.join(real, "rt"), 0o700)
    link = os.path.join(place, "link")
    os.symlink(real, link)
    # Ours (or root's): a symlink we made is followed.
    os.close(open_dir(os.path.join(link, "rt")))
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)
    with pytest.raises(RuntimeDirError, match=f"symbolic link owned by uid {NOBODY}"):
        open_dir(os.path.join(link, "rt"))


@as_root
@pytest.mark.timeout(30)
def test_a_parent_owned_by_another_user_or_open_to_all_is_refused(place):
    parent = os.path.join(place, "parent")
    os.mkdir(parent, 0o755)
    rt = os.path.join(parent, "rt")
    os.mkdir(rt, 0o700)
    os.close(open_dir(rt))
    # Whoever owns a directory on the way can swap what lies beyond it.
    os.chown(parent, NOBODY, NOBODY)
    with pytest.raises(RuntimeDirError, match=f"{parent} belongs to uid {NOBODY}"):
        open_dir(rt)
    os.chown(parent, 0, 0)
    # World-writable without the sticky bit: anyone can rename our dir away and put theirs.
    os.chmod(parent, 0o777)
    with pytest.raises(RuntimeDirError, match="writable by others and not sticky"):
        open_dir(rt)
    # Sticky (like /tmp): nobody else can rename or replace an entry of ours.
    os.chmod(parent, 0o1777)
    os.close(open_dir(rt))
    assert stat.S_IMODE(os.stat(parent).st_mode) == 0o1777


@pytest.mark.timeout(30)
def test_a_missing_dir_is_made_0700_and_missing_is_told_apart(place):
    rt = os.path.join(place, "a", "b", "rt")
    with pytest.raises(RuntimeDirMissing):
        open_dir(rt)
    old = os.umask(0o022)
    try:
        os.close(open_dir(rt, create=True))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(rt).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.dirname(rt)).st_mode) == 0o700
    assert not C.daemon_status(RuntimeDir(os.path.join(place, "nothing"))).running


@as_root
@pytest.mark.timeout(30)
def test_another_users_xdg_runtime_dir_is_not_the_default(place, monkeypatch):
    xdg = os.path.join(place, "xdg")
    os.mkdir(xdg, 0o700)
    monkeypatch.delenv("SLUICE_RUNTIME_DIR")
    monkeypatch.setenv("XDG_RUNTIME_DIR", xdg)
    assert default_runtime_dir() == os.path.join(xdg, "sluice")
    os.chown(xdg, NOBODY, NOBODY)
    run = os.lstat("/run") if os.path.isdir("/run") else None
    roots = run is not None and not os.path.islink("/run") and run.st_uid == 0 and not run.st_mode & 0o022
    assert default_runtime_dir() == ("/run/sluice" if roots else f"/tmp/sluice-{os.getuid()}")


# ---------------------------------------------------------------- files in it


@pytest.fixture
def rtdir(place):
    """A good runtime dir and a descriptor of it."""
    path = os.path.join(place, "rt")
    fd = open_dir(path, create=True)
    try:
        yield path, fd
    finally:
        os.close(fd)


@pytest.mark.timeout(30)
def test_reused_files_are_never_a_link_a_hard_link_a_fifo_or_someone_elses(rtdir, victims):
    path, fd = rtdir
    target = victims.file()
    os.symlink(target.path, os.path.join(path, "daemon.log"))
    os.link(target.path, os.path.join(path, "daemon.lock"))
    os.mkfifo(os.path.join(path, "fifo"))
    victims.seal(target)
    with pytest.raises(RuntimeDirError, match="symbolic link"):
        open_reused(fd, "daemon.log", os.O_WRONLY | os.O_APPEND)
    with pytest.raises(RuntimeDirError, match="has 2 links"):
        open_reused(fd, "daemon.lock", os.O_RDWR)
    for flags in (os.O_WRONLY, os.O_RDWR):  # refused, and no hang waiting for a reader
        with pytest.raises(RuntimeDirError, match="fifo"):
            open_reused(fd, "fifo", flags)
    assert read_file(fd, "daemon.log") is None and read_file(fd, "daemon.lock") is None
    victims.assert_untouched()
    if os.getuid() == 0:
        theirs = os.path.join(path, "theirs")
        with open(theirs, "w"):
            pass
        os.chown(theirs, NOBODY, NOBODY)
        with pytest.raises(RuntimeDirError, match=f"belongs to uid {NOBODY}"):
            open_reused(fd, "theirs", os.O_WRONLY)
    lock = open_reused(fd, "fresh.lock", os.O_RDWR)
    os.close(lock)
    assert stat.S_IMODE(os.stat(os.path.join(path, "fresh.lock")).st_mode) == 0o600


@pytest.mark.timeout(30)
def test_new_files_replace_a_planted_link_instead_of_writing_through_it(rtdir, victims):
    path, fd = rtdir
    token, tmp = victims.file("token-victim"), victims.file("tmp-victim")
    os.symlink(token.path, os.path.join(path, "token"))
    os.symlink(tmp.path, os.path.join(path, "token.new"))
    victims.seal(token, tmp)
    RuntimeDir(path).new_token(fd)
    victims.assert_untouched()
    st = os.lstat(os.path.join(path, "token"))
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert len(RuntimeDir(path).read_token()) == 64
    assert not os.path.lexists(os.path.join(path, "token.new"))


@pytest.mark.timeout(30)
def test_remove_takes_only_the_file_it_was_given(rtdir, victims):
    path, fd = rtdir
    target = victims.file()
    ident = write_new(fd, "daemon.pid", b"1\n")
    # Moved aside (kept, so its inode cannot be reused) and a link put in its place.
    os.rename(os.path.join(path, "daemon.pid"), os.path.join(path, "moved"))
    os.symlink(target.path, os.path.join(path, "daemon.pid"))
    victims.seal(target)
    assert not remove(fd, "daemon.pid", ident)  # not the file we wrote any more
    assert os.path.islink(os.path.join(path, "daemon.pid"))
    victims.assert_untouched()


@pytest.mark.timeout(30)
def test_the_journal_dir_is_emptied_without_following_links(rtdir, victims):
    path, fd = rtdir
    target_dir = victims.directory()
    target = victims.file("precious.events")
    journal = os.path.join(path, "journal")
    # journal/ a symlink to a victim dir: not used, nothing in the victim dir removed.
    os.symlink(target_dir.path, journal)
    victims.seal(target_dir, target)
    with pytest.raises(OSError):
        reset_directory("journal", dir_fd=fd)
    victims.assert_untouched()
    os.unlink(journal)
    # Inside: a link to a victim file and a directory named like segments.
    os.mkdir(journal, 0o700)
    os.symlink(target.path, os.path.join(journal, "s.0.events"))
    os.symlink(target_dir.path, os.path.join(journal, "d.0.events"))
    os.mkdir(os.path.join(journal, "sub.events"))
    with open(os.path.join(journal, "sub.events", "x.events"), "w") as f:
        f.write("x")
    with open(os.path.join(journal, "old.1.events"), "w") as f:
        f.write("x")
    victims.seal(target_dir, target)
    jfd = reset_directory("journal", dir_fd=fd)
    try:
        assert sorted(os.listdir(journal)) == ["sub.events"]
        assert os.listdir(os.path.join(journal, "sub.events")) == ["x.events"]
        victims.assert_untouched()
        # A segment whose name (its bodies' or its index's) a link took: replaced, not written through.
        os.symlink(target.path, os.path.join(journal, "sess.0.events"))
        os.symlink(target.path, os.path.join(journal, "sess.0.index"))
        victims.seal(target_dir, target)
        j = Journal(jfd, "sess")
        j.append(1, b"event one")
        assert j.read(1, 10, 1 << 20).events() == [(1, b"event one")]
        assert stat.S_ISREG(os.lstat(os.path.join(journal, "sess.0.index")).st_mode)
        seg = os.path.join(journal, "sess.0.events")
        assert stat.S_ISREG(os.lstat(seg).st_mode)
        # Swapped for a link after it was made: closing leaves the link (and its target) be.
        os.rename(seg, os.path.join(journal, "moved"))
        os.symlink(target.path, seg)
        j.close()
        assert os.path.islink(seg)
        victims.assert_untouched()
    finally:
        os.close(jfd)


@as_root
@pytest.mark.timeout(30)
def test_a_journal_dir_owned_by_another_user_is_not_used_or_chmodded(rtdir):
    path, fd = rtdir
    journal = os.path.join(path, "journal")
    os.mkdir(journal, 0o777)
    os.chown(journal, NOBODY, NOBODY)
    before = Victim(journal).snapshot()
    with pytest.raises(OSError):
        reset_directory("journal", dir_fd=fd)
    assert Victim(journal).snapshot() == before


@as_root
@pytest.mark.timeout(30)
def test_stop_never_signals_a_pid_named_in_someone_elses_dir(place):
    rt = os.path.join(place, "rt")
    os.mkdir(rt, 0o700)
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        for name in ("daemon.pid", "daemon.lock"):
            with open(os.path.join(rt, name), "w") as f:
                f.write(f"{bystander.pid}\n")
            os.utime(os.path.join(rt, name), (time.time() + 3600, time.time() + 3600))
        os.chown(rt, NOBODY, NOBODY)
        with pytest.raises(C.DaemonError, match="not to you"):
            C.stop_daemon(RuntimeDir(rt), timeout=2)
        with pytest.raises(C.DaemonError, match="not to you"):
            C.daemon_status(RuntimeDir(rt))
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


# ---------------------------------------------------------------- real daemons


@pytest.mark.timeout(60)
def test_sluice_daemon_refuses_a_symlink_to_a_victim_dir(sluice, place, victims):
    target = victims.directory(mode=0o755)
    rt = RuntimeDir(os.path.join(place, "rt"))
    os.symlink(target.path, rt.path)
    victims.seal(target)
    assert_refused(run_sluice(sluice, rt, "daemon", "--executors", "0"), rt.path, "symbolic link")
    assert_refused(run_sluice(sluice, rt, "daemon", "start", "--executors", "0"), "symbolic link")
    assert_refused(run_sluice(sluice, rt, "daemon", "status"), "symbolic link")
    assert_refused(run_sluice(sluice, rt, "daemon", "stop"), "symbolic link")
    victims.assert_untouched()


@pytest.mark.timeout(60)
def test_sluice_daemon_refuses_a_world_writable_dir_and_leaves_it_be(sluice, place, victims):
    target = victims.file()
    rt = RuntimeDir(os.path.join(place, "rt"))
    os.mkdir(rt.path)
    os.chmod(rt.path, 0o777)
    os.symlink(target.path, rt.pid_path)
    os.symlink(target.path, rt.log_path)
    victims.seal(target, Victim(rt.path))
    assert_refused(run_sluice(sluice, rt, "daemon", "--executors", "0"), "mode 0777, not 0700")
    assert_refused(run_sluice(sluice, rt, "daemon", "start", "--executors", "0"), "mode 0777, not 0700")
    victims.assert_untouched()


@as_root
@pytest.mark.timeout(60)
def test_sluice_daemon_refuses_a_dir_owned_by_another_user(sluice, place):
    rt = RuntimeDir(os.path.join(place, "rt"))
    os.mkdir(rt.path, 0o700)
    os.chown(rt.path, NOBODY, NOBODY)
    before = Victim(rt.path).snapshot()
    assert_refused(run_sluice(sluice, rt, "daemon", "--executors", "0"), f"belongs to uid {NOBODY}")
    assert_refused(run_sluice(sluice, rt, "run", "--", "true"), f"belongs to uid {NOBODY}")
    assert Victim(rt.path).snapshot() == before


@pytest.mark.timeout(60)
@pytest.mark.parametrize("trap", ["daemon.lock-symlink", "daemon.lock-hardlink", "daemon.log-symlink",
                                  "daemon.log-hardlink"])
def test_sluice_daemon_refuses_a_planted_lock_or_log(sluice, place, victims, trap):
    name, kind = trap.split("-")
    target = victims.file()
    rt = RuntimeDir(os.path.join(place, "rt"))
    os.mkdir(rt.path, 0o700)
    (os.symlink if kind == "symlink" else os.link)(target.path, os.path.join(rt.path, name))
    victims.seal(target)
    # The lock: the daemon itself; the log: `daemon start`, which opens it for the daemon.
    argv = ("daemon", "--executors", "0") if name == "daemon.lock" else ("daemon", "start", "--executors", "0")
    assert_refused(run_sluice(sluice, rt, *argv), name, "symbolic link" if kind == "symlink" else "2 links")
    victims.assert_untouched()
    assert not C.daemon_status(rt).running


@pytest.mark.timeout(90)
def test_planted_links_for_pid_token_socket_and_journal_are_not_followed(sluice, place, victims):
    rt = RuntimeDir(os.path.join(place, "rt"))
    os.mkdir(rt.path, 0o700)
    files = {name: victims.file(name.replace("/", "-")) for name in
             ("daemon.pid", "daemon.pid.new", "token", "token.new", "broker.sock", "journal/old.0.events")}
    target_dir = victims.directory()
    os.mkdir(os.path.join(rt.path, "journal"), 0o700)
    for name, victim in files.items():
        os.symlink(victim.path, os.path.join(rt.path, name))
    os.symlink(target_dir.path, os.path.join(rt.path, "journal", "dir.0.events"))
    victims.seal(target_dir, *files.values())

    started = run_sluice(sluice, rt, "daemon", "start", "--executors", "1")
    assert started.returncode == 0, started.stderr
    try:
        st = os.lstat(rt.socket_path)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        for name in ("daemon.pid", "token"):
            st = os.lstat(os.path.join(rt.path, name))
            assert stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and stat.S_IMODE(st.st_mode) == 0o600
        assert os.listdir(os.path.join(rt.path, "journal")) == []
        ran = run_sluice(sluice, rt, "run", "--", "echo", "still works")
        assert ran.returncode == 0 and ran.stdout == "still works\n", ran
        victims.assert_untouched()
    finally:
        stopped = run_sluice(sluice, rt, "daemon", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert not os.path.lexists(rt.socket_path) and not os.path.lexists(rt.pid_path)
    victims.assert_untouched()


@pytest.mark.timeout(60)
def test_a_journal_dir_that_is_a_link_is_not_used_and_the_daemon_still_serves(sluice, place, victims):
    target_dir = victims.directory(mode=0o700)
    rt = RuntimeDir(os.path.join(place, "rt"))
    os.mkdir(rt.path, 0o700)
    os.symlink(target_dir.path, os.path.join(rt.path, "journal"))
    victims.seal(target_dir)
    started = run_sluice(sluice, rt, "daemon", "start", "--executors", "0")
    try:
        assert started.returncode == 0, started.stderr
        victims.assert_untouched()
    finally:
        run_sluice(sluice, rt, "daemon", "stop")
    with open(rt.log_path) as f:
        assert "no session journal" in f.read()
    victims.assert_untouched()


@pytest.mark.timeout(90)
def test_a_normal_start_and_a_restart_after_a_crash_still_work(sluice, place):
    rt = RuntimeDir(os.path.join(place, "rt"))  # not there yet: made 0700
    started = run_sluice(sluice, rt, "daemon", "start", "--executors", "1")
    assert started.returncode == 0, started.stderr
    assert stat.S_IMODE(os.stat(rt.path).st_mode) == 0o700
    for name in ("token", "daemon.pid", "daemon.lock", "daemon.log"):
        st = os.lstat(os.path.join(rt.path, name))
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600, name
    first = C.daemon_status(rt).pid
    ran = run_sluice(sluice, rt, "run", "--", "echo", "hello")
    assert ran.returncode == 0 and ran.stdout == "hello\n", ran

    # A crash: the daemon dies without cleaning up; its executor follows it.
    import psutil

    children = psutil.Process(first).children(recursive=True)
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE,
             what="the daemon to die")
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(children, timeout=10)
    assert os.path.lexists(rt.socket_path) and os.path.lexists(rt.pid_path)  # stale
    assert not C.daemon_status(rt).running

    again = run_sluice(sluice, rt, "daemon", "start", "--executors", "1")
    assert again.returncode == 0, again.stderr
    second = C.daemon_status(rt).pid
    assert second and second != first
    ran = run_sluice(sluice, rt, "run", "--", "echo", "again")
    assert ran.returncode == 0 and ran.stdout == "again\n", ran
    stopped = run_sluice(sluice, rt, "daemon", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert not os.path.lexists(rt.socket_path)
