"""landlock_helper.relay on its own: pipes and files, no sandbox (the command's side is
played by this test, writing to and reading from the ends the relay hands out)."""

from __future__ import annotations

import errno
import os

from landlock_helper.relay import COPY, NULL, SPLICE, Relay, kind_of


def _pump_until(relay: Relay, done) -> None:
    for _ in range(10_000):
        if done():
            return
        relay.step(timeout=1.0)
    raise AssertionError("the relay did not get there")


def test_what_each_kind_of_descriptor_is(tmp_path):
    r, w = os.pipe()
    f = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    null = os.open(os.devnull, os.O_WRONLY)
    zero = os.open("/dev/zero", os.O_RDONLY)
    try:
        assert [kind_of(fd) for fd in (r, w, f, null, zero)] == [SPLICE, SPLICE, SPLICE, NULL, COPY]
        assert kind_of(9999) is None
    finally:
        for fd in (r, w, f, null, zero):
            os.close(fd)


def test_output_reaches_a_pipe_a_file_and_an_append_only_file_exactly(tmp_path):
    data = os.urandom(3 * 1024 * 1024 + 7)
    r, w = os.pipe()
    os.set_blocking(r, False)  # the test's own reader: it must not wait inside a read
    plain = os.open(tmp_path / "plain", os.O_WRONLY | os.O_CREAT)
    appended = os.open(tmp_path / "appended", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.write(appended, b"before\n")
    null = os.open(os.devnull, os.O_WRONLY)
    relay = Relay()
    try:
        assert relay.output(null) is None  # the sandbox's own /dev/null: nothing to relay
        theirs = [os.dup(relay.output(fd)) for fd in (w, plain, appended)]  # the command's stdouts
        relay.handed_over()
        left = {fd: memoryview(data) for fd in theirs}
        for fd in theirs:
            os.set_blocking(fd, False)
        got = bytearray()
        while left or relay.open_outputs:
            for fd, rest in list(left.items()):
                try:
                    rest = rest[os.write(fd, rest):]
                except BlockingIOError:
                    pass
                left[fd] = rest
                if not rest:
                    del left[fd]
                    os.close(fd)  # the command's end of file
            relay.step(timeout=0.05)
            try:
                while chunk := os.read(r, 1 << 20):
                    got += chunk
            except BlockingIOError:
                pass
        assert bytes(got) == data
        assert (tmp_path / "plain").read_bytes() == data
        assert (tmp_path / "appended").read_bytes() == b"before\n" + data  # O_APPEND: copied, not spliced
        assert os.get_blocking(w)  # no flag left on the caller's pipe
    finally:
        relay.close()
        for fd in (r, w, plain, appended, null):
            os.close(fd)


def test_stdin_to_its_end_and_a_gone_reader_gives_the_writer_epipe(tmp_path):
    data = os.urandom(2 * 1024 * 1024 + 3)
    (tmp_path / "in").write_bytes(data)
    src = os.open(tmp_path / "in", os.O_RDONLY)
    r, w = os.pipe()
    relay = Relay()
    try:
        stdin, stdout = os.dup(relay.input(src)), os.dup(relay.output(w))  # the command's ends
        relay.handed_over()
        os.set_blocking(stdin, False)
        got = bytearray()

        def fed() -> bool:
            try:
                while chunk := os.read(stdin, 1 << 20):
                    got.extend(chunk)
                return True  # end of file: the relay closed its end after the file's last byte
            except BlockingIOError:
                return False

        _pump_until(relay, fed)
        assert bytes(got) == data
        os.close(r)  # the caller's reader goes away
        os.write(stdout, b"x")
        _pump_until(relay, lambda: not relay.open_outputs)
        try:
            os.write(stdout, b"x")
            raise AssertionError("nobody reads the command's stdout any more")
        except OSError as e:
            assert e.errno == errno.EPIPE  # in a command: SIGPIPE, as in a shell
        assert relay.error is None  # a closed pipe is nothing to say
    finally:
        relay.close()
        for fd in (src, w, stdin, stdout):
            os.close(fd)
