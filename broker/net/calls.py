"""The runs a peer asked the daemon for, sans-io: one table of calls for every caller.

:class:`CallTable` is told each message the daemon sends about a call (``out``,
``started``, ``ack``, ``notice``, ``exit``, an ``error`` naming it) and keeps the caller's
side of the protocol: output acknowledged in increments as it is taken (never while
held), the stdin window (at most :data:`~broker.wire.frames.STDIN_WINDOW_BYTES` written
and not yet acked), a window size asked for before the command started sent once it has.
It has no socket and no loop: what it sends goes through the ``send`` it is given, which
never blocks and says whether the message went. Its calls are :class:`PeerCall` objects
whose hooks a shell overrides to hand the news on: the client library's blocking
:class:`broker.client.Call` to callbacks and a result, the agent's runner to futures.
"""

from __future__ import annotations

from collections.abc import Callable

import zmq

from broker.wire import frames as wire

Send = Callable[[list[bytes]], bool]


class PeerCall:
    """One run asked for: what the daemon said of it so far. The hooks (``output``,
    ``began``, ``noted``, ``stdin_taken``, ``ended``) do nothing here."""

    __slots__ = ("call_id", "request", "pid", "executor", "unacked_bytes", "unacked_chunks", "output_held",
                 "stdin_unacked", "stdin_closed", "resize_pending")

    def __init__(self, call_id: str, request: wire.RunRequest) -> None:
        self.call_id = call_id
        self.request = request
        self.pid: int | None = None
        self.executor = ""
        # Output taken and not yet acknowledged; none is while it is held.
        self.unacked_bytes = 0
        self.unacked_chunks = 0
        self.output_held = False
        # Stdin sent and not yet acked by the executor; closed once end of file was sent.
        self.stdin_unacked = 0
        self.stdin_closed = not request.stdin
        # A window size asked for before the command started, sent once it has.
        self.resize_pending: wire.Winsize | None = None

    def output(self, stream: int, chunk: memoryview) -> None:
        """A chunk of output (``chunk`` is only valid during the call)."""

    def began(self) -> None:
        """The executor started the command (``pid``, ``executor`` are set)."""

    def noted(self, note: str) -> None:
        """The daemon says something of the call that does not end it."""

    def stdin_taken(self) -> None:
        """The executor acked stdin: the window has room again."""

    def ended(self, status: wire.ExitStatus) -> None:
        """How it ended (``status.error`` when it never ran or the daemon failed it)."""


class CallTable:
    """The calls in flight, by id, and what the daemon's messages do to them."""

    def __init__(self, send: Send) -> None:
        self.calls: dict[str, PeerCall] = {}
        self.send = send

    def run(self, call: PeerCall) -> list[bytes]:
        """The message asking for ``call``, which is in flight from now on."""
        self.calls[call.call_id] = call
        return [wire.header(wire.RUN, call.call_id), wire.encode(call.request)]

    def receive(self, head: wire.Header, frames: list[zmq.Frame]) -> bool:
        """Take a message from the daemon; False if it is about no call of ours."""
        kind = head.kind
        if kind == wire.OUT:
            call = self.calls.get(head.corr)
            if call is not None and len(frames) >= 2:
                self._output(call, head.stream, frames[1].buffer)
        elif kind == wire.EXIT:
            call = self.calls.pop(head.corr, None)
            if call is not None and len(frames) >= 2:
                try:
                    status = wire.decode(wire.EXIT, frames[1].buffer)
                except wire.WireError as e:
                    status = wire.ExitStatus(error=f"unreadable exit status: {e}")
                call.ended(status)
        elif kind == wire.STARTED:
            call = self.calls.get(head.corr)
            if call is not None and len(frames) >= 2:
                self._started(call, frames[1].buffer)
        elif kind == wire.ACK:  # stdin the command has read
            call = self.calls.get(head.corr)
            if call is not None:
                call.stdin_unacked = max(0, call.stdin_unacked - head.n)
                call.stdin_taken()
        elif kind == wire.NOTICE:
            call = self.calls.get(head.corr)
            if call is not None and len(frames) >= 2:
                try:
                    call.noted(wire.decode(wire.NOTICE, frames[1].buffer).message)
                except wire.WireError:
                    pass
        elif kind == wire.ERROR and head.corr in self.calls:
            self.calls.pop(head.corr).ended(wire.ExitStatus(error=error_message(frames)))
        else:
            return False
        return True

    def _output(self, call: PeerCall, stream: int, chunk: memoryview) -> None:
        size = len(chunk)
        call.unacked_bytes += size
        call.unacked_chunks += 1
        try:
            if size:
                call.output(stream, chunk)
        finally:
            if not call.output_held and (call.unacked_bytes >= wire.ACK_EVERY_BYTES
                                         or call.unacked_chunks >= wire.ACK_EVERY_CHUNKS):
                # Not sent (the queue is full): the next chunk tries again, with more.
                if self.send(_ack(call)):
                    call.unacked_bytes = call.unacked_chunks = 0

    def _started(self, call: PeerCall, body) -> None:
        try:
            started = wire.decode(wire.STARTED, body)
        except wire.WireError:
            return
        call.pid = started.pid
        call.executor = started.executor
        if call.resize_pending is not None:
            size, call.resize_pending = call.resize_pending, None
            self.send(_resize(call, size))
        call.began()

    def release(self, call: PeerCall) -> list[bytes] | None:
        """Output acknowledged again as it is taken: the ack of what was held back, if any
        (counted as sent: the caller sends it so that it cannot be lost)."""
        call.output_held = False
        if call.call_id not in self.calls or not (call.unacked_bytes or call.unacked_chunks):
            return None
        parts = _ack(call)
        call.unacked_bytes = call.unacked_chunks = 0
        return parts

    def stdin_room(self, call: PeerCall) -> int:
        """How many bytes of stdin may go to ``call`` now."""
        if call.stdin_closed or call.call_id not in self.calls:
            return 0
        return max(0, wire.STDIN_WINDOW_BYTES - call.stdin_unacked)

    def stdin(self, call: PeerCall, data) -> list[bytes]:
        """The message writing ``data`` (within :meth:`stdin_room`) to ``call``'s stdin."""
        call.stdin_unacked += len(data)
        return [wire.header(wire.IN, call.call_id), bytes(data)]

    def close_stdin(self, call: PeerCall) -> list[bytes] | None:
        """The end of file of ``call``'s stdin, once (None: sent already, or it ended)."""
        if call.stdin_closed:
            return None
        call.stdin_closed = True
        return [wire.header(wire.IN, call.call_id), b""] if call.call_id in self.calls else None

    def resize(self, call: PeerCall, size: wire.Winsize) -> list[bytes] | None:
        """The message giving ``call``'s terminal ``size``; None after it ended, or before it
        started (then it is sent once it has)."""
        if call.call_id not in self.calls:
            return None
        if call.pid is None:
            call.resize_pending = size
            return None
        return _resize(call, size)


def error_message(frames: list[zmq.Frame]) -> str:
    """What an ``error`` message says."""
    if len(frames) >= 2:
        try:
            return wire.decode(wire.ERROR, frames[1].buffer).message
        except wire.WireError:
            pass
    return "the daemon reported an error"


def _ack(call: PeerCall) -> list[bytes]:
    # Acks are increments: bytes and chunks taken since the previous ack.
    return [wire.header(wire.ACK, call.call_id, n=call.unacked_bytes, seq=call.unacked_chunks)]


def _resize(call: PeerCall, size: wire.Winsize) -> list[bytes]:
    return [wire.header(wire.RESIZE, call.call_id), wire.encode(size)]
