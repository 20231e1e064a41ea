"""The environment a sandboxed command gets: the caller's, minus anything secret-looking.

A variable is dropped when its name contains one of :data:`SECRET_MARKERS`
(case-insensitive), unless the caller passes it explicitly. Variables that would hand
the command a way out of the sandbox (an ssh-agent or a session bus socket) go too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

SECRET_MARKERS = (
    "KEY",
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "CREDENTIAL",
    "AUTH",
    "PRIVATE",
    "COOKIE",
    "SESSION",
)

# Not secrets by name, but sockets/handles that reach outside the sandbox or the daemon.
ALWAYS_DROPPED = frozenset({"SSH_AUTH_SOCK", "DBUS_SESSION_BUS_ADDRESS", "GPG_AGENT_INFO"})
ALWAYS_DROPPED_PREFIXES = ("SLUICE_",)


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    if upper in ALWAYS_DROPPED or upper.startswith(ALWAYS_DROPPED_PREFIXES):
        return True
    return any(marker in upper for marker in SECRET_MARKERS)


def filter_env(env: Mapping[str, str], passthrough: Iterable[str] = ()) -> dict[str, str]:
    """``env`` without secret-looking variables, except the names in ``passthrough``."""
    keep = set(passthrough)
    return {k: v for k, v in env.items() if k in keep or not is_secret_name(k)}
