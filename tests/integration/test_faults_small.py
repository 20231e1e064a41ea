"""Small faults, each as a user met it: ``sluice run`` with stdout or stderr closed, a
daemon stopped under running commands, a request over the size limit, polling a
session with ``timeout=0``, a timeout while the caller's stdout is blocked, and a
terminal session printing with nobody attached (the journals' cap across sessions).

Real daemons, real sandboxes, real processes.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from broker.client import UsageError
from broker.wire import frames as wire
from broker.wire.protocol import TextInput, UnifiedExecSettings, UserInput
from broker.wire.results import DAEMON_SHUTTING_DOWN, DAEMON_STOPPED, EXIT_DAEMON_STOPPED
from landlock_helper.limits import format_size
from tests.support.fake_model import assistant, call, response
from tests.support.frontends import Frontends
from tests.support.harness import daemons, reap, short_tempdir, wait_for
from tests.support.sessions import collect, configure_op

pytestmark = pytest.mark.timeout(120)

# A command that says something on each stream and exits 3.
BOTH_STREAMS = ["sh", "-c", "echo out; echo err >&2; exit 3"]


@pytest.fixture
def shell_run(module_daemon, sluice, tmp_path):
    """shell_run(redirect, *args): ``sluice run --cwd TMP ARGS REDIRECT`` as a shell runs it
    (``>&-`` closes our stdout), against the module's daemon, once an executor has joined
    it (else the first command is told it waits for one)."""
    client = module_daemon.client()
    wait_for(lambda: client.daemon_info().executors, 30, "an executor to join")

    def run(redirect: str, *args: str) -> subprocess.CompletedProcess:
        line = shlex.join([*sluice, "run", "--cwd", str(tmp_path), *args]) + " " + redirect
        return subprocess.run(["sh", "-c", line], env=module_daemon.env, capture_output=True, timeout=60)

    return run


@pytest.mark.parametrize("path", [[], ["--via-broker"]], ids=["direct", "via-broker"])
def test_closed_stdout_or_stderr_loses_that_output_and_nothing_else(shell_run, path) -> None:
    closed_out = shell_run(">&-", *path, "--", *BOTH_STREAMS)
    assert (closed_out.returncode, closed_out.stdout, closed_out.stderr) == (3, b"", b"err\n")

    closed_err = shell_run("2>&-", *path, "--", *BOTH_STREAMS)
    assert (closed_err.returncode, closed_err.stdout, closed_err.stderr) == (3, b"out\n", b"")

    # The daemon was not written to in their place: it still serves.
    assert shell_run("", *path, "--", "echo", "still here").stdout == b"still here\n"


@pytest.fixture(scope="module")
def agent_daemon():
    """A daemon with its agent, in a home of its own."""
    with daemons() as factory:
        yield factory.start(executors=1, env={"SLUICE_HOME": short_tempdir("sl-small-home-")})


def test_three_clients_polling_with_timeout_0_get_every_event(agent_daemon, server, tmp_path) -> None:
    deltas = [f"w{i} " for i in range(900)]
    server.script(response(assistant("".join(deltas)), deltas=deltas))
    owner = agent_daemon.client()
    session = owner.open_session(configure_op(server, str(tmp_path)))
    pollers = [agent_daemon.client().attach(session.id, since=0) for _ in range(3)]
    session.submit(UserInput([TextInput("talk a lot")]))
    collect(session, "task_complete", timeout=60)
    head = owner.list_sessions().sessions[0].seq
    assert head > 900

    # As a program with a loop of its own polls: take what is there, else go on with other work.
    seen: list[list[int]] = [[] for _ in pollers]
    deadline = time.monotonic() + 30
    while any(not got or got[-1] < head for got in seen) and time.monotonic() < deadline:
        idle = True
        for poller, got in zip(pollers, seen):
            event = poller.next_event(timeout=0)
            if event is not None:
                idle = False
                got.append(event.seq)
        if idle:
            time.sleep(0.005)
    for got in seen:
        assert got == list(range(1, head + 1)), f"{len(got)} of {head} events"


def test_a_request_over_the_size_limit_is_refused_naming_the_limit(agent_daemon, server, tmp_path) -> None:
    client = agent_daemon.client()
    limit = f"more than the {format_size(wire.MAX_MESSAGE_SIZE)} the daemon takes in one message"
    big = "x" * (wire.MAX_MESSAGE_SIZE + 1024)
    with pytest.raises(UsageError, match=limit):
        client.run(["echo", big])
    session = client.open_session(configure_op(server, str(tmp_path)))
    with pytest.raises(UsageError, match=limit):
        session.submit(UserInput([TextInput(big)]))

    # Refused before it was sent (the daemon would have cut the connection): the client
    # and the session serve on.
    assert client.run(["echo", "fine"]).stdout == b"fine\n"
    server.script(response(assistant("Still here.")))
    session.submit(UserInput([TextInput("hello")]))
    assert collect(session, "task_complete", timeout=30)[-1].msg.last_agent_message == "Still here."


def test_clients_of_a_stopped_daemon_are_told_so_with_an_exit_code_of_its_own(daemon_factory, sluice, server,
                                                                               tmp_path) -> None:
    dmn = daemon_factory.start(executors=1, env={"SLUICE_HOME": short_tempdir("sl-small-home-")})
    work = tmp_path / "work"
    work.mkdir()
    clients = {}
    for name, args in {"direct": [], "via-broker": ["--via-broker"]}.items():
        script = f"echo started > {name}; exec sleep 60"
        clients[name] = subprocess.Popen([*sluice, "run", "--cwd", str(work), *args, "--", "sh", "-c", script],
                                         env=dmn.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    fe = Frontends(dmn.runtime, server, tmp_path / "fe-home")
    server.script(response(call("shell", {"command": ["sh", "-c", "echo started > exec; exec sleep 60"]}, "c1")))
    clients["exec"] = fe.popen("exec", "--sandbox", "workspace-write", "--cd", str(work), "-c",
                               "approval_policy=never", "start it", stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: all((work / name).exists() for name in clients), 30, "the commands to start")
        stop = subprocess.run([*sluice, "daemon", "stop"], env=dmn.env, capture_output=True, timeout=60)
        assert stop.returncode == 0, stop.stderr
        said = {}
        for name, proc in clients.items():
            _, err = proc.communicate(timeout=30)
            assert proc.returncode == EXIT_DAEMON_STOPPED == 75, (name, err)
            said[name] = err.decode().splitlines()[-1]
        assert said == {"direct": f"sluice: error: {DAEMON_STOPPED}", "via-broker": f"sluice: error: {DAEMON_STOPPED}",
                        "exec": f"error: {DAEMON_SHUTTING_DOWN}"}
    finally:
        for proc in clients.values():
            reap(proc)


def test_a_timeout_fires_while_our_reader_reads_nothing(module_daemon, sluice, tmp_path) -> None:
    # `sluice run --via-broker --timeout-ms 2000 -- yes | sleep 6`: the reader never reads.
    argv = [*sluice, "run", "--via-broker", "--cwd", str(tmp_path), "--timeout-ms", "2000", "--", "yes"]
    proc = subprocess.Popen(argv, env=module_daemon.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.wait(timeout=60) == 124, proc.stderr.read()
    finally:
        reap(proc)


def test_output_a_slow_reader_has_not_taken_when_the_command_ends_still_reaches_it(module_daemon, sluice,
                                                                                  tmp_path) -> None:
    size = 20 * 1024 * 1024  # more than a window: the command waits for the reader too
    script = f"head -c {size} /dev/zero; echo done > ended"
    proc = subprocess.Popen([*sluice, "run", "--via-broker", "--cwd", str(tmp_path), "--", "sh", "-c", script],
                            env=module_daemon.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # Read a little at a time until the command has ended, then the rest.
        got = 0
        while not (tmp_path / "ended").exists():
            got += len(proc.stdout.read1(4096))
        got += len(proc.stdout.read())
        assert (proc.wait(timeout=60), got) == (0, size), proc.stderr.read()
    finally:
        reap(proc)


def _on_disk(directory: Path) -> int:
    total = 0
    for entry in os.scandir(directory):
        with contextlib.suppress(FileNotFoundError):  # a segment dropped meanwhile
            total += entry.stat(follow_symlinks=False).st_size
    return total


def test_terminal_sessions_printing_with_nobody_attached_stay_within_the_journals_cap(daemon_factory, server,
                                                                                     tmp_path) -> None:
    limit = 8 * 1024 * 1024
    dmn = daemon_factory.start(executors=1, args=["--journal-limit", "8M"],
                               env={"SLUICE_HOME": short_tempdir("sl-small-home-")})
    journal = Path(dmn.runtime.path, "journal")
    client = dmn.client()
    sessions = []
    for i in range(2):
        server.script(response(call("exec_command", {"cmd": "yes", "tty": True, "yield_time_ms": 300}, f"c{i}")),
                      response(assistant("Left it running.")))
        op = configure_op(server, str(tmp_path), unified_exec=UnifiedExecSettings(tools="codex"))
        session = client.open_session(op)
        session.submit(UserInput([TextInput("start yes in a terminal")]))
        collect(session, "task_complete", timeout=60)
        session.detach()  # nobody attached: its output goes only to the log and the journal
        sessions.append(session)

    # Until each session has printed three times what the cap leaves it (and more than its
    # memory log keeps, so its first events are gone), the journals never hold more than the cap.
    sizes = []
    segments = {s.id: 0 for s in sessions}
    deadline = time.monotonic() + 90
    while min(segments.values()) < 3:
        assert time.monotonic() < deadline, f"the sessions stopped printing? {sorted(os.listdir(journal))}"
        sizes.append(_on_disk(journal))
        for name in os.listdir(journal):
            session_id, n, _ = name.rsplit(".", 2)
            segments[session_id] = max(segments[session_id], int(n))
        time.sleep(0.02)
    assert max(sizes) <= limit, max(sizes)

    # A frontend replaying from the start is told what is gone, then gets the rest in order.
    late = dmn.client().attach(sessions[0].id, since=0)
    notice = late.next_event(10)
    assert notice.seq is None and notice.msg.message.startswith("events 1..")
    assert " of this session are no longer kept; continuing at " in notice.msg.message
    resumed = int(notice.msg.message.rsplit(" ", 1)[1])
    assert [late.next_event(10).seq for _ in range(3)] == [resumed, resumed + 1, resumed + 2]
