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

Stdlib only: this module is imported between fork and exec and by ``sluice sandbox``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

FULL_READ = "disk-full-read-access"
USER_TEMP = "disk-write-platform-user-temp-folder"
GLOBAL_TEMP = "disk-write-platform-global-temp-folder"
WRITE_CWD = "disk-write-cwd"
WRITE_FOLDER = "disk-write-folder"
FULL_WRITE = "disk-full-write-access"
NETWORK = "network-full-access"

UNIT_PERMISSIONS = (FULL_READ, USER_TEMP, GLOBAL_TEMP, WRITE_CWD, FULL_WRITE, NETWORK)

MODES = ("read-only", "workspace-write", "danger-full-access")

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


class PolicyError(ValueError):
    """A policy that cannot be understood; the message is meant for a person."""


@dataclass(frozen=True)
class Permission:
    """One Codex sandbox permission; ``folder`` is set only for ``disk-write-folder``."""

    kind: str
    folder: str | None = None

    def __post_init__(self) -> None:
        if self.kind == WRITE_FOLDER:
            if not self.folder or not os.path.isabs(self.folder):
                raise PolicyError(f"disk-write-folder needs an absolute folder, got {self.folder!r}")
        elif self.kind not in UNIT_PERMISSIONS:
            raise PolicyError(f"unknown sandbox permission {self.kind!r}")
        elif self.folder is not None:
            raise PolicyError(f"permission {self.kind!r} takes no folder")

    def to_json(self) -> str | dict:
        if self.kind == WRITE_FOLDER:
            return {WRITE_FOLDER: {"folder": self.folder}}
        return self.kind

    @classmethod
    def from_json(cls, value: object) -> Permission:
        if isinstance(value, str):
            return cls(value)
        if isinstance(value, dict) and len(value) == 1 and WRITE_FOLDER in value:
            inner = value[WRITE_FOLDER]
            if isinstance(inner, dict) and isinstance(inner.get("folder"), str):
                return cls(WRITE_FOLDER, inner["folder"])
        raise PolicyError(f"not a sandbox permission: {value!r}")


@dataclass(frozen=True)
class SandboxPolicy:
    """An ordered, de-duplicated set of permissions."""

    permissions: tuple[Permission, ...] = field(default_factory=tuple)

    # -- construction -------------------------------------------------------------

    @classmethod
    def from_mode(
        cls,
        mode: str,
        *,
        writable_roots: tuple[str, ...] | list[str] = (),
        network: bool = False,
    ) -> SandboxPolicy:
        """The policy for a mode name plus extra writable roots and network access."""
        if mode == "read-only":
            kinds = [FULL_READ]
        elif mode == "workspace-write":
            kinds = [FULL_READ, USER_TEMP, GLOBAL_TEMP, WRITE_CWD]
        elif mode == "danger-full-access":
            kinds = [FULL_READ, FULL_WRITE, NETWORK]
        else:
            raise PolicyError(f"unknown sandbox mode {mode!r}; expected one of {', '.join(MODES)}")
        perms = [Permission(k) for k in kinds]
        for root in writable_roots:
            if not os.path.isabs(root):
                raise PolicyError(f"writable root must be an absolute path, got {root!r}")
            perms.append(Permission(WRITE_FOLDER, os.path.normpath(root)))
        if network:
            perms.append(Permission(NETWORK))
        return cls.of(perms)

    @classmethod
    def of(cls, permissions) -> SandboxPolicy:
        seen: list[Permission] = []
        for p in permissions:
            if p not in seen:
                seen.append(p)
        return cls(tuple(seen))

    @classmethod
    def from_json(cls, value: object) -> SandboxPolicy:
        """Parse Codex's JSON form ``{"permissions": [...]}`` (or a bare mode name)."""
        if isinstance(value, str):
            return cls.from_mode(value)
        if not isinstance(value, dict) or not isinstance(value.get("permissions"), list):
            raise PolicyError('a sandbox policy is {"permissions": [...]} or a mode name')
        return cls.of(Permission.from_json(p) for p in value["permissions"])

    def to_json(self) -> dict:
        return {"permissions": [p.to_json() for p in self.permissions]}

    # -- questions ----------------------------------------------------------------

    def _has(self, kind: str) -> bool:
        return any(p.kind == kind for p in self.permissions)

    @property
    def full_read(self) -> bool:
        return self._has(FULL_READ)

    @property
    def full_write(self) -> bool:
        return self._has(FULL_WRITE)

    @property
    def network(self) -> bool:
        return self._has(NETWORK)

    @property
    def unrestricted(self) -> bool:
        return self.full_read and self.full_write and self.network

    @property
    def mode(self) -> str:
        """The closest mode name, for display."""
        if self.unrestricted:
            return "danger-full-access"
        if self._has(WRITE_CWD):
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
            if p.kind == USER_TEMP:
                tmpdir = env.get("TMPDIR", "")
                if os.path.isabs(tmpdir):
                    roots.append(tmpdir)
                    real = os.path.realpath(tmpdir)
                    if real != tmpdir:
                        roots.append(real)
            elif p.kind == GLOBAL_TEMP:
                roots.append("/tmp")
            elif p.kind == WRITE_CWD:
                roots.append(cwd)
            elif p.kind == WRITE_FOLDER:
                roots.append(p.folder)  # type: ignore[arg-type]
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
