"""Drive a ZeroMQ socket from an asyncio event loop without zmq.asyncio's per-message futures.

A ZeroMQ socket's ``FD`` is edge-triggered: it signals "something changed", and any
operation on the socket (a send included) may consume that edge. So the rule is: after
the FD fires, and after every send, drain while ``EVENTS`` says POLLIN. :class:`ZSocket`
does exactly that, in bounded batches so one busy socket cannot starve the loop's other
readers (pipes, pidfds, other sockets).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import zmq

# Messages handled per wake-up before yielding to the rest of the loop.
BATCH = 256

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
    ) -> None:
        self.sock = sock
        self.on_message = on_message
        self.loop = loop or asyncio.get_running_loop()
        self._drain_scheduled = False
        self._closed = False
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
        for _ in range(BATCH):
            if self._closed:
                return
            try:
                frame = sock.recv(_NOBLOCK, copy=False)
                frames = [frame]
                while frame.more:  # the rest of a message is there once its first part is
                    frame = sock.recv(_NOBLOCK, copy=False)
                    frames.append(frame)
            except zmq.Again:
                return
            except zmq.ZMQError:
                if self._closed:
                    return
                raise
            self.on_message(frames)
        self._schedule_drain()

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
