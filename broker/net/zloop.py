"""Drive a ZeroMQ socket from an asyncio event loop without zmq.asyncio's per-message futures.

A ZeroMQ socket's ``FD`` is edge-triggered: it signals "something changed", and any
operation on the socket (a send included) may consume that edge. So the rule is: after
the FD fires, and after every send, drain while ``EVENTS`` says POLLIN. :class:`ZSocket`
does exactly that, in bounded batches so one busy socket cannot starve the loop's other
readers (pipes, pidfds, other sockets).

A batch is bounded in parts as well as in messages, and a socket that takes messages from
strangers is given ``max_parts`` / ``max_bytes``: a message is judged part by part as it
is received, and one past either bound is refused (``on_refused``) and the rest of it read
and let go, a bounded number of parts per turn, without ever being held. So one message of
millions of parts costs the loop no more per turn than any other input.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import zmq

# Messages handled per wake-up before yielding to the rest of the loop ...
BATCH = 256
# ... and parts received (a refused message's included), at most.
PARTS_PER_TURN = 4 * BATCH

# pyzmq's flags and options as plain ints: its enum arithmetic (``NOBLOCK | SNDMORE``,
# ``getsockopt(EVENTS)``) costs more than the send itself on this hot path.
_NOBLOCK = int(zmq.NOBLOCK)
_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


class ZSocket:
    """Calls ``on_message(frames)`` for every multipart message, from the event loop.

    Frames are :class:`zmq.Frame` objects (``copy=False``): bulk payloads are never
    copied into Python bytes unless the handler asks for ``frame.bytes``.
    """

    def __init__(
        self,
        sock: zmq.Socket,
        on_message: Callable[[list[zmq.Frame]], None],
        loop: asyncio.AbstractEventLoop | None = None,
        *,
        max_parts: int | None = None,
        max_bytes: int | None = None,
        on_refused: Callable[[zmq.Frame, bool], None] | None = None,
    ) -> None:
        self.sock = sock
        self.on_message = on_message
        self.loop = loop or asyncio.get_running_loop()
        # A message of more parts or bytes than these is refused: ``on_refused(first part,
        # too_many_parts)`` (the first part is the sender's routing identity on a ROUTER;
        # False: too many bytes) and the rest of it discarded.
        self.max_parts = max_parts or 1 << 62
        self.max_bytes = max_bytes or 1 << 62
        self.on_refused = on_refused
        self._drain_scheduled = False
        self._closed = False
        # Discarding the rest of a refused message (it may take several turns).
        self._discarding = False
        # The last turn stopped at its bounds with input left: the socket is behind; and
        # how many turns have read it dry (all there was), since it was made.
        self.behind = False
        self.ran_dry = 0
        # Messages refused so far (``max_parts`` / ``max_bytes``).
        self.refused = 0
        self.loop.add_reader(sock.getsockopt(zmq.FD), self._drain)
        # Messages may already be queued; the edge for them has passed.
        self._schedule_drain()

    def _schedule_drain(self) -> None:
        if not self._drain_scheduled and not self._closed:
            self._drain_scheduled = True
            self.loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._drain_scheduled = False
        sock = self.sock
        parts = PARTS_PER_TURN
        for _ in range(BATCH):
            if self._closed:
                return
            try:
                if self._discarding:
                    parts -= self._discard(parts)
                    if self._discarding:
                        break
                    continue
                frame = sock.recv(_NOBLOCK, copy=False)
                frames = [frame]
                size = len(frame)
                while frame.more:  # the rest of a message is there once its first part is
                    if len(frames) >= self.max_parts or size > self.max_bytes:
                        break
                    frame = sock.recv(_NOBLOCK, copy=False)
                    frames.append(frame)
                    size += len(frame)
                parts -= len(frames)
            except zmq.Again:
                self.behind = False
                self.ran_dry += 1
                return
            except zmq.ZMQError:
                if self._closed:
                    return
                raise
            if frame.more or size > self.max_bytes:
                self._refuse(frames)
            else:
                self.on_message(frames)
            if parts <= 0:
                break
        self.behind = True
        self._schedule_drain()

    def _refuse(self, frames: list[zmq.Frame]) -> None:
        """A message past ``max_parts`` / ``max_bytes``: its sender is told, its parts go."""
        self._discarding = frames[-1].more
        self.refused += 1
        too_many_parts = len(frames) >= self.max_parts and self._discarding
        first = frames[0]
        del frames[:]  # let the parts received go before the sender is answered
        if self.on_refused is not None:
            self.on_refused(first, too_many_parts)

    def _discard(self, budget: int) -> int:
        """Receive and drop up to ``budget`` parts of a refused message; returns how many."""
        sock = self.sock
        for n in range(1, max(budget, 1) + 1):
            if not sock.recv(_NOBLOCK, copy=False).more:
                self._discarding = False
                return n
        return max(budget, 1)

    def send(self, parts, *, copy: bool = False) -> None:
        """Non-blocking multipart send; raises zmq.Again / zmq.ZMQError to the caller.

        Even a send that raises has run the socket's command queue and may have taken
        the FD's edge, so input is re-checked either way.
        """
        sock = self.sock
        try:
            # As send_multipart does, part by part: a message whose first part was taken
            # is taken whole.
            last = len(parts) - 1
            for i, part in enumerate(parts):
                sock.send(part, _MORE if i < last else _NOBLOCK, copy=copy)
        finally:
            if sock.getsockopt(_EVENTS) & _POLLIN:
                self._schedule_drain()

    def close(self, linger_ms: int = 0) -> None:
        """Close, giving already-queued messages (final exits, a bye) ``linger_ms`` to go out."""
        if self._closed:
            return
        self._closed = True
        try:
            self.loop.remove_reader(self.sock.getsockopt(zmq.FD))
        except (zmq.ZMQError, ValueError, OSError):
            pass
        self.sock.close(linger=linger_ms)
