"""What a peer has provably received of what the daemon sent it.

A frontend's ``ack`` says it read a call's output, and the executor sends more for each
one; a frontend that acknowledges output it never reads would have the daemon queue
that output for it without end. Its word is not enough, and neither is the kernel's:
the bytes can wait in libzmq's queue for the peer (in the daemon's memory, not visible
to the kernel) for as long as libzmq's I/O thread does not get the CPU.

A pong is proof. Messages reach a peer in the order they were sent, and a peer answers
a ping only once it has received everything sent before it, so a pong that echoes the
ping's nonce proves that all those bytes left the daemon. :class:`Receipts` counts the
bytes sent to one peer, sends such a ping (a *checkpoint*) every :data:`CHECK_EVERY`
bytes, and records how far the pongs reached. A peer whose unproven bytes exceed
:data:`UNPROVEN_BYTES` is :attr:`~Receipts.behind`; the router then holds its credit
(for calls and sessions alike) until a pong catches up. That bounds what the daemon
holds for a peer by :data:`UNPROVEN_BYTES` plus the flow-control windows of its calls
and sessions, whatever the peer says and however late libzmq's thread runs. The nonce
is random, so a peer cannot answer a ping it did not receive.

Exit statuses are counted apart as well (:attr:`~Receipts.unproven_output` leaves them
out): each carries its call's captured output, so a burst of them can be many MiB sent
within one round trip to a peer that reads, and what the router keeps of its calls'
streamed output is not judged by them (see :mod:`broker.daemon.router`).
"""

from __future__ import annotations

import os
from collections import deque

# A peer may have this much sent to it and not yet proven received before its credit waits.
UNPROVEN_BYTES = 8 * 1024 * 1024
# A checkpoint ping goes out after this many bytes (so a peer reading as fast as we send
# proves receipt long before it is behind).
CHECK_EVERY = UNPROVEN_BYTES // 8
# What one message costs beyond its frames (libzmq's message, the queue's slot): so many
# tiny messages count too.
MESSAGE_COST = 256
# Checkpoints awaiting their pong, at most (the oldest are forgotten: a later pong proves more).
OUTSTANDING = 64


class Receipts:
    """Bytes sent to one peer and how many of them its pongs proved received."""

    __slots__ = ("sent", "proven", "exits", "exits_proven", "_next_check", "_pending")

    def __init__(self) -> None:
        self.sent = 0
        self.proven = 0
        # Of those, the bytes of exit statuses.
        self.exits = 0
        self.exits_proven = 0
        self._next_check = CHECK_EVERY
        # (nonce, bytes sent before that ping, of them exit statuses), oldest first.
        self._pending: deque[tuple[str, int, int]] = deque(maxlen=OUTSTANDING)

    @property
    def behind(self) -> bool:
        """More than :data:`UNPROVEN_BYTES` sent and not yet proven received."""
        return self.sent - self.proven > UNPROVEN_BYTES

    @property
    def unproven_output(self) -> int:
        """Bytes sent and not yet proven received, but for exit statuses."""
        return self.sent - self.exits - (self.proven - self.exits_proven)

    def count(self, size: int, *, exit: bool = False) -> bool:
        """A message of ``size`` bytes went out (``exit``: an exit status); True when a
        checkpoint is due."""
        self.sent += size + MESSAGE_COST
        if exit:
            self.exits += size + MESSAGE_COST
        return self.sent >= self._next_check

    def checkpoint(self) -> str:
        """The nonce of a ping about to be sent, as its ``corr``."""
        nonce = os.urandom(8).hex()
        self._pending.append((nonce, self.sent, self.exits))
        self._next_check = self.sent + CHECK_EVERY
        return nonce

    def confirm(self, nonce: str) -> bool:
        """A pong echoed ``nonce``; True when that made a peer that was behind no longer so."""
        for i, (pending, sent, exits) in enumerate(self._pending):
            if pending == nonce:
                break
        else:
            return False  # not ours, already superseded, or forged
        was_behind = self.behind
        for _ in range(i + 1):
            self._pending.popleft()
        self.proven = max(self.proven, sent)
        self.exits_proven = max(self.exits_proven, exits)
        return was_behind and not self.behind
