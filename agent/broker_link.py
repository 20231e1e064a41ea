"""The agent's connection to the daemon: one DEALER peer on the asyncio loop.

``await BrokerLink.connect(runtime)`` says hello (role ``agent`` by default, with the
runtime dir's auth token) and waits for the welcome; ``runtime`` may also be a
:class:`Target` (an endpoint and a token file, as ``python -m agent`` is given them). From then on every message the
broker sends is handed to the handler registered for its kind (:meth:`BrokerLink.on`),
from the event loop, with the frames as they came (``zmq.Frame``, not copied).

The link keeps itself alive by the rules every peer follows (:mod:`broker.net.peer`):
it answers ``ping``, pings the broker after a heartbeat of silence, and gives up when
those pings go unanswered (:class:`broker.net.peer.Liveness`), when the socket file is
gone, or when the socket reports a disconnect. Giving up calls every ``on_broken`` callback
once with a :class:`LinkError` saying why; nothing raises into the loop.

Sends never block the loop: :meth:`send` is non-blocking, :meth:`send_wait` retries a
full queue for a bounded time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable

import structlog
import zmq

from broker.net import peer
from broker.net.logging import Throttle
from broker.net.runtime import RuntimeDir, TokenError, read_token
from broker.net.zloop import ZSocket
from broker.wire import frames as wire

log = structlog.get_logger("agent.broker_link")

SEND_TIMEOUT_S = 10.0

Handler = Callable[[wire.Header, list[zmq.Frame]], None]


class Target:
    """Where the daemon is: an endpoint and the file holding its auth token.

    Has the attributes of :class:`~broker.net.runtime.RuntimeDir` the link uses, so either
    can be passed to :meth:`BrokerLink.connect`.
    """

    def __init__(self, endpoint: str, token_path: str) -> None:
        self.endpoint = endpoint
        self.token_path = token_path
        # For ipc endpoints: the socket file, whose disappearance means the daemon exited.
        self.socket_path = endpoint[len("ipc://"):] if endpoint.startswith("ipc://") else None
        self.path = endpoint

    def read_token(self) -> str:
        try:
            return read_token(self.token_path)
        except TokenError:
            return ""


class LinkError(Exception):
    """The daemon cannot be reached, refused us, or went away; one line for a person."""


class BrokerLink:
    """A connected peer. Create with :meth:`connect`; close with :meth:`aclose`."""

    def __init__(self, runtime: RuntimeDir | Target, sock: zmq.Socket, *, role: str, name: str) -> None:
        self.runtime = runtime
        self.role = role
        self.name = name
        self.peer_id = ""
        self.heartbeat_s = 1.0
        self.broken: LinkError | None = None
        self.on_broken: list[Callable[[LinkError], None]] = []
        self._sock = sock
        self._handlers: dict[str, Handler] = {wire.PING: self._on_ping}
        self._welcome: asyncio.Future[wire.Welcome | str] | None = None
        self._liveness = peer.Liveness()
        self._closed = False
        self._zsock = ZSocket(sock, self._on_message)
        self._monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._zmonitor = ZSocket(self._monitor, self._on_monitor)
        self._watchdog: asyncio.Task[None] | None = None
        self._throttle = Throttle(log)

    # -- connecting -------------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        runtime: RuntimeDir | Target | None = None,
        *,
        role: str = wire.ROLE_AGENT,
        name: str = "agent",
        timeout: float = 10.0,
    ) -> BrokerLink:
        """Connect to the daemon serving ``runtime`` (default: the user's) and say hello."""
        runtime = runtime or RuntimeDir.default()
        if runtime.socket_path is not None and not os.path.exists(runtime.socket_path):
            raise LinkError(f"no daemon is running in {runtime.path}; start one with `sluice daemon start`")
        deadline = time.monotonic() + timeout
        while True:
            token = runtime.read_token()
            link = cls(runtime, _new_socket(runtime), role=role, name=name)
            try:
                outcome = await link.hello(token, max(0.0, deadline - time.monotonic()))
            except BaseException:
                await link.aclose()
                raise
            if isinstance(outcome, wire.Welcome):
                link.peer_id = outcome.peer_id
                link.heartbeat_s = outcome.heartbeat_s if outcome.heartbeat_s > 0 else 1.0
                link._watchdog = asyncio.get_running_loop().create_task(link._watch())
                return link
            await link.aclose()
            if outcome is None:
                raise LinkError(f"the daemon in {runtime.path} did not answer within {timeout:g} s")
            # A daemon that just restarted may have replaced the token under us.
            if runtime.read_token() != token and time.monotonic() < deadline:
                continue
            raise LinkError(f"the daemon refused the connection: {outcome}")

    async def hello(self, token: str, timeout: float) -> wire.Welcome | str | None:
        self._welcome = asyncio.get_running_loop().create_future()
        self.send(peer.hello(self.role, token, self.name))
        try:
            async with asyncio.timeout(timeout):
                return await self._welcome
        except TimeoutError:
            return None
        finally:
            self._welcome = None

    # -- messages ---------------------------------------------------------------------

    def on(self, kind: str, handler: Handler) -> None:
        """Hand every message of ``kind`` to ``handler(header, frames)``."""
        self._handlers[kind] = handler

    def _on_message(self, frames: list[zmq.Frame]) -> None:
        self._liveness.heard()
        try:
            head = wire.decode_header(frames[0].buffer)
        except wire.WireError as err:
            self._throttle("warning", "dropped a bad message", error=str(err))
            return
        if self._welcome is not None and not self._welcome.done():
            outcome = peer.reply_to_hello(head.kind, frames[1].buffer if len(frames) > 1 else None)
            if outcome is not None:
                self._welcome.set_result(outcome)
            return
        if head.kind == wire.ERROR and not head.corr:
            # Not about one call: the daemon no longer knows us (e.g. it restarted).
            message = "the daemon reported an error"
            if len(frames) > 1:
                with contextlib.suppress(wire.WireError):
                    message = wire.decode(wire.ERROR, frames[1].buffer).message
            self._break(LinkError(f"the daemon reported: {message}"))
            return
        handler = self._handlers.get(head.kind)
        if handler is None:
            return
        try:
            handler(head, frames)
        except wire.WireError as err:
            self._throttle("warning", "dropped a bad message", kind=head.kind, error=str(err))
        except Exception:
            log.exception("message handler failed", kind=head.kind)

    def _on_ping(self, head: wire.Header, frames: list[zmq.Frame]) -> None:
        self.send([wire.header(wire.PONG, head.corr)])  # the nonce echoed: see broker.daemon.receipts

    def send(self, parts: list[bytes]) -> bool:
        """Send without waiting; False if the link is closed, broken or its queue is full."""
        if self._closed or self.broken is not None:
            return False
        try:
            self._zsock.send(parts)
        except zmq.Again:
            return False
        except zmq.ZMQError as err:
            self._break(LinkError(f"lost the connection to the daemon: {err}"))
            return False
        return True

    async def send_wait(self, parts: list[bytes], timeout: float = SEND_TIMEOUT_S) -> None:
        """Send, waiting (without blocking the loop) while the queue is full."""
        deadline = time.monotonic() + timeout
        delay = 0.001
        while not self.send(parts):
            if self._closed:
                raise LinkError("the connection to the daemon is closed")
            if self.broken is not None:
                raise self.broken
            if time.monotonic() >= deadline:
                raise LinkError(f"the daemon did not take a message within {timeout:g} s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    # -- liveness ---------------------------------------------------------------------

    def _on_monitor(self, frames: list[zmq.Frame]) -> None:
        from zmq.utils.monitor import parse_monitor_message

        try:
            event = parse_monitor_message([f.bytes for f in frames])
        except Exception:
            return
        if event["event"] == zmq.EVENT_DISCONNECTED:
            self._break(LinkError("lost the connection to the daemon (it exited or was stopped)"))

    async def _watch(self) -> None:
        while not self._closed and self.broken is None:
            await asyncio.sleep(self.heartbeat_s)
            waiting = self._liveness.waiting(self.heartbeat_s)
            if waiting:
                log.warning(waiting)
            due = self._liveness.check(self.heartbeat_s, self.runtime.socket_path)
            if due == peer.PING:
                self.send([wire.header(wire.PING)])
            elif due is not None:
                self._break(LinkError(due))

    def _break(self, error: LinkError) -> None:
        if self.broken is not None or self._closed:
            return
        self.broken = error
        log.warning("link to the daemon broken", reason=str(error))
        for callback in list(self.on_broken):
            try:
                callback(error)
            except Exception:
                log.exception("on_broken callback failed")

    # -- closing ----------------------------------------------------------------------

    async def aclose(self) -> None:
        """Say bye and close the socket."""
        if self._closed:
            return
        if self.broken is None and self.peer_id:
            self.send([wire.header(wire.BYE)])
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        with contextlib.suppress(zmq.ZMQError):
            self._sock.disable_monitor()
        self._zmonitor.close()
        # A short linger lets the bye (and cancels queued before it) reach a live daemon.
        self._zsock.close(linger_ms=0 if self.broken is not None else 200)

    async def __aenter__(self) -> BrokerLink:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _new_socket(runtime: RuntimeDir | Target) -> zmq.Socket:
    sock = peer.dealer(zmq.Context.instance(), sndhwm=1 << 16, rcvhwm=1 << 20)
    sock.connect(runtime.endpoint)
    return sock
