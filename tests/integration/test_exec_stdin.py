"""Typing into a session's running interactive command (``exec_command_stdin``) through a
real daemon, agent and executors, with a scripted model: who may type, what every
frontend sees, what reaches the command and what the model reads afterwards.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.client import Client
from broker.wire.protocol import ExecCommandStdin, Shutdown, TextInput, UnifiedExecSettings, UserInput
from tests.support.fake_model import assistant, call, outputs_of, response
from tests.support.sessions import collect, configure_op, tag

pytestmark = pytest.mark.timeout(90)

CODEX = UnifiedExecSettings(tools="codex")


@pytest.fixture
def typist(dmn):
    client = Client.connect(dmn.runtime, autostart=False, name="typist")
    yield client
    client.close()


def output_of(events: list, call_id: str) -> bytes:
    return b"".join(e.msg.chunk for e in events if tag(e) == "exec_command_output_delta" and e.msg.call_id == call_id)


def until_output(session, call_id: str, needle: bytes, events: list = ()) -> list:
    """``events`` and the session's next ones, until the output of ``call_id`` in them holds ``needle``."""
    out = bytearray(output_of(list(events), call_id))
    if needle in out:
        return list(events)

    def done(event) -> bool:
        out.extend(output_of([event], call_id))
        return needle in out

    return [*events, *collect(session, done, timeout=30)]


def test_a_frontend_types_a_line_into_a_python_repl_and_every_frontend_sees_it(
        dmn, server, tmp_path: Path, typist) -> None:
    server.script(
        response(call("exec_command", {"cmd": "python3 -q -i", "tty": True, "yield_time_ms": 1500}, "c1")),
        response(assistant("The REPL runs.")),
        # The next turn: the model polls its session and reads what came meanwhile.
        response(call("write_stdin", {"session_id": 1000, "chars": "", "yield_time_ms": 500}, "c2")),
        response(assistant("Seen.")),
    )
    owner = dmn.client()
    session = owner.open_session(configure_op(server, str(tmp_path), unified_exec=CODEX))
    collect(session, "session_configured")
    session.submit(UserInput([TextInput("start python")]))
    until_output(session, "c1", b">>> ", collect(session, "task_complete"))  # the prompt may come after the turn

    # A frontend that has not attached cannot type: the daemon refuses it, and nothing
    # reaches the command or the other frontends.
    passer_by = typist.session(session.id)
    refused = passer_by.submit(ExecCommandStdin("c1", "print('passer-by')\n"))
    (error,) = collect(passer_by, "error")
    assert error.id == refused and error.seq is None
    assert error.msg.message == f"attach to session {session.id} before typing into its commands"
    passer_by.detach()

    # Attached, it types; the command gets the line, and both frontends see who typed what
    # (the name is the daemon's, not what the op said), then the command's answer.
    watcher = typist.attach(session.id, since=session.last_seq + 1)
    sub = watcher.submit(ExecCommandStdin("c1", "print(6*7)\n", by="someone else"))
    for frontend in (watcher, session):
        seen = until_output(frontend, "c1", b"\n42")
        (typed,) = [e for e in seen if tag(e) == "exec_command_stdin_typed"]
        assert typed.id == sub and typed.seq is not None
        msg = typed.msg
        assert (msg.call_id, msg.stdin, msg.by) == ("c1", "print(6*7)\n", f"{typist.peer_id} (typist)")
        assert not any(tag(e) == "error" for e in seen)
        assert b"passer-by" not in output_of(seen, "c1")

    # No convention tells a model of input it did not type: it reads the echo and the
    # answer in its session's output, on its next call.
    session.submit(UserInput([TextInput("what did it print?")]))
    collect(session, "task_complete")
    polled = json.dumps(outputs_of(server.requests[-1]["json"])["c2"])
    assert "print(6*7)" in polled and "42" in polled

    # A command that is not one, and one that has ended: an error, nothing typed.
    bad = watcher.submit(ExecCommandStdin("nope", "x\n"))
    (error,) = [e for e in collect(watcher, lambda e: e.id == bad) if e.id == bad]
    assert tag(error) == "error" and "no interactive command of this session has call id 'nope'" in error.msg.message
    watcher.submit(ExecCommandStdin("c1", "exit()\n"))
    collect(watcher, lambda e: tag(e) == "exec_command_end" and e.msg.call_id == "c1")
    late = watcher.submit(ExecCommandStdin("c1", "print(1)\n"))
    (error,) = [e for e in collect(watcher, lambda e: e.id == late) if e.id == late]
    assert tag(error) == "error" and error.msg.message == "command c1 has ended; nothing was typed"

    session.submit(Shutdown())
    collect(session, "shutdown_complete")
