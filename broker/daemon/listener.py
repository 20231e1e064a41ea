"""The daemon's network side: the CurveZMQ listener, its ZAP handler and the allow-list.

``sluice daemon --listen tcp://HOST:PORT --key FILE --allow DIR --allow-executors DIR``
binds a second ROUTER next to the local ipc one. It is a CurveZMQ server: every
connection is encrypted and proves the daemon by its key (``--key``, a ``.key_secret``
file). Which clients get through the handshake is decided by ZAP (ZeroMQ RFC 27): for
each new connection libzmq asks the handler bound at ``inproc://zeromq.zap.01`` in the
same context. Ours (:class:`ZapHandler`) accepts the CURVE mechanism only, and only
client keys found as ``*.key`` files in an allow-list directory (:class:`AllowList`,
re-read when the directory changes, so adding a key takes no restart).

Roles are allowed separately: ``--allow`` lists the keys that may join as frontends,
``--allow-executors`` those that may join as executors (and so receive other people's
commands). The handshake happens before the peer says which role it wants, so the
handler lets in a key found in either list and records which lists hold it: it answers
with the client's Z85 public key as the User-Id and the roles as the ``Sluice-Roles``
metadata property (:data:`ROLES_PROPERTY`), both of which libzmq attaches to every
message of that connection. The router reads them off the hello, refuses a role the key
was not allowed, and keeps the key on the peer. A key in both lists may do both.

An allow-list directory must belong to the daemon's user (or root) and be writable by
nobody else: whoever can write a ``.key`` file there can let themselves in.

libzmq lets every client in when no ZAP handler is bound, unless the socket enforces its
domain. So the handler is bound before the listener, the listener sets
``ZAP_ENFORCE_DOMAIN`` (where libzmq has it), and the listener is closed first.

Connections that fail before ZAP is asked (no CurveZMQ at all, a client that does not
have the daemon's public key) are seen through a socket monitor and logged by
:class:`HandshakeLog`, rate-limited: a stranger retrying in a loop cannot flood the log.
"""

from __future__ import annotations

import asyncio
import os
import stat
import struct
from dataclasses import dataclass

import structlog
import zmq
from zmq.utils import z85

from broker.net.keys import KeyFileError, load_public_key, load_secret_key
from broker.net.logging import Throttle
from broker.net.zloop import ZSocket
from broker.wire.frames import ROLE_EXECUTOR, ROLE_FRONTEND

__all__ = ["ROLES_PROPERTY", "ZAP_DOMAIN", "AllowList", "HandshakeLog", "Listen", "ListenError", "ZapHandler",
           "bind_listener", "check_allow_dir", "listener_socket"]

log = structlog.get_logger(component="zap")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_VERSION = b"1.0"
ZAP_DOMAIN = b"sluice"
# A connection that has not finished its handshake by then is dropped.
HANDSHAKE_IVL_MS = 10_000
# The ZAP metadata property naming the roles (comma-separated) the key was allowed for.
# Not an ``X-`` name: those a libzmq client can set on its own side of the handshake
# (and libzmq lets the ZAP handler's value win anyway).
ROLES_PROPERTY = "Sluice-Roles"
# The roles a network peer can be allowed, and the flag whose directory allows each.
ALLOW_FLAGS = {ROLE_FRONTEND: "--allow", ROLE_EXECUTOR: "--allow-executors"}


class ListenError(ValueError):
    """``--listen`` cannot be honoured (bad endpoint, key file or allow dir, address in use);
    ``str(e)`` is one line for a person."""


