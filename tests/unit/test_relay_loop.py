"""broker.cli.relay's one loop on its own: the command is played by this test (a
:class:`~broker.cli.relay.Running` over a pipe that says when it ended), the signals are
real ones sent to this process."""

from __future__ import annotations

import os
import signal

from broker.cli.relay import RelayLoop


class _Played:
    """A command that ends when told to stop; ``signals`` are sent to us on its first wait."""

    def __init__(self, loop: RelayLoop, signals=(), *, feeds: bool = True) -> None:
        self.loop = loop
        self.feeds = feeds
        self.signals = list(signals)
        self.stops: list[int] = []
        self.end_r, self.end_w = os.pipe()

    def watched(self):
        return (self.end_r,)

    def timeout(self):
        return 0.0 if self.signals else 5.0

    def heard(self, ready):
        for signum in self.signals:
            os.kill(os.getpid(), signum)
        self.signals = []
        if self.end_r in ready:
            self.loop.relay.drain()
            return "ended"
        return None

    def stop(self, signum):
        self.stops.append(signum)
        os.write(self.end_w, b"x")

    def pass_signal(self, signum):
        raise AssertionError("no -i here")

    def close(self):
        os.close(self.end_r)
        os.close(self.end_w)


def test_the_first_stopping_signal_stops_the_command_once_and_its_output_is_relayed(capfd):
    loop = RelayLoop()
    with loop.signals():
        _, stdout, _ = loop.stdio(stdin=False)
        os.write(stdout, b"written before the end\n")
        loop.relay.handed_over()  # the command's end goes: its output ends there
        played = _Played(loop, [signal.SIGINT, signal.SIGTERM])
        try:
            assert loop.run(played) == "ended"
        finally:
            played.close()
            loop.close()
    assert played.stops == [signal.SIGINT]
    assert loop.signum == signal.SIGINT
    assert "written before the end" in capfd.readouterr().out


def test_stdin_waits_while_the_command_does_not_take_it(tmp_path):
    source = tmp_path / "in"
    source.write_bytes(b"typed ahead")
    fd = os.open(source, os.O_RDONLY)
    saved = os.dup(0)
    os.dup2(fd, 0)
    os.close(fd)
    loop = RelayLoop()
    try:
        with loop.signals():
            stdin = os.dup(loop.stdio(stdin=True)[0])  # what the command would read
            loop.relay.handed_over()
            played = _Played(loop, [signal.SIGTERM], feeds=False)
            try:
                loop.run(played)
            finally:
                played.close()
            os.set_blocking(stdin, False)
            try:
                taken = os.read(stdin, 100)
            except BlockingIOError:
                taken = b""
            os.close(stdin)
            loop.close()
    finally:
        os.dup2(saved, 0)
        os.close(saved)
    assert taken == b""  # held back: a refused run's stdin is the next transport's to read
    assert played.stops == [signal.SIGTERM]
