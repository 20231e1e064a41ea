"""The executor worker: one DEALER to the broker, one asyncio loop, many sandboxed calls.

Everything happens on one thread: the zmq socket (via :class:`broker.zloop.ZSocket`),
every call's pipes and done_fds (``loop.add_reader``), timers and signals. Nothing here
blocks, so a cancel is acted on as soon as it arrives, whatever else is streaming.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import time

import structlog
import zmq

from broker import wire
from broker.zloop import ZSocket
from executor.call import Call, one_line
from executor.errors import StartupError

log = structlog.get_logger("executor")

WELCOME_TIMEOUT_S = 10.0
# The broker is presumed gone after this many heartbeat intervals without a word.
MISSED_HEARTBEATS = 10
# Bounded queues on the socket; past SNDHWM output waits in our backlog and the
# pipes stop being read, so memory stays bounded and nothing is dropped.
SNDHWM = 10_000
RCVHWM = 10_000
# Killed trees die at once; this only bounds a shutdown if a sandbox misbehaves.
SHUTDOWN_DEADLINE_S = 5.0
# At a clean exit, how long queued exits and the bye may take to leave.
FINAL_LINGER_MS = 1000
BACKLOG_RETRY_MIN_S = 0.001
BACKLOG_RETRY_MAX_S = 0.05


class Worker:
    def __init__(self, endpoint: str, token: str, *, name: str, slots: int, hidden_paths: tuple[str, ...] = (),
                 spawner=None) -> None:
        self.endpoint = endpoint
        self.token = token
        self.name = name
        self.slots = slots
        self.hidden_paths = tuple(hidden_paths)
        # A landlock_helper.spawn.Spawner keeping warm sandboxes; without one, every
        # call makes its sandbox from scratch (slower, same containment).
        self.spawner = spawner
        self._spawner_fd: int | None = None
        self.calls: dict[str, Call] = {}
        # True while the socket refuses sends: every call stops reading its pipes.
        self.congested = False
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self.ctx: zmq.Context | None = None
        self.sock: zmq.Socket | None = None
        self.zs: ZSocket | None = None
        self.heartbeat_s = 1.0
        self.last_heard = 0.0
        self.exit_linger_ms = 0
        self._backlog: collections.deque = collections.deque()
        self._backlog_delay = BACKLOG_RETRY_MIN_S
        self._welcome: asyncio.Future | None = None
        self._stopped: asyncio.Future | None = None
        self._stopping: tuple[int, bool] | None = None  # (exit code, say bye)
        self._give_up_at = 0.0
        self._bye_sent = False
        self._handlers = {
            wire.RUN: self._on_run,
            wire.ACK: self._on_ack,
            wire.CANCEL: self._on_cancel,
            wire.PING: self._on_ping,
            wire.PONG: _ignore,
            wire.WELCOME: self._on_welcome,
            wire.ERROR: self._on_error,
        }

    # -- lifecycle ------------------------------------------------------------------------

    async def run(self) -> int:
        """Join the broker, serve until told to stop; returns the process exit code."""
        self.loop = asyncio.get_running_loop()
        self._welcome = self.loop.create_future()
        self._stopped = self.loop.create_future()
        self.ctx = zmq.Context()
        sock = self.sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, SNDHWM)
        sock.setsockopt(zmq.RCVHWM, RCVHWM)
        sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_MESSAGE_SIZE)
        try:
            sock.connect(self.endpoint)
        except zmq.ZMQError as e:
            raise StartupError(f"cannot connect to {self.endpoint}: {e.strerror}") from None
        self.zs = ZSocket(sock, self._on_message, self.loop)
        if self.spawner is not None:
            self._refill_spawner()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(sig, self.shutdown)

        hello = wire.Hello(role=wire.ROLE_EXECUTOR, token=self.token, pid=os.getpid(), name=self.name, slots=self.slots)
        self.send(wire.message(wire.HELLO, body=hello))
        try:
            welcome = await asyncio.wait_for(self._welcome, WELCOME_TIMEOUT_S)
        except TimeoutError:
            raise StartupError(f"no answer from the broker at {self.endpoint} within {WELCOME_TIMEOUT_S:g} s") from None
        if welcome is None:  # told to stop while waiting
            return 0
        if welcome.version != wire.PROTOCOL_VERSION:
            raise StartupError(
                f"the broker speaks protocol {welcome.version}, this executor {wire.PROTOCOL_VERSION}; upgrade one of them"
            )
        if welcome.heartbeat_s > 0:
            self.heartbeat_s = welcome.heartbeat_s
        self.last_heard = time.monotonic()
        self.loop.call_later(self.heartbeat_s, self._check_heartbeat)
        log.info("executor ready", name=self.name, peer_id=welcome.peer_id, slots=self.slots)
        return await self._stopped

    def spawn(self, argv, **kw):
        """Start a sandboxed command (see landlock_helper.spawn.spawn); raises SandboxError."""
        if self.spawner is not None:
            try:
                return self.spawner.spawn(argv, **kw)
            finally:
                self._watch_spawner()
        from landlock_helper.spawn import spawn

        return spawn(argv, hidden_paths=self.hidden_paths, **kw)

    def _refill_spawner(self) -> None:
        try:
            self.spawner.refill()
        except OSError as e:
            log.warning("sandbox pool refill failed", error=str(e))
        self._watch_spawner()

    def _watch_spawner(self) -> None:
        # The zygote's socket changes if it had to be restarted.
        fd = self.spawner.fileno
        if fd != self._spawner_fd:
            if self._spawner_fd is not None:
                self.loop.remove_reader(self._spawner_fd)
            self.loop.add_reader(fd, self._refill_spawner)
            self._spawner_fd = fd

    def close(self) -> None:
        """Release the socket; after a clean stop, give queued exits and the bye a moment."""
        if self.spawner is not None:
            if self._spawner_fd is not None and self.loop is not None and not self.loop.is_closed():
                self.loop.remove_reader(self._spawner_fd)
            self.spawner.close()
            self.spawner = None
        if self.sock is not None:
            self.sock.close(linger=self.exit_linger_ms)
            self.sock = None
        if self.ctx is not None:
            self.ctx.term()
            self.ctx = None

    def shutdown(self) -> None:
        """SIGTERM/SIGINT: kill every command, report each, say bye, exit 0."""
        if self._welcome is not None and not self._welcome.done():
            self._welcome.set_result(None)
            return
        self._stop(0, "executor shutting down", bye=True)

    def _broker_lost(self) -> None:
        log.error("no word from the broker; presuming it gone", silent_s=round(time.monotonic() - self.last_heard, 1))
        self._stop(1, "executor lost its broker", bye=False)

    def _stop(self, code: int, reason: str, *, bye: bool) -> None:
        if self._stopping is not None:
            return
        self._stopping = (code, bye)
        self._give_up_at = time.monotonic() + SHUTDOWN_DEADLINE_S
        for call in list(self.calls.values()):
            call.abort(reason)
        if self.calls:
            self.loop.call_later(SHUTDOWN_DEADLINE_S, self._stop_deadline)
        else:
            self._stopped_now()

    def _stop_deadline(self) -> None:
        if self._stopped.done() or not self.calls:
            return
        log.error("commands still running at shutdown", calls=sorted(self.calls))
        self._stopping = (1, self._stopping[1])
        self._stopped_now()

    def _stopped_now(self) -> None:
        code, bye = self._stopping
        if bye and not self._bye_sent:
            self._bye_sent = True
            self.send(wire.message(wire.BYE))
            self.exit_linger_ms = FINAL_LINGER_MS
        if self._backlog and time.monotonic() < self._give_up_at:
            # The last exits and the bye are still queued here, not yet in zmq's hands.
            self.loop.call_later(0.01, self._stopped_now)
            return
        if not self._stopped.done():
            self._stopped.set_result(code)

    def call_finished(self, call: Call) -> None:
        self.calls.pop(call.corr, None)
        if self._stopping is not None and not self.calls:
            self._stopped_now()

    def _check_heartbeat(self) -> None:
        if self._stopping is not None:
            return
        if time.monotonic() - self.last_heard > MISSED_HEARTBEATS * self.heartbeat_s:
            self._broker_lost()
            return
        self.loop.call_later(self.heartbeat_s, self._check_heartbeat)

    # -- sending ------------------------------------------------------------------------

    def send(self, parts) -> None:
        """Send now, or queue in order behind earlier messages while the socket is full."""
        if self._backlog:
            self._backlog.append(parts)
            return
        try:
            self.zs.send(parts)
        except zmq.Again:
            self._backlog.append(parts)
            self._set_congested(True)
            self._backlog_delay = BACKLOG_RETRY_MIN_S
            self.loop.call_later(self._backlog_delay, self._flush_backlog)
        except zmq.ZMQError as e:
            log.warning("send failed", error=e.strerror)

    def _flush_backlog(self) -> None:
        backlog = self._backlog
        while backlog:
            try:
                self.zs.send(backlog[0])
            except zmq.Again:
                self._backlog_delay = min(self._backlog_delay * 2, BACKLOG_RETRY_MAX_S)
                self.loop.call_later(self._backlog_delay, self._flush_backlog)
                return
            except zmq.ZMQError as e:
                log.warning("send failed", error=e.strerror)
            backlog.popleft()
        self._set_congested(False)

    def _set_congested(self, congested: bool) -> None:
        self.congested = congested
        for call in self.calls.values():
            call.update_readers()

    # -- receiving ----------------------------------------------------------------------

    def _on_message(self, frames: list[zmq.Frame]) -> None:
        self.last_heard = time.monotonic()
        try:
            h = wire.decode_header(frames[0].buffer)
        except wire.WireError as e:
            log.warning("dropped a bad message", error=str(e))
            return
        handler = self._handlers.get(h.kind)
        if handler is None:
            log.warning("dropped a message of unexpected kind", kind=h.kind)
            return
        try:
            handler(h, frames)
        except wire.WireError as e:
            log.warning("dropped a bad message", kind=h.kind, corr=h.corr, error=str(e))
        except Exception:
            # A bug handling one message must not take every running command down.
            log.exception("failed to handle a message", kind=h.kind, corr=h.corr)

    def _body(self, kind: str, frames):
        if len(frames) < 2:
            raise wire.WireError(f"{kind} without a body")
        return wire.decode(kind, frames[1].buffer)

    def _on_welcome(self, h: wire.Header, frames) -> None:
        welcome = self._body(wire.WELCOME, frames)
        if not self._welcome.done():
            self._welcome.set_result(welcome)

    def _on_error(self, h: wire.Header, frames) -> None:
        err = self._body(wire.ERROR, frames)
        if not self._welcome.done():
            self._welcome.set_exception(StartupError(f"the broker refused this executor: {one_line(err.message)}"))
            return
        log.warning("broker reported an error", corr=h.corr, message=err.message)

    def _on_run(self, h: wire.Header, frames) -> None:
        corr = h.corr
        if not corr:
            raise wire.WireError("run without a call id")
        if corr in self.calls:
            raise wire.WireError("run for a call id already in flight")
        try:
            req = self._body(wire.RUN, frames)
        except wire.WireError as e:
            # The caller is waiting for this call: tell it, rather than leave it hanging.
            self._refuse(corr, f"bad run request: {e}")
            raise
        if self._stopping is not None:
            self._refuse(corr, "executor shutting down")
            return
        if not self._welcome.done():
            self._refuse(corr, "executor not ready")
            return
        if len(self.calls) >= self.slots:
            self._refuse(corr, f"executor busy: all {self.slots} slots in use")
            return
        call = Call(self, corr, req)
        self.calls[corr] = call
        if not call.start():
            del self.calls[corr]

    def _refuse(self, corr: str, message: str) -> None:
        self.send(wire.message(wire.EXIT, corr, wire.ExitStatus(error=one_line(message))))

    def _on_ack(self, h: wire.Header, frames) -> None:
        call = self.calls.get(h.corr)
        if call is not None:
            call.ack(h.n, h.seq)

    def _on_cancel(self, h: wire.Header, frames) -> None:
        call = self.calls.get(h.corr)
        if call is not None:  # unknown: it may have just finished
            call.cancel()

    def _on_ping(self, h: wire.Header, frames) -> None:
        self.send([wire.header(wire.PONG, h.corr, seq=h.seq)])


def _ignore(h, frames) -> None:
    pass
