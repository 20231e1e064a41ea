"""A daemon you can see (issue 14): versions, ``sluice daemon status`` and ``logs``, the
line that says a daemon was started, a log of JSON lines that rotates, a run with no
executor, ``--executors`` capped, ``--connect`` to nothing, a timeout or a signal named
on a terminal, ``stop`` signalling only the daemon, the sandbox's init by a short name,
and ``sluice executor --help`` without internal flags. Real processes throughout."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from broker.net.logging import LOG_KEEP, LOG_MAX_BYTES
from broker.wire.version import SLUICE_VERSION
from tests.support.harness import reap, subprocess_env, wait_for
from tests.support.terminal import OnTerminal


def _run(sluice, *args, env, timeout=40, **kw):
    return subprocess.run([*sluice, *args], env=env, capture_output=True, timeout=timeout, **kw)


def _stderr_lines(p) -> list[str]:
    text = p.stderr.decode()
    assert "Traceback" not in text, text
    return [line for line in text.splitlines() if line.strip()]


# -- versions -------------------------------------------------------------------------------------


def test_version_flag(sluice) -> None:
    p = _run(sluice, "--version", env=subprocess_env())
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode().strip() == f"sluice {SLUICE_VERSION}"


# A daemon that says it is an older sluice (the same code, its version patched before it serves).
OLD_DAEMON = textwrap.dedent(
    """
    import sys
    from broker.wire import version
    version.SLUICE_VERSION = "0.0.1"
    from broker.cli.main import main
    sys.exit(main(["daemon", "--executors", "1"]))
    """
)


@pytest.mark.timeout(60)
def test_a_cli_newer_than_the_daemon_says_so_and_how_to_restart_it(daemon_factory, sluice) -> None:
    old = daemon_factory.start(argv=[sys.executable, "-c", OLD_DAEMON])
    env = old.env_for_children()
    p = _run(sluice, "run", "--", "echo", "hi", env=env)
    assert (p.returncode, p.stdout) == (0, b"hi\n"), p.stderr
    [line] = _stderr_lines(p)
    assert f"runs sluice 0.0.1, this command is {SLUICE_VERSION}" in line
    assert "`sluice daemon stop`" in line
    status = _run(sluice, "daemon", "status", env=env)
    assert "sluice daemon 0.0.1 running" in status.stdout.decode()
    assert f"this sluice is {SLUICE_VERSION}" in status.stdout.decode()
    # The same version: nothing said.
    current = daemon_factory.start(executors=1)
    p = _run(sluice, "run", "--", "true", env=current.env_for_children())
    assert (p.returncode, p.stderr) == (0, b"")


# -- sluice daemon status -------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_daemon_status_tells_what_the_daemon_runs(daemon_factory, sluice) -> None:
    daemon = daemon_factory.start(executors=2)
    env = daemon.env_for_children()
    client = daemon.client()
    wait_for(lambda: len(client.daemon_info().executors) == 2, what="both executors to join")
    busy = client.submit(["sleep", "30"], sandbox="read-only", cwd="/")
    shell = client.submit(["cat"], sandbox="read-only", cwd="/", stdin=True, interactive=True)
    wait_for(lambda: client.poll(0.05) >= 0 and busy.started and shell.started, what="both commands started")

    p = _run(sluice, "daemon", "status", "--json", env=env)
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert info["running"] is True
    assert info["sluice_version"] == info["client_version"] == SLUICE_VERSION
    assert info["pid"] == daemon.pid and info["uptime_s"] > 0
    assert info["socket"] == daemon.runtime.endpoint and info["runtime_dir"] == daemon.runtime.path
    assert info["listen"] == "" and info["log"] == "stderr"  # a daemon in the foreground logs to its stderr
    executors = info["executors"]
    assert len(executors) == 2 and info["executors_wanted"] == 2
    assert {e["remote"] for e in executors} == {False}
    assert sum(e["busy"] for e in executors) == 1 and sum(e["interactive"] for e in executors) == 1
    assert sum(e["slots"] for e in executors) > 1
    assert info["sessions"] == 0 and info["max_sessions"] > 0 and info["journal_bytes"] == 0
    assert info["frontends"] >= 2  # our client and the status command itself

    p = _run(sluice, "daemon", "status", env=env)
    assert p.returncode == 0, p.stderr
    text = p.stdout.decode()
    assert text.splitlines()[0].startswith(f"sluice daemon {SLUICE_VERSION} running (pid {daemon.pid}, up ")
    for expected in (f"socket:     {daemon.runtime.endpoint}", "listening:  no", "log:        stderr",
                     "executors:  2 local (1 of ", "1 interactive), 0 remote", "sessions:   0", "journal:    0 bytes"):
        assert expected in text, text
    client.cancel(busy)
    client.cancel(shell)
    client.wait_all([busy, shell])

    daemon.terminate()
    p = _run(sluice, "daemon", "status", "--json", env=env)
    assert p.returncode == 3
    assert json.loads(p.stdout) == {"running": False, "runtime_dir": daemon.runtime.path,
                                    "client_version": SLUICE_VERSION}


# -- starting in the background, the log ----------------------------------------------------------


@pytest.mark.timeout(60)
def test_the_command_that_starts_the_daemon_says_so_once(sluice, runtime_dir) -> None:
    env = subprocess_env(runtime_dir)
    p = _run(sluice, "run", "--", "echo", "first", env=env)
    assert (p.returncode, p.stdout) == (0, b"first\n"), p.stderr
    [line] = _stderr_lines(p)
    pid = json.loads(_run(sluice, "daemon", "status", "--json", env=env).stdout)["pid"]
    assert line.startswith(f"sluice: started the sluice daemon in the background (pid {pid}, log "
                           f"{runtime_dir.log_path})")
    assert "stop it with `sluice daemon stop`" in line
    p = _run(sluice, "run", "--", "echo", "second", env=env)
    assert (p.returncode, p.stdout, p.stderr) == (0, b"second\n", b"")


def _executors_wanted(sluice, env) -> int:
    return json.loads(_run(sluice, "daemon", "status", "--json", env=env).stdout)["executors_wanted"]


@pytest.mark.timeout(60)
def test_an_auto_started_daemon_runs_one_executor_per_cpu_or_sluice_executors(sluice, runtime_dir) -> None:
    """The default (the suite sets SLUICE_EXECUTORS=1 for everything else), the variable
    reaching the daemon `sluice run` starts, and `daemon start`'s flag over it."""
    env = subprocess_env(runtime_dir)
    del env["SLUICE_EXECUTORS"]
    assert _run(sluice, "run", "--", "true", env=env).returncode == 0
    assert _executors_wanted(sluice, env) == os.cpu_count()
    assert _run(sluice, "daemon", "stop", env=env).returncode == 0
    env["SLUICE_EXECUTORS"] = "3"
    assert _run(sluice, "run", "--", "true", env=env).returncode == 0
    assert _executors_wanted(sluice, env) == 3
    assert _run(sluice, "daemon", "stop", env=env).returncode == 0
    assert _run(sluice, "daemon", "start", "--executors", "2", env=env).returncode == 0
    assert _executors_wanted(sluice, env) == 2


