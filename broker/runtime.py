"""Where a daemon keeps its runtime state, and how peers find it.

The runtime dir is ``$SLUICE_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/sluice``, else
``/tmp/sluice-<uid>``. It is mode 0700 and holds:

- ``broker.sock``: the broker's ROUTER endpoint (``ipc://``).
- ``token``: the auth token every peer presents in its HELLO (mode 0600).
- ``daemon.lock``: flocked by the running daemon, so a second one refuses to start.
- ``daemon.pid``: the running daemon's pid (for ``sluice daemon stop|status``).
- ``daemon.log``: the log of a daemon started in the background.

Sandboxed commands never see this directory: the sandbox mounts an empty, read-only
tmpfs over it.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass


class RuntimeDirError(RuntimeError):
    """The runtime dir is unusable (wrong owner, too open, not a directory)."""


def without_secrets(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default ours) minus secrets (:func:`landlock_helper.env.is_secret`),
    sluice's own kept: the environment for the daemon and its children. An API key
    exported in the shell that happened to start the daemon has no business in it (each
    session's key comes from the frontend that configured it)."""
    from landlock_helper.env import is_secret

    return {
        name: value
        for name, value in (os.environ if environ is None else environ).items()
        if name.upper().startswith("SLUICE_") or not is_secret(name, value)
    }


def default_runtime_dir() -> str:
    explicit = os.environ.get("SLUICE_RUNTIME_DIR")
    if explicit:
        return os.path.abspath(explicit)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return os.path.join(xdg, "sluice")
    return f"/tmp/sluice-{os.getuid()}"


@dataclass(frozen=True)
class RuntimeDir:
    path: str

    @classmethod
    def default(cls) -> RuntimeDir:
        return cls(default_runtime_dir())

    @property
    def socket_path(self) -> str:
        return os.path.join(self.path, "broker.sock")

    @property
    def endpoint(self) -> str:
        return "ipc://" + self.socket_path

    @property
    def token_path(self) -> str:
        return os.path.join(self.path, "token")

    @property
    def lock_path(self) -> str:
        return os.path.join(self.path, "daemon.lock")

    @property
    def pid_path(self) -> str:
        return os.path.join(self.path, "daemon.pid")

    @property
    def log_path(self) -> str:
        return os.path.join(self.path, "daemon.log")

    def ensure(self) -> None:
        """Create the dir 0700, or check that an existing one is ours and private."""
        try:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
        except OSError as e:
            raise RuntimeDirError(f"cannot create runtime dir {self.path}: {e.strerror}") from None
        st = os.lstat(self.path)
        if not stat.S_ISDIR(st.st_mode):
            raise RuntimeDirError(f"runtime dir {self.path} is not a directory")
        if st.st_uid != os.getuid():
            raise RuntimeDirError(f"runtime dir {self.path} belongs to uid {st.st_uid}, not to you")
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.chmod(self.path, 0o700)

    def new_token(self) -> str:
        """Write a fresh token (0600, replaced atomically) and return it."""
        token = secrets.token_hex(32)
        tmp = self.token_path + ".new"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, token.encode())
        finally:
            os.close(fd)
        os.replace(tmp, self.token_path)
        return token

    def read_token(self) -> str:
        try:
            with open(self.token_path, encoding="ascii") as f:
                return f.read().strip()
        except OSError:
            return ""

    def read_pid(self) -> int | None:
        try:
            with open(self.pid_path, encoding="ascii") as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None
