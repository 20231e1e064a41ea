"""The daemon's network side: the CurveZMQ listener, its ZAP handler and the allow-list.

``sluice daemon --listen tcp://HOST:PORT --key FILE --allow DIR`` binds a second ROUTER
next to the local ipc one. It is a CurveZMQ server: every connection is encrypted and
proves the daemon by its key (``--key``, a ``.key_secret`` file). Which clients get
through the handshake is decided by ZAP (ZeroMQ RFC 27): for each new connection libzmq
asks the handler bound at ``inproc://zeromq.zap.01`` in the same context. Ours
(:class:`ZapHandler`) accepts the CURVE mechanism only, and only client keys found as
``*.key`` files in the allow-list directory (:class:`AllowList`, re-read when the
directory changes, so adding a key takes no restart). It answers with the client's Z85
public key as the User-Id, which libzmq attaches to every message of that connection;
the router reads it off the hello and keeps it on the peer.

libzmq lets every client in when no ZAP handler is bound, unless the socket enforces its
domain. So the handler is bound before the listener, the listener sets
``ZAP_ENFORCE_DOMAIN`` (where libzmq has it), and the listener is closed first.

Connections that fail before ZAP is asked (no CurveZMQ at all, a client that does not
have the daemon's public key) are seen through a socket monitor and logged by
:class:`HandshakeLog`, rate-limited: a stranger retrying in a loop cannot flood the log.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import stat
from dataclasses import dataclass

import structlog
import zmq
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

from broker.logging import Throttle
from broker.remote import KeyFileError, load_public_key, load_secret_key
from broker.zloop import ZSocket

__all__ = ["ZAP_DOMAIN", "AllowList", "HandshakeLog", "Listen", "ListenError", "ZapHandler", "bind_listener", "listener_socket"]

log = structlog.get_logger(component="zap")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_VERSION = b"1.0"
ZAP_DOMAIN = b"sluice"
# A connection that has not finished its handshake by then is dropped.
HANDSHAKE_IVL_MS = 10_000
_monitor_ids = itertools.count(1)


class ListenError(ValueError):
    """``--listen`` cannot be honoured (bad endpoint, key file or allow dir, address in use);
    ``str(e)`` is one line for a person."""


@dataclass(frozen=True)
class Listen:
    """Where and as whom the daemon listens over tcp, and whom it lets in."""

    endpoint: str
    public: bytes
    secret: bytes
    allow_dir: str
    # The daemon's secret key file: hidden from sandboxed commands like the runtime dir.
    key_file: str

    @classmethod
    def from_args(cls, endpoint: str | None, key_file: str | None, allow_dir: str | None) -> Listen:
        """Validate ``--listen/--key/--allow``; raises :class:`ListenError`."""
        if not endpoint:
            raise ListenError("--key and --allow go with --listen tcp://HOST:PORT")
        check_endpoint(endpoint)
        if not key_file or not allow_dir:
            raise ListenError(
                "--listen needs --key FILE (the daemon's NAME.key_secret, from `sluice keys new NAME`) "
                "and --allow DIR (the clients' public .key files); the daemon never listens unauthenticated"
            )
        try:
            public, secret = load_secret_key(key_file)
        except KeyFileError as e:
            raise ListenError(str(e)) from None
        allow_dir = os.path.abspath(allow_dir)
        if not os.path.isdir(allow_dir):
            what = "is not a directory" if os.path.exists(allow_dir) else "does not exist"
            raise ListenError(f"allow-list directory {allow_dir} {what}; make it and copy clients' NAME.key files into it")
        return cls(endpoint, public, secret, allow_dir, os.path.abspath(key_file))


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

    Every lookup rescans the directory (names, inodes, sizes, mtimes: a few stat calls,
    once per connection) and reloads only if that changed. A file that does not hold a
    key is skipped with a warning rather than locking everyone out; a directory that
    cannot be read allows nobody.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._signature: tuple | None = None
        self._keys: dict[bytes, str] = {}

    def lookup(self, public_z85: bytes) -> str | None:
        """The name (file name without ``.key``) the key is allowed under, or None."""
        self.refresh()
        return self._keys.get(public_z85)

    def __len__(self) -> int:
        return len(self._keys)

    def refresh(self) -> None:
        try:
            entries = []
            with os.scandir(self.directory) as it:
                for entry in it:
                    if entry.name.endswith(".key") and not entry.name.startswith("."):
                        try:
                            st = entry.stat()
                        except OSError:
                            continue  # removed while we looked
                        if stat.S_ISREG(st.st_mode):
                            entries.append((entry.name, st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError as e:
            if self._signature != ("unreadable",):
                log.error("cannot read the allow-list directory; refusing every key", dir=self.directory,
                          error=e.strerror)
            self._signature = ("unreadable",)
            self._keys = {}
            return
        signature = tuple(sorted(entries))
        if signature == self._signature:
            return
        self._signature = signature
        keys: dict[bytes, str] = {}
        for name, *_ in signature:
            path = os.path.join(self.directory, name)
            try:
                keys[load_public_key(path)] = name[: -len(".key")]
            except KeyFileError as e:
                log.warning("allow-list file skipped", file=path, why=str(e))
        self._keys = keys
        log.info("allow-list loaded", dir=self.directory, keys=sorted(keys.values()))


class ZapHandler:
    """Answers libzmq's ZAP requests from the daemon's event loop.

    Bound at construction (before any listener exists), served once :meth:`start` puts it
    on the loop; requests that arrive in between wait in the socket.
    """

    def __init__(self, ctx: zmq.Context, allow: AllowList, domain: bytes = ZAP_DOMAIN) -> None:
        self.allow = allow
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
        else:
            self._sock.close(linger=0)

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
        name = self.allow.lookup(key)
        if name is None:
            return self._refuse(request_id, addr, key, "key not in the allow-list")
        log.info("connection accepted", address=addr, key=key.decode(), name=name)
        return _reply(request_id, b"200", b"OK", key)

    def _refuse(self, request_id: bytes, address: str, key: bytes | None, why: str) -> list[bytes]:
        self._throttle("warning", "connection refused", address=address, key=key.decode() if key else None, why=why)
        return _reply(request_id, b"400", why.encode())


def _reply(request_id: bytes, status: bytes, text: bytes, user_id: bytes = b"") -> list[bytes]:
    return [ZAP_VERSION, request_id, status, text, user_id, b""]


_PROTOCOL_ERRORS = {
    zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH: "the peer does not speak CurveZMQ",
    zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC: "the peer does not have this daemon's public key",
}


class HandshakeLog:
    """Logs connections to the listener that failed before ZAP was asked (rate-limited).

    ZAP refusals are not repeated here: the handler logged them with address and key.
    """

    def __init__(self, sock: zmq.Socket, ctx: zmq.Context, loop: asyncio.AbstractEventLoop) -> None:
        address = f"inproc://sluice-listener-monitor-{next(_monitor_ids)}"
        sock.monitor(address, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        pair = ctx.socket(zmq.PAIR)
        pair.setsockopt(zmq.LINGER, 0)
        pair.connect(address)
        self._sock = sock
        self._throttle = Throttle(log)
        self._zs = ZSocket(pair, self._on_event, loop)

    def _on_event(self, frames: list[zmq.Frame]) -> None:
        try:
            event = parse_monitor_message([f.bytes for f in frames])
        except (RuntimeError, ValueError):
            return
        code = int(event["value"])
        if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            why = _PROTOCOL_ERRORS.get(code, f"ZMTP protocol error {code:#x}")
        elif event["event"] == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            why = f"the connection ended during the handshake ({os.strerror(code) if code else 'closed'})"
        else:
            return
        self._throttle("warning", "connection refused before authentication", why=why)
        self._throttle.flush()

    def close(self) -> None:
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self._zs.close()
