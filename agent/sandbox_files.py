"""The agent's only way to the files it reads or writes for the model: through the sandbox.

The agent process runs with the user's rights, so it never uses them on the model's
behalf. Every file it reads for the model (the files a patch updates, ``AGENTS.md``)
and every change a patch makes is a batch of :mod:`landlock_helper.fileops` operations,
run by the session's executors in a sandbox of the session's policy, exactly as a
``shell`` call of that session runs: so the kernel decides, at the moment of each open,
write, rename and unlink, with the sandbox's view (its private /tmp, the hidden
directories, read-only ``.git``/``.sluice``), and the executor's checks after a command
hold for patches too.

:class:`SandboxFiles` runs batches over a :class:`~agent.exec_runner.CommandRunner`, a
sandboxed process each, or several in one (a :class:`Conversation`: the read a patch is
verified against, then its write, when nothing is asked between them);
:func:`read_ops` and :func:`states_from` are the pure halves (a batch of reads, and what
its answer says of each path), also used to read in-process where no sandbox is
involved (unit tests).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from broker.wire.protocol import ExecOutputStream
from landlock_helper import fileops
from landlock_helper.fileops import DIR, FILE, NONE, OTHER

if TYPE_CHECKING:
    from agent.exec_runner import CommandRunner, ExecResult, InteractiveProcess
    from broker.wire.protocol import SandboxPolicy
    from landlock_helper.limits import Limits

__all__ = ["DIR", "FILE", "NONE", "OTHER", "Conversation", "FileAccessError", "FileState", "SandboxFiles",
           "read_ops", "states_from"]

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


class _Batches:
    """Runs batches (:meth:`run`); reads paths with one (:meth:`read`)."""

    async def run(self, ops: list[dict]) -> dict:
        raise NotImplementedError

    async def read(self, reads: Iterable[str], stats: Iterable[str] = (),
                   max_bytes: int = fileops.MAX_READ) -> dict[str, FileState]:
        """Each path of ``reads`` (contents, at most ``max_bytes``) and ``stats``, as the
        sandbox sees it."""
        ops = read_ops(reads, stats, max_bytes)
        if not ops:
            return {}
        return states_from(ops, await self.run(ops))


def _failure(result: ExecResult, timeout_ms: int) -> FileAccessError | None:
    """Why a run of the builtin did not give its answers (None: it did)."""
    if result.error:
        return FileAccessError(result.error)
    if result.timed_out:
        return FileAccessError(f"the file operations took longer than {timeout_ms / 1000:g} s")
    if result.returncode != 0:
        said = result.stderr.decode("utf-8", "replace").strip()
        return FileAccessError(f"the sandbox's file operations failed (exit {result.returncode})"
                               + (f": {said}" if said else ""))
    return None


def _answer(data: bytes) -> dict:
    try:
        return fileops.decode(data)
    except fileops.BatchError as e:
        raise FileAccessError(f"unreadable answer from the sandbox: {e}") from None


class SandboxFiles(_Batches):
    """Runs batches of file operations in the sandbox of ``policy`` (whose
    ``disk-write-cwd`` is ``sandbox_cwd``, the session's directory): each in a sandboxed
    process of its own (:meth:`run`), or several in one (:meth:`conversation`)."""

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
        failure = _failure(result, self.timeout_ms)
        if failure is not None:
            raise failure
        return _answer(result.stdout)

    @contextlib.asynccontextmanager
    async def conversation(self) -> AsyncIterator[Conversation]:
        """One sandboxed process that carries out batch after batch (each one's answer
        before the next is sent: a read, then a write computed from it), ended on leaving."""
        conversation = Conversation(self.timeout_ms)
        conversation.process = await self.runner.start_interactive(
            [fileops.PROGRAM], self.sandbox_cwd, self.policy, conversation.on_output, env={},
            sandbox_cwd=self.sandbox_cwd, limits=self.limits, fileops=True)
        try:
            yield conversation
        finally:
            await conversation.close()


class Conversation(_Batches):
    """Batches carried out in turn by one sandboxed process (:meth:`SandboxFiles.conversation`)."""

    def __init__(self, timeout_ms: int) -> None:
        self.timeout_ms = timeout_ms
        self.process: InteractiveProcess | None = None
        self._out = bytearray()
        self._err = bytearray()
        self._more = asyncio.Event()

    def on_output(self, stream: ExecOutputStream, chunk: bytes) -> None:
        (self._out if stream == ExecOutputStream.STDOUT else self._err).extend(chunk)
        self._more.set()

    async def run(self, ops: list[dict]) -> dict:
        process = self.process
        assert process is not None
        try:
            async with asyncio.timeout(self.timeout_ms / 1000):
                if not await process.write(fileops.encode({"ops": ops}) + b"\n"):
                    raise await self._ended()
                while (end := self._out.find(b"\n")) < 0:
                    if process.done:
                        raise await self._ended()
                    self._more.clear()
                    ended = asyncio.ensure_future(process.wait())
                    more = asyncio.ensure_future(self._more.wait())
                    try:
                        await asyncio.wait([ended, more], return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        ended.cancel()
                        more.cancel()
        except TimeoutError:
            await process.cancel()
            raise FileAccessError(f"the file operations took longer than {self.timeout_ms / 1000:g} s") from None
        line = bytes(self._out[:end])
        del self._out[:end + 1]
        return _answer(line)

    async def _ended(self) -> FileAccessError:
        result = await self.process.wait()
        result = msgspec.structs.replace(result, stderr=bytes(self._err))
        return _failure(result, self.timeout_ms) or FileAccessError("the sandbox's file operations ended early")

    async def close(self) -> None:
        """End of file: the builtin exits (stopped if it does not, in time)."""
        process = self.process
        if process is None or process.done:
            return
        process.close_stdin()
        try:
            async with asyncio.timeout(self.timeout_ms / 1000):
                await process.wait()
        except TimeoutError:
            await process.cancel()
