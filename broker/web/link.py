"""The web process's side of the daemon: clients of :mod:`broker.client`, each in a thread.

A :class:`broker.client.Client` is synchronous and belongs to one thread; the web server
is asyncio. So every client here lives in a thread of its own and meets the event loop
through a bounded queue:

- :class:`Control`, one per web process: the short requests (list the sessions, submit
  an op to a session, type into a session's command as a frontend attached to it). It
  reconnects after the daemon restarts; until then its requests fail with
  :class:`Unavailable`, which the page shows.
- :class:`Follower`, one per session shown in any tab (:mod:`broker.web.hub` fans it out
  to the tabs): its own client attached from an event on, handing the events out in
  batches. When its reader stops, the queue fills, the thread stops taking events and
  the daemon's lag handling applies (it stops sending to this client and resumes from
  its journal later): it holds at most :data:`QUEUE_BATCHES` batches here and never
  slows the session.
- :class:`CommandRun`, one per command of the page's command box, as ``sluice run``.

Nothing is kept here that the daemon does not have: a reload attaches again and replays.
"""

from __future__ import annotations

import asyncio
import codecs
import os
import queue
import select
import threading
import time
from collections.abc import Callable

from broker.client import Client, DaemonError, SessionError, SluiceError
from broker.net.runtime import RuntimeDir
from broker.wire import frames as wire
from broker.wire.protocol import Event, encode_json

# Events handed to the event loop at a time, and batches held per stream: what one tab
# can make this process hold.
BATCH_EVENTS = 256
QUEUE_BATCHES = 8
CLIENT_NAME = "sluice web"
# An attach asking for events past the head starts at the head (the daemon clamps it).
AT_HEAD = 1 << 62


class Unavailable(Exception):
    """The daemon cannot be reached (not running, restarting); ``str(e)`` is one line."""


class Refused(Exception):
    """The daemon refused the request (an unknown session, a bad op); ``str(e)`` is its reason."""


def connect(runtime: RuntimeDir, what: str = "") -> Client:
    try:
        return Client.connect(runtime, autostart=False, name=CLIENT_NAME + (f" {what}" if what else ""))
    except SluiceError as e:
        raise Unavailable(str(e)) from None


class _Handoff:
    """A bounded queue from a thread to the event loop: the thread blocks while it is full."""

    def __init__(self, loop: asyncio.AbstractEventLoop, size: int) -> None:
        self.loop = loop
        self.items: queue.Queue = queue.Queue(size)
        self.ready = asyncio.Event()
        self.stopped = threading.Event()

    def put(self, item) -> bool:
        """Hand ``item`` over, waiting for room; False once the reader has gone."""
        while not self.stopped.is_set():
            try:
                self.items.put(item, timeout=0.25)
            except queue.Full:
                continue
            try:
                self.loop.call_soon_threadsafe(self.ready.set)
            except RuntimeError:  # the loop has closed: nobody reads
                self.stopped.set()
                return False
            return True
        return False

    async def get(self):
        while True:
            try:
                return self.items.get_nowait()
            except queue.Empty:
                self.ready.clear()
                if self.items.empty():
                    await self.ready.wait()


