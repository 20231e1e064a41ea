"""Starting, stopping and finding the daemon of a runtime dir (the local one only)."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass

import zmq

from broker.client.errors import DaemonError
from broker.client.handshake import hello
from broker.net.runtime import (
    RuntimeDir,
    RuntimeDirError,
    RuntimeDirMissing,
    open_reused,
    read_file,
    with_source_root,
    without_secrets,
)
from broker.wire import frames as wire
from landlock_helper.outcome import alive


@dataclass(frozen=True)
class DaemonStatus:
    running: bool
    pid: int | None
    runtime_dir: str
    socket: str

    def describe(self) -> str:
        if self.running:
            return f"daemon running (pid {self.pid}, socket {self.socket})"
        return f"daemon not running (runtime dir {self.runtime_dir})"


def daemon_status(runtime: RuntimeDir | None = None) -> DaemonStatus:
    """Whether a daemon runs in ``runtime``; DaemonError if the runtime dir is not one of
    ours to trust (someone else's, too open, a symlink): its pid file means nothing."""
    runtime = runtime or RuntimeDir.default()
    pid = daemon_pid(runtime)
    return DaemonStatus(pid is not None, pid, runtime.path, runtime.socket_path)


_started: list = []  # keeps background daemons' Popen objects (and their reaping) alive


# Less than this free where the runtime dir is, and a daemon that failed to start is said
# to have failed for want of space (its token, pid file and log are a few KiB).
LOW_SPACE_BYTES = 64 * 1024


def start_daemon(
    runtime: RuntimeDir | None = None,
    *,
    timeout: float = 10.0,
    args: Iterable[str] = (),
    _probe: bool = True,
) -> int:
    """Start a daemon in the background and wait until it answers; returns its pid.

    Its stdout/stderr are appended to the runtime dir's ``daemon.log`` (opened relative to
    the checked dir, never through a link, only a file of ours with one link). If another
    daemon wins the race to the runtime dir's lock, that one is waited for instead.
    Raises :class:`DaemonError` (with the last line of the log) if it dies, or if the
    runtime dir or its log is not ours to use.
    """
    runtime = runtime or RuntimeDir.default()
    deadline = time.monotonic() + timeout
    dir_fd = _checked_dir(runtime, create=True)
    import subprocess

    # The caller's secrets (an API key exported for `sluice exec`) stay out of the daemon.
    env = without_secrets()
    env["SLUICE_RUNTIME_DIR"] = runtime.path
    with_source_root(env)  # the same code as this client, installed or not
    try:
        log_fd = open_reused(dir_fd, "daemon.log", os.O_WRONLY | os.O_APPEND, shown=runtime.log_path)
    except RuntimeDirError as e:
        raise DaemonError(f"the daemon log: {e}") from None
    finally:
        os.close(dir_fd)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "broker", "daemon", *args],
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            cwd="/",
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as e:
        raise DaemonError(f"cannot start the daemon: {e.strerror}") from None
    finally:
        os.close(log_fd)
    _started.append(proc)
    pid = wait_serving(runtime, deadline, proc)
    if _probe:
        sock, outcome = hello(runtime.endpoint, runtime.read_token(), deadline)
        if isinstance(outcome, wire.Welcome):
            # Said goodbye, so the daemon does not count this probe as a client until it times out.
            with contextlib.suppress(Exception):
                sock.send_multipart([wire.header(wire.BYE)], flags=zmq.NOBLOCK)
            sock.close(linger=200)
        else:
            sock.close(linger=0)
        if outcome is None:
            raise DaemonError(f"the daemon did not answer within {timeout:g} s; see {runtime.log_path}")
        if not isinstance(outcome, wire.Welcome):
            raise DaemonError(f"the daemon refused the connection: {wire.one_line(outcome)}")
    return pid


