"""The sluice daemon: one asyncio process that owns the broker socket and the executors.

Start-up order matters. The runtime dir is checked (:func:`broker.net.runtime.open_dir`: a
directory of ours, mode 0700, reached through nothing someone else controls) and every
file in it is then opened relative to that descriptor, never through a symlink. The flock
on ``daemon.lock`` is taken before anything else in the runtime dir is touched, so a
second daemon fails without disturbing the first (its socket, token and pid file stay as
they are). Only the lock holder removes a stale
socket, writes a fresh token, binds and finally writes the pid file, which therefore
means "a daemon is up and serving".

Routing is in :mod:`broker.daemon.router` (sessions in :mod:`broker.daemon.sessions`), the executor and
agent processes in :mod:`broker.daemon.supervisor`; this module wires them to a ROUTER socket and
an event loop and handles start and stop. The agent process is started on the first
session submission, not with the daemon, so a daemon used only for ``sluice run`` never
pays for it.

With ``listen`` the daemon also binds a CurveZMQ ROUTER on tcp (:mod:`broker.daemon.listener`: the
ZAP handler, bound first, and the allow-lists, one per role). Both sockets feed the one
router: network peers' identities get the :data:`broker.daemon.router.REMOTE` byte in front on
the way in, which the transport strips on the way out, and a local peer that chose such
an identity itself is ignored, so it can neither pass for a network peer nor skip the
token.
"""

from __future__ import annotations

import asyncio
import ctypes
import fcntl
import os
import signal
import socket
import stat

import structlog
import zmq

from broker.daemon.direct import DirectRuns
from broker.daemon.gate import ConnectionGate
from broker.daemon.journal import JournalSpace, default_limit, reset_directory
from broker.daemon.listener import AllowList, HandshakeLog, ZapHandler, bind_listener, listener_socket
from broker.daemon.router import (
    DIRECT,
    EXECUTOR_WAIT_S,
    HEARTBEAT_S,
    MAX_MESSAGE_BYTES,
    MAX_PARTS,
    REMOTE,
    SUSPEND_LIMIT_S,
    Router,
)
from broker.daemon.sessions import max_sessions
from broker.daemon.supervisor import AgentSupervisor, ExecutorPool
from broker.net.fdlimit import raise_fd_limit
from broker.net.keys import default_keys_dir
from broker.net.logging import LogFile, Throttle, capture_stdio, configure
from broker.net.peer import DEAD_AFTER_HEARTBEATS
from broker.net.runtime import (
    RuntimeDir,
    RuntimeDirError,
    ensure_sluice_home,
    hidden_paths,
    open_reused,
    publish_hidden,
    read_file,
    remove,
    unpublish_hidden,
    write_new,
)
from broker.net.zloop import ZSocket
from broker.wire import frames as wire
from broker.wire.direct import SOCKET_NAME

__all__ = ["DaemonAlreadyRunning", "RuntimeDirError", "serve"]

log = structlog.get_logger(component="daemon")
_throttle = Throttle(log)

# Messages queued for one peer, at most (what it is sent is bounded before that: windows,
# holds, session windows; this is the backstop) ...
HWM = 100_000
# ... and received from one peer and not yet read. Small: a message waiting there keeps
# alive the whole buffer libzmq read it into (8 KiB, however small the message), and a
# peer that sends faster than the daemon reads is better stopped at its own socket (an
# executor then stops reading its commands' output) than queued here.
RCVHWM = 1000
IO_THREADS = 2
SHUTDOWN_GRACE_S = 3.0
# What the last messages (every call's exit at shutdown) get to go out once the socket
# closes: a frontend that does not read holds the exit up this long at most. As long as
# an executor's own final linger, so that on a machine loaded to 15-20 on two cores the
# I/O thread that writes them need not get a CPU within a quarter of a second.
FINAL_LINGER_MS = 1000
# sun_path is 108 bytes including the terminating NUL.
_MAX_SOCKET_PATH = 107
# Buffers this big (a large run request or submission, a malformed message of many MiB)
# get pages of their own, which go back to the system when freed. Left to itself, glibc
# raises this threshold to the largest buffer freed so far (up to 32 MiB) and keeps the
# memory of later ones in its heaps: tens of MiB held for good after a few big messages.
# Output chunks (at most 1 MiB) stay below it.
_MMAP_THRESHOLD = 4 * 1024 * 1024
_M_MMAP_THRESHOLD = -3


