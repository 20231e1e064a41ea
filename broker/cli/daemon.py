"""``sluice daemon``: run the daemon in the foreground, or start, stop, ask after it, read its log."""

from __future__ import annotations

import json
import os
import sys
import time

import broker.client as C
from broker.cli.base import fail, running_version, say_weak_limits
from broker.cli.keys import listen_argv, listen_from_args
from broker.daemon.listener import ListenError
from broker.daemon.server import DaemonAlreadyRunning, serve
from broker.net.runtime import RuntimeDir, RuntimeDirError
from broker.wire.results import EXIT_NOT_RUNNING, EXIT_SLUICE
from broker.wire.version import SLUICE_VERSION, version_key

# Most executors `--executors` starts: more than this many per CPU only adds processes
# that wait for the same cores (each runs many commands at once anyway).
EXECUTORS_PER_CPU = 4
# Where the executors of a daemon started without --executors are set (default: one per CPU).
EXECUTORS_VARIABLE = "SLUICE_EXECUTORS"
# How long `daemon start` and `daemon stop` wait for a running daemon to say what it runs
# (a daemon that does not answer is stopped all the same).
ASK_S = 3.0


def executors_cap() -> int:
    return EXECUTORS_PER_CPU * (os.cpu_count() or 1)


def capped_executors(n: int | None, given: str | None = None) -> int | None:
    """``--executors N`` (or what ``given`` says asked for N), capped (with one warning
    line) at :func:`executors_cap`."""
    cap = executors_cap()
    if n is not None and n > cap:
        print(f"sluice: warning: {given or f'--executors {n}'} is more than this machine can use; starting {cap} "
              f"({EXECUTORS_PER_CPU} per CPU)", file=sys.stderr, flush=True)
        return cap
    return n


def wanted_executors(flag: int | None) -> int | None:
    """The executors to start: ``--executors``, else ``$SLUICE_EXECUTORS`` (which reaches
    the daemon ``sluice run`` starts by itself too), else None (one per CPU); capped.
    ValueError, in words, for a value of the variable that is not a whole number >= 0."""
    if flag is not None:
        return capped_executors(flag)
    text = os.environ.get(EXECUTORS_VARIABLE, "").strip()
    if not text:
        return None
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"{EXECUTORS_VARIABLE} must be a whole number of executors (0 or more), got {text!r}")
    return capped_executors(int(text), f"{EXECUTORS_VARIABLE}={text}")


def daemon_main(args) -> int:
    runtime = RuntimeDir.default()
    listen = listen_from_args(args) if args.action in (None, "start") else None
    if args.action is None:
        try:
            executors = wanted_executors(args.executors)
        except ValueError as e:
            return fail(str(e), 2)
        try:
            return serve(runtime, executors=executors, log_json=True if args.log_json else None,
                         listen=listen, suspend_limit_s=args.suspend_limit, executor_wait_s=args.executor_wait,
                         heartbeat_s=args.heartbeat, journal_limit=args.journal_limit)
        except DaemonAlreadyRunning as e:
            return fail(str(e) or f"a daemon is already running in {runtime.path}", 1)
        except (RuntimeDirError, ListenError) as e:
            return fail(str(e), 1)

    if args.action == "status":
        return _status(runtime, args.json)

    if args.action == "logs":
        return _logs(runtime, args.lines, args.follow)

    if args.action == "stop":
        if not args.force:
            waiting = _sessions_waiting(runtime)
            if waiting:
                shown = ", ".join(s.id[:8] for s in waiting)
                return fail(f"not stopping: {_count(len(waiting), 'session')} wait{'s' if len(waiting) == 1 else ''} "
                            f"for approval ({shown}); answer with `sluice attach ID`, or stop anyway with "
                            "`sluice daemon stop --force`", 1)
        try:
            pid = C.stop_daemon(runtime)
        except C.DaemonError as e:
            return fail(str(e), 1)
        print(f"sluice: daemon stopped (pid {pid})" if pid else f"sluice: daemon not running (runtime dir {runtime.path})", flush=True)
        return 0

    # start
    try:
        status = C.daemon_status(runtime)
    except C.DaemonError as e:
        return fail(str(e), 1)
    if status.running:
        ignored = _not_applied(runtime, args)
        if ignored:
            return fail(f"{status.describe()}; {ignored}: stop it first (`sluice daemon stop`), "
                        "then start it with them", 1)
        print(f"sluice: {status.describe()}", flush=True)
        return 0
    try:
        executors = wanted_executors(args.executors)
    except ValueError as e:
        return fail(str(e), 2)
    extra = []
    if executors is not None:
        extra += ["--executors", str(executors)]
    if args.log_json:
        extra.append("--log-json")
    for flag, value in _tunables(args):
        if value is not None:
            extra += [flag, str(value)]
    extra += listen_argv(args)
    try:
        pid = C.start_daemon(runtime, args=extra)
    except C.DaemonError as e:
        return fail(str(e), 1)
    print(f"sluice: daemon started (pid {pid}, socket {runtime.socket_path})", flush=True)
    say_weak_limits()
    return 0


