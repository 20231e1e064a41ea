"""What a sandboxed process comes to: how it ended, or why the sandbox could not be made.

Shared by the Linux sandbox (:mod:`landlock_helper.spawn`) and the macOS one
(:mod:`landlock_helper.darwin`)."""

from __future__ import annotations

from dataclasses import dataclass


class SandboxError(RuntimeError):
    """The sandbox cannot be set up (kernel too old, bad cwd, ...); message for a person."""


@dataclass(frozen=True)
class Outcome:
    """How a sandboxed command ended: an exit code, a killing signal, or an error."""

    exit_code: int | None = None
    signal: int | None = None
    error: str | None = None
    # Lines for a person about what the command left that sluice undid (a planted .git).
    notes: tuple[str, ...] = ()
    # The resource limit the command ran into, for a person ("killed: memory limit 512 MiB
    # reached"); see landlock_helper.limits.what_hit.
    limit: str | None = None
