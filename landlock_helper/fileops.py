"""File operations done for the agent from inside a session's sandbox.

The agent runs with the user's rights, so it never touches a file for the model itself:
it sends a batch of these operations to a process in the session's sandbox (the same
policy, view and checks a ``shell`` call of the session gets) and reads the results.
:mod:`landlock_helper.spawn` runs :func:`serve` as a *builtin*: the sandboxed command
process, instead of exec'ing a program, calls it over its stdin and stdout and exits. So
nothing of sluice (nor a Python interpreter) needs to be visible inside the sandbox, and
the kernel checks every open, rename and unlink at the moment it is made.

A batch is JSON (one object in, one out, each on a line of its own; file contents
base64); one run serves batches until end of file (see :func:`serve`)::

    {"ops": [{"op": "read", "path": P, "max": N},
             {"op": "stat", "path": P},
             {"op": "write", "path": P, "data": B64, "expect": SHA256_OR_EMPTY},
             {"op": "delete", "path": P, "expect": SHA256_OR_EMPTY}]}
    -> {"results": [one per op], "failed": null | {"path", "error", "errno", "stage"}}

``read`` and ``stat`` follow symlinks as far as the sandbox's view goes, and answer
``{"kind": "file" | "dir" | "other" | "none", ...}`` (``none`` with the ``error`` that
says why; a symlink itself also gives its ``link``). ``read`` opens with ``O_NONBLOCK``
(a FIFO never blocks), reads regular files only, at most ``max`` bytes (``truncated``
says there was more), and gives the file's permission bits as ``mode``.

``write`` and ``delete`` ops of one batch are one change, made after every read:
first every ``expect`` is checked (the SHA-256 of the file's bytes as the caller saw
them, ``""`` for no readable file: a file changed since then refuses the whole change,
compare-and-swap done here, where the write happens); then each new content goes to a
temporary file beside its target (parents made as needed; an existing file's mode
kept; a symlink written through to its target), and only when all are written are they
renamed into place, within the directory opened for the temporary file, and the deletes
done. A failure before the renames leaves nothing
behind. No path component named ``.git`` or ``.sluice`` is ever created (a new
repository is git's to make, not a patch's; the executor's post-command check would
move one aside too). The first failure is ``failed``; ``stage`` says how far it got
(``check``, ``write``, or ``update``: the change was partly made).

Stdlib only, imported before any sandbox is forked (nothing is imported inside).
"""

from __future__ import annotations

import binascii
import errno
import json
import os
import stat
from typing import NamedTuple

from landlock_helper.policy import PROTECTED_SUBDIRS

# CPython's own SHA-256, not hashlib's: hashlib loads OpenSSL (3.5 MiB resident) into the
# process every sandbox is forked from.
try:
    from _sha2 import sha256  # Python 3.12+
except ImportError:
    try:
        from _sha256 import sha256  # Python 3.11
    except ImportError:  # a build without them
        from hashlib import sha256

# What a sandbox shows for the builtin's argv[0] (``ps``, logs).
PROGRAM = "sluice-fileops"
# A read's default bound, and the largest batch serve() takes.
MAX_READ = 16 * 1024 * 1024
MAX_REQUEST = 48 * 1024 * 1024

FILE, DIR, OTHER, NONE = "file", "dir", "other", "none"
CHANGE_OPS = ("write", "delete")


class BatchError(ValueError):
    """A batch that is not one: for a person, one line."""


# -- building and reading batches (both sides) --------------------------------------------


def digest(data: bytes | None) -> str:
    """What ``expect`` holds for ``data`` (``""``: no readable file)."""
    return "" if data is None else sha256(data).hexdigest()


def read_op(path: str, max_bytes: int = MAX_READ) -> dict:
    return {"op": "read", "path": path, "max": max_bytes}


def stat_op(path: str) -> dict:
    return {"op": "stat", "path": path}


def write_op(path: str, data: bytes, expect: bytes | None) -> dict:
    return {"op": "write", "path": path, "data": _b64(data), "expect": digest(expect)}


def delete_op(path: str, expect: bytes | None) -> dict:
    return {"op": "delete", "path": path, "expect": digest(expect)}


