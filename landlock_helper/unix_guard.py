"""Every ``connect(2)`` of a sandboxed command, performed by the sandbox's init.

The threat: a unix socket is a door to whatever daemon listens on it. A command that
reaches the user's tmux server (``tmux -S /tmp/tmux-0/default send-keys ...``), an
ssh-agent, the Docker socket, D-Bus or an X server runs code or uses keys outside the
sandbox. Landlock (up to ABI 8) has no right for connecting to a socket file, and a
read-only mount does not stop ``connect``. So the sandbox decides every ``connect``
itself:

- The command's seccomp filter returns SECCOMP_RET_USER_NOTIF for ``connect``. The
  command process installs it last, just before exec, with a listener fd, and hands the
  listener to the init over a socketpair the init made before forking it
  (:func:`hand_over`); the command keeps no copy. The init is pid 1 of the PID
  namespace, outside the command's Landlock domain, with capabilities the command has
  not, and not dumpable: the command can neither signal, ptrace nor take an fd from it.
- The init (:class:`Guard`) *emulates* each connect and never lets the kernel continue
  the original call: the address lives in the command's memory and another thread could
  change it after a check, and the fd could be swapped with ``dup2``. It reads the
  address once, takes the command's socket with ``pidfd_getfd``, and:

  * AF_UNIX (pathname or abstract): connects a *fresh* socket of the same type to that
    address (a relative path resolved from the command's cwd, an absolute one from its
    root), then asks the kernel who listens (SO_PEERCRED). A listener outside the
    sandbox has no pid in the sandbox's PID namespace (0): the fresh socket is closed
    and the command gets EACCES. The outside daemon sees a connection that closes
    without a byte. A listener inside: the fresh socket replaces the command's fd
    (SECCOMP_IOCTL_NOTIF_ADDFD with SETFD, close-on-exec kept) and connect returns 0.
  * Other families (only with network): connect the command's own socket (the
    ``pidfd_getfd`` copy is the same socket) and return its result, EINPROGRESS
    included. A blocking connect runs in a thread, so the init keeps reaping and
    forwarding signals meanwhile.

With network the command shares the host's network namespace (without, the sandbox has
one of its own, where abstract names are its own: see :mod:`.namespaces`), so an abstract
name it listens on could be reached from outside. Its ``listen`` calls come here too: the
init takes the socket (``pidfd_getfd``), refuses (EACCES) to listen on a unix socket
bound to an abstract name (its own or one the kernel chose), and otherwise listens on it
itself. No race: a socket's name, once bound, never changes; an unbound unix socket gets
EINVAL without a call, as the kernel would answer.

Limits, by design: a socket already bound to an address (``bind`` before ``connect``)
cannot be connected (EOPNOTSUPP): its address cannot move to the fresh socket. Of the
options set before connect only SO_PASSCRED, SO_PASSSEC and the send/receive timeouts
are carried to the fresh socket. The listening server sees the init (pid 1) as its
peer's pid. Abstract names are looked up in the init's network namespace. AF_UNIX
datagram sockets cannot be created at all (seccomp.py says why).
"""

from __future__ import annotations

import _thread
import array
import ctypes
import errno
import fcntl
import os
import select
import socket
import struct

from landlock_helper import _libc

# <linux/seccomp.h>: _IOWR('!', 0, struct seccomp_notif) and friends (same on x86_64 and aarch64).
NOTIF_RECV = 0xC0502100
NOTIF_SEND = 0xC0182101
NOTIF_ID_VALID = 0x40082102
NOTIF_ADDFD = 0x40182103
ADDFD_FLAG_SETFD = 1 << 0
PIDFD_THREAD = os.O_EXCL  # Linux 6.9+: a pidfd for a thread, not only a thread-group leader
SO_PEERCRED = 17
SO_PASSSEC = 34
CLONE_FS = 0x00000200
_UCRED = struct.Struct("iII")


class _Data(ctypes.Structure):
    _fields_ = [("nr", ctypes.c_int), ("arch", ctypes.c_uint32), ("ip", ctypes.c_uint64),
                ("args", ctypes.c_uint64 * 6)]


class _Notif(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("pid", ctypes.c_uint32), ("flags", ctypes.c_uint32), ("data", _Data)]


class _Resp(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("val", ctypes.c_int64), ("error", ctypes.c_int32),
                ("flags", ctypes.c_uint32)]


