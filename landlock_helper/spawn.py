"""Spawn one command inside the sandbox (implementation in progress)."""

from __future__ import annotations

from dataclasses import dataclass


class SandboxError(RuntimeError):
    """The sandbox cannot be set up (kernel too old, bad cwd, ...); message for a person."""


@dataclass(frozen=True)
class Outcome:
    exit_code: int | None = None
    signal: int | None = None
    error: str | None = None


class SandboxedProcess:
    pid: int
    init_pid: int
    done_fds: tuple[int, ...]

    def terminate(self) -> None: ...
    def kill(self) -> None: ...
    def poll(self) -> Outcome | None: ...
    def wait(self, timeout: float | None = None) -> Outcome | None: ...
    def close(self) -> None: ...


def spawn(argv, *, cwd, env, policy, stdout, stderr, stdin=None, hidden_paths=()) -> SandboxedProcess:
    raise NotImplementedError
