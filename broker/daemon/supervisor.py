"""Child processes of the daemon: the executor pool and the agent, spawned, watched, replaced.

Deaths are seen through a pidfd per child registered with the event loop, so the daemon
learns of a crash the moment it happens (no polling, no SIGCHLD races) and signals go
through the pidfd too, so a recycled pid is never hit. Liveness of a process that is alive
but stuck is the router's business (heartbeats); it asks us to :meth:`ProcessPool.kill`.

:class:`ProcessPool` holds what both kinds share (spawn, hello deadline, restart with
backoff, stop); :class:`ExecutorPool` keeps N ``python -m executor`` running from the
start, :class:`AgentSupervisor` one ``python -m agent``, started on first use
(:meth:`AgentSupervisor.ensure_started`) and restarted when it dies.

Children get the daemon's environment without secret-looking variables (an API key
exported in the shell that started the daemon stays out of the executors and the
agent: the agent gets each session's key from the frontend that configured it).
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import structlog

from broker.net.runtime import RuntimeDir, with_source_root, without_secrets
from broker.wire import direct

log = structlog.get_logger(component="supervisor")

# The worker programs; tests may point them elsewhere.
EXECUTOR_COMMAND = [sys.executable, "-m", "executor"]
AGENT_COMMAND = [sys.executable, "-m", "agent"]
# A child that dies sooner than this after its start counts as failing at start-up.
STABLE_AFTER_S = 10.0
BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 5.0
# A spawned child that has not said hello by then is killed and replaced.
HELLO_TIMEOUT_S = 20.0
# How long a child whose connection dropped is given to be seen exiting (see exited).
EXIT_SEEN_S = 0.05


def describe_status(returncode: int) -> str:
    if returncode < 0:
        return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


def child_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a child: ours minus secret-looking names (sluice's own kept),
    with this checkout on PYTHONPATH."""
    return with_source_root(without_secrets(environ))


class Worker:
    """One spawned child process and, once it said hello, its router peer."""

    __slots__ = ("name", "proc", "pidfd", "started_at", "peer", "hello_timer", "channel")

    def __init__(self, name: str, proc: subprocess.Popen, pidfd: int, channel: socket.socket | None = None) -> None:
        self.name = name
        self.proc = proc
        self.pidfd = pidfd
        # Our end of an executor's fd channel (broker.wire.direct), or None.
        self.channel = channel
        self.started_at = time.monotonic()
        self.peer = None
        self.hello_timer: asyncio.TimerHandle | None = None

    def signal(self, signum: int) -> None:
        try:
            signal.pidfd_send_signal(self.pidfd, signum)
        except ProcessLookupError:
            pass  # already exited; the pidfd callback will reap it