class DaemonAlreadyRunning(RuntimeError):
    """Another daemon holds the runtime dir's lock."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        super().__init__(f"a sluice daemon is already running (pid {pid if pid else 'unknown'})")


def serve(runtime: RuntimeDir, *, executors: int | None = None, log_json: bool | None = None, listen=None,
          suspend_limit_s: float | None = None, executor_wait_s: float | None = None,
          heartbeat_s: float | None = None, journal_limit: int | None = None) -> int:
    """Run the daemon in the foreground until SIGTERM/SIGINT; returns the exit code.

    ``executors=None`` spawns one executor per CPU; ``0`` spawns none (executors may
    still connect on their own). ``listen`` (a :class:`broker.daemon.listener.Listen`) also accepts
    peers over tcp. ``heartbeat_s``: how often peers are pinged (None:
    :data:`broker.wire.liveness.HEARTBEAT_S`); one silent for
    :data:`~broker.wire.liveness.DEAD_AFTER_HEARTBEATS` of them is given up. ``journal_limit``: bytes the session journals hold together (None:
    :func:`broker.daemon.journal.default_limit`). Raises :class:`DaemonAlreadyRunning` or :class:`RuntimeDirError`
    before serving if the runtime dir is taken or unusable, :class:`broker.daemon.listener.ListenError`
    if the tcp endpoint cannot be bound.
    """
    if executors is None:
        executors = os.cpu_count() or 1
    if executors < 0:
        raise ValueError("executors must be >= 0")
    if suspend_limit_s is None:
        suspend_limit_s = SUSPEND_LIMIT_S
    if len(runtime.socket_path.encode()) > _MAX_SOCKET_PATH:
        raise RuntimeDirError(
            f"runtime dir {runtime.path} is too long for a unix socket path; "
            "set SLUICE_RUNTIME_DIR to a shorter directory"
        )
    dir_fd = runtime.open(create=True)
    try:
        lock_fd = _take_lock(runtime, dir_fd)
        try:
            log_file = _own_log(dir_fd)
            if log_file is not None:
                # Started in the background: the log rotates, and what else reaches our
                # stderr (our children's, a traceback) goes into it as JSON lines too.
                capture_stdio(configure(True, stream=log_file))
            else:
                configure(log_json)
            fd_limit = raise_fd_limit()
            _give_back_big_buffers()
            # Before any executor starts: hiding it from commands needs it to exist.
            problem = ensure_sluice_home()
            if problem:
                log.warning(f"{problem}; commands cannot be kept from creating it")
            daemon = _Daemon(runtime, dir_fd, executors, listen, fd_limit, suspend_limit_s)
            if executor_wait_s is not None:
                daemon.executor_wait_s = executor_wait_s
            if heartbeat_s is not None:
                daemon.heartbeat_s = heartbeat_s
            daemon.journal_limit = journal_limit
            daemon.log_path = runtime.log_path if log_file is not None else "stderr"
            try:
                daemon.bind()
                return asyncio.run(daemon.run())
            finally:
                daemon.cleanup()
        finally:
            os.close(lock_fd)  # releases the flock
    finally:
        os.close(dir_fd)


def _take_lock(runtime: RuntimeDir, dir_fd: int) -> int:
    fd = open_reused(dir_fd, "daemon.lock", os.O_RDWR, shown=runtime.lock_path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _read_pid(dir_fd) or _read_pid_fd(fd)
        os.close(fd)
        raise DaemonAlreadyRunning(pid) from None
    # Also in the lock file: the holder is identifiable before its pid file exists.
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _own_log(dir_fd: int) -> LogFile | None:
    """A :class:`LogFile` for ``daemon.log`` when our stderr is that file (a daemon
    started in the background by ``sluice daemon start`` or a client); else None."""
    try:
        ours = os.fstat(2)
        there = os.stat("daemon.log", dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    if not stat.S_ISREG(ours.st_mode) or (ours.st_dev, ours.st_ino) != (there.st_dev, there.st_ino):
        return None
    try:
        return LogFile(dir_fd, "daemon.log")
    except OSError:
        return None


def _read_pid(dir_fd: int) -> int | None:
    got = read_file(dir_fd, "daemon.pid", 32)
    try:
        return int(got[0].strip()) if got else None
    except ValueError:
        return None


def _read_pid_fd(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip())
    except (OSError, ValueError):
        return None


def _journal_dir(runtime: RuntimeDir, dir_fd: int) -> int | None:
    """A descriptor of ``journal/`` in the runtime dir, emptied (journals do not outlive their
    daemon); None when it cannot be made, and sessions replay from their memory logs only."""
    try:
        return reset_directory("journal", dir_fd=dir_fd)
    except OSError as e:
        log.warning("no session journal: replay is limited to the memory log",
                    dir=os.path.join(runtime.path, "journal"), error=e.strerror or str(e))
        return None


class _Daemon:
    def __init__(self, runtime: RuntimeDir, dir_fd: int, executors: int, listen=None, fd_limit: int = 1024,
                 suspend_limit_s: float = SUSPEND_LIMIT_S) -> None:
        self.runtime = runtime
        self.fd_limit = fd_limit
        self.suspend_limit_s = suspend_limit_s
        # The checked runtime dir; every file in it is opened or removed relative to this.
        self.dir_fd = dir_fd
        # What we made there, (st_dev, st_ino), so that only those are removed at exit.
        self._socket_ident: tuple[int, int] | None = None
        # run.sock (broker.daemon.direct), if it could be made: its socket and identity.
        self.direct_listener: socket.socket | None = None
        self._direct_ident: tuple[int, int] | None = None
        self._pid_ident: tuple[int, int] | None = None
        self._journal_fd: int | None = None
        self.executors = executors
        self.listen = listen
        self.ctx: zmq.Context | None = None
        self.sock: zmq.Socket | None = None
        # With ``listen``: the CurveZMQ ROUTER on tcp, the endpoint it got, its ZAP handler.
        self.tcp: zmq.Socket | None = None
        self.tcp_endpoint = ""
        self.zap = None
        # With ``listen``: the file that asks every sandbox of our sluice home to hide our
        # key file and allow dirs (broker.net.runtime.publish_hidden).
        self._published: str | None = None
        self.token = ""
        self.log_path = "stderr"
        self.executor_wait_s = EXECUTOR_WAIT_S
        self.heartbeat_s = HEARTBEAT_S
        self.journal_limit: int | None = None

    def bind(self) -> None:
        rt = self.runtime
        self._remove_stale_socket("broker.sock")
        self.token = rt.new_token(self.dir_fd)
        listening, self._socket_ident = self._unix_listener("broker.sock", socket.SOCK_STREAM)
        # Two I/O threads: connections are spread over them, so one peer that floods (a
        # message of millions of parts takes libzmq seconds to decode) does not hold up
        # every other connection's handshake and traffic.
        self.ctx = zmq.Context(io_threads=IO_THREADS)
        sock = self.ctx.socket(zmq.ROUTER)
        _router_options(sock)
        self.sock = sock
        # libzmq takes over the socket we bound (and closes it); it unlinks nothing itself.
        sock.setsockopt(zmq.USE_FD, listening.detach())
        try:
            sock.bind(rt.endpoint)
        except zmq.ZMQError as e:
            raise RuntimeDirError(f"cannot listen on {rt.endpoint}: {e}") from None
        if self.listen is not None:
            self._listen()
            try:
                self._published = publish_hidden(self._listen_secrets())
            except OSError as e:
                log.warning("cannot ask other sluice processes' sandboxes to hide the key file and allow dirs; "
                            "only this daemon's executors hide them", why=e.strerror)
        try:
            self._remove_stale_socket(SOCKET_NAME)
            self.direct_listener, self._direct_ident = self._unix_listener(SOCKET_NAME, socket.SOCK_SEQPACKET)
        except RuntimeDirError as e:
            log.warning("no direct runs: sluice run goes through the broker socket", why=str(e))
        self._pid_ident = write_new(self.dir_fd, "daemon.pid", f"{os.getpid()}\n".encode())

    def _remove_stale_socket(self, name: str) -> None:
        """Unlink what a dead daemon left at a socket's name (we hold the lock, so no daemon
        uses it): the entry itself, never what a link there points to, and only one of ours
        that is not a directory (the same one we looked at: removed by identity)."""
        path = os.path.join(self.runtime.path, name)
        try:
            st = os.stat(name, dir_fd=self.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            what = "a directory" if stat.S_ISDIR(st.st_mode) else f"owned by uid {st.st_uid}"
            raise RuntimeDirError(f"{path} is {what}, "
                                  "not a socket a sluice daemon left; refusing to remove it: remove it yourself")
        if not stat.S_ISSOCK(st.st_mode):
            log.warning("removed something that was not a socket at the socket's name", path=path,
                        was="a symbolic link" if stat.S_ISLNK(st.st_mode) else "a file")
        remove(self.dir_fd, name, (st.st_dev, st.st_ino))

    def _unix_listener(self, name: str, kind: int) -> tuple[socket.socket, tuple[int, int]]:
        """A unix socket bound at ``name`` in the runtime dir, 0600, and its identity. Bound
        through /proc/self/fd where there is one, so the name is made in the directory
        that was checked, whatever its path leads to now; bind never follows a link at the
        name itself."""
        path = os.path.join(self.runtime.path, name)
        address = path
        if os.path.isdir(f"/proc/self/fd/{self.dir_fd}"):
            address = f"/proc/self/fd/{self.dir_fd}/{name}"
        listening = socket.socket(socket.AF_UNIX, kind | socket.SOCK_CLOEXEC)
        old_umask = os.umask(0o177)
        try:
            listening.bind(address)
            listening.listen(100)
        except OSError as e:
            listening.close()
            raise RuntimeDirError(f"cannot listen on {path}: {e.strerror or e}") from None
        finally:
            os.umask(old_umask)
        st = os.stat(name, dir_fd=self.dir_fd, follow_symlinks=False)
        return listening, (st.st_dev, st.st_ino)

    def _listen(self) -> None:
        listen = self.listen
        # The handler first: libzmq would let every client in while none is bound.
        lists = []
        for role, directory in listen.allow_dirs.items():
            allow = AllowList(directory, role)
            allow.refresh()
            if not len(allow):
                log.warning(f"the {role} allow-list is empty: no {role} can connect over tcp until a key is added",
                            dir=directory)
            lists.append(allow)
        for role in (wire.ROLE_FRONTEND, wire.ROLE_EXECUTOR):
            if role not in listen.allow_dirs:
                log.info(f"no {role} allow-list: no {role} can connect over tcp", role=role)
        self.zap = ZapHandler(self.ctx, lists)
        sock = listener_socket(self.ctx, listen, heartbeat_s=self.heartbeat_s, missed=DEAD_AFTER_HEARTBEATS)
        _router_options(sock)
        self.tcp = sock
        self.tcp_endpoint = bind_listener(sock, listen.endpoint)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)

        gate = ConnectionGate(self.fd_limit)
        router = Router(self.token, defer=loop.call_soon, gate=gate, suspend_limit_s=self.suspend_limit_s,
                        executor_wait_s=self.executor_wait_s, heartbeat_s=self.heartbeat_s)
        pool = ExecutorPool(self.runtime, self.executors, router.executor_died, loop, hide=self._hidden())
        router.supervisor = pool
        router.about = dict(socket=self.runtime.endpoint, listen=self.tcp_endpoint, log=self.log_path,
                            runtime_dir=self.runtime.path, executors_wanted=self.executors)
        agents = AgentSupervisor(self.runtime, router.agent_died, loop)
        router.agent_supervisor = agents
        router.sessions.starter = agents
        router.sessions.max_sessions = max_sessions(self.fd_limit)
        self._journal_fd = router.sessions.journal_dir = _journal_dir(self.runtime, self.dir_fd)
        if self._journal_fd is not None:
            router.sessions.journal_space = JournalSpace(self.journal_limit or default_limit(self._journal_fd))
        # With the routing identity libzmq puts in front: one part more, of 256 bytes at most.
        bounds = dict(max_parts=MAX_PARTS + 1, max_bytes=MAX_MESSAGE_BYTES + 256)
        zsock = ZSocket(self.sock, _local_only(router.on_message), loop, on_refused=_local_refusal(router.refused),
                        **bounds)
        gate.watch(self.sock, self.ctx, loop)
        tsock = None
        if self.tcp is not None:
            self.zap.start(loop)
            gate.watch(self.tcp, self.ctx, loop, events=HandshakeLog.EVENTS, also=HandshakeLog().on_event)
            tsock = ZSocket(self.tcp, _from_network(router.on_message), loop,
                            on_refused=lambda first, parts: router.refused(REMOTE + first.bytes, parts), **bounds)
        direct = None
        if self.direct_listener is not None:
            direct = DirectRuns(router, self.direct_listener, loop, self.token)
        router.transport = _transport(zsock.send, tsock.send if tsock else None)
        heartbeat = loop.create_task(self._heartbeat(router, gate, stop, [s for s in (zsock, tsock) if s is not None]))
        pool.start()
        log.info("daemon ready", endpoint=self.runtime.endpoint, listen=self.tcp_endpoint or None, pid=os.getpid(),
                 executors=self.executors, fd_limit=self.fd_limit, max_connections=gate.max_connections,
                 max_peers=gate.max_peers, max_sessions=router.sessions.max_sessions)

        await stop.wait()
        log.info("shutting down")
        router.close()
        await asyncio.gather(pool.stop(SHUTDOWN_GRACE_S), agents.stop(SHUTDOWN_GRACE_S))
        router.fail_all()
        if direct is not None:
            direct.close()
        heartbeat.cancel()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        gate.close()
        # Bounded: a frontend that does not read cannot hold up the exit.
        zsock.close(linger_ms=FINAL_LINGER_MS)
        self.sock = None
        if tsock is not None:
            tsock.close(linger_ms=FINAL_LINGER_MS)
            self.tcp = None
            self.zap.close()
            self.zap = None
        log.info("daemon stopped")
        return 0

    def _hidden(self) -> tuple[str, ...]:
        """What commands must not see: the runtime dir, sluice's home (config, sessions,
        keys), and with ``listen`` the daemon's secret key and its allow-list dirs,
        wherever they are."""
        return hidden_paths(self.runtime.path, default_keys_dir(), *self._listen_secrets())

    def _listen_secrets(self) -> list[str]:
        """With ``listen``: the daemon's secret key file and its allow-list dirs, resolved."""
        if self.listen is None:
            return []
        return [os.path.realpath(p) for p in (self.listen.key_file, *self.listen.allow_dirs.values())]

    async def _heartbeat(self, router: Router, gate: ConnectionGate, stop: asyncio.Event,
                         inputs: list[ZSocket]) -> None:
        dry = [s.ran_dry for s in inputs]
        refused = trimmed = 0
        while True:
            await asyncio.sleep(self.heartbeat_s)
            # Caught up: every socket was read dry since the last heartbeat, or is not behind.
            now = [s.ran_dry for s in inputs]
            caught_up = all(n != d or not s.behind for s, n, d in zip(inputs, now, dry, strict=True))
            router.heartbeat(caught_up)
            dry = now
            refused = sum(s.refused for s in inputs)
            if refused != trimmed and not any(s.behind for s in inputs):
                # libzmq took a refused message in whole (64 bytes a part) before we saw it;
                # once it is read through, that memory goes back to the system.
                trimmed = refused
                _trim()
            gate.sweep()
            lost = self._runtime_dir_lost()
            if lost:
                # Nobody can reach a daemon whose socket is gone, and the next client would
                # start a second one: stop, as for SIGTERM (sessions end, commands die).
                log.warning(f"{lost}: shutting down", dir=self.runtime.path)
                stop.set()
                return

    def _runtime_dir_lost(self) -> str | None:
        """Why this daemon can no longer be found through its runtime dir, or None."""
        try:
            here = os.stat(self.runtime.path)
            ours = os.fstat(self.dir_fd)
        except OSError:
            return "the runtime dir was removed"
        if (here.st_dev, here.st_ino) != (ours.st_dev, ours.st_ino):
            return "the runtime dir was replaced"
        try:
            st = os.stat("broker.sock", dir_fd=self.dir_fd, follow_symlinks=False)
        except OSError:
            return "the daemon's socket was removed"
        if (st.st_dev, st.st_ino) != self._socket_ident:
            return "the daemon's socket was replaced"
        return None

    def cleanup(self) -> None:
        """Remove what marks this daemon as running. Only ever called by the lock holder."""
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None
        # The listener before its ZAP handler, never the other way round.
        if self.tcp is not None:
            self.tcp.close(linger=0)
            self.tcp = None
        if self.zap is not None:
            self.zap.close()
            self.zap = None
        if self.ctx is not None:
            self.ctx.term()
            self.ctx = None
        # Only what this daemon made, by identity: a name replaced since is left alone.
        if self._socket_ident is not None:
            remove(self.dir_fd, "broker.sock", self._socket_ident)
            self._socket_ident = None
        if self.direct_listener is not None:
            self.direct_listener.close()
            self.direct_listener = None
        if self._direct_ident is not None:
            remove(self.dir_fd, SOCKET_NAME, self._direct_ident)
            self._direct_ident = None
        if self._pid_ident is not None:
            remove(self.dir_fd, "daemon.pid", self._pid_ident)
            self._pid_ident = None
        if self._published is not None:
            unpublish_hidden(self._published)
            self._published = None
        if self._journal_fd is not None:
            os.close(self._journal_fd)
            self._journal_fd = None


