"""Connecting over the network: CurveZMQ key files and where a remote daemon is.

A daemon started with ``sluice daemon --listen tcp://HOST:PORT`` accepts peers on that
endpoint only through CurveZMQ: every connection is encrypted, and the daemon lets in
only the public keys in its allow-list. Keys live in files in ZeroMQ's certificate
format (what ``zmq.auth.create_certificates`` writes): ``NAME.key`` holds the public key
and can be shared; ``NAME.key_secret`` holds both keys, mode 0600, and stays with its
owner. ``sluice keys new NAME`` makes a pair.

A frontend or an executor that connects remotely needs three things, collected in
:class:`Remote`: the endpoint, the daemon's public key (``--server-key FILE``, so it
cannot be talked to by an impostor) and its own key pair (``--key FILE``, the
``.key_secret`` file). Over ``tcp://`` there is no token: the key pair is the credential.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass

__all__ = ["KeyFileError", "Remote", "default_keys_dir", "load_public_key", "load_secret_key", "new_key_pair",
           "write_key_file"]

# A key file is a few hundred bytes; anything much bigger is not one.
_MAX_KEY_FILE = 64 * 1024


def default_keys_dir() -> str:
    """Where ``sluice keys new`` writes: ``$SLUICE_HOME/keys``, else ``~/.sluice/keys``.
    Sandboxed commands never see it (it is in sluice's home, which is hidden)."""
    # Here, not at the top: every `sluice` command's parser asks for this path, and the
    # runtime dir's module (with the secret rule) would double its start-up.
    from broker.net.runtime import sluice_home

    return os.path.join(sluice_home(), "keys")


class KeyFileError(ValueError):
    """A key file that is missing, unreadable or not a CurveZMQ key; ``str(e)`` is one line."""


def _load(path: str, dir_fd: int | None = None) -> tuple[bytes | None, bytes | None]:
    """(public, secret) from a key file in ZeroMQ's certificate format (what
    ``zmq.auth.load_certificate`` reads); ``path`` relative to ``dir_fd`` if given."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        raise KeyFileError(f"key file {path} does not exist") from None
    except OSError as e:
        raise KeyFileError(f"cannot read key file {path}: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise KeyFileError(f"key file {path} is not a file")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(_MAX_KEY_FILE)
        except OSError as e:
            raise KeyFileError(f"cannot read key file {path}: {e.strerror}") from None
    public = secret = None
    for line in data.splitlines():
        line = line.strip()
        if line.startswith(b"#") or b"=" not in line:
            continue
        value = line.split(b"=", 1)[1].strip(b" \t'\"")
        if line.startswith(b"public-key"):
            public = value
        elif line.startswith(b"secret-key"):
            secret = value
    if public is None:
        raise KeyFileError(f"{path} is not a CurveZMQ key file (make one with `sluice keys new NAME`)")
    for key in (public, secret):
        if key is not None and len(key) != 40:
            raise KeyFileError(f"{path} holds a malformed key (expected 40 Z85 characters)")
    return public, secret


def load_public_key(path: str, dir_fd: int | None = None) -> bytes:
    """The public key (Z85) in ``path`` (a ``.key`` or a ``.key_secret`` file; relative to
    the directory ``dir_fd`` if given)."""
    public, _ = _load(path, dir_fd)
    if not public:
        raise KeyFileError(f"{path} holds no public key")
    return public


def load_secret_key(path: str) -> tuple[bytes, bytes]:
    """(public, secret) from a ``.key_secret`` file, which only its owner may read."""
    public, secret = _load(path)
    if not public or not secret:
        raise KeyFileError(f"{path} holds no secret key; pass the NAME.key_secret file made by `sluice keys new`")
    mode = os.stat(path).st_mode & 0o777
    if mode & 0o077:
        raise KeyFileError(f"secret key file {path} is accessible by others (mode {mode:04o}); run `chmod 600 {path}`")
    return public, secret


def new_key_pair(directory: str, name: str) -> tuple[str, str]:
    """Write ``NAME.key`` and ``NAME.key_secret`` (0600) in ``directory``; returns their paths.

    Refuses to overwrite an existing pair.
    """
    import zmq.auth

    if not name or "/" in name or name.startswith("."):
        raise KeyFileError(f"bad key name {name!r}: use a plain file name such as 'laptop'")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    public_path = os.path.join(directory, f"{name}.key")
    secret_path = os.path.join(directory, f"{name}.key_secret")
    for path in (public_path, secret_path):
        if os.path.exists(path):
            raise KeyFileError(f"{path} exists already; remove it or choose another name")
    old = os.umask(0o077)
    try:
        zmq.auth.create_certificates(directory, name)
    finally:
        os.umask(old)
    os.chmod(secret_path, 0o600)
    os.chmod(public_path, 0o644)
    return public_path, secret_path


def write_key_file(path: str, public: bytes, secret: bytes | None = None) -> None:
    """Write a key file in ZeroMQ's certificate format for keys held in memory (Z85):
    a ``.key`` with ``public`` alone (mode 0644), or, with ``secret``, a ``.key_secret``
    (mode 0600 from its creation, never readable by others even for an instant).
    Replaces what is there."""
    lines = ["#   ZeroMQ CURVE certificate written by sluice", "metadata", "curve",
             f'    public-key = "{public.decode("ascii")}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode("ascii")}"')
    partial = f"{path}.{os.getpid()}.partial"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
                 0o600 if secret is not None else 0o644)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise


@dataclass(frozen=True)
class Remote:
    """A daemon reached over ``tcp://`` with CurveZMQ."""

    endpoint: str
    # Z85 keys (40 bytes each).
    server_public: bytes
    public: bytes
    secret: bytes

    @classmethod
    def from_files(cls, endpoint: str, server_key_file: str | None, key_file: str | None) -> Remote:
        """Raises :class:`KeyFileError` (one line) for a bad endpoint or key file."""
        if not endpoint.startswith("tcp://") or ":" not in endpoint[6:]:
            raise KeyFileError(f"--connect takes tcp://HOST:PORT, got {endpoint!r}")
        if not server_key_file:
            raise KeyFileError("--connect needs --server-key FILE (the daemon's public key)")
        if not key_file:
            raise KeyFileError("--connect needs --key FILE (your NAME.key_secret, from `sluice keys new NAME`)")
        server_public = load_public_key(server_key_file)
        public, secret = load_secret_key(key_file)
        return cls(endpoint, server_public, public, secret)

    def apply(self, sock) -> None:
        """Make ``sock`` (before it connects) a CurveZMQ client of this daemon."""
        import zmq

        sock.setsockopt(zmq.CURVE_SERVERKEY, self.server_public)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret)
        # Notice a peer that vanished without closing (a host gone) at the ZMTP level.
        sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 5000)
        sock.setsockopt(zmq.HEARTBEAT_TTL, 6000)