class _AddFd(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("flags", ctypes.c_uint32), ("srcfd", ctypes.c_uint32),
                ("newfd", ctypes.c_uint32), ("newfd_flags", ctypes.c_uint32)]


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_ioctl = _libc.function("ioctl", ctypes.c_int, ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)
_vm_readv = _libc.function("process_vm_readv", ctypes.c_ssize_t, ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                           ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong)
_connect = _libc.function("connect", ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)  # without the GIL
# The backlog as given (Python's listen() clamps it).
_listen = _libc.function("listen", ctypes.c_int, ctypes.c_int, ctypes.c_int)

MAX_SOCKADDR = 128  # sizeof(struct sockaddr_storage): the kernel refuses longer (EINVAL)
_SUN_PATH = 2  # offsetof(struct sockaddr_un, sun_path)


def _start_thread(fn, *args) -> None:
    """Run ``fn(*args)`` in a thread of its own (the init's blocking connects).

    With ``_thread``, not ``threading``: importing threading registers an after-fork hook
    that every later ``os.fork`` runs in the child (about 0.4 ms of Python, its pages
    copied), and this module is loaded in the zygote every sandbox process is forked from.
    Nothing waits for these threads: the init ends with ``os._exit``."""
    _thread.start_new_thread(fn, args)


# --- the command's side -------------------------------------------------------------


def hand_over(listener: int, channel: int, network: bool) -> None:
    """In the command process, after its filter is installed, before exec: give the
    listener to the init and keep no copy (whoever holds it decides the connects)."""
    try:
        sock = socket.socket(fileno=channel)
        try:
            sock.sendmsg([b"N" if network else b"-"],
                         [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [listener]))])
        finally:
            sock.close()
    finally:
        os.close(listener)


# --- the init's side ----------------------------------------------------------------