def _give_back_big_buffers() -> None:
    """A fixed mmap threshold (see :data:`_MMAP_THRESHOLD`); where malloc is not glibc's, nothing."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)


def _trim() -> None:
    """Give the heap's free memory back to the system (glibc's malloc_trim; elsewhere nothing)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _router_options(sock: zmq.Socket) -> None:
    """Bounded queues and messages, and non-blocking sends that fail for a vanished peer."""
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.SNDHWM, HWM)
    sock.setsockopt(zmq.RCVHWM, RCVHWM)
    sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_MESSAGE_SIZE)
    sock.setsockopt(zmq.LINGER, 0)


def _local_only(on_message):
    """Messages from the ipc socket, minus those of a peer whose chosen identity would pass
    for a network peer's (it could skip the token, or speak for a peer it is not)."""

    def on_local(frames: list) -> None:
        if frames[0].bytes[:1] not in (REMOTE, DIRECT):
            on_message(frames)
        else:
            _throttle("warning", "local peer with a reserved routing id ignored")

    return on_local


def _local_refusal(refused):
    """``refused`` for a message from the ipc socket, unless its identity is a reserved one."""

    def on_refused(first, too_many_parts: bool) -> None:
        identity = first.bytes
        if identity[:1] not in (REMOTE, DIRECT):
            refused(identity, too_many_parts)

    return on_refused


def _from_network(on_message):
    def on_remote(frames: list) -> None:
        frames[0] = zmq.Frame(REMOTE + frames[0].bytes)
        on_message(frames)

    return on_remote


def _transport(local_send, remote_send=None):
    """The router's send to socket peers: to the tcp socket for :data:`REMOTE` identities,
    else ipc (a direct run's caller has its own, :class:`broker.daemon.router.DirectCaller`)."""
    if remote_send is None:
        return local_send
    remote = REMOTE[0]

    def send(parts) -> None:
        if parts[0][0] == remote:
            remote_send([parts[0][1:], *parts[1:]])
        else:
            local_send(parts)

    return send