@dataclass(frozen=True)
class Listen:
    """Where and as whom the daemon listens over tcp, and whom it lets in as what."""

    endpoint: str
    public: bytes
    secret: bytes
    # role -> the directory of the public keys allowed to join as that role. A role
    # without a directory is not available over the network.
    allow_dirs: dict[str, str]
    # The daemon's secret key file: hidden from sandboxed commands like the runtime dir.
    key_file: str

    @classmethod
    def from_args(cls, endpoint: str | None, key_file: str | None, allow_dir: str | None,
                  executor_allow_dir: str | None = None) -> Listen:
        """Validate ``--listen/--key/--allow/--allow-executors``; raises :class:`ListenError`."""
        if not endpoint:
            raise ListenError("--key, --allow and --allow-executors go with --listen tcp://HOST:PORT")
        check_endpoint(endpoint)
        if not key_file or not (allow_dir or executor_allow_dir):
            raise ListenError(
                "--listen needs --key FILE (the daemon's NAME.key_secret, from `sluice keys new NAME`) "
                "and --allow DIR (frontends' public .key files) and/or --allow-executors DIR (executors'); "
                "the daemon never listens unauthenticated"
            )
        try:
            public, secret = load_secret_key(key_file)
        except KeyFileError as e:
            raise ListenError(str(e)) from None
        dirs = {}
        for role, path in ((ROLE_FRONTEND, allow_dir), (ROLE_EXECUTOR, executor_allow_dir)):
            if path:
                dirs[role] = check_allow_dir(os.path.abspath(path), ALLOW_FLAGS[role])
        if len(dirs) == 2 and os.path.samefile(dirs[ROLE_FRONTEND], dirs[ROLE_EXECUTOR]):
            raise ListenError(
                f"--allow and --allow-executors name the same directory {dirs[ROLE_FRONTEND]}: every frontend key "
                "could join as an executor and receive other people's commands; keep the two kinds of keys in "
                "separate directories (a key copied into both may act as both)"
            )
        return cls(endpoint, public, secret, dirs, os.path.abspath(key_file))


def check_allow_dir(path: str, flag: str = "--allow") -> str:
    """``path`` if it can serve as an allow-list: a directory of the daemon's user (or
    root) that nobody else can write to. Raises :class:`ListenError` (one line)."""
    why = allow_dir_problem(path)
    if why is None:
        return path
    if why == "does not exist":
        raise ListenError(f"{flag} directory {path} does not exist; make it (mkdir -m 700 {path}) "
                          "and copy the allowed NAME.key files into it")
    raise ListenError(f"{flag} directory {path} {why}")


def allow_dir_problem(path: str) -> str | None:
    """Why ``path`` must not be trusted as an allow-list (words after its name), or None."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "does not exist"
    except OSError as e:
        return f"cannot be read: {e.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    return _ownership_problem(st.st_uid, st.st_mode, path, "directory")


def _ownership_problem(owner: int, mode: int, path: str, what: str) -> str | None:
    """Why a ``what`` (directory, file) of an allow-list could have been written by someone else."""
    uid = os.geteuid()
    if owner not in (uid, 0):
        return (f"belongs to uid {owner}, not to the daemon's user (uid {uid}): its owner could let any key in; "
                f"use a {what} of your own")
    mode = stat.S_IMODE(mode)
    if mode & 0o022:
        who = "group and others" if mode & 0o022 == 0o022 else "group" if mode & 0o020 else "others"
        return (f"is writable by {who} (mode {mode:04o}): they could let any key in; "
                f"run `chmod go-w {path}`")
    return None


def check_endpoint(endpoint: str) -> None:
    """``tcp://HOST:PORT`` with a numeric port; raises :class:`ListenError`."""
    if not endpoint.startswith("tcp://"):
        raise ListenError(f"--listen takes tcp://HOST:PORT, got {endpoint!r}")
    host, sep, port = endpoint[6:].rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ListenError(f"--listen takes tcp://HOST:PORT with a port from 1 to 65535, got {endpoint!r}")


def listener_socket(ctx: zmq.Context, listen: Listen, *, heartbeat_s: float, missed: int) -> zmq.Socket:
    """A ROUTER with CurveZMQ and ZAP on, not yet bound; the caller sets its queue limits.

    ZMTP heartbeats close a connection whose peer went silent (a host that vanished
    without a FIN), a little after the router has given up on it (``missed``
    heartbeats), so the router's clearer verdict ("stopped responding") comes first.
    """
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, listen.public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, listen.secret)
    sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
    try:
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
    except (AttributeError, zmq.ZMQError):
        pass  # a libzmq without the option: our handler is bound before we listen, and outlives us
    ivl_ms = int(heartbeat_s * 1000)
    sock.setsockopt(zmq.HEARTBEAT_IVL, ivl_ms)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, ivl_ms * (missed + 2))
    sock.setsockopt(zmq.HEARTBEAT_TTL, ivl_ms * (missed + 2))
    sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_IVL_MS)
    return sock


