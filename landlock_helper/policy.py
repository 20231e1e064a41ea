"""Sandbox policy: the Codex permission list, the modes people type, and what they mean.

A policy is a list of permissions, exactly as Codex spells them in JSON::

    {"permissions": ["disk-full-read-access", "disk-write-cwd",
                     {"disk-write-folder": {"folder": "/srv/out"}}]}

The modes are shorthands for permission lists:

- ``read-only``: read everything, write nothing.
- ``workspace-write``: read everything; write the cwd, /tmp and $TMPDIR.
- ``danger-full-access``: no restriction at all.

Extra writable roots and network access add permissions to any mode. Inside every
writable root, ``.git`` and ``.sluice`` stay read-only (they hold hooks and config
that would let a command escalate the next time a person runs git or sluice).

:class:`SandboxPolicy` is sluice's one policy type: the Codex protocol and the wire carry
it as it is (its fields are that JSON; msgspec encodes and validates it like a Struct),
and the sandbox enforces it. :func:`is_beneath` and :func:`write_allowed` are the one rule
for where a write may land, for the sandbox and for the agent's checks alike.

Stdlib only: this module is imported between fork and exec and by ``sluice sandbox``.
"""

from __future__ import annotations

import enum
import functools
import os
import pwd
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal


class SandboxPermission(enum.StrEnum):
    """The permissions that are bare strings; ``disk-write-folder`` is a
    :class:`DiskWriteFolder` under that one key."""

    DISK_FULL_READ_ACCESS = "disk-full-read-access"
    DISK_WRITE_PLATFORM_USER_TEMP_FOLDER = "disk-write-platform-user-temp-folder"
    DISK_WRITE_PLATFORM_GLOBAL_TEMP_FOLDER = "disk-write-platform-global-temp-folder"
    DISK_WRITE_CWD = "disk-write-cwd"
    DISK_FULL_WRITE_ACCESS = "disk-full-write-access"
    NETWORK_FULL_ACCESS = "network-full-access"


# Short names for the sandbox's own code.
FULL_READ = SandboxPermission.DISK_FULL_READ_ACCESS
USER_TEMP = SandboxPermission.DISK_WRITE_PLATFORM_USER_TEMP_FOLDER
GLOBAL_TEMP = SandboxPermission.DISK_WRITE_PLATFORM_GLOBAL_TEMP_FOLDER
WRITE_CWD = SandboxPermission.DISK_WRITE_CWD
FULL_WRITE = SandboxPermission.DISK_FULL_WRITE_ACCESS
NETWORK = SandboxPermission.NETWORK_FULL_ACCESS
WRITE_FOLDER = "disk-write-folder"

MODES = ("read-only", "workspace-write", "danger-full-access")
_MODE_PERMISSIONS = {
    "read-only": (FULL_READ,),
    "workspace-write": (FULL_READ, USER_TEMP, GLOBAL_TEMP, WRITE_CWD),
    "danger-full-access": (FULL_READ, FULL_WRITE, NETWORK),
}

# Directories that stay read-only even inside a writable root.
PROTECTED_SUBDIRS = (".git", ".sluice")