def wait_serving(runtime: RuntimeDir, deadline: float, proc=None) -> int | None:
    """Wait until a daemon serves in ``runtime`` (its pid file names it); returns its pid.

    Without ``proc``: None if the daemon that was starting went away instead. With
    ``proc`` (the daemon we just spawned): DaemonError if it died and no other took over.
    """
    dir_fd = _checked_dir(runtime)
    if dir_fd is None:
        if proc is None:
            return None
        raise DaemonError(f"the runtime dir {runtime.path} went away while the daemon was starting")
    try:
        delay = 0.002
        while True:
            pid = _serving_pid(dir_fd)
            if pid is not None:
                return pid
            if _starting_pid(dir_fd) is None and (proc is None or proc.poll() is not None):
                if proc is None:
                    return None
                raise DaemonError(_start_failure(runtime, proc.returncode))
            if time.monotonic() >= deadline:
                raise DaemonError(f"the daemon did not start in time: {_last_log_line(runtime)}")
            # Start-up takes a few hundred milliseconds; files are all there is to watch.
            time.sleep(delay)
            delay = min(delay * 2, 0.025)
    finally:
        os.close(dir_fd)


def stop_daemon(runtime: RuntimeDir | None = None, *, timeout: float = 10.0) -> int | None:
    """SIGTERM the running daemon and wait for it to exit (SIGKILL after ``timeout``).

    Returns the pid it stopped, or None if none was running.
    """
    runtime = runtime or RuntimeDir.default()
    pid = daemon_pid(runtime)
    if pid is None:
        return None
    holders = lock_holders(runtime)
    if holders is not None and pid not in holders:
        # A pid file names what wrote it, but a signal must reach the daemon, nothing else.
        raise DaemonError(f"process {pid} named in {runtime.path} does not hold the daemon's lock "
                          f"({runtime.lock_path}): it is not the daemon, so it was not signalled")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return pid
    except PermissionError:
        raise DaemonError(f"not allowed to signal the daemon (pid {pid})") from None
    if not _wait_gone(pid, timeout):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if not _wait_gone(pid, 5.0):
            raise DaemonError(f"the daemon (pid {pid}) did not exit")
    return pid


def lock_holders(runtime: RuntimeDir) -> set[int] | None:
    """The pids holding an flock on the runtime dir's ``daemon.lock`` (as /proc/locks
    tells), an empty set when nobody holds it; None where that cannot be told (no
    /proc/locks)."""
    dir_fd = _checked_dir(runtime)
    if dir_fd is None:
        return set()
    try:
        st = os.stat("daemon.lock", dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return set()
    finally:
        os.close(dir_fd)
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    holders = set()
    for line in lines:
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 00:2a:5678 0 EOF"; "1: -> FLOCK ..." is a waiter.
        if len(fields) < 6 or fields[1] != "FLOCK" or fields[5] != wanted:
            continue
        with contextlib.suppress(ValueError):
            holders.add(int(fields[4]))
    return holders


def _wait_gone(pid: int, timeout: float) -> bool:
    import psutil

    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return True
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap_started()
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.01)
    return False


def _reap_started() -> None:
    for p in list(_started):
        if p.poll() is not None:
            _started.remove(p)


def _checked_dir(runtime: RuntimeDir, *, create: bool = False) -> int | None:
    """A descriptor of the runtime dir once it passed :func:`broker.net.runtime.open_dir`'s
    checks; None if it does not exist (and not ``create``); DaemonError if it is not ours
    to trust: a pid file or socket in someone else's dir means nothing, and signalling or
    talking to what it names could hurt."""
    try:
        return runtime.open(create=create)
    except RuntimeDirMissing:
        return None
    except RuntimeDirError as e:
        raise DaemonError(str(e)) from None


def daemon_pid(runtime: RuntimeDir) -> int | None:
    """The pid of the daemon serving, or starting, in ``runtime``; None if there is none."""
    dir_fd = _checked_dir(runtime)
    if dir_fd is None:
        return None
    try:
        return _serving_pid(dir_fd) or _starting_pid(dir_fd)
    finally:
        os.close(dir_fd)