class Guard:
    """The init's half: receives the listener, then answers every notification.

    :meth:`fds` are what the init's loop polls; :meth:`ready` handles one readable fd.
    Nothing here raises: an error answers the command with an errno.
    """

    @classmethod
    def open(cls) -> tuple[Guard, int]:
        """A guard and the channel end for the command process (to pass to :func:`hand_over`)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        return cls(ours.detach()), theirs.detach()

    def __init__(self, channel: int) -> None:
        self._channel: int | None = channel
        self._listener: int | None = None
        self._network = False
        self._done = False
        self._connect_nr = _libc.nr("connect")
        self._listen_nr = _libc.nr("listen")

    def fds(self) -> list[int]:
        return [fd for fd in (self._channel, None if self._done else self._listener) if fd is not None]

    def ready(self, fd: int, events: int) -> None:
        try:
            if fd == self._channel:
                self._receive()
            elif fd == self._listener:
                if events & select.POLLIN:
                    self._serve()
                elif events & (select.POLLHUP | select.POLLERR):
                    # No process uses the filter any more: nothing will come. (Kept open:
                    # a connect thread may still be answering with it.)
                    self._done = True
        except Exception:  # noqa: BLE001 - the init must survive anything a command provokes
            pass

    def _receive(self) -> None:
        """The one message the command sends before exec; EOF when it sends none
        (an unrestricted command has no filter)."""
        sock = socket.socket(fileno=self._channel)
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1, 4)
        except OSError:
            msg, fds = b"", []
        finally:
            sock.close()
            self._channel = None
        for extra in fds[1:]:
            os.close(extra)
        if fds:
            self._listener = fds[0]
            self._network = msg == b"N"

    def _serve(self) -> None:
        n = _Notif()
        if _ioctl(self._listener, NOTIF_RECV, ctypes.byref(n)) < 0:
            return  # ENOENT: the caller died or was interrupted before we got it
        try:
            if n.data.nr == self._connect_nr:
                self._connect(n)
            elif n.data.nr == self._listen_nr:
                self._listen(n)
            else:
                self._answer(n.id, errno.ENOSYS)
        except OSError as e:
            self._answer(n.id, e.errno or errno.EACCES)
        except Exception:  # noqa: BLE001
            self._answer(n.id, errno.EACCES)

    def _answer(self, notif_id: int, err: int) -> None:
        resp = _Resp(notif_id, 0, -err if err else 0, 0)
        _ioctl(self._listener, NOTIF_SEND, ctypes.byref(resp))  # ENOENT: the caller is gone

    def _valid(self, notif_id: int) -> bool:
        return _ioctl(self._listener, NOTIF_ID_VALID, ctypes.byref(ctypes.c_uint64(notif_id))) == 0

    def _take(self, n: _Notif) -> socket.socket | None:
        """The caller's socket (its first argument), taken with ``pidfd_getfd``: the very
        socket, whatever the fd number means by the time we act. None: the caller is gone."""
        fd = ctypes.c_int32(n.data.args[0] & 0xFFFFFFFF).value
        pidfd = _pidfd_open(n.pid)
        try:
            if not self._valid(n.id):
                return None  # the caller is gone (its tid may already be someone else's)
            copy = _libc.syscall(_libc.nr("pidfd_getfd"), pidfd, fd, 0)
        finally:
            os.close(pidfd)
        try:
            return socket.socket(fileno=copy)  # ENOTSOCK for anything else
        except OSError:
            os.close(copy)
            raise

    def _listen(self, n: _Notif) -> None:
        sock = self._take(n)
        if sock is None:
            return
        with sock:
            if sock.family == socket.AF_UNIX:
                name = sock.getsockname()
                if name in ("", b""):
                    return self._answer(n.id, errno.EINVAL)  # unbound: the kernel's answer
                if isinstance(name, bytes) and name.startswith(b"\0"):
                    return self._answer(n.id, errno.EACCES)  # abstract: reachable from outside
            backlog = ctypes.c_int32(n.data.args[1] & 0xFFFFFFFF).value
            err = 0 if _listen(sock.fileno(), backlog) == 0 else ctypes.get_errno()
            self._answer(n.id, err)

    def _connect(self, n: _Notif) -> None:
        tid = n.pid
        fd = ctypes.c_int32(n.data.args[0] & 0xFFFFFFFF).value
        addr_ptr = n.data.args[1]
        addrlen = ctypes.c_int32(n.data.args[2] & 0xFFFFFFFF).value
        if addrlen < 0 or addrlen > MAX_SOCKADDR:
            return self._answer(n.id, errno.EINVAL)
        # One read of the address: what we act on can no longer change under us.
        addr = _read_memory(tid, addr_ptr, addrlen)
        sock = self._take(n)
        if sock is None:
            return
        copy = sock.fileno()
        try:
            if sock.family == socket.AF_UNIX:
                self._connect_unix(n, tid, fd, sock, addr)
            elif not self._network:
                self._answer(n.id, errno.EACCES)
            elif not fcntl.fcntl(copy, fcntl.F_GETFL) & os.O_NONBLOCK and sock.type != socket.SOCK_DGRAM:
                # The same socket object as the command's: connect it, in a thread if it blocks.
                dup = sock.detach()
                _start_thread(self._connect_inet, n.id, dup, addr)
            else:
                self._connect_inet(n.id, sock.detach(), addr)
        finally:
            sock.close()

    def _connect_inet(self, notif_id: int, fd: int, addr: bytes) -> None:
        try:
            err = 0 if _connect(fd, addr, len(addr)) == 0 else ctypes.get_errno()
            self._answer(notif_id, err)
        except Exception:  # noqa: BLE001
            self._answer(notif_id, errno.EACCES)
        finally:
            os.close(fd)

    def _connect_unix(self, n: _Notif, tid: int, fd: int, sock: socket.socket, addr: bytes) -> None:
        if len(addr) <= _SUN_PATH or struct.unpack_from("H", addr)[0] != socket.AF_UNIX:
            return self._answer(n.id, errno.EINVAL)
        if _peer_of(sock) is not None:
            return self._answer(n.id, errno.EISCONN)
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            return self._answer(n.id, errno.EINVAL)
        if sock.getsockname() not in ("", b""):
            return self._answer(n.id, errno.EOPNOTSUPP)  # see the module docstring
        blocking = not fcntl.fcntl(sock.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK
        name = addr[_SUN_PATH:]
        fresh = socket.socket(socket.AF_UNIX, sock.type, sock.proto)
        try:
            _copy_options(sock, fresh)
            fresh.setblocking(False)
            where = None
            if name[0] != 0:
                # A pathname: from the command's root or cwd, as the kernel would for it.
                path = name.split(b"\0", 1)[0]
                base = "root" if path.startswith(b"/") else "cwd"
                where = os.open(f"/proc/{tid}/{base}", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                name = path.lstrip(b"/") or b"."
            try:
                err = _connect_from(fresh, where, name)
                if err == errno.EAGAIN and blocking:
                    # The listener's backlog is full: wait for room like the command would,
                    # in a thread (with its own cwd) so the init's loop goes on.
                    _start_thread(self._connect_unix_blocking, n, fd, fresh, where, name)
                    fresh = where = None
                    return
            finally:
                if where is not None:
                    os.close(where)
            if err:
                return self._answer(n.id, err)
            self._install(n, fd, fresh, blocking)
        finally:
            if fresh is not None:
                fresh.close()

    def _connect_unix_blocking(self, n: _Notif, fd: int, fresh: socket.socket, where: int | None,
                               name: bytes) -> None:
        try:
            _libc.unshare(CLONE_FS)  # this thread's cwd is its own
            fresh.setblocking(True)
            err = _connect_from(fresh, where, name)
            if err:
                self._answer(n.id, err)
            else:
                self._install(n, fd, fresh, True)
        except OSError as e:
            self._answer(n.id, e.errno or errno.EACCES)
        except Exception:  # noqa: BLE001
            self._answer(n.id, errno.EACCES)
        finally:
            fresh.close()
            if where is not None:
                os.close(where)

    def _install(self, n: _Notif, fd: int, fresh: socket.socket, blocking: bool) -> None:
        """The peer check, then the fresh socket in place of the command's fd."""
        pid, _, _ = _UCRED.unpack(fresh.getsockopt(socket.SOL_SOCKET, SO_PEERCRED, _UCRED.size))
        if pid == 0:
            # The listener has no pid in our PID namespace: it lives outside the sandbox.
            return self._answer(n.id, errno.EACCES)
        fresh.setblocking(blocking)  # the command's O_NONBLOCK, not ours
        cloexec = _cloexec(n.pid, fd)
        add = _AddFd(n.id, ADDFD_FLAG_SETFD, fresh.fileno(), fd, os.O_CLOEXEC if cloexec else 0)
        _libc.check(_ioctl(self._listener, NOTIF_ADDFD, ctypes.byref(add)))
        self._answer(n.id, 0)