@pytest.mark.timeout(60)
def test_a_bad_sluice_executors_is_one_line_and_starts_nothing(sluice, runtime_dir) -> None:
    env = subprocess_env(runtime_dir, SLUICE_EXECUTORS="two")
    why = "SLUICE_EXECUTORS must be a whole number of executors (0 or more), got 'two'"
    p = _run(sluice, "daemon", "start", env=env)
    assert p.returncode == 2 and _stderr_lines(p) == [f"sluice: error: {why}"]
    p = _run(sluice, "run", "--", "true", env=env)
    assert p.returncode == 125
    assert _stderr_lines(p) == [f"sluice: error: the daemon exited at start (status 2): sluice: error: {why}"]
    assert _run(sluice, "daemon", "status", env=env).returncode == 3


@pytest.mark.timeout(60)
def test_a_daemon_started_without_cgroups_says_its_commands_have_no_default_limits(sluice, runtime_dir) -> None:
    """As for a user the host gives no cgroups: said once, by the command that starts the
    daemon (and by `sluice daemon start`), not by every command after it."""
    env = dict(subprocess_env(runtime_dir), SLUICE_NO_CGROUPS="1")
    p = _run(sluice, "run", "--", "echo", "first", env=env)
    assert (p.returncode, p.stdout) == (0, b"first\n"), p.stderr
    started, weak = _stderr_lines(p)
    assert started.startswith("sluice: started the sluice daemon")
    assert weak.startswith("sluice: no memory or pids cgroup for this user here (cgroups turned off by "
                           "SLUICE_NO_CGROUPS): commands get no default memory or process limit"), weak
    p = _run(sluice, "run", "--", "echo", "second", env=env)
    assert (p.returncode, p.stdout, p.stderr) == (0, b"second\n", b"")
    assert _run(sluice, "daemon", "stop", env=env).returncode == 0
    p = _run(sluice, "daemon", "start", env=env)
    assert p.returncode == 0 and b"no memory or pids cgroup" in p.stderr, p.stderr