class Control:
    """The web process's one client for short requests, in its own thread; see the module."""

    def __init__(self, runtime: RuntimeDir) -> None:
        self.runtime = runtime
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sluice-web-control", daemon=True)
        self._client: Client | None = None

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        self._wake()
        self._thread.join(5)
        os.close(self._wake_r)
        os.close(self._wake_w)

    async def call(self, fn: Callable[[Client], object], timeout: float = 15.0):
        """``fn(client)`` run in the control thread; raises :class:`Unavailable` or :class:`Refused`."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._requests.put((fn, loop, future))
        self._wake()
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise Unavailable(f"the daemon did not answer within {timeout:g} s") from None

    async def sessions(self) -> wire.SessionList:
        return await self.call(lambda client: client.list_sessions())

    async def submit(self, session_id: str, op) -> None:
        await self.call(lambda client: _submit_detached(client, session_id, op))

    async def type_into(self, session_id: str, op) -> str:
        """Submit an ``exec_command_stdin`` as a frontend attached to the session (the
        daemon takes typing from no other); returns its submission id."""
        return await self.call(lambda client: _submit_attached(client, session_id, op))

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass  # already woken, or closed

    def _run(self) -> None:
        while not self._closed.is_set():
            client = self._client
            try:
                if client is None:
                    client = self._client = connect(self.runtime)
                client.wait_io([self._wake_r], 1.0, interruptible=False)
            except (Unavailable, DaemonError) as e:
                self._drop()
                self._fail_all(Unavailable(str(e)))
                _wait_readable(self._wake_r, 1.0)
            try:
                os.read(self._wake_r, 4096)
            except BlockingIOError:
                pass
            self._serve()
        self._drop()
        self._fail_all(Unavailable("the web server is stopping"))

    def _serve(self) -> None:
        while True:
            try:
                fn, loop, future = self._requests.get_nowait()
            except queue.Empty:
                return
            try:
                if self._client is None:
                    self._client = connect(self.runtime)
                result, error = fn(self._client), None
            except SessionError as e:
                result, error = None, Refused(str(e))
            except (DaemonError, Unavailable) as e:
                self._drop()
                result, error = None, Unavailable(str(e))
            except SluiceError as e:
                result, error = None, Refused(str(e))
            _settle(loop, future, result, error)

    def _fail_all(self, error: Exception) -> None:
        while True:
            try:
                _fn, loop, future = self._requests.get_nowait()
            except queue.Empty:
                return
            _settle(loop, future, None, error)

    def _drop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _submit_detached(client: Client, session_id: str, op) -> None:
    """Submit ``op`` to a session without staying attached: submitting attaches a client,
    and the control client must not collect every session's events."""
    session = client.session(session_id)
    session.submit(op)
    session.detach()
    client.send_frames([wire.header(wire.DETACH, session=session_id)], block=True)


def _submit_attached(client: Client, session_id: str, op) -> str:
    """Attach to a session at its head, submit ``op``, detach: its submission id."""
    session = client.attach(session_id, since=AT_HEAD)
    try:
        return session.submit(op)
    finally:
        session.detach()
        # detach() sends without blocking (it never raises); this one is sure to go.
        client.send_frames([wire.header(wire.DETACH, session=session_id)], block=True)


def _settle(loop, future, result, error) -> None:
    def settle() -> None:
        if future.done():
            return  # the caller gave up waiting
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:
        pass  # the loop has closed


def _wait_readable(fd: int, timeout: float) -> None:
    select.select([fd], [], [], timeout)


class _Feed:
    """A client of its own in a thread of its own, handing items to the event loop: after
    :meth:`start`, :meth:`next` returns them in order, the last one saying it ended;
    :meth:`stop` tells the thread its reader has gone (it ends without being waited for)."""

    CLIENT: str  # the client's name, after CLIENT_NAME
    UNAVAILABLE: str  # the kind of the item that says the daemon could not be reached

    def __init__(self, runtime: RuntimeDir, queue_size: int, thread_name: str) -> None:
        self.runtime = runtime
        self._handoff = _Handoff(asyncio.get_running_loop(), queue_size)
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    async def next(self):
        return await self._handoff.get()

    def stop(self) -> None:
        self._handoff.stopped.set()

    def _run(self) -> None:
        try:
            client = connect(self.runtime, self.CLIENT)
        except Unavailable as e:
            self._handoff.put((self.UNAVAILABLE, str(e)))
            return
        try:
            self._feed(client, self._handoff)
        finally:
            client.close()

    def _feed(self, client: Client, handoff: _Handoff) -> None:
        raise NotImplementedError


