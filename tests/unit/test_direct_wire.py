"""broker.wire.direct (run.sock's messages, fd passing) and broker.wire.run_args (a run's
arguments checked once, for both the client library and a direct run)."""

from __future__ import annotations

import os
import socket

import pytest

from broker.client import make_request
from broker.wire import direct
from broker.wire import frames as wire
from broker.wire.run_args import RunArgsError, check_run, json_fields


def test_a_message_and_its_fds_round_trip():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r, w = os.pipe()
    try:
        direct.send(a, {"call": "c1"}, [w, r])
        message, fds = direct.receive(b)
        assert message == {"call": "c1"} and len(fds) == 2
        os.write(fds[0], b"x")
        assert os.read(r, 1) == b"x"
        assert not os.get_inheritable(fds[0])
        direct.close_all(fds)
        assert fds == []
        a.close()
        assert direct.receive(b) == (None, [])
    finally:
        for s in (a, b):
            s.close()
        os.close(r)
        os.close(w)


@pytest.mark.parametrize("payload", [b"{nope", b"[1]", b'"x"', b"[" * 100_000])
def test_what_is_not_a_json_object_is_an_error_and_its_fds_are_closed(payload):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r, w = os.pipe()
    try:
        a.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, w.to_bytes(4, "little"))])
        os.close(w)
        with pytest.raises(direct.DirectError):
            direct.receive(b)
        assert os.read(r, 1) == b""  # the copy that came with it was closed: end of file
    finally:
        a.close()
        b.close()
        os.close(r)


def test_too_many_fds_are_refused_and_none_kept():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r, w = os.pipe()
    try:
        direct.send(a, {"run": {}}, [w] * 40)
        os.close(w)
        with pytest.raises(direct.DirectError, match="cut short"):
            direct.receive(b)
        assert os.read(r, 1) == b""
    finally:
        a.close()
        b.close()
        os.close(r)


def test_only_anonymous_pipe_ends_in_their_direction_are_taken(tmp_path):
    r, w = os.pipe()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    f_r = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    f_w = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    f = os.open(tmp_path / "file", os.O_WRONLY | os.O_CREAT)
    null = os.open(os.devnull, os.O_WRONLY)
    both = os.open(f"/proc/self/fd/{w}", os.O_RDWR)  # the same pipe, reopened both ways
    a, b = socket.socketpair()
    try:
        assert direct.refused([w, w]) is None and direct.refused([w, w, r]) is None
        for bad in (f_w, f, null, a.fileno()):
            assert "not a pipe" in direct.refused([w, bad]), bad
        assert "not a pipe" in direct.refused([w, w, f_r])
        assert "stdout sent is not a pipe's write end" in direct.refused([r, w])
        assert "stdout sent is not a pipe's write end" in direct.refused([both, w])
        assert "stdin sent is not a pipe's read end" in direct.refused([w, w, w])
        assert "cannot be checked" in direct.refused([w, 9999])
    finally:
        for fd in (r, w, f_r, f_w, f, null, both):
            os.close(fd)
        a.close()
        b.close()


def test_a_direct_runs_fields_decode_to_the_request_the_client_library_sends(tmp_path):
    kw = dict(cwd=str(tmp_path), sandbox="workspace-write", writable=[str(tmp_path)], network=True,
              env={"A": "1", "OPENAI_API_KEY": "secret"}, timeout_ms=500, memory="64M", stdin=True)
    fields = check_run(["echo", "hi"], **kw)
    via_json = wire.run_from_builtins({**json_fields(fields), "stdio_fds": True})
    assert via_json == wire.RunRequest(**{**fields, "stdio_fds": True})
    assert via_json.env == {"A": "1"}  # the secret never left
    assert make_request(["echo", "hi"], **kw) == wire.RunRequest(**fields)


@pytest.mark.parametrize("bad", [{"argv": 3}, {"argv": ["x"]}, {"argv": ["x"], "cwd": "/", "sandbox": "nonsense"}])
def test_a_bad_direct_run_is_a_wire_error(bad):
    with pytest.raises(wire.WireError, match="bad run request"):
        wire.run_from_builtins(bad)


def test_run_args_errors_are_one_kind():
    with pytest.raises(RunArgsError, match="missing command"):
        check_run([])
    with pytest.raises(RunArgsError, match="unknown sandbox mode"):
        check_run(["x"], sandbox="nope")
