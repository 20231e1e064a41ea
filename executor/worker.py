"""The executor worker: one DEALER to the broker, one asyncio loop, many sandboxed calls.

Everything happens on one thread: the zmq socket (via :class:`broker.net.zloop.ZSocket`),
every call's pipes and done_fds (``loop.add_reader``), timers and signals. Nothing here
blocks, so a cancel is acted on as soon as it arrives, whatever else is streaming.

Like every peer, an executor pings a broker that has been quiet for a heartbeat, says
that it waits, and gives the broker up only after :data:`broker.net.peer.PATIENCE_HEARTBEATS`
heartbeats of unanswered pings, far longer than the broker waits for it: a stalled daemon
finds its commands running when it resumes. A local executor (spawned by the daemon, ipc
and a token) then exits. A remote one (``remote``: tcp and CurveZMQ) outlives its broker:
after that patience, or at once when the broker answers "send hello first" (it dropped
us, or restarted), it kills every command it runs (the broker has failed or will fail
those calls: nothing is re-run) and joins again, on a fresh socket, until it is
welcomed; its pings make a broker that forgot it say so within a heartbeat or two. A
CurveZMQ handshake the daemon refuses is a one-line error at start-up, and a logged
error (and retries) later.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import signal
import socket
import time

import structlog
import zmq
from zmq.utils.monitor import parse_monitor_message

from broker.net import peer
from broker.net.logging import Throttle
from broker.net.runtime import published_hidden
from broker.net.zloop import ZSocket
from broker.wire import direct
from broker.wire import frames as wire
from executor.call import Call
from executor.errors import StartupError
from landlock_helper import limits

log = structlog.get_logger("executor")

WELCOME_TIMEOUT_S = 10.0
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
# While (re)joining: a fresh connection and hello this often until welcomed.
REJOIN_EVERY_S = 5.0
# tcp reconnects back off to this, and a connect() that hangs (SYNs into a dead link)
# is abandoned after this, so a host whose network comes back is seen within seconds.
RECONNECT_IVL_MAX_MS = 2000
CONNECT_TIMEOUT_MS = 2000
_monitor_ids = itertools.count(1)


class Worker:
    def __init__(self, endpoint: str, token: str, *, name: str, slots: int, hidden_paths: tuple[str, ...] = (),
                 spawner=None, remote=None, fd_channel: socket.socket | None = None) -> None:
        self.endpoint = endpoint
        self.token = token
        # A broker.net.keys.Remote: join over tcp with CurveZMQ, and rejoin instead of exiting.
        self.remote = remote
        self.name = name
        self.slots = slots
        self.hidden_paths = tuple(hidden_paths)
        # A landlock_helper.spawn.Spawner keeping warm sandboxes; without one, every
        # call makes its sandbox from scratch (slower, same containment).
        self.spawner = spawner
        self._spawner_fd: int | None = None
        # Where the daemon that spawned us hands direct runs' stdio, ahead of their runs
        # (broker.wire.direct), and what came for runs not here yet.
        self.fd_channel = fd_channel
        if fd_channel is not None:
            fd_channel.setblocking(False)
        self._stdio: dict[str, list[int]] = {}
        self.calls: dict[str, Call] = {}
        # Calls of a broker we lost: being killed, reporting to nobody.
        self.orphans: set[Call] = set()
        # Welcomed by the broker on the current socket.
        self.joined = False
        # True while the socket refuses sends: every call stops reading its pipes.
        self.congested = False
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self.ctx: zmq.Context | None = None
        self.sock: zmq.Socket | None = None
        self.zs: ZSocket | None = None
        self._monitor: ZSocket | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._attempts = 0
        self._throttle = Throttle(log)
        self.heartbeat_s = 1.0
        # Remote executors give up on a silent broker by the rule every peer follows.
        self._liveness = peer.Liveness()
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
            wire.IN: self._on_stdin,
            wire.RESIZE: self._on_resize,
            wire.SIGNAL: self._on_signal,
            wire.CANCEL: self._on_cancel,
            wire.HOLD: self._on_hold,
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
        if self.spawner is not None:
            self._refill_spawner()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(sig, self.shutdown)
        self._connect()
        try:
            # A remote executor waits for its broker as long as it takes (it may start first).
            welcome = await asyncio.wait_for(self._welcome, None if self.remote else WELCOME_TIMEOUT_S)
        except TimeoutError:
            raise StartupError(f"no answer from the broker at {self.endpoint} within {WELCOME_TIMEOUT_S:g} s") from None
        if welcome is None:  # told to stop while waiting
            return 0
        self.loop.call_later(self.heartbeat_s, self._check_heartbeat)
        # What an executor killed before us left (it could not remove its commands' cgroups).
        limits.sweep_stale()
        # Found once, here: what enforces each command's resource limits on this host.
        log.info("executor ready", name=self.name, peer_id=welcome.peer_id, slots=self.slots,
                 broker=self.endpoint if self.remote else None, limits=limits.mechanism().describe(),
                 default_limits=limits.defaults().describe())
        return await self._stopped

    def _connect(self) -> None:
        """A fresh DEALER to the broker, and our hello on it."""
        sock = peer.dealer(self.ctx, sndhwm=SNDHWM, rcvhwm=RCVHWM, remote=self.remote)
        if self.remote is not None:
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
            sock.setsockopt(zmq.CONNECT_TIMEOUT, CONNECT_TIMEOUT_MS)
            # Before connecting, so no handshake outcome is missed.
            address = f"inproc://executor-monitor-{next(_monitor_ids)}"
            sock.monitor(address, peer.HANDSHAKE_FAILED_EVENTS)
            pair = self.ctx.socket(zmq.PAIR)
            pair.setsockopt(zmq.LINGER, 0)
            pair.connect(address)
            self._monitor = ZSocket(pair, self._on_monitor, self.loop)
        try:
            sock.connect(self.endpoint)
        except zmq.ZMQError as e:
            sock.close(linger=0)
            raise StartupError(f"cannot connect to {self.endpoint}: {e.strerror}") from None
        self.sock = sock
        self.zs = ZSocket(sock, self._on_message, self.loop)
        self.send(peer.hello(wire.ROLE_EXECUTOR, self.token, self.name, slots=self.slots))
        if self.remote is not None:
            self._retry = self.loop.call_later(REJOIN_EVERY_S, self._join_again)

    def _disconnect(self) -> None:
        """Drop the socket and whatever was still queued for it."""
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._monitor is not None:
            try:
                self.sock.disable_monitor()
            except zmq.ZMQError:
                pass
            self._monitor.close()
            self._monitor = None
        if self.zs is not None:
            self.zs.close()
        self.zs = None
        self.sock = None
        self._backlog.clear()
        self.congested = False

    def _join_again(self) -> None:
        """No welcome yet on this socket: start over on a fresh one."""
        self._retry = None
        if self.joined or self._stopping is not None:
            return
        self._attempts += 1
        if self._attempts & (self._attempts - 1) == 0:  # 1, 2, 4, 8, ...: a long outage stays readable
            log.info("no answer from the broker yet; still trying", broker=self.endpoint, attempts=self._attempts)
        self._disconnect()
        self._connect()

    def _rejoin(self, why: str) -> None:
        """Remote only: let go of this broker (killing what it asked us to run) and join again."""
        log.warning("lost the broker; cancelling its commands and joining again", why=why, broker=self.endpoint,
                    cancelled=len(self.calls))
        self.joined = False
        calls = list(self.calls.values())
        self.calls.clear()
        for call in calls:
            self.orphans.add(call)
            call.abandon("executor lost its broker")
        self._disconnect()
        self._connect()

    def spawn(self, argv, **kw):
        """Start a sandboxed command (see landlock_helper.spawn.spawn); raises SandboxError.

        Besides what this executor hides, the command's sandbox hides what listening daemons
        started since have published (their key files and allow dirs)."""
        published = published_hidden()
        if self.spawner is not None:
            try:
                return self.spawner.spawn(argv, hidden_paths=published, **kw)
            finally:
                self._watch_spawner()
        # Only without a warm pool (no spawner was made, or it was given up): a cold sandbox.
        from landlock_helper.spawn import spawn

        return spawn(argv, hidden_paths=(*self.hidden_paths, *published), **kw)

    def _refill_spawner(self) -> None:
        try:
            self.spawner.refill()
        except OSError as e:
            log.warning("sandbox pool refill failed", error=str(e))
        self._watch_spawner()

    def _watch_spawner(self) -> None:
        # The zygote's socket changes if it had to be restarted, and is None while it
        # cannot be (no process could be forked: the next command tries again).
        fd = self.spawner.fileno
        if fd != self._spawner_fd:
            if self._spawner_fd is not None:
                self.loop.remove_reader(self._spawner_fd)
            if fd is not None:
                self.loop.add_reader(fd, self._refill_spawner)
            self._spawner_fd = fd

    def close(self) -> None:
        """Release the socket; after a clean stop, give queued exits and the bye a moment."""
        limits.sweep_stale()
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._monitor is not None:
            self._monitor.close()
            self._monitor = None
        if self.spawner is not None:
            if self._spawner_fd is not None and self.loop is not None and not self.loop.is_closed():
                self.loop.remove_reader(self._spawner_fd)
            self.spawner.close()
            self.spawner = None
        for fds in self._stdio.values():
            direct.close_all(fds)
        self._stdio.clear()
        if self.fd_channel is not None:
            self.fd_channel.close()
            self.fd_channel = None
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
        # A broker we are not joined to (a remote one we are rejoining) is owed no bye.
        self._stop(0, "executor shutting down", bye=self.joined)

    def _broker_lost(self) -> None:
        log.error("no word from the broker; presuming it gone", silent_s=round(self._liveness.silence(), 1))
        self._stop(1, "executor lost its broker", bye=False)

    def _stop(self, code: int, reason: str, *, bye: bool) -> None:
        if self._stopping is not None:
            return
        self._stopping = (code, bye)
        self._give_up_at = time.monotonic() + SHUTDOWN_DEADLINE_S
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        for call in list(self.calls.values()):
            call.abort(reason)
        # Orphans are being killed already; they too must be gone before we exit.
        if self.calls or self.orphans:
            self.loop.call_later(SHUTDOWN_DEADLINE_S, self._stop_deadline)
        else:
            self._stopped_now()

    def _stop_deadline(self) -> None:
        if self._stopped.done() or not (self.calls or self.orphans):
            return
        log.error("commands still running at shutdown", calls=sorted([*self.calls, *(c.corr for c in self.orphans)]))
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
        if self.calls.get(call.corr) is call:
            del self.calls[call.corr]
        else:
            self.orphans.discard(call)
        if self._stopping is not None and not self.calls and not self.orphans:
            self._stopped_now()

    def _check_heartbeat(self) -> None:
        if self._stopping is not None:
            return
        if self.joined:
            # The rule every peer follows: ping a quiet broker, say that we wait, give it up
            # after the patience (broker.wire.liveness). A broker that dropped us (or
            # restarted) answers the ping with "send hello first".
            due = self._liveness.check(self.heartbeat_s)
            waiting = self._liveness.waiting(self.heartbeat_s)
            if waiting:
                log.warning(waiting, calls=len(self.calls))
            if due == peer.PING:
                self.send([wire.header(wire.PING)])
            elif due is not None and self.remote is None:
                self._broker_lost()
                return
            elif due is not None:
                self._rejoin(f"no word from the broker for {self._liveness.silence():.1f} s")
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
        self._liveness.heard()
        try:
            h = wire.decode_header(frames[0].buffer)
        except wire.WireError as e:
            self._throttle("warning", "dropped a bad message", error=str(e))
            return
        handler = self._handlers.get(h.kind)
        if handler is None:
            self._throttle("warning", "dropped a message of unexpected kind", kind=wire.one_line(h.kind, 80))
            return
        try:
            handler(h, frames)
        except wire.WireError as e:
            self._throttle("warning", "dropped a bad message", kind=h.kind, corr=wire.one_line(h.corr, 80), error=str(e))
        except Exception:
            # A bug handling one message must not take every running command down.
            log.exception("failed to handle a message", kind=h.kind, corr=h.corr)

    def _body(self, kind: str, frames):
        if len(frames) < 2:
            raise wire.WireError(f"{kind} without a body")
        return wire.decode(kind, frames[1].buffer)

    def _on_welcome(self, h: wire.Header, frames) -> None:
        welcome = self._body(wire.WELCOME, frames)
        if self.joined:
            return
        if welcome.version != wire.PROTOCOL_VERSION:
            return self._fatal(
                f"the broker speaks protocol {welcome.version}, this executor {wire.PROTOCOL_VERSION}; upgrade one of them"
            )
        self.joined = True
        self._attempts = 0
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if welcome.heartbeat_s > 0:
            self.heartbeat_s = welcome.heartbeat_s
        self._liveness.heard()
        if not self._welcome.done():
            self._welcome.set_result(welcome)
        else:
            log.info("joined the broker again", name=self.name, peer_id=welcome.peer_id, broker=self.endpoint)

    def _on_error(self, h: wire.Header, frames) -> None:
        err = self._body(wire.ERROR, frames)
        if not self.joined:
            return self._fatal(f"the broker refused this executor: {wire.one_line(err.message)}")
        if self.remote is not None and err.message == peer.HELLO_FIRST:
            return self._rejoin("the broker no longer knows this executor")
        log.warning("broker reported an error", corr=h.corr, message=err.message)

    def _fatal(self, message: str) -> None:
        """Nothing will change by trying again: exit 2 with ``message``."""
        if not self._welcome.done():
            self._welcome.set_exception(StartupError(message))
            return
        log.error(message)
        self._stop(2, message, bye=False)

    def _on_monitor(self, frames) -> None:
        try:
            event = parse_monitor_message([f.bytes for f in frames])["event"]
        except (RuntimeError, ValueError):
            return
        why = peer.handshake_refusal(event, self.endpoint)
        if why is None:
            return
        if not self._welcome.done():
            # At start-up a person is watching: a refusal is a mistake to fix, not to wait out.
            self._welcome.set_exception(StartupError(why))
            return
        self._throttle("error", "cannot join the broker; still trying", why=why)

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
        stdio = self._stdio_for(corr) if req.stdio_fds else None
        if req.stdio_fds and stdio is None:
            self._refuse(corr, "the command's stdio did not come with it (a direct run is for the daemon's own executors)")
            return
        refused = direct.refused(stdio, direct.stdio_names(req.stdin, req.stdio_null)) if stdio is not None else None
        if refused is not None:  # the daemon checks too; what reaches the sandbox is checked here
            direct.close_all(stdio)
            self._refuse(corr, refused)
            return
        why = self._why_not(req)
        if why is not None:
            direct.close_all(stdio or [])  # the caller's pipes must not wait on us for their end
            self._refuse(corr, why)
            return
        call = Call(self, corr, req, stdio)
        self.calls[corr] = call
        if not call.start():
            del self.calls[corr]

    def _why_not(self, req: wire.RunRequest) -> str | None:
        """Why this executor does not take ``req`` now (None: it does)."""
        if self._stopping is not None:
            return "executor shutting down"
        if not self.joined:
            return "executor not ready"
        interactive = sum(1 for call in self.calls.values() if call.req.interactive)
        if req.interactive:
            if interactive >= wire.INTERACTIVE_PER_EXECUTOR:
                return f"executor busy: it hosts {interactive} interactive commands, its most"
        elif len(self.calls) - interactive >= self.slots:
            return f"executor busy: all {self.slots} slots in use"
        return None

    def _stdio_for(self, corr: str) -> list[int] | None:
        """The fds the daemon sent for run ``corr`` (sent before it, so here by now)."""
        channel = self.fd_channel
        while channel is not None and corr not in self._stdio:
            try:
                message, fds = direct.receive(channel)
            except (BlockingIOError, InterruptedError):
                break
            except direct.DirectError as e:
                self._throttle("warning", "bad message on the fd channel", error=wire.one_line(e))
                continue
            except OSError as e:
                self._throttle("warning", "the fd channel failed", error=wire.one_line(e.strerror))
                break
            if message is None:
                self.fd_channel = None
                channel.close()
                break
            call = message.get("call")
            if not isinstance(call, str) or call in self._stdio or not fds:
                direct.close_all(fds)
                continue
            self._stdio[call] = fds
            if len(self._stdio) > 4 * self.slots + wire.INTERACTIVE_PER_EXECUTOR:
                oldest = next(iter(self._stdio))  # runs that never came: not kept forever
                direct.close_all(self._stdio.pop(oldest))
        return self._stdio.pop(corr, None)

    def _refuse(self, corr: str, message: str) -> None:
        self.send(wire.message(wire.EXIT, corr, wire.ExitStatus(error=wire.one_line(message) or "unknown error")))

    def _on_ack(self, h: wire.Header, frames) -> None:
        call = self.calls.get(h.corr)
        if call is not None:
            call.ack(h.n, h.seq)

    def _on_hold(self, h: wire.Header, frames) -> None:
        call = self.calls.get(h.corr)
        if call is not None:
            call.hold_output(bool(h.n))

    def _on_stdin(self, h: wire.Header, frames) -> None:
        call = self.calls.get(h.corr)
        if call is not None and len(frames) >= 2:  # unknown: it may have just finished
            call.feed_stdin(frames[1].buffer)

    def _on_resize(self, h: wire.Header, frames) -> None:
        call = self.calls.get(h.corr)
        if call is not None:
            size = self._body(wire.RESIZE, frames)
            call.resize(size.rows, size.cols)

    def _on_signal(self, h: wire.Header, frames) -> None:
        call = self.calls.get(h.corr)
        if call is not None:  # unknown: it may have just finished
            call.pass_signal(h.n)

    def _on_cancel(self, h: wire.Header, frames) -> None:
        call = self.calls.get(h.corr)
        if call is not None:  # unknown: it may have just finished
            call.cancel()

    def _on_ping(self, h: wire.Header, frames) -> None:
        # Ahead of output waiting in the backlog: a busy executor is not a hung one.
        pong = [wire.header(wire.PONG, h.corr, seq=h.seq)]
        if self._backlog:
            self._backlog.appendleft(pong)  # a refused send took no part of its message
        else:
            self.send(pong)


def _ignore(h, frames) -> None:
    pass