def _tunables(args) -> tuple[tuple[str, object], ...]:
    """The flags ``daemon start`` hands on to the daemon it starts, with their values
    (None: not given)."""
    return (("--suspend-limit", args.suspend_limit), ("--executor-wait", args.executor_wait),
            ("--heartbeat", args.heartbeat), ("--journal-limit", args.journal_limit))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _sessions_waiting(runtime: RuntimeDir) -> list:
    """The running daemon's sessions that wait for an approval (stopping would end them
    unanswered); none when no daemon answers (then there is nothing to ask)."""
    try:
        with C.Client.connect(runtime, autostart=False, name="sluice daemon stop", timeout=ASK_S) as client:
            sessions = client.list_sessions(timeout=ASK_S).sessions
    except C.DaemonError:
        return []
    return [s for s in sessions if s.pending_approvals]


def _not_applied(runtime: RuntimeDir, args) -> str:
    """What ``daemon start``'s flags ask of a daemon that is already running and that it
    does not have (it runs as it was started): "" when nothing, else the words for it,
    e.g. ``it runs 4 executors; --executors 20 is not applied``."""
    given = [flag for flag, value in (("--log-json", args.log_json), *_tunables(args)) if value]
    if args.executors is None and not args.listen and not given:
        return ""
    try:
        with C.Client.connect(runtime, autostart=False, name="sluice daemon start", timeout=ASK_S) as client:
            info = client.daemon_info(timeout=ASK_S)
    except C.DaemonError:
        info = None
    facts = []
    if args.executors is not None:
        wanted = min(args.executors, executors_cap())
        if info is None or info.executors_wanted != wanted:
            given.insert(0, f"--executors {args.executors}")
            if info is not None:
                facts.append(f"it runs {_count(info.executors_wanted, 'executor')}")
    if args.listen and (info is None or info.listen != args.listen):
        given.append(f"--listen {args.listen}")
        if info is not None:
            facts.append(f"it listens on {info.listen}" if info.listen else "it listens on no tcp address")
    if not given:
        return ""
    verb = "is" if len(given) == 1 else "are"
    return "; ".join([*facts, f"{' '.join(given)} {verb} not applied"])


