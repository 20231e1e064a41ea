"""The asyncio shell of :class:`broker.net.link.Link`: the agent's and every executor's link.

``await link.join()`` connects a DEALER, says hello and returns the welcome; a refusal,
silence past the timeout or a CurveZMQ handshake the daemon refuses raise
:class:`~broker.net.link.LinkError`, one line for a person (a refusal is retried while the
token changes: a daemon that just restarted has a new one). Handlers run from the event
loop with the frames as they came; a heartbeat timer runs the link's rules. A link given
up breaks (``on_broken``), unless it rejoins (``rejoin``: a remote executor outlives its
broker): then ``on_lost`` hears why, and it joins again on a fresh socket, saying hello
every :data:`REJOIN_EVERY_S` until welcomed (``on_joined``).

Sends never block the loop: :meth:`~PeerLink.send` sends now or says it could not,
:meth:`~PeerLink.send_wait` waits for room (bounded), :meth:`~PeerLink.put` keeps the
message in order behind earlier ones (the backlog) until the socket takes it, and says
when the backlog starts and ends (``on_congested``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import time
from collections.abc import Callable

import structlog
import zmq

from broker.net import peer
from broker.net.link import Handler, Link, LinkError
from broker.net.logging import Throttle
from broker.net.runtime import RuntimeDir, TokenError, read_token
from broker.net.zloop import ZSocket
from broker.wire import frames as wire

log = structlog.get_logger("sluice.link")

WELCOME_TIMEOUT_S = 10.0
# send_wait gives up on a daemon that takes nothing for this long.
SEND_TIMEOUT_S = 10.0
# While (re)joining: a fresh connection and hello this often until welcomed.
REJOIN_EVERY_S = 5.0
# tcp reconnects back off to this, and a connect() that hangs (SYNs into a dead link)
# is abandoned after this, so a host whose network comes back is seen within seconds.
RECONNECT_IVL_MAX_MS = 2000
CONNECT_TIMEOUT_MS = 2000
BACKLOG_RETRY_MIN_S = 0.001
BACKLOG_RETRY_MAX_S = 0.05

class Target:
    """Where the daemon is: an endpoint and the file holding its auth token, with the
    attributes of :class:`~broker.net.runtime.RuntimeDir` that :meth:`PeerLink.connect` uses."""

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


class PeerLink(Link):
    """A peer's link to the daemon on an asyncio loop; :meth:`join` it, :meth:`aclose` it."""

    def __init__(self, endpoint: str, *, role: str, name: str, token: Callable[[], str] = str, slots: int = 0,
                 remote=None, rejoin: bool = False, socket_path: str | None = None, watch_disconnect: bool = False,
                 sndhwm: int = 1 << 16, rcvhwm: int = 1 << 20, ctx: zmq.Context | None = None) -> None:
        super().__init__(self._send, role=role, name=name, token=token, slots=slots, socket_path=socket_path)
        self.endpoint = endpoint
        self.remote = remote  # a broker.net.keys.Remote: tcp with CurveZMQ
        self.rejoin = rejoin
        self.watch_disconnect = watch_disconnect
        self.hwm = (sndhwm, rcvhwm)
        self.ctx = ctx  # None: the process's shared one
        self.on_waiting = lambda line: log.warning(line, role=role)
        self.on_lost: Callable[[str], None] = lambda why: None
        self.on_joined: Callable[[wire.Welcome], None] = lambda welcome: None
        self.on_congested: Callable[[bool], None] = lambda congested: None
        self.congested = False
        self.backlog: collections.deque[list[bytes]] = collections.deque()
        self.zs: ZSocket | None = None
        self._monitor: ZSocket | None = None
        self._welcome: asyncio.Future[wire.Welcome] | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._beat: asyncio.TimerHandle | None = None
        self._backlog_delay = BACKLOG_RETRY_MIN_S
        self._attempts = 0
        self._closed = False
        self._throttle = Throttle(log)

    # -- joining ----------------------------------------------------------------------

    @classmethod
    async def connect(cls, runtime: RuntimeDir | Target | None = None, *, role: str = wire.ROLE_AGENT,
                      name: str = "agent", timeout: float = WELCOME_TIMEOUT_S) -> PeerLink:
        """A link joined to the local daemon of ``runtime`` (a :class:`RuntimeDir`, by
        default the user's, or a :class:`Target`), given up with it."""
        runtime = runtime or RuntimeDir.default()
        if runtime.socket_path is not None and not os.path.exists(runtime.socket_path):
            raise LinkError(f"no daemon is running in {runtime.path}; start one with `sluice daemon start`")
        link = cls(runtime.endpoint, role=role, name=name, token=runtime.read_token, socket_path=runtime.socket_path,
                   watch_disconnect=True)
        try:
            await link.join(timeout, where=f"the daemon in {runtime.path}")
        except BaseException:
            await link.aclose()
            raise
        return link

    async def join(self, timeout: float | None = WELCOME_TIMEOUT_S, *, where: str = "") -> wire.Welcome:
        """Connect, say hello and return the welcome (``timeout`` None: wait as long as it
        takes, saying hello again every :data:`REJOIN_EVERY_S` if the link rejoins)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._welcome = asyncio.get_running_loop().create_future()
            hello = self.hello()
            self._connect(hello)
            try:
                async with asyncio.timeout(None if deadline is None else max(0.0, deadline - time.monotonic())):
                    welcome = await self._welcome
            except TimeoutError:
                raise LinkError(f"{where or self.endpoint} did not answer within {timeout:g} s") from None
            except LinkError as refused:
                self._disconnect()
                # A daemon that just restarted may have replaced the token under us.
                if self.hello() != hello and (deadline is None or time.monotonic() < deadline):
                    continue
                raise refused from None
            finally:
                self._welcome = None
            self._beat = asyncio.get_running_loop().call_later(self.heartbeat_s, self._heartbeat)
            return welcome

    def _connect(self, hello: list[bytes]) -> None:
        """A fresh DEALER to the daemon, and our hello on it."""
        self.ctx = self.ctx or zmq.Context.instance()
        sock = peer.dealer(self.ctx, sndhwm=self.hwm[0], rcvhwm=self.hwm[1], remote=self.remote)
        monitored = (zmq.EVENT_DISCONNECTED if self.watch_disconnect else 0) | (
            peer.HANDSHAKE_FAILED_EVENTS if self.remote is not None else 0)
        if self.remote is not None:
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
            sock.setsockopt(zmq.CONNECT_TIMEOUT, CONNECT_TIMEOUT_MS)
        if monitored:
            self._monitor = ZSocket(peer.monitor(sock, monitored), self._on_monitor)
        self.zs = ZSocket(sock, self.receive)
        try:
            sock.connect(self.endpoint)
        except zmq.ZMQError as e:
            self._disconnect()
            raise LinkError(f"cannot connect to {self.endpoint}: {e.strerror}") from None
        self.send(hello)
        if self.rejoin:
            self._retry = asyncio.get_running_loop().call_later(REJOIN_EVERY_S, self._hello_again)

    def _disconnect(self) -> None:
        """Drop the socket and whatever was still queued for it."""
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self._close_socket()
        self.joined = False
        self.backlog.clear()
        self._set_congested(False)

    def _hello_again(self) -> None:
        """No welcome yet on this socket: start over on a fresh one."""
        self._retry = None
        if self.joined or self._closed:
            return
        self._attempts += 1
        if self._attempts & (self._attempts - 1) == 0:  # 1, 2, 4, 8, ...: a long outage stays readable
            log.info("no answer from the daemon yet; still trying", daemon=self.endpoint, attempts=self._attempts)
        self._disconnect()
        self._connect(self.hello())

    def welcomed(self, welcome: wire.Welcome) -> None:
        if welcome.version != wire.PROTOCOL_VERSION:
            return self.refused(f"the daemon speaks protocol {welcome.version}, this {self.role} "
                                f"{wire.PROTOCOL_VERSION}; upgrade one of them")
        super().welcomed(welcome)
        self._attempts = 0
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._welcome is not None and not self._welcome.done():
            self._welcome.set_result(welcome)
        else:
            self.on_joined(welcome)
        return None

    def refused(self, words: str) -> None:
        """The join fails (when rejoining: the link breaks)."""
        if self._welcome is not None and not self._welcome.done():
            self._welcome.set_exception(
                LinkError(f"the daemon refused the connection: {wire.one_line(words)}", refused=words))
        else:
            super().refused(words)

    def dispatch(self, handler: Handler, head: wire.Header, frames: list[zmq.Frame]) -> None:
        try:
            handler(head, frames)
        except wire.WireError as err:
            self.dropped(head, err)
        except Exception:
            # A bug handling one message must not take the link (and what runs over it) down.
            log.exception("failed to handle a message", kind=head.kind, corr=head.corr)

    def dropped(self, head: wire.Header | None, err: wire.WireError) -> None:
        self._throttle("warning", "dropped a bad message", kind=head and head.kind,
                       corr=head and wire.one_line(head.corr, 80), error=str(err))

    # -- sending ----------------------------------------------------------------------

    def _send(self, parts: list[bytes]) -> bool:
        """Send without waiting; False if the link is down or its queue is full (or holds a
        backlog, which goes first)."""
        if self.zs is None or self.broken is not None or self.backlog:
            return False
        try:
            self.zs.send(parts)
        except zmq.Again:
            return False
        except zmq.ZMQError as err:
            self._throttle("warning", "send failed", error=err.strerror)
            return False
        return True

    def put(self, parts: list[bytes], *, first: bool = False) -> None:
        """Send now, or keep in order behind earlier messages (``first``: ahead of them)
        until the socket takes it."""
        if self.send(parts) or self.zs is None or self.broken is not None:
            return
        if first:
            self.backlog.appendleft(parts)  # a refused send took no part of its message
        else:
            self.backlog.append(parts)
        if not self.congested:
            self._set_congested(True)
            self._backlog_delay = BACKLOG_RETRY_MIN_S
            asyncio.get_running_loop().call_later(self._backlog_delay, self._flush)

    def _flush(self) -> None:
        backlog = self.backlog
        while backlog and self.zs is not None:
            try:
                self.zs.send(backlog[0])
            except zmq.Again:
                self._backlog_delay = min(self._backlog_delay * 2, BACKLOG_RETRY_MAX_S)
                asyncio.get_running_loop().call_later(self._backlog_delay, self._flush)
                return
            except zmq.ZMQError as e:
                self._throttle("warning", "send failed", error=e.strerror)
            backlog.popleft()
        self._set_congested(False)

    def _set_congested(self, congested: bool) -> None:
        if congested != self.congested:
            self.congested = congested
            self.on_congested(congested)

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
            event = parse_monitor_message([f.bytes for f in frames])["event"]
        except (RuntimeError, ValueError):
            return
        self.monitor_event(event, self.endpoint)

    def handshake_refused(self, why: str) -> None:
        if self._welcome is not None:
            # At start-up a person is watching: a refusal is a mistake to fix, not to wait out.
            if not self._welcome.done():
                self._welcome.set_exception(LinkError(why))
        else:
            self._throttle("error", "cannot join the daemon; still trying", why=why)

    def _heartbeat(self) -> None:
        self._beat = None
        if self._closed or self.broken is not None:
            return
        if self.joined:
            self.tick()
        if self.broken is None:
            self._beat = asyncio.get_running_loop().call_later(self.heartbeat_s, self._heartbeat)

    def lost(self, why: str) -> None:
        """The daemon is gone for this link: join again if it rejoins, else break."""
        if self._closed or self.broken is not None:
            return
        if not self.rejoin:
            return self.give_up(why)
        self.on_lost(why)
        self._disconnect()
        self._connect(self.hello())

    def _break(self, error: LinkError) -> None:
        if self.broken is not None or self._closed:
            return
        log.warning("link to the daemon broken", role=self.role, reason=str(error))
        self.broken = error
        for callback in list(self.on_broken):
            try:
                callback(error)
            except Exception:
                log.exception("on_broken callback failed")

    # -- closing ----------------------------------------------------------------------

    def close(self, linger_ms: int = 0) -> None:
        """Close the socket, giving what is queued in it (a bye, last exits) ``linger_ms``."""
        self._closed = True
        for timer in (self._retry, self._beat):
            if timer is not None:
                timer.cancel()
        self._close_socket(linger_ms)

    def _close_socket(self, linger_ms: int = 0) -> None:
        """Close the socket (giving what is queued in it ``linger_ms``) and its monitor."""
        if self._monitor is not None:
            with contextlib.suppress(zmq.ZMQError):
                self.zs.sock.disable_monitor()
            self._monitor.close()
            self._monitor = None
        if self.zs is not None:
            self.zs.close(linger_ms)
            self.zs = None

    async def aclose(self) -> None:
        """Say bye and close; a short linger lets the bye (and what went before) reach a live daemon."""
        if self._closed:
            return
        if self.broken is None and self.joined:
            self.send([wire.header(wire.BYE)])
        self.close(0 if self.broken is not None else 200)

    async def __aenter__(self) -> PeerLink:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