def encode(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def decode(data: bytes) -> dict:
    """A batch or its answer; :class:`BatchError` if it is neither."""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise BatchError(f"not a JSON object: {e}") from None
    if not isinstance(obj, dict):
        raise BatchError("not a JSON object")
    return obj


def file_data(result: dict) -> bytes | None:
    """The bytes a ``read`` result carries (None for anything but a file)."""
    data = result.get("data")
    if result.get("kind") != FILE or not isinstance(data, str):
        return None
    try:
        return binascii.a2b_base64(data, strict_mode=True)
    except (binascii.Error, ValueError):
        return None


def _b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


# -- carrying a batch out (inside the sandbox) ------------------------------------------


def serve(fd_in: int = 0, fd_out: int = 1, fd_err: int = 2) -> int:
    """Carry out the batches read from ``fd_in``, answering each on ``fd_out``, until end
    of file; 0, or 2 with a line on ``fd_err`` at the first that is not a batch.

    A batch is one line (:func:`encode` never writes a newline), or all that is left
    before end of file; each answer is one line. So one run can serve a conversation:
    a read batch, then, once the caller has read its answer, the write batch."""
    pending = bytearray()
    served = eof = False
    while True:
        while b"\n" not in pending and not eof:
            chunk = os.read(fd_in, 1 << 20)
            eof = not chunk
            pending += chunk
            if len(pending) > MAX_REQUEST:
                return _complain(fd_err, f"batch larger than {MAX_REQUEST} bytes")
        end = pending.find(b"\n")
        if end < 0 and served and not pending.strip():
            return 0
        line = bytes(pending[:end] if end >= 0 else pending)
        del pending[:end + 1 if end >= 0 else len(pending)]
        try:
            answer = encode(run(decode(line))) + b"\n"
        except BatchError as e:
            return _complain(fd_err, str(e))
        served = True
        view = memoryview(answer)
        while view:
            view = view[os.write(fd_out, view):]
        if eof and not pending.strip():
            return 0


def _complain(fd: int, message: str) -> int:
    os.write(fd, f"{PROGRAM}: {message}\n".encode())
    return 2


def run(batch: dict) -> dict:
    """Carry ``batch`` out with this process's rights (see the module docstring)."""
    ops = batch.get("ops")
    if not isinstance(ops, list) or not all(isinstance(op, dict) and isinstance(op.get("path"), str)
                                            and op["path"] and "\0" not in op["path"] for op in ops):
        raise BatchError("'ops' must be a list of operations, each with a path")
    results: list[dict] = []
    changes: list[_Change] = []
    for op in ops:
        kind = op.get("op")
        if kind == "read":
            limit = op.get("max", MAX_READ)
            if not isinstance(limit, int) or limit < 0:
                raise BatchError("a read's 'max' must be a non-negative integer")
            results.append(_read(op["path"], limit))
        elif kind == "stat":
            results.append(_stat(op["path"]))
        elif kind in CHANGE_OPS:
            data = None
            if kind == "write":
                try:
                    data = binascii.a2b_base64(op["data"], strict_mode=True)
                except (KeyError, TypeError, binascii.Error, ValueError):
                    raise BatchError(f"a write needs its 'data' in base64 ({op['path']})") from None
            expect = op.get("expect")
            if expect is not None and not isinstance(expect, str):
                raise BatchError("'expect' must be a SHA-256 in hex, or empty")
            changes.append(_Change(kind, op["path"], data, expect))
            results.append({})
        else:
            raise BatchError(f"unknown operation {kind!r}")
    failed = _change(changes) if changes else None
    return {"results": results, "failed": failed}


def _kind(mode: int) -> str:
    return FILE if stat.S_ISREG(mode) else DIR if stat.S_ISDIR(mode) else OTHER


def _none(err: OSError) -> dict:
    return {"kind": NONE, "error": err.strerror or str(err), "errno": err.errno or 0}


def _link(path: str) -> dict:
    try:
        return {"link": os.readlink(path)}
    except OSError:
        return {}  # not a symlink (or gone): nothing to say


def _stat(path: str) -> dict:
    try:
        st = os.stat(path)
    except OSError as e:
        return {**_none(e), **_link(path)}
    return {"kind": _kind(st.st_mode), "mode": stat.S_IMODE(st.st_mode), **_link(path)}


def _read(path: str, limit: int) -> dict:
    result = _link(path)
    try:
        # Non-blocking: a FIFO (or a device that waits) must not hold the batch up.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ENXIO, errno.EOPNOTSUPP):  # a socket, or a FIFO nobody writes
            return {**result, "kind": OTHER}
        return {**result, **_none(e)}
    try:
        st = os.fstat(fd)
        kind = _kind(st.st_mode)
        result.update(kind=kind, mode=stat.S_IMODE(st.st_mode))
        if kind != FILE:
            return result
        data = _read_fd(fd, limit + 1)
    except OSError as e:
        return {**result, **_none(e)}
    finally:
        os.close(fd)
    result["truncated"] = len(data) > limit
    result["data"] = _b64(data[:limit])
    return result


def _read_fd(fd: int, most: int) -> bytes:
    parts, size = [], 0
    while size < most:
        chunk = os.read(fd, min(most - size, 1 << 20))
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)


