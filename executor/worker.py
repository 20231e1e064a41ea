"""The executor worker: one DEALER to the broker, one asyncio loop, many sandboxed calls.

Everything happens on one thread: the zmq socket (via :class:`broker.net.zloop.ZSocket`),
every call's pipes and done_fds (``loop.add_reader``), timers and signals. Nothing here
blocks, so a cancel is acted on as soon as it arrives, whatever else is streaming.

It joins the broker over a :class:`broker.net.aiolink.PeerLink`, which keeps the rules every
peer follows: it pings a broker that has been quiet for a heartbeat, says that it waits,
and gives the broker up only after :data:`broker.net.peer.PATIENCE_HEARTBEATS` heartbeats
of unanswered pings, far longer than the broker waits for it: a stalled daemon finds its
commands running when it resumes. A local executor (spawned by the daemon, ipc and a
token) then exits. A remote one (``remote``: tcp and CurveZMQ) outlives its broker: after
that patience, or at once when the broker answers "send hello first" (it dropped us, or
restarted), it kills every command it runs (the broker has failed or will fail those
calls: nothing is re-run) and the link joins again, on a fresh socket, until it is
welcomed; its pings make a broker that forgot it say so within a heartbeat or two. A
CurveZMQ handshake the daemon refuses is a one-line error at start-up, and a logged
error (and retries) later. What the socket cannot take yet waits in the link's backlog,
in order, and every call stops reading its pipes meanwhile.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time

import structlog
import zmq

from broker.net.aiolink import PeerLink
from broker.net.link import LinkError
from broker.net.logging import Throttle
from broker.net.runtime import published_hidden
from broker.wire import direct
from broker.wire import frames as wire
from executor.call import Call
from executor.errors import StartupError
from landlock_helper import limits

log = structlog.get_logger("executor")

WELCOME_TIMEOUT_S = 10.0
# Bounded queues on the socket; past SNDHWM output waits in the link's backlog and the
# pipes stop being read, so memory stays bounded and nothing is dropped.
SNDHWM = 10_000
RCVHWM = 10_000
# Killed trees die at once; this only bounds a shutdown if a sandbox misbehaves.
SHUTDOWN_DEADLINE_S = 5.0
# At a clean exit, how long queued exits and the bye may take to leave.
FINAL_LINGER_MS = 1000


class Worker:
    def __init__(self, endpoint: str, token: str, *, name: str, slots: int, hidden_paths: tuple[str, ...] = (),
                 spawner=None, remote=None, fd_channel: socket.socket | None = None, nice: int | None = None) -> None:
        self.endpoint = endpoint
        # A broker.net.keys.Remote: join over tcp with CurveZMQ, and rejoin instead of exiting.
        self.remote = remote
        self.name = name
        self.slots = slots
        self.hidden_paths = tuple(hidden_paths)
        # The niceness of every command (None: ours); the spawner has it too.
        self.nice = nice
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
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self.ctx: zmq.Context | None = None
        self._throttle = Throttle(log)
        self.exit_linger_ms = 0
        self._joining: asyncio.Future | None = None
        self._stopped: asyncio.Future | None = None
        self._stopping: tuple[int, bool] | None = None  # (exit code, say bye)
        self._give_up_at = 0.0
        self._bye_sent = False
        self.link = PeerLink(endpoint, role=wire.ROLE_EXECUTOR, name=name, token=lambda: token, slots=slots,
                             remote=remote, rejoin=remote is not None, sndhwm=SNDHWM, rcvhwm=RCVHWM)
        # Sent now, or in order once the socket takes it.
        self.send = self.link.put
        self.link.on_broken.append(self._broker_lost)
        self.link.on_lost = self._rejoining
        self.link.on_joined = self._joined_again
        self.link.on_refused = self._reported
        self.link.on_congested = self._set_congested
        for kind, handler in {
            wire.RUN: self._on_run,
            wire.ACK: self._on_ack,
            wire.IN: self._on_stdin,
            wire.RESIZE: self._on_resize,
            wire.SIGNAL: self._on_signal,
            wire.CANCEL: self._on_cancel,
            wire.HOLD: self._on_hold,
            wire.ERROR: self._on_error,
        }.items():
            self.link.on(kind, handler)

    @property
    def congested(self) -> bool:
        """True while the socket refuses sends: every call stops reading its pipes."""
        return self.link.congested

    # -- lifecycle ------------------------------------------------------------------------

    async def run(self) -> int:
        """Join the broker, serve until told to stop; returns the process exit code."""
        self.loop = asyncio.get_running_loop()
        self._stopped = self.loop.create_future()
        self.ctx = self.link.ctx = zmq.Context()
        if self.spawner is not None:
            self._refill_spawner()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(sig, self.shutdown)
        # A remote executor waits for its broker as long as it takes (it may start first).
        self._joining = asyncio.ensure_future(self.link.join(None if self.remote else WELCOME_TIMEOUT_S,
                                                             where=f"the broker at {self.endpoint}"))
        try:
            welcome = await self._joining
        except asyncio.CancelledError:  # told to stop while waiting
            return 0
        except LinkError as e:
            if e.refused is not None:
                raise StartupError(f"the broker refused this executor: {wire.one_line(e.refused)}") from None
            raise StartupError(str(e)) from None
        # What an executor killed before us left (it could not remove its commands' cgroups).
        limits.sweep_stale()
        # Found once, here: what enforces each command's resource limits on this host.
        log.info("executor ready", name=self.name, peer_id=welcome.peer_id, slots=self.slots,
                 broker=self.endpoint if self.remote else None, limits=limits.mechanism().describe(),
                 default_limits=limits.defaults().describe(),
                 command_nice=os.getpriority(os.PRIO_PROCESS, 0) if self.nice is None else self.nice)
        return await self._stopped

    def _rejoining(self, why: str) -> None:
        """Remote only: let go of this broker (killing what it asked us to run); the link joins again."""
        log.warning("lost the broker; cancelling its commands and joining again", why=why, broker=self.endpoint,
                    cancelled=len(self.calls))
        calls = list(self.calls.values())
        self.calls.clear()
        for call in calls:
            self.orphans.add(call)
            call.abandon("executor lost its broker")

    def _joined_again(self, welcome: wire.Welcome) -> None:
        log.info("joined the broker again", name=self.name, peer_id=welcome.peer_id, broker=self.endpoint)

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

        return spawn(argv, hidden_paths=(*self.hidden_paths, *published), nice=self.nice, **kw)

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
        self.link.close(self.exit_linger_ms)
        if self.ctx is not None:
            self.ctx.term()
            self.ctx = None

    def shutdown(self) -> None:
        """SIGTERM/SIGINT: kill every command, report each, say bye, exit 0."""
        if self._joining is not None and not self._joining.done():
            self._joining.cancel()
            return
        # A broker we are not joined to (a remote one we are rejoining) is owed no bye.
        self._stop(0, "executor shutting down", bye=self.link.joined)

    def _broker_lost(self, error: LinkError) -> None:
        if error.refused is not None:  # nothing will change by trying again
            message = f"the broker refused this executor: {wire.one_line(error.refused)}"
            log.error(message)
            return self._stop(2, message, bye=False)
        log.error("no word from the broker; presuming it gone", why=str(error),
                  silent_s=round(self.link.liveness.silence(), 1))
        self._stop(1, "executor lost its broker", bye=False)

    def _stop(self, code: int, reason: str, *, bye: bool) -> None:
        if self._stopping is not None:
            return
        self._stopping = (code, bye)
        self._give_up_at = time.monotonic() + SHUTDOWN_DEADLINE_S
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
        if self.link.backlog and time.monotonic() < self._give_up_at:
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

    def _set_congested(self, congested: bool) -> None:
        for call in self.calls.values():
            call.update_readers()

    # -- receiving ----------------------------------------------------------------------

    def _body(self, kind: str, frames):
        if len(frames) < 2:
            raise wire.WireError(f"{kind} without a body")
        return wire.decode(kind, frames[1].buffer)

    def _on_error(self, h: wire.Header, frames) -> None:
        self._reported(self._body(wire.ERROR, frames).message, h.corr)

    def _reported(self, message: str, corr: str = "") -> None:
        log.warning("broker reported an error", corr=corr, message=message)

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
        if not self.link.joined:
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