class ProcessPool:
    """Keeps child processes running until :meth:`stop`; subclasses say which and how.

    ``on_death(peer, name, reason)`` is called for every exit (``peer`` is None if the
    process never said hello) so the router can fail what it was doing.
    """

    what = "child"

    def __init__(
        self,
        runtime: RuntimeDir,
        on_death: Callable[[object, str, str], None],
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.runtime = runtime
        self.on_death = on_death
        self.loop = loop or asyncio.get_running_loop()
        self.workers: dict[str, Worker] = {}
        self._failures: dict[str, int] = {}
        self._restarts: dict[str, asyncio.TimerHandle] = {}
        # name -> when its replacement is (was) due, until that replacement says hello.
        self._restart_at: dict[str, float] = {}
        self._stopping = False
        self._all_exited = asyncio.Event()

    def _argv(self, name: str) -> list[str]:
        raise NotImplementedError

    def _channel(self) -> tuple[socket.socket, socket.socket] | None:
        """Ours and the child's end of a socket to hand it file descriptors, or None."""
        return None

    def _spawn(self, name: str) -> None:
        self._restarts.pop(name, None)
        if self._stopping:
            return
        channel = None
        try:
            channel = self._channel()
            argv, keep = self._argv(name), ()
            if channel is not None:
                argv, keep = [*argv, "--fd-channel", str(channel[1].fileno())], (channel[1].fileno(),)
            # Own process group: a terminal's Ctrl-C reaches the daemon, which stops its
            # children in order, instead of hitting every one at once.
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=child_env(), process_group=0, pass_fds=keep)
        except OSError as e:
            log.error(f"cannot start {self.what}", name=name, error=str(e))
            if channel is not None:
                channel[0].close()
                channel[1].close()
            self._schedule_restart(name, quick=True)
            return
        finally:
            if channel is not None:
                channel[1].close()
        try:
            pidfd = os.pidfd_open(proc.pid)
        except OSError as e:
            log.error(f"cannot watch {self.what}", name=name, pid=proc.pid, error=str(e))
            proc.kill()
            proc.wait()
            if channel is not None:
                channel[0].close()
            self._schedule_restart(name, quick=True)
            return
        worker = Worker(name, proc, pidfd, channel[0] if channel is not None else None)
        self.workers[name] = worker
        self.loop.add_reader(pidfd, self._on_exit, name)
        worker.hello_timer = self.loop.call_later(HELLO_TIMEOUT_S, self._hello_overdue, name)
        log.info(f"{self.what} started", name=name, pid=proc.pid)

    def _hello_overdue(self, name: str) -> None:
        worker = self.workers.get(name)
        if worker is not None and worker.peer is None:
            log.warning(f"{self.what} never said hello; killing it", name=name, pid=worker.proc.pid)
            worker.signal(signal.SIGKILL)

    def _on_exit(self, name: str) -> None:
        worker = self.workers.pop(name)
        self.loop.remove_reader(worker.pidfd)
        os.close(worker.pidfd)
        if worker.channel is not None:
            worker.channel.close()
        if worker.hello_timer is not None:
            worker.hello_timer.cancel()
        returncode = worker.proc.wait()
        reason = describe_status(returncode)
        lived = time.monotonic() - worker.started_at
        if self._stopping:
            log.info(f"{self.what} stopped", name=name, pid=worker.proc.pid, status=reason)
        else:
            log.warning(f"{self.what} died", name=name, pid=worker.proc.pid, status=reason, lived_s=round(lived, 3))
        self.on_death(worker.peer, name, reason)
        if self._stopping:
            if not self.workers:
                self._all_exited.set()
            return
        self._schedule_restart(name, quick=lived < STABLE_AFTER_S)

    def _schedule_restart(self, name: str, *, quick: bool) -> None:
        if self._stopping:
            return
        failures = self._failures.get(name, 0) + 1 if quick else 0
        self._failures[name] = failures
        delay = 0.0 if failures == 0 else min(BACKOFF_FIRST_S * 2 ** (failures - 1), BACKOFF_MAX_S)
        if failures > 1:
            log.warning(f"{self.what} keeps failing at start-up; backing off", name=name, delay_s=delay)
        self._restarts[name] = self.loop.call_later(delay, self._spawn, name)
        self._restart_at[name] = time.monotonic() + delay

    def restarting(self) -> str | None:
        """One line on the replacements under way (None if none is): what a command that
        waits for one is told."""
        if self._stopping or not self._restart_at:
            return None
        delay, name = min((at - time.monotonic(), name) for name, at in self._restart_at.items())
        when = f"restarted in {delay:.1f} s" if delay > 0.05 else "being restarted"
        again = " (it keeps dying at start: backing off)" if self._failures.get(name, 0) > 1 else ""
        return f"{self.what} {name} died and is {when}{again}"

    def starting(self) -> bool:
        """A child started (or due to be) that has not said hello yet."""
        if self._stopping:
            return False
        return bool(self._restarts) or any(worker.peer is None for worker in self.workers.values())

    # -------------------------------------------------------- router hooks

    def claim(self, peer) -> bool:
        for worker in self.workers.values():
            if worker.proc.pid == peer.pid and worker.peer is None:
                worker.peer = peer
                self._restart_at.pop(worker.name, None)
                if worker.hello_timer is not None:
                    worker.hello_timer.cancel()
                    worker.hello_timer = None
                if peer.name != worker.name:
                    log.warning(f"{self.what} hello names a different {self.what}", expected=worker.name, got=peer.name)
                return True
        return False

    def kill(self, peer) -> bool:
        for worker in self.workers.values():
            if worker.peer is peer:
                worker.signal(signal.SIGKILL)
                return True
        return False

    def exited(self, peer, wait_s: float = EXIT_SEEN_S) -> str | None:
        """How the process behind ``peer`` ended ("killed by signal 9"), waiting up to
        ``wait_s`` for it; None if it still runs or is not ours. Its connection closes as
        it dies, just before its pidfd says so: a send that finds it unreachable asks
        here first, so the reason is the exit, not the symptom. (The pidfd's callback still
        reaps it, reports the death and restarts it.)"""
        for worker in self.workers.values():
            if worker.peer is peer:
                poller = select.poll()
                poller.register(worker.pidfd, select.POLLIN)
                if not poller.poll(int(wait_s * 1000)):
                    return None
                return describe_status(worker.proc.wait())
        return None

    # ------------------------------------------------------------ shutdown

    async def stop(self, grace: float = 3.0) -> None:
        """SIGTERM every child (executors end their commands and say bye), SIGKILL after ``grace``."""
        self._stopping = True
        for handle in self._restarts.values():
            handle.cancel()
        self._restarts.clear()
        if not self.workers:
            return
        for worker in list(self.workers.values()):
            worker.signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self._all_exited.wait(), grace)
            return
        except TimeoutError:
            pass
        for worker in list(self.workers.values()):
            log.warning(f"{self.what} ignored SIGTERM; killing it", name=worker.name, pid=worker.proc.pid)
            worker.signal(signal.SIGKILL)
        try:
            await asyncio.wait_for(self._all_exited.wait(), 2.0)
        except TimeoutError:
            log.error(f"{self.what}s still running after SIGKILL", names=sorted(self.workers))