def bind_listener(sock: zmq.Socket, endpoint: str) -> str:
    """Bind ``sock``; returns the endpoint bound. Raises :class:`ListenError` (one line)."""
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as e:
        raise ListenError(f"cannot listen on {endpoint}: {zmq.strerror(e.errno)}") from None
    last = sock.getsockopt(zmq.LAST_ENDPOINT)
    return last.decode() if isinstance(last, bytes) else str(last)


class AllowList:
    """Client public keys: the ``*.key`` files in one directory, re-read when it changes.

    The directory is opened once, at start, and always read through that descriptor: if
    its path is later made to name another directory (a parent renamed and a new one put
    in its place, a symlink swapped), the list still comes from the directory that was
    checked, and a warning says so. Every lookup rescans it (names, inodes, sizes, mtimes:
    a few stat calls, once per connection) and reloads only if that changed. A file that
    does not hold a key, or that someone else could have written (not ours or root's, or
    writable by group or others), is skipped with a warning rather than locking everyone
    out; a directory that cannot be read, or that others could write to, allows nobody.
    """

    def __init__(self, directory: str, role: str = ROLE_FRONTEND) -> None:
        self.directory = directory
        self.role = role
        self._signature: tuple | None = None
        self._keys: dict[bytes, str] = {}
        self._moved_warned = False
        self._fd: int | None = None
        self._open_error = "closed"
        try:
            self._fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            self._open_error = e.strerror

    def lookup(self, public_z85: bytes) -> str | None:
        """The name (file name without ``.key``) the key is allowed under, or None."""
        self.refresh()
        return self._keys.get(public_z85)

    def __len__(self) -> int:
        return len(self._keys)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def refresh(self) -> None:
        fd = self._fd
        if fd is None:
            return self._refuse_all(f"cannot be opened: {self._open_error}")
        try:
            st = os.fstat(fd)
        except OSError as e:
            return self._refuse_all(f"cannot be read: {e.strerror}")
        problem = _ownership_problem(st.st_uid, st.st_mode, self.directory, "directory")
        if problem is not None:
            return self._refuse_all(problem)
        self._check_still_there(st)
        try:
            entries = []
            with os.scandir(fd) as it:
                for entry in it:
                    if entry.name.endswith(".key") and not entry.name.startswith("."):
                        try:
                            est = entry.stat()
                        except OSError:
                            continue  # removed while we looked
                        if stat.S_ISREG(est.st_mode):
                            entries.append((entry.name, est.st_ino, est.st_size, est.st_mtime_ns, est.st_uid,
                                            est.st_mode))
        except OSError as e:
            return self._refuse_all(f"cannot be read: {e.strerror}")
        signature = tuple(sorted(entries))
        if signature == self._signature:
            return
        self._signature = signature
        keys: dict[bytes, str] = {}
        for name, _ino, _size, _mtime, uid, mode in signature:
            path = os.path.join(self.directory, name)
            why = _ownership_problem(uid, mode, path, "file")
            if why is not None:
                log.warning("allow-list file skipped", role=self.role, file=path, why=f"it {why}")
                continue
            try:
                keys[load_public_key(name, dir_fd=fd)] = name[: -len(".key")]
            except KeyFileError as e:
                log.warning("allow-list file skipped", role=self.role, file=path, why=str(e))
        self._keys = keys
        log.info("allow-list loaded", role=self.role, dir=self.directory, keys=sorted(keys.values()))

    def _check_still_there(self, st: os.stat_result) -> None:
        try:
            now = os.stat(self.directory)
            moved = (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino)
        except OSError:
            moved = True
        if moved and not self._moved_warned:
            log.warning("the allow-list directory was moved or replaced; still reading the one opened at start "
                        "(restart the daemon to use another)", role=self.role, dir=self.directory)
        self._moved_warned = moved

    def _refuse_all(self, problem: str) -> None:
        if self._signature != ("refused", problem):
            log.error("allow-list directory unusable; refusing every key", role=self.role, dir=self.directory,
                      why=problem)
        self._signature = ("refused", problem)
        self._keys = {}


