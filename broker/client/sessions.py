"""Sessions from the frontend side: what :class:`broker.client.Client` uses to talk to the agent.

::

    from broker.client import Client
    from broker.wire.protocol import ConfigureSession, TextInput, UserInput

    with Client.connect(name="my tool") as client:
        session = client.open_session(ConfigureSession(...))   # the daemon names it
        session.submit(UserInput([TextInput("list the files")]))
        while (event := session.next_event()) is not None:
            ...                                              # Codex Events, ``seq`` set

        watched = client.attach(session_id, since=0)         # another session, from its start
        for info in client.list_sessions().sessions: ...     # what the daemon hosts

A session's events arrive while the client is pumped (by :meth:`ClientSession.next_event`,
or by any other wait of the client) and queue up in the session, each a
:class:`broker.wire.protocol.Event` with ``seq``, its position in the session's event log,
set by the broker (None for what the broker says outside the numbered stream: an
unknown session, an approval someone else answered first, events no longer kept).

Attaching: :meth:`Client.attach` subscribes this client to a session from an event on
(``since``: 0 for all of it, None for the start of the current or last turn, N for event
N on) and returns once the daemon has answered; :attr:`ClientSession.info` then describes
the session, and its events follow in seq order, without gaps or repeats, from where the
daemon said the stream starts (that is where asked, unless those events are no longer
kept: an error event then says which are gone, as it does should the daemon ever have to
skip events it no longer keeps for a client that fell far behind). Attaching again
re-positions: events of the old position not taken yet are dropped. Submitting to a
session attaches this client at its newest event if it was not attached.
:meth:`ClientSession.detach` stops the events; the session goes on.

Flow control: :meth:`ClientSession.next_event` acknowledges the events it hands out, every
:data:`~broker.wire.frames.SESSION_ACK_EVERY_EVENTS` events or
:data:`~broker.wire.frames.SESSION_ACK_EVERY_BYTES` bytes, without blocking (an ack that cannot go
out now goes with a later event). A client that stops taking events falls a window behind:
the daemon then stops sending (a ``lagged`` notice, counted in :attr:`ClientSession.lagged`)
and resumes from its log and journal as events are taken again, so nothing is lost and
neither the daemon nor the other frontends wait for it.

Batches: the daemon sends numbered events in ``events`` messages of many at a time (see
:mod:`broker.wire.frames`); they are unpacked as they arrive, decoded in one call, and
handed out one by one as if each had come on its own, acks included (a batch's bytes
count in proportion to the events taken of it).

Errors: :class:`SessionError` when the daemon refuses to create or attach to a session
(its message is the error event's); :class:`broker.client.errors.DaemonError` when the daemon goes
away or does not answer in time.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from broker.client.errors import DaemonError, SessionError, UsageError
from broker.wire import frames as wire
from broker.wire.results import new_call_id

# The Codex types (broker.wire.protocol) are imported where a session needs them: the
# client imports this module, and `sluice run` should not pay for them.
if TYPE_CHECKING:
    from broker.client.connection import Client
    from broker.wire.protocol import ConfigureSession, Event

__all__ = ["ClientSession"]


class ClientSession:
    """One session as this client sees it; made by :meth:`Client.open_session`,
    :meth:`Client.attach` or :meth:`Client.session`."""

    def __init__(self, client: Client, session_id: str = "") -> None:
        self.client = client
        self.id = session_id
        self.events: collections.deque[Event] = collections.deque()
        # The seq of the last event before this client's stream starts, then of the last received.
        self.last_seq = 0
        self.attached = False
        # The session as the daemon described it when it last attached us.
        self.info: wire.SessionInfo | None = None
        # How many times the daemon stopped sending because this client fell a window behind.
        self.lagged = 0
        self.failure: DaemonError | None = None
        self._next_sub = 0
        # Numbered events received and not taken yet, for the acks: [last seq, events, body
        # bytes] per message that brought them (one event, or an ``events`` batch).
        self._received: collections.deque[list[int]] = collections.deque()
        # The newest seq taken, and what was taken since the last ack that went out.
        self._taken_seq = 0
        self._unacked_events = 0
        self._unacked_bytes = 0
        # Taking an event below this seq neither finishes a message nor calls for an ack:
        # nothing to count yet.
        self._settle_at = 0

    def new_sub_id(self) -> str:
        self._next_sub += 1
        return f"{self.client.peer_id}.{self._next_sub}"

    def submit(self, op, sub_id: str | None = None) -> str:
        """Send an op to the session; returns the submission id its events will carry."""
        from broker.wire.protocol import Submission

        sub_id = sub_id or self.new_sub_id()
        if self.id:
            # Submitting attaches us (again, after a detach): the events must find us.
            self.client.session_table().by_id.setdefault(self.id, self)
        self.client.send_submission(self.id, Submission(id=sub_id, op=op))
        return sub_id

    def interrupt(self) -> str:
        from broker.wire.protocol import Interrupt

        return self.submit(Interrupt())

    def next_event(self, timeout: float | None = None, *, fds=(), interruptible: bool = True):
        """The next event (waiting up to ``timeout`` seconds; None when none came).
        ``timeout=0`` polls: an event if one has arrived, the socket read first.

        ``fds`` are more file descriptors to watch: if one becomes readable first, it is
        returned instead (an ``int``), so a frontend can read its terminal meanwhile.
        Raises :class:`broker.client.errors.Interrupted` inside ``catch_signals`` and
        :class:`broker.client.errors.DaemonError` if the daemon went away.
        """
        events = self.events
        if events:  # the common case, when events come faster than they are taken
            event = events.popleft()
            self._took(event)
            return event
        return self.client.next_session_event(self, timeout, fds, interruptible)

    def detach(self) -> None:
        """Stop this session's events coming here; the session goes on. Events already
        queued stay readable; submitting to the session attaches this client again."""
        table = self.client.session_table()
        for key in [key for key, found in table.by_id.items() if found is self]:  # its id, and an earlier one
            del table.by_id[key]
        if self.attached:
            self.attached = False
            # Non-blocking: a detach never raises, not even for a daemon that has gone.
            self.client.send_frames([wire.header(wire.DETACH, session=self.id)], block=False)
        self._received.clear()
        self._settle_at = 0

    def _restart(self, seq: int) -> None:
        """The daemon answered an attach: the stream starts over after ``seq``."""
        self.events.clear()
        self._received.clear()
        self.last_seq = seq
        self._taken_seq = seq
        self._unacked_events = 0
        self._unacked_bytes = 0
        self._settle_at = 0

    def _received_event(self, event: Event, seq: int, size: int) -> None:
        if seq:
            event.seq = seq
            self.last_seq = seq
            self._received.append([seq, 1, size])
            if seq < self._settle_at:
                self._settle_at = seq
        self.events.append(event)

    def _received_events(self, events: list[Event], first: int, size: int) -> None:
        """An ``events`` batch: ``events`` numbered from ``first`` on, ``size`` bytes of bodies in all."""
        for seq, event in enumerate(events, first):
            event.seq = seq
        last = first + len(events) - 1
        self.last_seq = last
        self._received.append([last, len(events), size])
        if last < self._settle_at:
            self._settle_at = last
        self.events.extend(events)

    def _took(self, event: Event) -> None:
        """``next_event`` handed ``event`` out: count it, and ack once enough was taken."""
        seq = event.seq
        if not seq or seq <= self._taken_seq:
            return  # outside the numbered stream, or handed back (events.extendleft) and taken again
        self._taken_seq = seq
        if seq < self._settle_at:
            return
        received = self._received
        while received:
            entry = received[0]
            last, count, size = entry
            if last <= seq:
                received.popleft()
                self._unacked_events += count
                self._unacked_bytes += size
                continue
            taken = seq - (last - count)
            if taken > 0:  # part of a batch: its bytes in proportion
                part = size * taken // count
                entry[1] = count - taken
                entry[2] = size - part
                self._unacked_events += taken
                self._unacked_bytes += part
            break
        if self._unacked_events >= wire.SESSION_ACK_EVERY_EVENTS or self._unacked_bytes >= wire.SESSION_ACK_EVERY_BYTES:
            self._ack()
        # Next: the end of the oldest message not all taken, or the event count that calls for an ack.
        self._settle_at = min(received[0][0] if received else seq + wire.SESSION_ACK_EVERY_EVENTS,
                              seq + max(1, wire.SESSION_ACK_EVERY_EVENTS - self._unacked_events))

    def _ack(self) -> None:
        if not self.attached:
            return
        hdr = wire.header(wire.ACK, session=self.id, seq=self._taken_seq, n=self._unacked_bytes)
        if self.client.send_frames([hdr], block=False):
            self._unacked_events = 0
            self._unacked_bytes = 0

    def __repr__(self) -> str:
        return f"<ClientSession {self.id or '(new)'} seq={self.last_seq} queued={len(self.events)}>"


class SessionTable:
    """A client's sessions by id, and its requests waiting for the daemon's answer by corr:
    sessions being created or attached, session lists asked for."""

    def __init__(self) -> None:
        self.by_id: dict[str, ClientSession] = {}
        self.creating: dict[str, ClientSession] = {}
        self.attaching: dict[str, ClientSession] = {}
        self.listing: set[str] = set()
        self.lists: dict[str, wire.SessionList] = {}
        # corr -> the daemon's one-line reason for refusing that request.
        self.refusals: dict[str, str] = {}
        from broker.wire import protocol

        self._protocol = protocol

    def __bool__(self) -> bool:
        return bool(self.by_id or self.creating or self.attaching or self.listing)

    def on_attached(self, head: wire.Header, body) -> None:
        corr = head.corr
        session = self.creating.pop(corr, None) if corr else None
        if session is None and corr in self.attaching:
            session = self.attaching.pop(corr)
            session._restart(head.seq)
        if session is None:
            session = self.by_id.get(head.session)
            if session is None:
                return
        session.id = head.session
        session.attached = True
        session.last_seq = max(session.last_seq, head.seq)
        if body is not None:
            try:
                session.info = wire.decode(wire.ATTACHED, body)
            except wire.WireError:
                pass  # a description that does not decode: the stream works without it
        self.by_id[head.session] = session

    def on_event(self, head: wire.Header, body) -> None:
        P = self._protocol
        try:
            event = P.decode_event_msgpack(body)
        except P.ProtocolError as err:
            event = P.Event(id="", msg=P.ErrorEvent(f"unreadable event from the daemon: {err}"))
        if not head.seq and head.corr:
            reason = getattr(event.msg, "message", "the daemon refused the request")
            if self.refuse(head.corr, reason):
                return
        session = self.by_id.get(head.session) if head.session else None
        if session is not None:
            if isinstance(event.msg, P.SessionConfiguredEvent) and str(event.msg.session_id) != session.id:
                # It resumed a rollout and took its id: the daemon calls it that from the
                # next event on (the old id stays an alias there, and here).
                session.id = str(event.msg.session_id)
                self.by_id[session.id] = session
            session._received_event(event, head.seq, len(body))

    def on_events(self, head: wire.Header, body) -> None:
        """An ``events`` batch: numbered events ``head.seq`` on, as if each came on its own."""
        P = self._protocol
        session = self.by_id.get(head.session)
        if session is None or head.seq < 1:
            return
        try:
            events = P.decode_events_msgpack(body)
        except P.ProtocolError as err:
            # Not even an array: one error in place of the lot, so the numbering goes on.
            message = f"unreadable events from the daemon: {err}"
            events = [P.Event(id="", msg=P.ErrorEvent(message)) for _ in range(max(1, head.n))]
        for i, event in enumerate(events):
            if isinstance(event, P.ProtocolError):
                events[i] = event = P.Event(id="", msg=P.ErrorEvent(f"unreadable event from the daemon: {event}"))
            elif isinstance(event.msg, P.SessionConfiguredEvent) and str(event.msg.session_id) != session.id:
                session.id = str(event.msg.session_id)
                self.by_id[session.id] = session
        if events:
            session._received_events(events, head.seq, max(0, len(body) - wire.EVENTS_HEAD_SIZE))

    def on_lagged(self, head: wire.Header) -> None:
        session = self.by_id.get(head.session)
        if session is not None:
            session.lagged += 1

    def on_sessions(self, head: wire.Header, body) -> None:
        corr = head.corr
        if corr not in self.listing:
            return
        self.listing.discard(corr)
        try:
            self.lists[corr] = wire.decode(wire.SESSIONS, body)
        except wire.WireError as e:
            self.refusals[corr] = f"unreadable session list from the daemon: {e}"

    def refuse(self, corr: str, reason: str) -> bool:
        """The daemon refused our request ``corr``: its waiter raises ``reason``. False if
        ``corr`` is not a request waiting here."""
        if self.creating.pop(corr, None) is None and self.attaching.pop(corr, None) is None:
            if corr not in self.listing:
                return False
            self.listing.discard(corr)
        self.refusals[corr] = reason
        return True

    def broken(self, error: DaemonError) -> None:
        for session in (*self.by_id.values(), *self.creating.values(), *self.attaching.values()):
            session.failure = error


def _await_answer(client: Client, corr: str, answered: Callable[[], bool], timeout: float, what: str) -> None:
    """Pump ``client`` until ``answered()``; SessionError if the daemon refused ``corr``."""
    table = client.session_table()
    deadline = time.monotonic() + timeout
    while True:
        if corr in table.refusals:
            raise SessionError(table.refusals.pop(corr))
        if answered():
            return
        client.check_usable()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DaemonError(f"the daemon did not answer {what} within {timeout:g} s")
        client.poll(remaining)


def open_session(client: Client, op: ConfigureSession, *, sub_id: str = "0", timeout: float = 10.0) -> ClientSession:
    """Ask the daemon for a new session configured with ``op``; see :meth:`Client.open_session`."""
    from broker.wire.protocol import Submission

    table = client.session_table()
    session = ClientSession(client)
    corr = new_call_id()
    table.creating[corr] = session
    try:
        client.send_submission("", Submission(id=sub_id, op=op), corr=corr)
        _await_answer(client, corr, lambda: session.attached, timeout, "the new session")
    finally:
        table.creating.pop(corr, None)
        table.refusals.pop(corr, None)
    return session


def attach(client: Client, session_id: str, *, since: int | None, timeout: float) -> ClientSession:
    """Subscribe to an existing session from ``since`` on; see :meth:`Client.attach`."""

    if since is not None and (isinstance(since, bool) or not isinstance(since, int) or since < 0):
        raise UsageError(f"since must be an event number (0 for all) or None, got {since!r}")
    if not session_id:
        raise UsageError("attach needs a session id")
    table = client.session_table()
    session = table.by_id.get(session_id) or ClientSession(client, session_id)
    corr = new_call_id()
    table.attaching[corr] = session
    try:
        seq = wire.SINCE_TURN if since is None else since
        client.send_frames([wire.header(wire.ATTACH, corr, session=session_id, seq=seq)], block=True)
        _await_answer(client, corr, lambda: corr not in table.attaching, timeout, f"attaching to session {session_id}")
    finally:
        table.attaching.pop(corr, None)
        table.refusals.pop(corr, None)
    return session


def list_sessions(client: Client, *, timeout: float) -> wire.SessionList:
    """The daemon's sessions; see :meth:`Client.list_sessions`."""

    table = client.session_table()
    corr = new_call_id()
    table.listing.add(corr)
    try:
        client.send_frames([wire.header(wire.SESSIONS, corr)], block=True)
        _await_answer(client, corr, lambda: corr in table.lists, timeout, "the session list")
        return table.lists.pop(corr)
    finally:
        table.listing.discard(corr)
        table.lists.pop(corr, None)
        table.refusals.pop(corr, None)