def _serving_pid(dir_fd: int) -> int | None:
    # The daemon writes its pid file once bound (after a fresh token) and removes it on exit.
    _reap_started()
    return _live_pid_in(dir_fd, "daemon.pid")


def _starting_pid(dir_fd: int) -> int | None:
    # The lock holder also writes its pid into the lock file, before anything else.
    # (Not /proc/locks: reading it waits for an RCU grace period, tens of milliseconds.)
    return _live_pid_in(dir_fd, "daemon.lock")


def _live_pid_in(dir_fd: int, name: str) -> int | None:
    """The pid in the file ``name`` if that process is alive and is the one that wrote it.

    A file left by a daemon that was killed may name a pid since reused: a process
    that started after the file was written cannot have written it.
    """
    got = read_file(dir_fd, name, 32)
    if got is None:
        return None
    try:
        pid = int(got[0].strip() or 0)
    except ValueError:
        return None
    written = got[1].st_mtime
    if pid <= 0:
        return None
    started = _start_time(pid)
    if started is None:
        return None
    # Slack for clock granularity: boot time and start ticks are coarse.
    return pid if started <= written + 2.0 else None


_boot_time: float | None = None


def _start_time(pid: int) -> float | None:
    """When ``pid`` started (epoch seconds), 0.0 if unknown, None if dead or a zombie."""
    global _boot_time
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    except OSError:  # no /proc (macOS): existence is all we can tell
        return 0.0 if alive(pid) else None
    fields = raw[raw.rindex(b")") + 2 :].split()  # fields from the 3rd (state) on
    if fields[0] in (b"Z", b"X"):
        return None
    if _boot_time is None:
        try:
            with open("/proc/stat", "rb") as f:
                for line in f:
                    if line.startswith(b"btime "):
                        _boot_time = float(line.split()[1])
                        break
        except OSError:
            pass
        if _boot_time is None:
            return 0.0
    return _boot_time + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def _start_failure(runtime: RuntimeDir, status: int) -> str:
    """Why the daemon we started exited: its last log line, or, when a full disk kept it
    from writing one, that."""
    space = _free_bytes(runtime.path)
    if space is not None and space < LOW_SPACE_BYTES:
        return (f"no space left on the device holding the runtime dir {runtime.path} ({space} bytes free): "
                "the daemon could not start; free some space there or set SLUICE_RUNTIME_DIR")
    return f"the daemon exited at start (status {status}): {_last_log_line(runtime)}"


def _free_bytes(path: str) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _last_log_line(runtime: RuntimeDir) -> str:
    tail = _log_tail(runtime)
    if tail is None:
        return f"(no log at {runtime.log_path})"
    lines = [ln for ln in tail.decode("utf-8", "replace").splitlines() if ln.strip()]
    return wire.one_line(_readable(lines[-1])) if lines else f"(empty log {runtime.log_path})"


def _readable(line: str) -> str:
    """A log line for a person: a JSON line's event (and error), else the line."""
    if not line.startswith("{"):
        return line
    import json

    try:
        record = json.loads(line)
    except ValueError:
        return line
    if not isinstance(record, dict) or "event" not in record:
        return line
    text = str(record["event"])
    if record.get("error"):
        text += f": {record['error']}"
    return text


def _log_tail(runtime: RuntimeDir, size: int = 8192) -> bytes | None:
    """The last ``size`` bytes of ``daemon.log``, read like every file in the runtime dir."""
    try:
        dir_fd = runtime.open()
    except RuntimeDirError:
        return None
    try:
        fd = os.open("daemon.log", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    finally:
        os.close(dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            return None
        return os.pread(fd, size, max(0, st.st_size - size))
    except OSError:
        return None
    finally:
        os.close(fd)
