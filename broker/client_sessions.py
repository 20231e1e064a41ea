"""Sessions from the frontend side: what :class:`broker.client.Client` uses to talk to the agent.

::

    from broker.client import Client
    from broker.protocol import ConfigureSession, TextInput, UserInput

    with Client.connect() as client:
        session = client.open_session(ConfigureSession(...))   # the daemon names it
        session.submit(UserInput([TextInput("list the files")]))
        while (event := session.next_event()) is not None:
            ...                                              # Codex Events, ``seq`` set

A session's events arrive while the client is pumped (by :meth:`ClientSession.next_event`,
or by any other wait of the client) and queue up in the session, each a
:class:`broker.protocol.Event` with ``seq``, its position in the session's event log,
set by the broker (None for what the broker says about a session that does not exist).
Submitting to a session attaches this client to it: from then on it gets every event the
session emits, whichever frontend caused it.

Errors: :class:`SessionError` when the daemon refuses to create a session (its message is
the error event's); :class:`broker.client.DaemonError` when the daemon goes away.
"""

from __future__ import annotations

import collections
import time
from typing import TYPE_CHECKING

from broker import wire

if TYPE_CHECKING:
    from broker.client import Client, DaemonError
    from broker.protocol import ConfigureSession, Event

__all__ = ["ClientSession", "SessionError"]


class SessionError(Exception):
    """The daemon refused to create or reach a session; ``str(e)`` is one line."""


class ClientSession:
    """One session as this client sees it; made by :meth:`Client.open_session` or :meth:`Client.session`."""

    def __init__(self, client: Client, session_id: str = "") -> None:
        self.client = client
        self.id = session_id
        self.events: collections.deque[Event] = collections.deque()
        # The seq of the last event before this client attached, then of the last received.
        self.last_seq = 0
        self.attached = False
        self.failure: DaemonError | None = None
        self._next_sub = 0

    def new_sub_id(self) -> str:
        self._next_sub += 1
        return f"{self.client.peer_id}.{self._next_sub}"

    def submit(self, op, sub_id: str | None = None) -> str:
        """Send an op to the session; returns the submission id its events will carry."""
        from broker.protocol import Submission

        sub_id = sub_id or self.new_sub_id()
        self.client._submit(self.id, Submission(id=sub_id, op=op))
        return sub_id

    def interrupt(self) -> str:
        from broker.protocol import Interrupt

        return self.submit(Interrupt())

    def next_event(self, timeout: float | None = None, *, fds=(), interruptible: bool = True):
        """The next event (waiting up to ``timeout`` seconds; None when none came).

        ``fds`` are more file descriptors to watch: if one becomes readable first, it is
        returned instead (an ``int``), so a frontend can read its terminal meanwhile.
        Raises :class:`broker.client.Interrupted` inside ``catch_signals`` and
        :class:`broker.client.DaemonError` if the daemon went away.
        """
        return self.client._next_session_event(self, timeout, fds, interruptible)

    def __repr__(self) -> str:
        return f"<ClientSession {self.id or '(new)'} seq={self.last_seq} queued={len(self.events)}>"


class SessionTable:
    """A client's sessions, by id, and the ones being created, by the corr of their submit."""

    def __init__(self) -> None:
        self.by_id: dict[str, ClientSession] = {}
        self.creating: dict[str, ClientSession] = {}
        self.refusals: dict[str, str] = {}
        from broker import protocol

        self._protocol = protocol

    def __bool__(self) -> bool:
        return bool(self.by_id or self.creating)

    def on_attached(self, head: wire.Header) -> None:
        session = self.creating.pop(head.corr, None) if head.corr else None
        if session is None:
            session = self.by_id.get(head.session)
            if session is None:
                return
        session.id = head.session
        session.attached = True
        session.last_seq = max(session.last_seq, head.seq)
        self.by_id[head.session] = session

    def on_event(self, head: wire.Header, body) -> None:
        session = self.by_id.get(head.session) if head.session else None
        P = self._protocol
        try:
            event = P.decode_event_msgpack(body)
        except P.ProtocolError as err:
            event = P.Event(id="", msg=P.ErrorEvent(f"unreadable event from the daemon: {err}"))
        if session is None:
            if head.corr in self.creating:
                # The daemon would not create the session: the error says why.
                self.creating.pop(head.corr)
                msg = event.msg
                self.refusals[head.corr] = getattr(msg, "message", "the daemon refused to create the session")
            return
        if head.seq:
            event.seq = head.seq
            session.last_seq = head.seq
        session.events.append(event)

    def broken(self, error: DaemonError) -> None:
        for session in (*self.by_id.values(), *self.creating.values()):
            session.failure = error


def open_session(client: Client, op: ConfigureSession, *, sub_id: str = "0", timeout: float = 10.0) -> ClientSession:
    """Ask the daemon for a new session configured with ``op``; see :meth:`Client.open_session`."""
    from broker.client import DaemonError, new_call_id
    from broker.protocol import Submission

    table = client._session_table()
    session = ClientSession(client)
    corr = new_call_id()
    table.creating[corr] = session
    try:
        client._submit("", Submission(id=sub_id, op=op), corr=corr)
        deadline = time.monotonic() + timeout
        while not session.attached:
            if session.failure is not None:
                raise session.failure
            if corr in table.refusals:
                raise SessionError(table.refusals.pop(corr))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DaemonError(f"the daemon did not answer the new session within {timeout:g} s")
            client.poll(remaining)
    finally:
        table.creating.pop(corr, None)
        table.refusals.pop(corr, None)
    return session