class Follower(_Feed):
    """One browser stream of one session, from event ``since`` on; see the module.

    :meth:`next` returns the next item: ``("attached", SessionInfo)`` first, then
    ``("events", seq of the first, seq of the last, JSON array bytes)``, and at the end ``("gone", reason)``
    (the session is unknown or ended) or ``("unavailable", reason)`` (the daemon went away).
    """

    CLIENT, UNAVAILABLE = "tab", "unavailable"

    def __init__(self, runtime: RuntimeDir, session_id: str, since: int) -> None:
        super().__init__(runtime, QUEUE_BATCHES, f"sluice-web-follow-{session_id[:8]}")
        self.session_id = session_id
        self.since = since

    def _feed(self, client: Client, handoff: _Handoff) -> None:
        try:
            session = client.attach(self.session_id, since=self.since)
            if not handoff.put(("attached", session.info or wire.SessionInfo(id=session.id))):
                return
            while not handoff.stopped.is_set():
                event = session.next_event(0.5, interruptible=False)
                if event is None:
                    continue
                batch = [event]
                while len(batch) < BATCH_EVENTS and (event := session.next_event(0, interruptible=False)) is not None:
                    batch.append(event)
                if not handoff.put(("events", batch[0].seq or 0, _last_seq(batch), encode_events(batch))):
                    return
        except SessionError as e:
            handoff.put(("gone", str(e)))
        except DaemonError as e:
            handoff.put(("unavailable", str(e)))


def _last_seq(batch: list[Event]) -> int:
    return next((e.seq for e in reversed(batch) if e.seq), 0)


def encode_events(events: list[Event]) -> bytes:
    """A JSON array of Codex events (``seq`` set), as the page reads them."""
    return b"[" + b",".join(encode_json(e) for e in events) + b"]"


def event_range(runtime: RuntimeDir, session_id: str, first: int, last: int, timeout: float = 15.0) -> bytes:
    """Events ``first`` to ``last`` of a session, as a JSON array (what the daemon still keeps
    of them): the page's earlier events, fetched as it scrolls up. Blocking: run in a thread."""
    client = connect(runtime, "range")
    try:
        session = client.attach(session_id, since=first)
        deadline = time.monotonic() + timeout
        got: list[Event] = []
        newest = session.info.seq if session.info else last
        last = min(last, newest)
        while time.monotonic() < deadline:
            event = session.next_event(0.5, interruptible=False)
            if event is None:
                continue
            if event.seq and event.seq > last:
                break
            got.append(event)
            if event.seq == last:
                break
        session.detach()
        return encode_events(got)
    except SessionError as e:
        raise Refused(str(e)) from None
    except DaemonError as e:
        raise Unavailable(str(e)) from None
    finally:
        client.close()


class CommandRun(_Feed):
    """One command of the page's command box, run through the daemon as ``sluice run`` does.

    :meth:`next` returns ``("output", stream, text)`` as it comes, then ``("exit", Result)``
    or ``("error", reason)``. :meth:`stop` cancels the command (its tree is killed).
    """

    CLIENT, UNAVAILABLE = "run", "error"

    def __init__(self, runtime: RuntimeDir, argv: list[str], **options) -> None:
        super().__init__(runtime, QUEUE_BATCHES * 4, "sluice-web-run")
        self.argv = argv
        self.options = options
        self._decoders = {1: codecs.getincrementaldecoder("utf-8")("replace"),
                          2: codecs.getincrementaldecoder("utf-8")("replace")}

    def _on_output(self, call, stream: int, data: memoryview) -> None:
        # Blocking while the page is behind: the client then stops acknowledging, and the
        # executor pauses the command once a window of output is unacknowledged.
        text = self._decoders.get(stream, self._decoders[1]).decode(bytes(data))
        if text:
            self._handoff.put(("output", stream, text))

    def _feed(self, client: Client, handoff: _Handoff) -> None:
        try:
            call = client.submit(self.argv, on_output=self._on_output, **self.options)
            while True:
                try:
                    result = client.wait(call, 0.25, interruptible=False)
                    break
                except TimeoutError:
                    if handoff.stopped.is_set():
                        client.cancel(call)
                        result = client.wait(call, 30, interruptible=False)
                        break
            handoff.put(("exit", result))
        except (SluiceError, TimeoutError, ValueError) as e:
            handoff.put(("error", str(e)))
