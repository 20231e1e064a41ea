"""Bad input lines for ``sluice bridge`` and ``sluice attach --json``: JSON nested 100,000
deep, bytes that are not UTF-8, a line past the 64 MiB limit. Each is one error (an
``error`` event on stdout from the bridge, one line on stderr from both) naming its line,
and the lines after it are taken as if it had not been there.

Real processes: a daemon with its agent, the command line on pipes, a scripted model on
loopback (:mod:`tests.fake_model`). How long a long line takes to read is measured by
tests/bench/bench_bridge_lines.py, not asserted here.
"""

from __future__ import annotations

import subprocess

import pytest

from broker.cli.session_loop import MAX_LINE
from broker.wire.protocol import TextInput, UserInput
from tests.support.fake_model import assistant, response, user_item
from tests.support.frontends import Frontends, configure_op, json_events, submission_line, tag
from tests.support.harness import daemons, short_tempdir

pytestmark = pytest.mark.timeout(90)

DEPTH = 100_000
DEEP_OBJECTS = b'{"a":' * DEPTH + b"1" + b"}" * DEPTH + b"\n"
DEEP_IN_A_SUBMISSION = (b'{"id":"deep","op":{"type":"user_input","items":[{"type":"text","text":"x","extra":'
                        + b"[" * DEPTH + b"]" * DEPTH + b"}]}}\n")
NOT_UTF8 = b'{"id":"\xff\xfe","op":{"type":"interrupt"}}\n'


def too_long() -> bytes:
    """A submission one line longer than a line may be (made when a test needs it: it is
    as big as the limit, and every worker of a parallel run would make it as it collects)."""
    return b'{"id":"big","op":{"type":"user_input","items":[{"type":"text","text":"' + b"x" * MAX_LINE + b'"}]}}\n'


@pytest.fixture(scope="module")
def dmn():
    with daemons() as factory:
        yield factory.start(executors=1, env={"SLUICE_HOME": short_tempdir("sl-input-home-")})


def run(fe: Frontends, *args: str, stdin: bytes) -> subprocess.CompletedProcess:
    """The command with ``stdin`` as bytes (the lines need not be UTF-8); output as text."""
    p = subprocess.run(fe.argv(*args), env=fe.env, input=stdin, capture_output=True, timeout=60)
    return subprocess.CompletedProcess(p.args, p.returncode, p.stdout.decode(), p.stderr.decode())


def test_bridge_answers_deep_undecodable_and_too_long_lines_with_errors_and_goes_on(fe, server, tmp_path) -> None:
    server.script(response(assistant("Still here.")))
    stdin = b"".join([
        DEEP_OBJECTS,  # 1: before any session
        submission_line("cfg", configure_op(server, tmp_path)),  # 2
        DEEP_IN_A_SUBMISSION,  # 3
        NOT_UTF8,  # 4
        too_long(),  # 5
        submission_line("t1", UserInput([TextInput("after the bad lines")])),  # 6
    ])
    p = run(fe, "bridge", stdin=stdin)
    assert p.returncode == 0, p.stderr

    events = json_events(p.stdout)
    errors = [e.msg.message for e in events if tag(e) == "error"]
    assert errors == [
        "line 1: invalid submission: nested too deeply",
        "line 3: invalid submission: nested too deeply",
        "line 4: invalid submission: a string is not valid UTF-8",
        "line 5: longer than 64 MiB, the most one submission may be; skipped to its end",
    ], p.stdout[-2000:]
    assert p.stderr.splitlines() == [f"sluice: error: {message}" for message in errors]
    numbered = [e for e in events if e.seq is not None]
    assert tag(numbered[0]) == "session_configured" and numbered[0].id == "cfg"
    turn = [tag(e) for e in numbered if e.id == "t1"]
    assert turn[0] == "task_started" and turn[-1] == "task_complete"
    assert server.requests[-1]["json"]["input"][-1] == user_item("after the bad lines")


def test_attach_json_skips_deep_and_undecodable_lines_and_goes_on(dmn, fe, server, tmp_path) -> None:
    session = dmn.client().open_session(configure_op(server, tmp_path))
    event = session.next_event(20)
    assert event is not None and tag(event) == "session_configured", event
    server.script(response(assistant("Attached and fine.")))
    stdin = b"".join([
        DEEP_OBJECTS,
        NOT_UTF8,
        DEEP_IN_A_SUBMISSION,
        submission_line("in-1", UserInput([TextInput("after the bad lines")])),
    ])
    p = run(fe, "attach", session.id, "--json", "--until-idle", stdin=stdin)
    assert p.returncode == 0, p.stderr
    assert p.stderr.splitlines() == [
        "sluice: error: line 1: invalid submission: nested too deeply",
        "sluice: error: line 2: invalid submission: a string is not valid UTF-8",
        "sluice: error: line 3: invalid submission: nested too deeply",
    ]
    ours = [tag(e) for e in json_events(p.stdout) if e.id == "in-1"]
    assert ours[0] == "task_started" and ours[-1] == "task_complete"
    assert server.requests[-1]["json"]["input"][-1] == user_item("after the bad lines")


def test_a_too_long_line_at_the_end_of_input_is_an_error_too(fe) -> None:
    p = run(fe, "bridge", stdin=b"\n" + b"y" * (MAX_LINE + 1))
    assert p.returncode == 0, p.stderr
    (event,) = json_events(p.stdout)
    assert tag(event) == "error" and event.msg.message.startswith("line 2: longer than 64 MiB")
    assert p.stderr.count("\n") == 1
