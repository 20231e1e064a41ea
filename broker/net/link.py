"""The rules of a peer's link to the daemon, sans-io: one :class:`Link` for every peer.

A peer (the client library, the agent, an executor) is a DEALER of the daemon's ROUTER.
It says hello (:func:`broker.net.peer.hello`) and is welcomed or refused; from then on it
answers ``ping`` with ``pong``, pings a daemon that has been quiet for a heartbeat, says
that it waits, and gives the daemon up by the rules of :class:`broker.net.peer.Liveness`,
when the socket disconnects, or when the daemon says that it no longer knows the peer.
:class:`Link` holds those rules and hands every other message to the handler of its kind;
it owns no socket and no clock. Its shells do: :class:`broker.net.aiolink.PeerLink` on an
asyncio loop (the agent, the executors; it also rejoins and keeps a backlog), and the
client library's blocking :class:`broker.client.Client`.
"""

from __future__ import annotations

from collections.abc import Callable

import zmq

from broker.net import peer
from broker.net.calls import error_message
from broker.wire import frames as wire

Handler = Callable[[wire.Header, list[zmq.Frame]], None]


class LinkError(Exception):
    """The daemon cannot be reached, refused us, or went away; one line for a person.
    ``refused``: the daemon's own words when it would not have us (None otherwise)."""

    def __init__(self, message: str, *, refused: str | None = None) -> None:
        super().__init__(message)
        self.refused = refused


class Link:
    """The rules of a peer's link, sans-io: what each message from the daemon means for the
    link (a welcome, a refusal, a ping, an error about no call), when to ping, say that it
    waits or give the daemon up (:meth:`tick`, once a heartbeat), what a socket event means
    (:meth:`monitor_event`); the rest goes to the handler of its kind. It sends through
    ``send`` (never blocks; False: not sent); a shell owns the socket and the clock:
    :class:`~broker.net.aiolink.PeerLink` on an asyncio loop, :class:`broker.client.Client`
    blocking."""

    def __init__(self, send: Callable[[list[bytes]], bool], *, role: str, name: str,
                 token: Callable[[], str] = str, slots: int = 0, socket_path: str | None = None) -> None:
        self.send = send
        self.role = role
        self.name = name
        self.token = token  # read at every hello: a restarted daemon has a new one
        self.slots = slots
        self.socket_path = socket_path  # a local daemon's socket file: gone, the daemon exited
        self.peer_id = ""
        self.heartbeat_s = 1.0
        self.joined = False  # welcomed on the current socket
        self.broken: LinkError | None = None
        self.on_broken: list[Callable[[LinkError], None]] = []
        self.on_refused: Callable[[str], None] | None = None
        self.on_waiting: Callable[[str], None] = lambda line: None
        self.liveness = peer.Liveness()
        self.rejoin = False
        self._handlers: dict[str, Handler] = {}

    def hello(self) -> list[bytes]:
        return peer.hello(self.role, self.token(), self.name, slots=self.slots)

    def on(self, kind: str, handler: Handler) -> None:
        """Hand every message of ``kind`` to ``handler(header, frames)``."""
        self._handlers[kind] = handler

    def welcomed(self, welcome: wire.Welcome) -> None:
        self.joined = True
        self.peer_id = welcome.peer_id
        if welcome.heartbeat_s > 0:
            self.heartbeat_s = welcome.heartbeat_s
        self.liveness.heard()

    def refused(self, words: str) -> None:
        """The daemon will not have us (its ``words``)."""
        self._break(LinkError(f"the daemon refused the connection: {wire.one_line(words)}", refused=words))

    def receive(self, frames: list[zmq.Frame]) -> None:
        """Take one message from the daemon."""
        self.liveness.heard()
        try:
            head = wire.decode_header(frames[0].buffer)
        except wire.WireError as err:
            return self.dropped(None, err)
        kind = head.kind
        if not self.joined:
            outcome = peer.reply_to_hello(kind, frames[1].buffer if len(frames) > 1 else None)
            if isinstance(outcome, wire.Welcome):
                self.welcomed(outcome)
            elif outcome is not None:
                self.refused(outcome)
            return None
        if kind == wire.PING:
            # The nonce echoed, ahead of anything queued: a busy peer is not a hung one.
            return self.put([wire.header(wire.PONG, head.corr, seq=head.seq)], first=True)
        if kind == wire.ERROR:
            message = error_message(frames)
            if self.rejoin and message == peer.HELLO_FIRST:  # whatever it answered: it dropped us, or restarted
                return self.lost(f"the broker no longer knows this {self.role}")
            if not head.corr:  # about no call
                if self.on_refused is not None:
                    return self.on_refused(message)
                return self.give_up(f"the daemon reported: {wire.one_line(message)}")
        handler = self._handlers.get(kind)
        if handler is not None:
            self.dispatch(handler, head, frames)
        return None

    def dispatch(self, handler: Handler, head: wire.Header, frames: list[zmq.Frame]) -> None:
        handler(head, frames)

    def dropped(self, head: wire.Header | None, err: wire.WireError) -> None:
        """A message that does not decode."""

    def put(self, parts: list[bytes], *, first: bool = False) -> None:
        """Send ``parts`` as soon as may be (``first``: ahead of what waits)."""
        self.send(parts)

    def tick(self) -> None:
        """Once a heartbeat: ping a quiet daemon, say that we wait, give it up."""
        waiting = self.liveness.waiting(self.heartbeat_s)
        if waiting:
            self.on_waiting(waiting)
        due = self.liveness.check(self.heartbeat_s, self.socket_path)
        if due == peer.PING:
            self.put([wire.header(wire.PING)])
        elif due is not None:
            self.lost(due)

    def monitor_event(self, event: int, endpoint: str) -> None:
        """What the socket's monitor said."""
        if event == zmq.EVENT_DISCONNECTED:
            return self.lost("lost the connection to the daemon (it exited or was stopped)")
        why = peer.handshake_refusal(event, endpoint)
        if why is not None:
            self.handshake_refused(why)
        return None

    def handshake_refused(self, why: str) -> None:
        self.give_up(why)

    def lost(self, why: str) -> None:
        """The daemon is gone for this link."""
        self.give_up(why)

    def give_up(self, why: str) -> None:
        """Break the link: every ``on_broken`` callback hears ``why``."""
        self._break(LinkError(why))

    def _break(self, error: LinkError) -> None:
        if self.broken is not None:
            return
        self.broken = error
        for callback in list(self.on_broken):
            callback(error)