def is_beneath(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or inside it (both absolute and normalised; no
    symlinks are resolved here)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def write_allowed(path: str, roots) -> bool:
    """Whether a write to ``path`` lands inside one of the writable ``roots`` and out of
    that root's protected subdirectories (all paths absolute, symlinks already resolved)."""
    return any(is_beneath(path, root) and not any(is_beneath(path, os.path.join(root, name)) for name in PROTECTED_SUBDIRS)
               for root in roots)


def refused_roots(env=None) -> frozenset[str]:
    """Directories never accepted as writable roots outside danger-full-access: / and the
    user's home directory (and every directory above it, which would contain it)."""
    env = os.environ if env is None else env
    return _refused_roots(os.geteuid(), env.get("HOME") or "")


@functools.lru_cache(maxsize=8)
def _refused_roots(euid: int, home_env: str) -> frozenset[str]:
    refused = {"/"}
    homes = {home_env}
    try:
        homes.add(pwd.getpwuid(euid).pw_dir)
    except KeyError:
        pass
    for home in homes:
        if not os.path.isabs(home):
            continue
        path = os.path.realpath(home)
        while path != "/":
            refused.add(path)
            path = os.path.dirname(path)
    return frozenset(refused)


def root_refusal(path: str) -> str | None:
    """Why the resolved ``path`` can never be a writable root outside danger-full-access,
    as the one line a person reads; None when it may be one. Said by the executor, which
    decides, and ahead of it by a caller on the same machine (:func:`broker.wire.run_args.check_run`)."""
    if path in refused_roots():
        what = "the root directory" if path == "/" else "your home directory or a directory above it"
        return (f"refusing to make {path} writable ({what}); run from a project directory, "
                "or use --sandbox read-only or danger-full-access")
    if any(part in PROTECTED_SUBDIRS for part in path.split("/")):
        return (f"refusing to make {path} writable (it is inside a repository's .git or .sluice); "
                "use --sandbox read-only or danger-full-access")
    return None


class PolicyError(ValueError):
    """A policy that cannot be understood; the message is meant for a person."""


def run_paths(cwd: str | None, writable: Iterable[str], readable: Iterable[str], *,
              here: bool = True) -> tuple[str, list[str], list[str]]:
    """A command's working directory (absolute; None: the current one), writable roots
    and readable directories (normalized), each absolute and, when they are to be found
    ``here`` (on this host), there: checked once for ``sluice run`` and ``sluice sandbox``
    alike. Raises :class:`PolicyError`."""
    if cwd is None:
        try:
            cwd = os.getcwd()
        except FileNotFoundError:
            raise PolicyError("the current directory no longer exists; cd somewhere else or pass a cwd") from None
    cwd = os.path.abspath(cwd)
    if here and not os.path.isdir(cwd):
        what = "is not a directory" if os.path.exists(cwd) else "does not exist"
        raise PolicyError(f"working directory {cwd} {what}")
    roots = []
    for path in writable:
        if not isinstance(path, str) or not os.path.isabs(path):
            raise PolicyError(f"writable path must be absolute: {path!r}")
        if here and not os.path.exists(path):
            raise PolicyError(f"writable path does not exist: {path}")
        roots.append(path)
    shown = []
    for path in readable:
        if not isinstance(path, str) or not os.path.isabs(path):
            raise PolicyError(f"readable path must be absolute: {path!r}")
        if here and not os.path.isdir(path):
            what = "is not a directory" if os.path.exists(path) else "does not exist"
            raise PolicyError(f"readable path {path} {what}")
        shown.append(os.path.normpath(path))
    return cwd, roots, shown


class DiskWriteFolder(dict):
    """Write access beneath one absolute folder: ``{"folder": "/srv/out"}``.

    A dict (of one key) so that it is its own JSON, for the sandbox (stdlib only) and for
    the wire's codecs alike."""

    def __init__(self, folder: str) -> None:
        if not isinstance(folder, str) or not os.path.isabs(folder):
            raise PolicyError(f"disk-write-folder needs an absolute folder, got {folder!r}")
        super().__init__(folder=folder)

    @property
    def folder(self) -> str:
        return self["folder"]

    @classmethod
    def from_json(cls, value: object) -> DiskWriteFolder:
        if not isinstance(value, dict) or set(value) != {"folder"}:
            raise PolicyError(f'disk-write-folder is {{"folder": "/absolute/path"}}, got {value!r}')
        return cls(value["folder"])


# One entry of SandboxPolicy.permissions, as Codex spells it.
PermissionEntry = SandboxPermission | dict[Literal["disk-write-folder"], DiskWriteFolder]


def Permission(kind: str, folder: str | None = None) -> PermissionEntry:  # noqa: N802 - reads as a type
    """The permission entry ``kind`` names (``folder`` only for ``disk-write-folder``)."""
    if kind == WRITE_FOLDER:
        return {WRITE_FOLDER: DiskWriteFolder(folder)}
    if folder is not None:
        raise PolicyError(f"permission {kind!r} takes no folder")
    try:
        return SandboxPermission(kind)
    except ValueError:
        raise PolicyError(f"unknown sandbox permission {kind!r}") from None


def _entry_from_json(value: object) -> PermissionEntry:
    if isinstance(value, str):
        return Permission(value)
    if isinstance(value, dict) and len(value) == 1 and WRITE_FOLDER in value:
        return {WRITE_FOLDER: DiskWriteFolder.from_json(value[WRITE_FOLDER])}
    raise PolicyError(f"not a sandbox permission: {value!r}")


@dataclass(frozen=True)
class SandboxPolicy:
    """What a command may do: Codex's ``{"permissions": [...]}``, an ordered list of
    :class:`SandboxPermission` values and ``{"disk-write-folder": DiskWriteFolder}``
    entries. The one policy type of sluice: the protocol and the wire carry it as it is
    (its fields are its JSON), the sandbox enforces it."""

    permissions: list[PermissionEntry] = field(default_factory=list)

    def __post_init__(self) -> None:
        entries = list(self.permissions)
        for entry in entries:
            if isinstance(entry, dict):
                if len(entry) != 1 or not isinstance(entry.get(WRITE_FOLDER), DiskWriteFolder):
                    raise PolicyError('a folder permission is {"disk-write-folder": {"folder": ...}}')
            elif not isinstance(entry, SandboxPermission):
                raise PolicyError(f"not a sandbox permission: {entry!r}")
        object.__setattr__(self, "permissions", entries)

    # -- construction -------------------------------------------------------------

    @classmethod
    def from_mode(
        cls,
        mode: str,
        writable_roots: tuple[str, ...] | list[str] = (),
        network: bool = False,
    ) -> SandboxPolicy:
        """The policy for a mode a person typed, plus extra writable roots and network access."""
        if mode not in _MODE_PERMISSIONS:
            raise PolicyError(f"unknown sandbox mode {mode!r}; expected one of {', '.join(MODES)}")
        entries: list[PermissionEntry] = list(_MODE_PERMISSIONS[mode])
        for root in writable_roots:
            if not os.path.isabs(root):
                raise PolicyError(f"writable root must be an absolute path, got {root!r}")
            entries.append(Permission(WRITE_FOLDER, os.path.normpath(root)))
        if network:
            entries.append(NETWORK)
        return cls.of(entries)

    @classmethod
    def of(cls, permissions) -> SandboxPolicy:
        """A policy of ``permissions``, duplicates dropped, order kept."""
        seen: list[PermissionEntry] = []
        for p in permissions:
            if p not in seen:
                seen.append(p)
        return cls(seen)

    @classmethod
    def from_json(cls, value: object) -> SandboxPolicy:
        """Parse Codex's JSON form ``{"permissions": [...]}`` (or a bare mode name)."""
        if isinstance(value, str):
            return cls.from_mode(value)
        if not isinstance(value, dict) or not isinstance(value.get("permissions"), list):
            raise PolicyError('a sandbox policy is {"permissions": [...]} or a mode name')
        return cls.of(_entry_from_json(p) for p in value["permissions"])

    def to_json(self) -> dict:
        """Plain builtins (str, dict, list): what ``json`` and ``marshal`` take."""
        return {"permissions": [{WRITE_FOLDER: dict(p[WRITE_FOLDER])} if isinstance(p, dict) else str(p)
                                for p in self.permissions]}

    # -- questions ----------------------------------------------------------------

    @property
    def full_read(self) -> bool:
        return FULL_READ in self.permissions

    @property
    def full_write(self) -> bool:
        return FULL_WRITE in self.permissions

    @property
    def network(self) -> bool:
        return NETWORK in self.permissions

    @property
    def unrestricted(self) -> bool:
        return self.full_read and self.full_write and self.network

    # Codex's names for the same questions.
    def has_full_disk_read_access(self) -> bool:
        return self.full_read

    def has_full_disk_write_access(self) -> bool:
        return self.full_write

    def has_full_network_access(self) -> bool:
        return self.network

    def is_unrestricted(self) -> bool:
        return self.unrestricted

    @property
    def writable_folders(self) -> list[str]:
        """The folders of the ``disk-write-folder`` permissions, in order."""
        return [p[WRITE_FOLDER].folder for p in self.permissions if isinstance(p, dict)]

    @property
    def mode(self) -> str:
        """The closest mode name, for display."""
        if self.unrestricted:
            return "danger-full-access"
        if WRITE_CWD in self.permissions:
            return "workspace-write"
        return "read-only"

    def writable_roots(self, cwd: str, env: dict[str, str] | None = None) -> list[str]:
        """Absolute, normalised writable roots for a command run in ``cwd``.

        ``env`` supplies $TMPDIR (the command's environment, not ours). Roots that do
        not exist are kept: Landlock skips them, Seatbelt matches nothing.
        """
        env = os.environ if env is None else env
        roots: list[str] = []
        for p in self.permissions:
            if isinstance(p, dict):
                roots.append(p[WRITE_FOLDER].folder)
            elif p == USER_TEMP:
                tmpdir = env.get("TMPDIR", "")
                if os.path.isabs(tmpdir):
                    roots.append(tmpdir)
                    real = os.path.realpath(tmpdir)
                    if real != tmpdir:
                        roots.append(real)
            elif p == GLOBAL_TEMP:
                roots.append("/tmp")
            elif p == WRITE_CWD:
                roots.append(cwd)
        out: list[str] = []
        for r in roots:
            r = os.path.normpath(r)
            if r not in out:
                out.append(r)
        return out

    def read_only_subpaths(self, cwd: str, env: dict[str, str] | None = None) -> list[str]:
        """Existing ``.git`` / ``.sluice`` entries directly inside any writable root."""
        out: list[str] = []
        for root in self.writable_roots(cwd, env):
            for name in PROTECTED_SUBDIRS:
                path = os.path.join(root, name)
                if os.path.lexists(path) and path not in out:
                    out.append(path)
        return out
