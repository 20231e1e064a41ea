"""The agent's only way to the files it reads or writes for the model: through the sandbox.

The agent process runs with the user's rights, so it never uses them on the model's
behalf. Every file it reads for the model (the files a patch updates, ``AGENTS.md``)
and every change a patch makes is a batch of :mod:`landlock_helper.fileops` operations,
run by the session's executors in a sandbox of the session's policy, exactly as a
``shell`` call of that session runs: so the kernel decides, at the moment of each open,
write, rename and unlink, with the sandbox's view (its private /tmp, the hidden
directories, read-only ``.git``/``.sluice``), and the executor's checks after a command
hold for patches too.

:class:`SandboxFiles` runs batches over a :class:`~agent.exec_runner.CommandRunner`;
:func:`read_ops` and :func:`states_from` are the pure halves (a batch of reads, and what
its answer says of each path), also used to read in-process where no sandbox is
involved (unit tests).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from landlock_helper import fileops
from landlock_helper.fileops import DIR, FILE, NONE, OTHER

if TYPE_CHECKING:
    from agent.exec_runner import CommandRunner
    from broker.wire.protocol import SandboxPolicy
    from landlock_helper.limits import Limits

__all__ = ["DIR", "FILE", "NONE", "OTHER", "FileAccessError", "FileState", "SandboxFiles", "read_ops", "states_from"]

# A batch that takes longer than this is stopped (a file system that hangs): the tool
# call fails, the session goes on.
FILEOPS_TIMEOUT_MS = 30_000


class FileAccessError(RuntimeError):
    """The sandbox could not carry a batch out at all; says why, in one line."""


@dataclass(frozen=True)
class FileState:
    """A path as the sandbox saw it: ``kind`` one of ``file``/``dir``/``other``/``none``
    (``error`` then says why), a file's ``data`` (its first bytes if ``truncated``) and
    permission bits, and ``link`` if the path itself is a symlink (to where)."""

    kind: str
    data: bytes | None = None
    mode: int | None = None
    error: str | None = None
    link: str | None = None
    truncated: bool = False

    @property
    def is_file(self) -> bool:
        return self.kind == FILE

    @property
    def is_dir(self) -> bool:
        return self.kind == DIR

    def not_a_file_reason(self) -> str | None:
        """Why this is not a regular file that can be read whole (None: it is)."""
        if self.kind == FILE:
            return "File too large" if self.truncated else None
        if self.kind == DIR:
            return "Is a directory"
        if self.kind == OTHER:
            return "Not a regular file"
        return self.error or "No such file or directory"


def read_ops(reads: Iterable[str], stats: Iterable[str] = (), max_bytes: int = fileops.MAX_READ) -> list[dict]:
    """One batch: read each of ``reads`` (at most ``max_bytes``), stat each of ``stats``."""
    return [fileops.read_op(p, max_bytes) for p in reads] + [fileops.stat_op(p) for p in stats]


def states_from(ops: list[dict], answer: Mapping) -> dict[str, FileState]:
    """Each path of a batch of reads and stats, as its answer describes it."""
    results = answer.get("results")
    if not isinstance(results, list) or len(results) != len(ops):
        raise FileAccessError("the sandbox's answer does not match the batch")
    states: dict[str, FileState] = {}
    for op, result in zip(ops, results):
        if not isinstance(result, dict):
            raise FileAccessError("the sandbox's answer does not match the batch")
        kind = result.get("kind")
        mode, link, error = result.get("mode"), result.get("link"), result.get("error")
        state = FileState(
            kind=kind if kind in (FILE, DIR, OTHER) else NONE,
            data=fileops.file_data(result) if op["op"] == "read" else None,
            mode=mode if isinstance(mode, int) else None,
            error=error if isinstance(error, str) else None,
            link=link if isinstance(link, str) else None,
            truncated=result.get("truncated") is True,
        )
        if op["op"] == "stat" and op["path"] in states:
            continue  # a read of the same path says more
        states[op["path"]] = state
    return states


class SandboxFiles:
    """Runs batches of file operations in the sandbox of ``policy`` (whose
    ``disk-write-cwd`` is ``sandbox_cwd``, the session's directory)."""

    def __init__(self, runner: CommandRunner, policy: SandboxPolicy, sandbox_cwd: str, *,
                 limits: Limits | None = None, timeout_ms: int = FILEOPS_TIMEOUT_MS) -> None:
        self.runner = runner
        self.policy = policy
        self.sandbox_cwd = sandbox_cwd
        self.limits = limits
        self.timeout_ms = timeout_ms

    async def run(self, ops: list[dict]) -> dict:
        """The answer to ``ops`` (see :mod:`landlock_helper.fileops`); raises
        :class:`FileAccessError` if the sandbox could not carry them out."""
        result = await self.runner.run_fileops(fileops.encode({"ops": ops}), self.sandbox_cwd, self.policy,
                                               self.timeout_ms,
                                               sandbox_cwd=self.sandbox_cwd, limits=self.limits)
        if result.error:
            raise FileAccessError(result.error)
        if result.timed_out:
            raise FileAccessError(f"the file operations took longer than {self.timeout_ms / 1000:g} s")
        if result.returncode != 0:
            said = result.stderr.decode("utf-8", "replace").strip()
            raise FileAccessError(f"the sandbox's file operations failed (exit {result.returncode})"
                                  + (f": {said}" if said else ""))
        try:
            return fileops.decode(result.stdout)
        except fileops.BatchError as e:
            raise FileAccessError(f"unreadable answer from the sandbox: {e}") from None

    async def read(self, reads: Iterable[str], stats: Iterable[str] = (),
                   max_bytes: int = fileops.MAX_READ) -> dict[str, FileState]:
        """Each path of ``reads`` (contents, at most ``max_bytes``) and ``stats``, as the
        sandbox sees it."""
        ops = read_ops(reads, stats, max_bytes)
        if not ops:
            return {}
        return states_from(ops, await self.run(ops))
