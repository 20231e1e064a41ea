"""``sluice daemon start`` on a running daemon and ``sluice daemon stop`` while a session
waits for approval, as a person types them: real daemon, agent, scripted model."""

from __future__ import annotations

import pytest

from broker.client import daemon_status
from tests.support.fake_model import assistant, call, response
from tests.support.harness import short_tempdir

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def dmn(daemon_factory):
    return daemon_factory.start(executors=1, env={"SLUICE_HOME": short_tempdir("sl-stop-home-")})


def test_start_with_flags_the_running_daemon_lacks_says_they_are_not_applied(dmn, fe) -> None:
    p = fe.run("daemon", "start", "--executors", "20")
    assert p.returncode == 1 and p.stdout == "", p.stdout
    (line,) = p.stderr.splitlines()
    assert line.startswith(f"sluice: error: daemon running (pid {dmn.pid}, ") and line.endswith(
        "; it runs 1 executor; --executors 20 is not applied: stop it first (`sluice daemon stop`), "
        "then start it with them"), line
    p = fe.run("daemon", "start", "--executors", "1", "--suspend-limit", "60")
    assert p.returncode == 1 and p.stderr.splitlines()[0].endswith(
        "; --suspend-limit is not applied: stop it first (`sluice daemon stop`), then start it with them"), p.stderr
    # What it has already, or nothing asked: as before, the line that says it runs.
    for args in ((), ("--executors", "1")):
        p = fe.run("daemon", "start", *args)
        assert (p.returncode, p.stderr) == (0, ""), p.stderr
        assert p.stdout.startswith(f"sluice: daemon running (pid {dmn.pid}, ")


def test_stop_refuses_while_a_session_waits_for_approval_unless_forced(dmn, fe, server, tmp_path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    server.script(response(call("shell", {"command": ["touch", "made.txt"]}, "c1")), response(assistant("Never.")))
    p = fe.run("exec", "--detach", "--approval-policy", "untrusted", "-C", str(work), "make a file")
    assert p.returncode == 0, p.stderr
    session_id = p.stdout.strip()
    with fe.on_pty("attach", session_id) as person:
        person.read_until(b"Allow? [y]es")

        p = fe.run("daemon", "stop")
        assert (p.returncode, p.stdout) == (1, ""), p.stdout
        assert p.stderr == (f"sluice: error: not stopping: 1 session waits for approval ({session_id[:8]}); "
                            "answer with `sluice attach ID`, or stop anyway with `sluice daemon stop --force`\n")
        assert daemon_status(dmn.runtime).running

        p = fe.run("daemon", "stop", "--force")
        assert p.returncode == 0 and p.stdout == f"sluice: daemon stopped (pid {dmn.pid})\n", p.stderr
        # The person at the attached terminal is told what ended unanswered.
        person.read_until(b"error: the sluice daemon is shutting down; the approval it waited for (c1) "
                          b"ends unanswered")
        person.wait()
    assert not daemon_status(dmn.runtime).running
    assert not (work / "made.txt").exists()