def _current_digest(path: str) -> str:
    """:func:`digest` of the regular file at ``path`` as it is now, read in full."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return digest(None)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return digest(None)
        h = sha256()
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
        return h.hexdigest()
    except OSError:
        return digest(None)
    finally:
        os.close(fd)


def _failure(path: str, stage: str, err: OSError) -> dict:
    return {"path": path, "stage": stage, "error": err.strerror or str(err), "errno": err.errno or 0}


class _Change(NamedTuple):
    op: str  # "write" or "delete"
    path: str
    data: bytes | None
    expect: str | None  # None: not checked


class _Staged(NamedTuple):
    dir_fd: int  # the directory it goes into, opened once: a link swapped in later moves nothing
    temp: str
    name: str
    path: str  # for a person


def _change(ops: list[_Change]) -> dict | None:
    for op in ops:
        if op.expect is not None and _current_digest(op.path) != op.expect:
            return {"path": op.path, "stage": "check", "error": "changed since it was read", "errno": 0}

    staged: list[_Staged] = []
    made: list[str] = []
    dirs: dict[str, int] = {}  # each directory opened once, however many files go there
    try:
        for op in ops:
            if op.op != "write":
                continue
            target = os.path.realpath(op.path) if os.path.islink(op.path) else op.path
            try:
                _make_parents(os.path.dirname(target), made)
                if not os.path.lexists(target):
                    _refuse_protected(target)
                staged.append(_stage(target, op.data, dirs))
            except OSError as e:
                for s in staged:
                    _unlink_quietly(s.temp, s.dir_fd)
                for directory in reversed(made):
                    try:
                        os.rmdir(directory)
                    except OSError:
                        pass
                return _failure(op.path, "write", e)

        # Nothing on disk has changed yet; from here on only renames and unlinks remain.
        done = 0
        path = ""
        try:
            for s in staged:
                path = s.path
                os.replace(s.temp, s.name, src_dir_fd=s.dir_fd, dst_dir_fd=s.dir_fd)
                done += 1
            for op in ops:
                if op.op == "delete":
                    path = op.path
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        pass
        except OSError as e:
            for s in staged[done:]:
                _unlink_quietly(s.temp, s.dir_fd)
            return _failure(path, "update", e)
        return None
    finally:
        for fd in dirs.values():
            os.close(fd)


def _refuse_protected(path: str) -> None:
    name = os.path.basename(path)
    if name in PROTECTED_SUBDIRS:
        raise OSError(errno.EPERM, f"Operation not permitted (a patch may not create {name})", path)


def _make_parents(directory: str, made: list[str]) -> None:
    missing: list[str] = []
    while directory and not os.path.isdir(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    for d in reversed(missing):
        _refuse_protected(d)
        os.mkdir(d)
        made.append(d)


def _stage(target: str, data: bytes, dirs: dict[str, int]) -> _Staged:
    """``data`` in a new temporary file beside ``target``, with ``target``'s mode if it
    exists; its directory opened (once, kept in ``dirs``)."""
    directory, name = os.path.split(target)
    directory = directory or "."
    if directory not in dirs:
        dirs[directory] = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    dir_fd = dirs[directory]
    temp = f".{name}.{os.urandom(6).hex()}.tmp"
    try:
        mode = stat.S_IMODE(os.stat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        mode = 0o666  # a new file: the umask applies, as for any file we create
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if mode != 0o666:
            os.fchmod(fd, mode)  # the umask must not narrow an existing file's mode
    except OSError:
        os.close(fd)
        _unlink_quietly(temp, dir_fd)
        raise
    os.close(fd)
    return _Staged(dir_fd, temp, name, target)


def _unlink_quietly(name: str, dir_fd: int | None = None) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def rehearse() -> None:
    """Use what a batch uses (JSON, SHA-256, base64) once, in the process sandboxes are
    forked from, so that no first use inside a sandbox has anything left to load."""
    decode(encode({"ops": [write_op("x", b"x", b"x")]}))
    file_data({"kind": FILE, "data": _b64(b"x")})