def _status(runtime: RuntimeDir, as_json: bool) -> int:
    try:
        status = C.daemon_status(runtime)
    except C.DaemonError as e:
        return fail(str(e), 1)
    if not status.running:
        if as_json:
            print(json.dumps({"running": False, "runtime_dir": runtime.path, "client_version": SLUICE_VERSION}))
        else:
            print(f"sluice: {status.describe()}", flush=True)
        return EXIT_NOT_RUNNING
    try:
        client = C.Client.connect(runtime, autostart=False, name="sluice daemon status")
    except C.DaemonError as e:
        return fail(f"{e} (daemon pid {status.pid})", EXIT_SLUICE)
    with client:
        try:
            info = client.daemon_info()
        except C.DaemonError as e:
            if version_key(client.daemon_version) >= version_key(SLUICE_VERSION):
                return fail(f"{e} (daemon pid {status.pid})", EXIT_SLUICE)
            # A daemon from before the status request: what the runtime dir tells, and why no more.
            print(f"sluice: {status.describe()}; it runs {running_version(client.daemon_version)}, "
                  f"which cannot tell more: restart it (`sluice daemon stop`, then `sluice daemon start`)", flush=True)
            return 0
    if as_json:
        import msgspec

        data = {"running": True, **msgspec.structs.asdict(info), "client_version": SLUICE_VERSION}
        data["executors"] = [msgspec.structs.asdict(e) for e in info.executors]
        print(json.dumps(data), flush=True)
        return 0
    print(describe_info(info), flush=True)
    return 0


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def describe_info(info) -> str:
    """``sluice daemon status`` for a person: one heading line, then one line per topic."""
    local = [e for e in info.executors if not e.remote]
    remote = [e for e in info.executors if e.remote]

    def pool(executors) -> str:
        slots = sum(e.slots for e in executors)
        busy = sum(e.busy for e in executors)
        interactive = sum(e.interactive for e in executors)
        return f"{busy} of {slots} slots busy, {interactive} interactive"

    lines = [f"sluice daemon {info.sluice_version or '(version not told)'} running (pid {info.pid}, up {_duration(info.uptime_s)})"]
    row = lines.append
    row(f"  socket:     {info.socket}")
    row(f"  listening:  {info.listen or 'no (local socket only)'}")
    row(f"  log:        {info.log}")
    text = f"{len(local)} local"
    if info.executors_wanted != len(local):
        text += f" of {info.executors_wanted}"
    if local:
        text += f" ({pool(local)})"
    text += f", {len(remote)} remote"
    if remote:
        text += f" ({pool(remote)}: {', '.join(e.name for e in remote)})"
    row(f"  executors:  {text}")
    if info.queued:
        row(f"  queued:     {info.queued} command(s) waiting for an executor")
    row(f"  frontends:  {info.frontends} connected (this one included)")
    agent = "agent running" if info.agent_running else "agent not started"
    row(f"  sessions:   {info.sessions} (at most {info.max_sessions}; {agent})")
    row(f"  journal:    {'off (replay from memory only)' if info.journal_bytes is None else _size(info.journal_bytes)}")
    if version_key(SLUICE_VERSION) != version_key(info.sluice_version):
        row(f"  this sluice is {SLUICE_VERSION}; restart the daemon to run the same: "
            "`sluice daemon stop`, then `sluice daemon start`")
    return "\n".join(lines)


def _logs(runtime: RuntimeDir, lines: int, follow: bool) -> int:
    """``sluice daemon logs [-n N] [-f]``: the last N lines of ``daemon.log`` (the rotated
    file first when that is where they are), then, with ``-f``, what comes, across
    rotations, until Ctrl-C."""
    try:
        dir_fd = runtime.open()
    except RuntimeDirError as e:
        if not os.path.isdir(runtime.path):
            return fail(f"no daemon log: the runtime dir {runtime.path} does not exist", 1)
        return fail(str(e), 1)
    try:
        fd = _open_log(dir_fd, "daemon.log")
        if fd is None:
            return fail(f"no daemon log at {runtime.log_path} (a daemon in the foreground logs to its stderr)", 1)
        tail = _last_lines(fd, lines)
        if len(tail) < lines:
            older = _open_log(dir_fd, "daemon.log.1")
            if older is not None:
                tail = _last_lines(older, lines - len(tail)) + tail
                os.close(older)
        out = sys.stdout.buffer
        out.write(b"".join(tail))
        out.flush()
        if not follow:
            os.close(fd)
            return 0
        try:
            _follow(dir_fd, fd, out)
        except KeyboardInterrupt:
            return 0
        return 0
    finally:
        os.close(dir_fd)


def _open_log(dir_fd: int, name: str) -> int | None:
    try:
        return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None


def _last_lines(fd: int, count: int) -> list[bytes]:
    if count <= 0:
        return []
    end = os.fstat(fd).st_size
    data = b""
    pos = end
    while pos > 0 and data.count(b"\n") <= count:
        step = min(65536, pos)
        pos -= step
        data = os.pread(fd, step, pos) + data
    os.lseek(fd, end, os.SEEK_SET)
    found = data.splitlines(keepends=True)
    return found[-count:]


def _follow(dir_fd: int, fd: int, out) -> None:
    """Print what is appended to ``fd``; when daemon.log is rotated, finish the old file
    and go on with the new one."""
    delay = 0.05
    while True:
        data = os.read(fd, 65536)
        if data:
            out.write(data)
            out.flush()
            delay = 0.05
            continue
        try:
            now = os.stat("daemon.log", dir_fd=dir_fd, follow_symlinks=False)
            ours = os.fstat(fd)
        except OSError:
            now = ours = None
        if now is not None and (now.st_dev, now.st_ino) != (ours.st_dev, ours.st_ino):
            new = _open_log(dir_fd, "daemon.log")
            if new is not None:
                rest = os.read(fd, 1 << 20)
                if rest:
                    out.write(rest)
                os.close(fd)
                fd = new
                continue
        # A log file gives no event to wait on without inotify; a short poll is enough.
        time.sleep(delay)
        delay = min(delay * 2, 0.5)
