"""The agent process's side of the daemon: one :class:`~agent.session.Session` per session id.

The broker sends every session's submissions over one link (``submit``, the session id
in the header, a Codex ``Submission`` as msgpack); the host makes a Session for an id it
has not seen, with that id, and feeds it. Each session's submissions are handled one at
a time in arrival order from its own inbox, except ``interrupt``, which goes to the
session at once instead of waiting behind the inbox.

Events go back as ``event`` messages (the session id in the header, the Codex ``Event``
as msgpack) through an :class:`Outbox`: sent at once when the link takes them, otherwise
kept in order and sent as it frees up. The outbox is bounded for bulk: past
:data:`OUTBOX_LIMIT` waiting events, output deltas are dropped (the command's
``exec_command_end`` still carries its output); other events are never dropped.

After ``shutdown`` the session is forgotten and the broker told (``closed``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable

import structlog
import zmq

from agent.exec_runner import CommandRunner
from agent.session import Session
from broker.net.aiolink import PeerLink
from broker.net.link import LinkError
from broker.wire import frames as wire
from broker.wire.protocol import (
    ConfigureSession,
    ErrorEvent,
    Event,
    ExecCommandOutputDeltaEvent,
    Interrupt,
    ProtocolError,
    Submission,
    decode_submission_msgpack,
    encode_msgpack,
)

log = structlog.get_logger("agent.host")

# Events waiting for the link beyond which output deltas are dropped.
OUTBOX_LIMIT = 10_000
# How long a stopping agent gives its sessions to flush their rollouts.
CLOSE_GRACE_S = 2.0


class Outbox:
    """Ordered, non-blocking delivery of messages over ``link`` (see the module docstring)."""

    def __init__(self, link: PeerLink, limit: int = OUTBOX_LIMIT) -> None:
        self.link = link
        self.limit = limit
        self.dropped = 0
        self._waiting: collections.deque[list[bytes]] = collections.deque()
        self._drainer: asyncio.Task[None] | None = None

    def event(self, session_id: str, event: Event) -> None:
        if len(self._waiting) >= self.limit and isinstance(event.msg, ExecCommandOutputDeltaEvent):
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("the daemon is not keeping up: output deltas dropped", dropped=self.dropped)
            return
        self.put([wire.header(wire.EVENT, session=session_id), encode_msgpack(event)])

    def put(self, parts: list[bytes]) -> None:
        if not self._waiting and self.link.send(parts):
            return
        if self.link.broken is not None:
            return
        self._waiting.append(parts)
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        waiting = self._waiting
        while waiting:
            try:
                await self.link.send_wait(waiting[0])
            except LinkError as err:
                log.warning("events not delivered", count=len(waiting), error=str(err))
                waiting.clear()
                return
            waiting.popleft()

    async def flush(self, timeout: float) -> None:
        if self._drainer is not None and not self._drainer.done():
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._drainer), timeout)


class _Hosted:
    __slots__ = ("id", "session", "inbox", "worker")

    def __init__(self, session_id: str, session: Session) -> None:
        self.id = session_id
        self.session = session
        self.inbox: asyncio.Queue[Submission] = asyncio.Queue()
        self.worker: asyncio.Task[None] | None = None


SessionFactory = Callable[[str, Callable[[Event], None]], Session]


class SessionHost:
    """Serves the daemon's sessions over ``link``; commands go through ``runner``.

    ``make_session(session_id, emit)`` builds each Session (default: a plain one over
    ``runner`` with ``session_kwargs``).
    """

    def __init__(
        self,
        link: PeerLink,
        runner: CommandRunner,
        *,
        make_session: SessionFactory | None = None,
        **session_kwargs,
    ) -> None:
        self.link = link
        self.runner = runner
        self.outbox = Outbox(link)
        self.sessions: dict[str, _Hosted] = {}
        self._make_session = make_session or (
            lambda session_id, emit: Session(emit, runner, session_id=session_id, **session_kwargs)
        )
        self._strays: set[asyncio.Task[None]] = set()
        link.on(wire.SUBMIT, self._on_submit)

    def start(self) -> bool:
        """Tell the broker this process hosts its sessions from now on (``serve``)."""
        return self.link.send([wire.header(wire.SERVE)])

    def _on_submit(self, head: wire.Header, frames: list[zmq.Frame]) -> None:
        session_id = head.session
        if not session_id or len(frames) < 2:
            log.warning("submission without a session id dropped")
            return
        try:
            sub = decode_submission_msgpack(frames[1].bytes)
        except ProtocolError as err:
            self.outbox.event(session_id, Event(id="", msg=ErrorEvent(str(err))))
            if session_id not in self.sessions:
                # A session's first submission (its configure_session), unreadable: no
                # session was made here, so the daemon must not keep one either.
                self.outbox.put([wire.header(wire.CLOSED, session=session_id)])
            return
        hosted = self.sessions.get(session_id)
        if hosted is None and not isinstance(sub.op, ConfigureSession):
            # Closed while this submission was on its way (the broker creates sessions
            # only with configure_session): say so rather than host an empty session.
            self.outbox.event(session_id, Event(id=sub.id, msg=ErrorEvent(f"unknown session {session_id}")))
            return
        if hosted is None:
            try:
                hosted = self._open(session_id)
            except ValueError:
                self.outbox.event(session_id, Event(id=sub.id, msg=ErrorEvent(f"bad session id {session_id!r}")))
                return
        if isinstance(sub.op, Interrupt):
            # Ahead of whatever waits in the inbox: the person wants the task stopped now.
            task = asyncio.get_running_loop().create_task(self._submit(hosted, sub))
            self._strays.add(task)
            task.add_done_callback(self._strays.discard)
        else:
            hosted.inbox.put_nowait(sub)

    def _open(self, session_id: str) -> _Hosted:
        outbox = self.outbox

        def emit(event: Event) -> None:
            outbox.event(session_id, event)

        hosted = _Hosted(session_id, self._make_session(session_id, emit))
        self.sessions[session_id] = hosted
        hosted.worker = asyncio.get_running_loop().create_task(self._serve(hosted), name=f"session-{session_id}")
        log.info("session opened", session=session_id, sessions=len(self.sessions))
        return hosted

    async def _serve(self, hosted: _Hosted) -> None:
        while True:
            sub = await hosted.inbox.get()
            await self._submit(hosted, sub)
            if isinstance(sub.op, ConfigureSession) and hosted.session.config is None and not hosted.session.closed:
                # Its first configuration was refused (the error event said why): a session
                # that never was is not kept, here or in the daemon, which forgets it on closed.
                await hosted.session.aclose()
            if hosted.session.closed:
                self._closed(hosted)
                # Submissions queued behind the shutdown get the answer a late one gets.
                while not hosted.inbox.empty():
                    late = hosted.inbox.get_nowait()
                    self.outbox.event(hosted.id, Event(id=late.id, msg=ErrorEvent(f"unknown session {hosted.id}")))
                return

    async def _submit(self, hosted: _Hosted, sub: Submission) -> None:
        try:
            await hosted.session.submit(sub)
        except Exception as err:  # a bug: say so rather than leave the frontends waiting
            log.exception("submission failed", session=hosted.id)
            hosted.session.error(sub.id, f"internal error: {err}")

    def _closed(self, hosted: _Hosted) -> None:
        if self.sessions.get(hosted.id) is hosted:
            del self.sessions[hosted.id]
            self.outbox.put([wire.header(wire.CLOSED, session=hosted.id)])
            log.info("session closed", session=hosted.id, sessions=len(self.sessions))

    async def aclose(self, grace: float = CLOSE_GRACE_S) -> None:
        """Stop every session (tasks aborted, rollouts flushed), within ``grace`` seconds."""
        hosted = list(self.sessions.values())
        self.sessions.clear()
        for h in hosted:
            if h.worker is not None:
                h.worker.cancel()
        for task in list(self._strays):
            task.cancel()
        closing = [asyncio.ensure_future(h.session.aclose()) for h in hosted]
        if closing:
            done, pending = await asyncio.wait(closing, timeout=grace)
            for task in pending:
                task.cancel()
        await self.outbox.flush(0.5)
