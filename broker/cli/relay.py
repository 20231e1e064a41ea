"""The one relay loop: our stdio (a terminal, pipes or files) to and from a running
command, our signals to it and its end back to us. ``sluice sandbox`` relays a command
it spawned itself; ``sluice run`` on its direct path (:mod:`broker.cli.run_direct`) one
the daemon runs for it. What differs between the two, how the command is stopped and
heard from, is a :class:`Running`; everything else is here:

- the command's stdio (:meth:`RelayLoop.stdio`): pipes of ours moved by
  :class:`landlock_helper.relay.Relay` (spliced where ours is a pipe or a file; the
  command never gets a descriptor of ours), or with ``-t`` a pty made here, to which our
  raw terminal's keys (less ssh's escapes, :class:`~broker.cli.terminal.EscapeKeys`) and
  window size go;
- what reaches a terminal passes :mod:`broker.cli.terminal_guard` (and a home-writes
  watch, :mod:`broker.cli.home_writes`);
- SIGINT, SIGTERM and SIGHUP stop the command (once; the loop relays until it has
  ended, and the caller exits with 128 + the first of them); with ``-i`` SIGINT is
  passed to the command instead (:class:`~broker.cli.terminal.CtrlC`).

``sluice run``'s broker path relays the command's output as messages of the client
library, not descriptors (:mod:`broker.cli.run`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import struct
import termios
from typing import Protocol, Sequence

from broker.cli.base import print_error
from broker.cli.home_writes import HomeWrites
from broker.cli.terminal import DEFAULT_ESCAPE, CtrlC, EscapeKeys, RawTerminal, window_size
from broker.net.signals import caught_signals
from landlock_helper.relay import Relay


class Running(Protocol):
    """A started command, as the loop sees it."""

    # Whether our stdin may flow to it yet.
    feeds: bool

    def watched(self) -> Sequence[int]:
        """Descriptors whose readiness is news of the command (a message, its end)."""

    def timeout(self) -> float | None:
        """How long the next wait may last (None: until something is ready)."""

    def heard(self, ready: list[int]) -> object | None:
        """After each wait (``ready``: which of :meth:`watched` are readable): the
        command's outcome once it has ended (with what it left relayed: the loop's
        :meth:`~landlock_helper.relay.Relay.drain`), else None."""

    def stop(self, signum: int) -> None:
        """End the command: we were told to stop by ``signum``. Called once."""

    def pass_signal(self, signum: int) -> None:
        """``-i``: hand ``signum`` to the command itself (``sluice sandbox`` only: ``sluice
        run -i`` goes through the broker socket)."""


class RelayLoop:
    """``with loop.signals():`` start the command with :meth:`stdio`, then :meth:`run`
    it to its end; :meth:`close` after. ``screen``: the terminal filter
    (:func:`broker.cli.terminal_guard.relay_filter`); ``watch`` sees what it passes."""

    def __init__(self, *, tty: bool = False, interactive: bool = False, escape: str | None = DEFAULT_ESCAPE,
                 screen=None, watch: HomeWrites | None = None) -> None:
        self.tty = tty
        self.escapes = EscapeKeys(escape)  # -t: ~. ends the command
        self.ctrl_c = CtrlC() if interactive and not tty else None  # -i: Ctrl-C goes to the command
        self.relay = Relay(terminal_filter=watch.screen(screen) if watch is not None else screen)
        # The first signal that told us to stop (``~.`` counts as SIGHUP), or None.
        self.signum: int | None = None
        self.running: Running | None = None
        self._stopped = False
        self._term: RawTerminal | None = None
        self._wake = -1

    def stdio(self, stdin: bool) -> tuple[int | None, int | None, int | None]:
        """The command's stdin, stdout and stderr (None: the sandbox's /dev/null, where
        ours is /dev/null or closed, or for stdin unless ``stdin``)."""
        if self.tty:
            slave = self.relay.terminal(key_filter=self._keys)
            self._resize(*window_size(0, 1, 2))
            return slave, slave, slave
        return self.relay.input(0) if stdin else None, self.relay.output(1), self.relay.output(2)

    @contextlib.contextmanager
    def signals(self):
        """Our stopping signals caught (from before the command starts: one that comes
        meanwhile stops it as soon as it runs); each wakes the loop."""
        with caught_signals(self._on_signal) as self._wake:
            yield

    def run(self, running: Running):
        """Relay until ``running`` has ended; its outcome. Our terminal is raw meanwhile
        with ``-t`` (given back on every way out)."""
        self.running = running
        with RawTerminal(0) if self.tty else contextlib.nullcontext() as self._term:
            while True:
                if self.signum is not None and not self._stopped:
                    self._stopped = True
                    running.stop(self.signum)
                if self._term is not None and self._term.resized():
                    with contextlib.suppress(OSError):
                        self._resize(*self._term.size())
                ready = self.relay.step([self._wake, *running.watched()], running.timeout(), feed=running.feeds)
                if self._wake in ready:
                    with contextlib.suppress(OSError):
                        while os.read(self._wake, 512):
                            pass
                outcome = running.heard(ready)
                if outcome is not None:
                    return outcome

    def close(self) -> None:
        """Our ends of the command's stdio go; a failure of ours to relay is said."""
        self.relay.close()
        if self.relay.error:
            print_error(self.relay.error)

    def _on_signal(self, signum, frame) -> None:
        running = self.running
        if signum == signal.SIGINT and self.ctrl_c is not None and self.ctrl_c.passes(running is not None):
            running.pass_signal(signal.SIGINT)
        elif self.signum is None:
            self.signum = signum

    def _keys(self, keys: bytes) -> bytes:
        """-t: the keys typed, less the escapes, which act here."""
        keys, asked = self.escapes.feed(keys)
        if asked == EscapeKeys.HELP and self._term is not None:
            self._term.say(self.escapes.help())
        elif asked == EscapeKeys.END:
            if self._term is not None:
                self._term.say(self.escapes.ending())
            if self.signum is None:
                self.signum = signal.SIGHUP  # as if its terminal hung up
        return keys

    def _resize(self, rows: int, cols: int) -> None:
        fcntl.ioctl(self.relay.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