class ZapHandler:
    """Answers libzmq's ZAP requests from the daemon's event loop.

    Bound at construction (before any listener exists), served once :meth:`start` puts it
    on the loop; requests that arrive in between wait in the socket.
    """

    def __init__(self, ctx: zmq.Context, allow: list[AllowList], domain: bytes = ZAP_DOMAIN) -> None:
        # One list per role that may join over the network.
        self.allow = list(allow)
        self.domain = domain
        self._throttle = Throttle(log)
        self._sock = ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            self._sock.bind(ZAP_ENDPOINT)
        except zmq.ZMQError as e:
            self._sock.close()
            raise ListenError(f"cannot start the authentication handler: {e.strerror}") from None
        self._zs: ZSocket | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._zs = ZSocket(self._sock, self._on_request, loop)

    def close(self) -> None:
        if self._zs is not None:
            self._zs.close()
            self._zs = None
        elif self._sock is not None:
            self._sock.close(linger=0)
        self._sock = None
        for allow in self.allow:
            allow.close()

    def _on_request(self, frames: list[zmq.Frame]) -> None:
        parts = [f.bytes for f in frames]
        try:
            reply = self.answer(parts)
        except Exception:
            log.exception("ZAP request failed")
            reply = _reply(parts[1] if len(parts) > 1 else b"", b"500", b"internal error")
        try:
            self._zs.send(reply, copy=True)
        except zmq.ZMQError as e:
            log.error("cannot answer a ZAP request", error=e.strerror)
        self._throttle.flush()

    def answer(self, parts: list[bytes]) -> list[bytes]:
        """The reply frames for one request (RFC 27)."""
        if len(parts) < 6 or parts[0] != ZAP_VERSION:
            self._throttle("warning", "malformed ZAP request", frames=len(parts))
            return _reply(parts[1] if len(parts) > 1 else b"", b"500", b"malformed request")
        _, request_id, domain, address, _identity, mechanism, *credentials = parts
        addr = address.decode("ascii", "replace")
        if domain != self.domain:
            return self._refuse(request_id, addr, None, f"unknown ZAP domain {domain.decode('ascii', 'replace')!r}")
        if mechanism != b"CURVE" or len(credentials) != 1 or len(credentials[0]) != 32:
            return self._refuse(request_id, addr, None, f"mechanism {mechanism.decode('ascii', 'replace')} is not allowed")
        key = z85.encode(credentials[0])
        names = {}
        for allow in self.allow:
            name = allow.lookup(key)
            if name is not None:
                names[allow.role] = name
        if not names:
            return self._refuse(request_id, addr, key, "key not in the allow-list")
        roles = list(names)
        log.info("connection accepted", address=addr, key=key.decode(), name=names[roles[0]], roles=roles)
        return _reply(request_id, b"200", b"OK", key, {ROLES_PROPERTY: ",".join(roles)})

    def _refuse(self, request_id: bytes, address: str, key: bytes | None, why: str) -> list[bytes]:
        self._throttle("warning", "connection refused", address=address, key=key.decode() if key else None, why=why)
        return _reply(request_id, b"400", why.encode())


def _reply(request_id: bytes, status: bytes, text: bytes, user_id: bytes = b"",
           metadata: dict[str, str] | None = None) -> list[bytes]:
    return [ZAP_VERSION, request_id, status, text, user_id, _metadata(metadata or {})]


def _metadata(properties: dict[str, str]) -> bytes:
    """ZMTP metadata encoding (RFC 23/27): name length (1 byte), name, value length (4), value."""
    out = b""
    for name, value in properties.items():
        n, v = name.encode("ascii"), value.encode()
        out += bytes([len(n)]) + n + struct.pack(">I", len(v)) + v
    return out


_PROTOCOL_ERRORS = {
    zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH: "the peer does not speak CurveZMQ",
    zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC: "the peer does not have this daemon's public key",
}


class HandshakeLog:
    """Logs connections to the listener that failed before ZAP was asked (rate-limited).

    ZAP refusals are not repeated here: the handler logged them with address and key.
    The listener's one monitor is the daemon's connection gate
    (:class:`broker.daemon.gate.ConnectionGate`), which hands :data:`EVENTS` here.
    """

    EVENTS = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL

    def __init__(self) -> None:
        self._throttle = Throttle(log)

    def on_event(self, event: dict) -> None:
        code = int(event["value"])
        if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            why = _PROTOCOL_ERRORS.get(code, f"ZMTP protocol error {code:#x}")
        elif event["event"] == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            why = f"the connection ended during the handshake ({os.strerror(code) if code else 'closed'})"
        else:
            return
        self._throttle("warning", "connection refused before authentication", why=why)
        self._throttle.flush()