def _log_files(runtime) -> dict[str, bytes]:
    found = {}
    for name in ["daemon.log", *(f"daemon.log.{k}" for k in range(1, LOG_KEEP + 3))]:
        try:
            with open(os.path.join(runtime.path, name), "rb") as f:
                found[name] = f.read()
        except FileNotFoundError:
            pass
    return found


def _all_json(data: bytes) -> list[dict]:
    records = []
    for line in data.decode().splitlines():
        record = json.loads(line)  # fails on anything that is not one JSON object per line
        assert isinstance(record, dict), line
        records.append(record)
    return records


@pytest.mark.timeout(120)
def test_the_background_log_holds_only_json_lines_and_rotates(sluice, runtime_dir) -> None:
    env = subprocess_env(runtime_dir)
    p = _run(sluice, "daemon", "start", "--executors", "1", env=env)
    assert p.returncode == 0, p.stderr
    pid = json.loads(_run(sluice, "daemon", "status", "--json", env=env).stdout)["pid"]
    # What else reaches the daemon's stderr (its children's, a traceback) becomes JSON too:
    # written here into the daemon's own stderr, as a child that inherited it would.
    with open(f"/proc/{pid}/fd/2", "w") as stderr:
        stderr.write("Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: boom\n")
    wait_for(lambda: b"ValueError: boom" in _log_files(runtime_dir)["daemon.log"], what="the traceback logged")
    records = _all_json(_log_files(runtime_dir)["daemon.log"])
    assert any("ValueError: boom" in r.get("text", "") and r["component"] == "stderr" for r in records)
    assert any(r["event"] == "daemon ready" for r in records)

    # Past LOG_MAX_BYTES the log rotates; LOG_KEEP old files are kept, none is larger.
    line = "x" * 1000 + "\n"
    with open(f"/proc/{pid}/fd/2", "w") as stderr:
        for _ in range((LOG_KEEP + 1) * LOG_MAX_BYTES // len(line) + 100):
            stderr.write(line)
    wait_for(lambda: f"daemon.log.{LOG_KEEP}" in _log_files(runtime_dir), timeout=60, what="the log rotated")
    p = _run(sluice, "run", "--", "echo", "after", env=env)
    assert p.stdout == b"after\n"
    files = _log_files(runtime_dir)
    assert set(files) == {"daemon.log", *(f"daemon.log.{k}" for k in range(1, LOG_KEEP + 1))}, sorted(files)
    for name, data in files.items():
        assert len(data) <= LOG_MAX_BYTES, (name, len(data))
        _all_json(data)

    # sluice daemon logs: the last N lines, then (-f) what comes.
    p = _run(sluice, "daemon", "logs", "-n", "3", env=env)
    assert p.returncode == 0, p.stderr
    assert len(_all_json(p.stdout)) == 3
    follow = subprocess.Popen([*sluice, "daemon", "logs", "-f", "-n", "0"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, preexec_fn=_default_sigint)
    try:
        seen = bytearray()
        deadline = time.monotonic() + 30
        while b"peer joined" not in seen:
            assert time.monotonic() < deadline, bytes(seen)
            _run(sluice, "run", "--", "true", env=env)  # a frontend joins and leaves: logged
            if select.select([follow.stdout], [], [], 1.0)[0]:
                seen += os.read(follow.stdout.fileno(), 65536)
        _all_json(bytes(seen[: seen.rindex(b"\n") + 1]))
    finally:
        follow.send_signal(signal.SIGINT)
        assert follow.wait(10) == 0
        assert b"Traceback" not in follow.stderr.read()


def _default_sigint() -> None:
    """In the child, before exec: SIGINT as a terminal's Ctrl-C would find it, whatever this
    test process inherited (an ignored or blocked SIGINT survives exec, and Python then
    never raises KeyboardInterrupt)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_logs_without_a_daemon_log_is_one_line(sluice, runtime_dir) -> None:
    p = _run(sluice, "daemon", "logs", env=subprocess_env(runtime_dir))
    assert p.returncode == 1
    [line] = _stderr_lines(p)
    assert line.startswith("sluice: error: no daemon log")


# -- no executor, too many, nothing listening -----------------------------------------------------


@pytest.mark.alone
@pytest.mark.timeout(60)
def test_a_run_without_executors_says_it_waits_and_then_fails(daemon_factory, sluice) -> None:
    daemon = daemon_factory.start(executors=0, args=["--executor-wait", "3"])
    started = time.monotonic()
    proc = subprocess.Popen([*sluice, "run", "--", "true"], env=daemon.env_for_children(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert select.select([proc.stderr], [], [], 10)[0]
        first = proc.stderr.readline().decode()
        said_after = time.monotonic() - started
        assert first.startswith("sluice: no executor is connected to the daemon"), first
        assert "waits for one" in first
        # Within a second of asking (the CLI's own start-up, a few hundred ms, included).
        assert said_after < 1.5, said_after
        assert proc.wait(20) == 125
        rest = proc.stderr.read().decode().splitlines()
        assert len(rest) == 1 and rest[0].startswith("sluice: error: no executor joined the daemon within 3 s")
        assert 2.5 < time.monotonic() - started < 10
    finally:
        reap(proc)


@pytest.mark.timeout(60)
def test_a_faster_heartbeat_gives_a_silent_executor_up_sooner(daemon_factory, sluice) -> None:
    """``--heartbeat 0.3``: an executor that stops answering (SIGSTOP: alive, connected,
    silent, as a host that powered off) fails its command after 10 heartbeats, 3 s."""
    daemon = daemon_factory.start(executors=1, args=["--heartbeat", "0.3"])
    wait_for(lambda: len(daemon.executor_pids()) == 1, timeout=30, what="the executor")
    [executor] = daemon.executor_pids()
    proc = subprocess.Popen([*sluice, "run", "--", "sh", "-c", "echo up; sleep 30"], env=daemon.env_for_children(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert select.select([proc.stdout], [], [], 30)[0] and proc.stdout.readline() == b"up\n"
        os.kill(executor, signal.SIGSTOP)
        stopped = time.monotonic()
        assert proc.wait(20) == 125
        given_up = time.monotonic() - stopped
        lines = proc.stderr.read().decode().splitlines()
        assert lines == ["sluice: error: executor exec-1 stopped responding (no heartbeat for 3 s) while running "
                         "this command; the command was not re-run"], lines
        assert 2 < given_up < 10, given_up
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(executor, signal.SIGCONT)
        reap(proc)


@pytest.mark.timeout(90)
def test_executors_beyond_what_the_machine_can_use_are_capped(daemon_factory, sluice) -> None:
    cap = 4 * (os.cpu_count() or 1)
    daemon = daemon_factory.start(executors=cap + 1000)
    wait_for(lambda: len(daemon.executor_pids()) == cap, timeout=60, what=f"{cap} executors")
    assert f"--executors {cap + 1000} is more than this machine can use; starting {cap}" in daemon.log()
    info = json.loads(_run(sluice, "daemon", "status", "--json", env=daemon.env_for_children()).stdout)
    assert info["executors_wanted"] == cap


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.alone
@pytest.mark.timeout(60)
def test_connect_where_nothing_listens_fails_in_a_second_or_two(sluice, tmp_path) -> None:
    env = subprocess_env()
    for name in ("daemon", "laptop"):
        assert _run(sluice, "keys", "new", name, "--dir", str(tmp_path), env=env).returncode == 0
    started = time.monotonic()
    p = _run(sluice, "run", "--connect", f"tcp://127.0.0.1:{_free_port()}", "--server-key",
             str(tmp_path / "daemon.key"), "--key", str(tmp_path / "laptop.key_secret"), "--", "true", env=env)
    took = time.monotonic() - started
    assert p.returncode == 125
    [line] = _stderr_lines(p)
    assert "nothing accepts connections there" in line
    assert took < 3.0, took


# -- a timeout or a signal, on a terminal ---------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_timeout_or_a_killing_signal_is_named_on_a_terminal(module_daemon, sluice) -> None:
    env = module_daemon.env_for_children()
    with OnTerminal([*sluice, "run", "--timeout-ms", "300", "--", "sleep", "30"], env=env) as term:
        assert term.wait() == 124
        assert b"sluice: timed out after 300 ms (--timeout-ms): the command and its processes were killed (exit 124)" \
            in term.output
    with OnTerminal([*sluice, "run", "--", "sh", "-c", "kill -KILL $$"], env=env) as term:
        assert term.wait() == 137
        assert b"sluice: the command was killed by SIGKILL (signal 9, exit 137)" in term.output
    # Not a terminal: the exit code says it, nothing is added to the command's stderr.
    p = _run(sluice, "run", "--timeout-ms", "300", "--", "sleep", "30", env=env)
    assert (p.returncode, p.stderr) == (124, b"")
    p = _run(sluice, "run", "--", "sh", "-c", "exit 3", env=env)
    assert (p.returncode, p.stderr) == (3, b"")


# -- stop -----------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_stop_signals_only_the_daemon_holding_the_lock(sluice, runtime_dir) -> None:
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        # Started before the pid file is written: the pid file names it as a live process.
        os.makedirs(runtime_dir.path, mode=0o700, exist_ok=True)
        with open(os.path.join(runtime_dir.path, "daemon.pid"), "w") as f:
            f.write(f"{bystander.pid}\n")
        p = _run(sluice, "daemon", "stop", env=subprocess_env(runtime_dir))
        assert p.returncode == 1
        [line] = _stderr_lines(p)
        assert f"process {bystander.pid}" in line and "does not hold the daemon's lock" in line
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.timeout(60)
def test_stop_still_stops_the_daemon(sluice, runtime_dir) -> None:
    env = subprocess_env(runtime_dir)
    assert _run(sluice, "daemon", "start", "--executors", "1", env=env).returncode == 0
    pid = json.loads(_run(sluice, "daemon", "status", "--json", env=env).stdout)["pid"]
    p = _run(sluice, "daemon", "stop", env=env)
    assert p.returncode == 0 and f"stopped (pid {pid})" in p.stdout.decode(), p.stderr
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


# -- the sandbox's init, sluice executor --help ---------------------------------------------------


@pytest.mark.timeout(60)
def test_the_sandbox_init_shows_a_short_name(module_daemon, sluice) -> None:
    env = module_daemon.env_for_children()
    p = _run(sluice, "run", "--", "sh", "-c", "cat /proc/1/comm; tr '\\0' ' ' < /proc/1/cmdline; echo; ps -o args= -p 1",
             env=env)
    assert p.returncode == 0, p.stderr
    comm, cmdline, shown = p.stdout.decode().splitlines()
    assert comm == "sluice-init"
    assert cmdline.strip() == "sluice-init"
    assert shown.strip() == "sluice-init"
    assert "token" not in p.stdout.decode() and "executor" not in p.stdout.decode()


def test_executor_help_lists_no_internal_flags(sluice) -> None:
    p = _run(sluice, "executor", "--help", env=subprocess_env())
    assert p.returncode == 0
    text = p.stdout.decode()
    for flag in ("--connect", "--server-key", "--key", "--name", "--slots"):
        assert flag in text
    for internal in ("--token-file", "--hide", "--die-with-parent", "ipc://"):
        assert internal not in text