def _connect_from(sock: socket.socket, where: int | None, name: bytes) -> int:
    """connect ``sock`` to ``name`` (relative to the directory fd ``where``); 0 or an errno."""
    try:
        if where is None:
            sock.connect(name)
        else:
            os.fchdir(where)
            try:
                sock.connect(name)
            finally:
                os.chdir("/")
    except OSError as e:
        return e.errno or errno.ECONNREFUSED
    return 0


def _peer_of(sock: socket.socket):
    try:
        return sock.getpeername()
    except OSError:
        return None


def _copy_options(src: socket.socket, dst: socket.socket) -> None:
    for opt, size in ((socket.SO_PASSCRED, 0), (SO_PASSSEC, 0), (socket.SO_SNDTIMEO, 16),
                      (socket.SO_RCVTIMEO, 16)):
        try:
            value = src.getsockopt(socket.SOL_SOCKET, opt, size) if size else src.getsockopt(socket.SOL_SOCKET, opt)
            dst.setsockopt(socket.SOL_SOCKET, opt, value)
        except OSError:
            pass


def _cloexec(tid: int, fd: int) -> bool:
    """The close-on-exec flag of the caller's ``fd`` (its fdinfo "flags:" line, octal)."""
    try:
        info = os.open(f"/proc/{tid}/fdinfo/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            text = os.read(info, 4096)
        finally:
            os.close(info)
        for line in text.splitlines():
            if line.startswith(b"flags:"):
                return bool(int(line.split()[1], 8) & os.O_CLOEXEC)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _read_memory(tid: int, address: int, size: int) -> bytes:
    if size == 0:
        return b""
    buf = ctypes.create_string_buffer(size)
    local = _IoVec(ctypes.cast(buf, ctypes.c_void_p), size)
    remote = _IoVec(address, size)
    got = _vm_readv(tid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    if got != size:
        raise OSError(errno.EFAULT, os.strerror(errno.EFAULT))
    return buf.raw


def _pidfd_open(tid: int) -> int:
    """A pidfd for the calling thread (its own fd table and cwd, if it unshared them)."""
    try:
        return _libc.syscall(_libc.nr("pidfd_open"), tid, PIDFD_THREAD)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
    return _libc.syscall(_libc.nr("pidfd_open"), tid, 0)  # before 6.9: fine for a leader