class ExecutorPool(ProcessPool):
    """Keeps ``count`` executors running from :meth:`start` until :meth:`stop`."""

    what = "executor"

    def __init__(
        self,
        runtime: RuntimeDir,
        count: int,
        on_death: Callable[[object, str, str], None],
        loop: asyncio.AbstractEventLoop | None = None,
        hide: tuple[str, ...] = (),
    ) -> None:
        super().__init__(runtime, on_death, loop)
        self.count = count
        # Paths besides the runtime dir that commands must not see (sluice's home, the
        # daemon's key file and allow-lists).
        self.hide = tuple(hide)

    def start(self) -> None:
        for k in range(1, self.count + 1):
            self._spawn(f"exec-{k}")

    def _channel(self) -> tuple[socket.socket, socket.socket] | None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        ours.setblocking(False)
        return ours, theirs

    def passes_fds(self, peer=None) -> bool:
        """Whether ``peer`` is an executor we spawned and can hand fds (None: whether we run any)."""
        if peer is None:
            return self.count > 0
        return any(worker.peer is peer and worker.channel is not None for worker in self.workers.values())

    def pass_fds(self, peer, call_id: str, fds: list[int]) -> str | None:
        """Hand a direct run's stdio to executor ``peer`` (before its run); None, or why not."""
        for worker in self.workers.values():
            if worker.peer is peer and worker.channel is not None:
                try:
                    direct.send(worker.channel, {"call": call_id}, fds)
                except OSError as e:
                    return e.strerror or str(e)
                return None
        return "not an executor of this daemon's own"

    def _argv(self, name: str) -> list[str]:
        rt = self.runtime
        return [
            *EXECUTOR_COMMAND,
            "--connect", rt.endpoint,
            "--token-file", rt.token_path,
            "--name", name,
            *(arg for path in (rt.path, *(p for p in self.hide if p != rt.path)) for arg in ("--hide", path)),
            "--die-with-parent",
        ]


class AgentSupervisor(ProcessPool):
    """The one agent process: started by :meth:`ensure_started`, then kept running."""

    what = "agent"
    NAME = "agent"

    @property
    def running(self) -> bool:
        """Started or about to be (a restart is scheduled)."""
        return self.NAME in self.workers or self.NAME in self._restarts

    def ensure_started(self) -> None:
        if not self.running and not self._stopping:
            self._spawn(self.NAME)

    def _argv(self, name: str) -> list[str]:
        rt = self.runtime
        return [*AGENT_COMMAND, "--connect", rt.endpoint, "--token-file", rt.token_path, "--die-with-parent"]
