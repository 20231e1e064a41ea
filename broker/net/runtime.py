"""Where a daemon keeps its runtime state, and how peers find it.

The runtime dir is ``$SLUICE_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/sluice`` (when that
is a directory of ours), else for root ``/run/sluice`` (when ``/run`` is root's alone),
else ``/tmp/sluice-<uid>``. Away from ``/tmp`` where there is a choice: sandboxed
commands may write there (their ``/tmp``), and filling it must not fill the daemon's
disk too. It holds:

- ``broker.sock``: the broker's ROUTER endpoint (``ipc://``).
- ``run.sock``: direct runs of a local ``sluice run`` (docs/protocol.md, :mod:`broker.wire.direct`).
- ``token``: the auth token every peer presents in its HELLO (mode 0600).
- ``daemon.lock``: flocked by the running daemon, so a second one refuses to start.
- ``daemon.pid``: the running daemon's pid (for ``sluice daemon stop|status``).
- ``daemon.log``: the log of a daemon started in the background.
- ``journal/``: the sessions' event journals (:mod:`broker.daemon.journal`).

The default lies in a world-writable directory, so another local user may have been
there first: made the dir (theirs, or 0777), or a symlink to somewhere the daemon would
then write its pid, token and log into. So the dir is only used when it is a directory
of ours with mode 0700, reached through no symlink or directory someone else controls
(:func:`open_dir`), and everything in it is opened relative to a descriptor of it,
without following links (:func:`open_reused`, :func:`write_new`, :func:`read_file`,
:func:`remove`). An existing dir that does not pass is refused, never repaired: nothing
is chmodded, chowned or deleted in a dir sluice did not make or does not own.

Sandboxed commands never see this directory: the sandbox mounts an empty, read-only
tmpfs over it. Nor do they see sluice's home (:func:`sluice_home`: config, sessions,
keys) or the daemon's key file and allow-lists: :func:`hidden_paths` is the one list.
A listening daemon also publishes its key file and allow-lists in sluice's home
(:func:`publish_hidden`), so that every sandbox of that home hides them, made by
whichever sluice, started before or after it: executors read them for each command.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass

from landlock_helper.outcome import alive


class RuntimeDirError(RuntimeError):
    """The runtime dir is unusable (wrong owner, too open, not a directory, a symlink)."""


class RuntimeDirMissing(RuntimeDirError):
    """The runtime dir does not exist (and was not to be created)."""


def without_secrets(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default ours) minus secrets (:func:`landlock_helper.env.is_secret`),
    sluice's own kept: the environment for the daemon and its children. An API key
    exported in the shell that happened to start the daemon has no business in it (each
    session's key comes from the frontend that configured it)."""
    # Here, not at the top: the secret rule is the heaviest import of a `sluice` start-up
    # that never needs it (the parser, --help, `sluice daemon status`).
    from landlock_helper.env import is_secret

    return {
        name: value
        for name, value in (os.environ if environ is None else environ).items()
        if name.upper().startswith("SLUICE_") or not is_secret(name, value)
    }


# The checkout sluice runs from (the directory holding the ``broker`` package), so that the
# processes it starts (a daemon, executors, the agent) run the same code, installed or not.
SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def with_source_root(env: dict[str, str]) -> dict[str, str]:
    """``env`` with :data:`SOURCE_ROOT` first on its PYTHONPATH (changed in place, returned)."""
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = SOURCE_ROOT + (os.pathsep + path if path else "")
    return env


def sluice_home(env: Mapping[str, str] | None = None) -> str:
    """``$SLUICE_HOME``, else ``~/.sluice``: config, sessions (rollouts), history, keys.
    ``env`` (default ``os.environ``) is the environment to take both from."""
    env = os.environ if env is None else env
    explicit = env.get("SLUICE_HOME")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    return os.path.join(env.get("HOME") or os.path.expanduser("~"), ".sluice")


def read_token(path: str) -> str:
    """The token in the file ``path`` (a token comes only from a file: argv and the
    environment are visible to others). :class:`TokenError`, one line, if the file cannot
    be read, is not ASCII or is empty."""
    try:
        with open(path, encoding="ascii") as f:
            token = f.read().strip()
    except OSError as e:
        raise TokenError(f"cannot read token file {path}: {e.strerror}") from None
    except ValueError:
        raise TokenError(f"token file {path} is not ASCII text") from None
    if not token:
        raise TokenError(f"token file {path} is empty")
    return token


class TokenError(ValueError):
    """A token file that gives no token; ``str()`` is one line."""


def ensure_sluice_home() -> str | None:
    """Create sluice's home (0700) if it is missing, so that it can be hidden from
    sandboxed commands from the start: hiding mounts over an existing path, and a keys
    dir or config made later then lies inside the hidden one. Returns the error (one
    line) if it cannot be made; an existing home is left as it is."""
    path = sluice_home()
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as e:
        return f"cannot create sluice's home {path}: {e.strerror}"
    return None


def hidden_paths(*paths: str) -> tuple[str, ...]:
    """What sandboxed commands must not see: ``paths`` (the runtime dir, the daemon's key
    file and allow-list dirs, ...) plus sluice's home and what listening daemons of this
    home published, each resolved once here (a symlink swapped in later changes nothing),
    in order, without a path that lies inside another one of the list (hiding the outer
    one hides it)."""
    resolved: list[str] = []
    for path in (*paths, sluice_home(), *published_hidden()):
        real = os.path.realpath(path)
        if real not in resolved:
            resolved.append(real)
    return tuple(p for p in resolved if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in resolved))


# In sluice's home (hidden from every sandbox of it): one file per listening daemon, named
# for its pid, listing the paths it asks every sandbox to hide, one a line.
PUBLISHED_DIR = "hidden"


def publish_hidden(paths) -> str:
    """Publish ``paths`` (absolute, resolved) for every sandbox of this sluice home to hide,
    until :func:`unpublish_hidden`; returns the file written (raises OSError). What
    daemons that are gone left behind is removed first."""
    directory = os.path.join(sluice_home(), PUBLISHED_DIR)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    for name, pid in _publishers(directory):
        if not alive(pid):
            unpublish_hidden(os.path.join(directory, name))
    path = os.path.join(directory, f"daemon-{os.getpid()}")
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"{p}\n" for p in paths))
    os.replace(tmp, path)
    return path


def unpublish_hidden(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def published_hidden() -> tuple[str, ...]:
    """What the listening daemons of this sluice home that still run asked to hide (a
    daemon killed without its clean-up leaves its file; its pid then names no process, or,
    reused, another one: hiding a little too long is the safe side)."""
    directory = os.path.join(sluice_home(), PUBLISHED_DIR)
    paths: list[str] = []
    for name, pid in _publishers(directory):
        if not alive(pid):
            continue
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                paths += [line for line in f.read().splitlines() if os.path.isabs(line)]
        except (OSError, UnicodeDecodeError):
            continue
    return tuple(dict.fromkeys(paths))


def _publishers(directory: str) -> list[tuple[str, int]]:
    """(file name, daemon pid) of each file published in ``directory``."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [(name, int(name[7:])) for name in names if name.startswith("daemon-") and name[7:].isdigit()]


def default_runtime_dir() -> str:
    explicit = os.environ.get("SLUICE_RUNTIME_DIR")
    if explicit:
        return os.path.abspath(explicit)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg):
        try:
            st = os.stat(xdg)
        except OSError:
            st = None
        # Another user's XDG_RUNTIME_DIR (left in the environment by su or sudo) is theirs.
        if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
            return os.path.join(xdg, "sluice")
    if os.getuid() == 0 and _roots_alone(RUN_DIR):
        return os.path.join(RUN_DIR, "sluice")
    return f"/tmp/sluice-{os.getuid()}"


# Root's runtime dirs live here when it is a directory only root can write.
RUN_DIR = "/run"


def _roots_alone(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


# -- the directory ---------------------------------------------------------------------

# Directories on the way are only looked through (O_PATH: no read permission needed).
_WALK = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC
_MAX_SYMLINKS = 40


def _trusted(uid: int) -> tuple[int, ...]:
    return (0, uid)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISREG, "a regular file"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISFIFO, "a fifo")):
        if test(mode):
            return name
    return "a device or special file"


def open_dir(path: str, *, create: bool = False) -> int:
    """A descriptor (O_DIRECTORY, close-on-exec) of the runtime dir ``path``, checked.

    Walks ``path`` from ``/`` one component at a time, relative to the previous one's
    descriptor. Every directory on the way must belong to root or to us and must not be
    writable by anyone else unless it is sticky (like /tmp, where nobody can rename or
    replace an entry of ours); a symlink on the way is followed only when root or we own
    it. The last component must be a directory (not a symlink) owned by us with mode
    0700. With ``create``, missing components are made (0700, ours); a dir we just made
    is the only one ever chmodded. Raises :class:`RuntimeDirError` (one line for a
    person), :class:`RuntimeDirMissing` when it does not exist and ``create`` is false.
    """
    if not os.path.isabs(path):
        raise RuntimeDirError(f"runtime dir {path} is not an absolute path")
    uid = os.getuid()
    parts = [p for p in path.split("/") if p and p != "."]
    if not parts:
        raise RuntimeDirError("the runtime dir cannot be /")
    fd = os.open("/", _WALK)
    where = "/"
    links = 0
    try:
        while parts:
            name = parts.pop(0)
            last = not parts
            _check_on_the_way(fd, where, path, uid)
            if name == "..":
                fd = _swap(fd, os.open("..", _WALK, dir_fd=fd))
                where = os.path.dirname(where.rstrip("/")) or "/"
                continue
            here = os.path.join(where, name)
            made = False
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if not create:
                    raise RuntimeDirMissing(f"runtime dir {path} does not exist") from None
                try:
                    os.mkdir(name, 0o700, dir_fd=fd)
                    made = True
                except FileExistsError:  # someone was quicker: judged below like any other
                    pass
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                if last:
                    raise RuntimeDirError(f"runtime dir {path} is a symbolic link; refusing to use it "
                                          "(remove it, or set SLUICE_RUNTIME_DIR to a directory of yours)")
                if st.st_uid not in _trusted(uid):
                    raise RuntimeDirError(f"runtime dir {path}: {here} is a symbolic link owned by uid {st.st_uid}; "
                                          "refusing to follow it")
                links += 1
                if links > _MAX_SYMLINKS:
                    raise RuntimeDirError(f"runtime dir {path}: too many symbolic links")
                target = os.readlink(name, dir_fd=fd)
                if target.startswith("/"):
                    fd = _swap(fd, os.open("/", _WALK))
                    where = "/"
                parts = [p for p in target.split("/") if p and p != "."] + parts
                continue
            flags = (os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if last else _WALK
            try:
                nfd = os.open(name, flags | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as e:
                why = _kind(st.st_mode) if e.errno in (errno.ENOTDIR, errno.ELOOP) else e.strerror
                raise RuntimeDirError(f"runtime dir {path}: cannot open {here}: {why}") from None
            fd = _swap(fd, nfd)
            where = here
            st = os.fstat(fd)  # what was opened is what counts, not what lstat saw
            if not stat.S_ISDIR(st.st_mode):
                raise RuntimeDirError(f"runtime dir {path}: {here} is not a directory")
            if last:
                _check_final(fd, st, path, uid, made)
            elif st.st_uid not in _trusted(uid):
                raise RuntimeDirError(f"runtime dir {path}: {here} belongs to uid {st.st_uid}; refusing to use it")
        result, fd = fd, -1
        return result
    except OSError as e:
        raise RuntimeDirError(f"runtime dir {path}: {e.strerror or e}") from None
    finally:
        if fd >= 0:
            os.close(fd)


def _swap(old: int, new: int) -> int:
    os.close(old)
    return new


def _check_on_the_way(fd: int, where: str, path: str, uid: int) -> None:
    """A directory we are about to look a name up in: nobody but root and us may change its
    entries (a sticky one only lets each owner change their own)."""
    st = os.fstat(fd)
    if st.st_uid not in _trusted(uid):
        raise RuntimeDirError(f"runtime dir {path}: {where} belongs to uid {st.st_uid}; refusing to use it")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise RuntimeDirError(f"runtime dir {path}: {where} is writable by others and not sticky; "
                              "refusing to use it (set SLUICE_RUNTIME_DIR elsewhere)")


def _check_final(fd: int, st: os.stat_result, path: str, uid: int, made: bool) -> None:
    if st.st_uid != uid:
        raise RuntimeDirError(f"runtime dir {path} belongs to uid {st.st_uid}, not to you (uid {uid}); "
                              "refusing to use it "
                              "(remove it, or set SLUICE_RUNTIME_DIR to a directory of yours)")
    if stat.S_IMODE(st.st_mode) & 0o777 != 0o700:
        if made:  # ours, just made, empty: an odd umask is all it can be
            os.fchmod(fd, 0o700)
            return
        raise RuntimeDirError(f"runtime dir {path} has mode {stat.S_IMODE(st.st_mode):04o}, not 0700; "
                              "refusing to use it "
                              "(others may have put files in it: remove it, or set SLUICE_RUNTIME_DIR)")


# -- files in it, relative to its descriptor ---------------------------------------------


def _check_own_file(fd: int, shown: str) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise RuntimeDirError(f"{shown} is {_kind(st.st_mode)}, not a regular file; refusing to use it")
    if st.st_uid != os.getuid():
        raise RuntimeDirError(f"{shown} belongs to uid {st.st_uid}, not to you; refusing to use it")
    if st.st_nlink != 1:
        raise RuntimeDirError(f"{shown} has {st.st_nlink} links (a hard link to another file?); refusing to use it")
    return st


def open_reused(dir_fd: int, name: str, flags: int, *, shown: str | None = None) -> int:
    """Open (creating, 0600) the file ``name`` in ``dir_fd`` for reuse across daemons: never
    through a symlink, never a fifo or device, and only a regular file of ours with one
    link. ``flags``: the access mode and extras like O_APPEND. Raises RuntimeDirError."""
    shown = shown or name
    try:
        fd = os.open(name, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except OSError as e:
        why = "it is a symbolic link" if e.errno == errno.ELOOP else e.strerror
        raise RuntimeDirError(f"cannot open {shown}: {why}") from None
    try:
        _check_own_file(fd, shown)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_new(dir_fd: int, name: str, data: bytes) -> tuple[int, int]:
    """Replace ``name`` in ``dir_fd`` atomically with a new 0600 file holding ``data``;
    returns its (st_dev, st_ino), for :func:`remove`. Whatever ``name`` was (a symlink
    included) is replaced, not written through."""
    tmp = name + ".new"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dir_fd)  # left by a crash; removes the entry, never a target
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        st = os.fstat(fd)
    finally:
        os.close(fd)
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    return st.st_dev, st.st_ino


def read_file(dir_fd: int, name: str, limit: int = 4096) -> tuple[bytes, os.stat_result] | None:
    """The first ``limit`` bytes of ``name`` in ``dir_fd`` and its stat, if it is a regular
    file of ours with one link (not reached through a symlink); None otherwise."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = _check_own_file(fd, name)
        return os.pread(fd, limit, 0), st
    except (OSError, RuntimeDirError):
        return None
    finally:
        os.close(fd)


def remove(dir_fd: int, name: str, ident: tuple[int, int] | None = None) -> bool:
    """Unlink ``name`` in ``dir_fd`` if it is still the file ``ident`` (st_dev, st_ino)
    names; with ``ident`` None, whatever non-directory it is. Never follows a link;
    True if something was removed."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    if stat.S_ISDIR(st.st_mode) or (ident is not None and (st.st_dev, st.st_ino) != ident):
        return False
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        return False
    return True


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

    def open(self, *, create: bool = False) -> int:
        """A checked descriptor of the dir (see :func:`open_dir`); the caller closes it."""
        return open_dir(self.path, create=create)

    def new_token(self, dir_fd: int) -> str:
        """Write a fresh token (0600, replaced atomically) into the dir ``dir_fd`` and return it."""
        import secrets  # here: only a starting daemon makes one, and frontends start faster without hashlib's load

        token = secrets.token_hex(32)
        write_new(dir_fd, "token", token.encode())
        return token

    def read(self, name: str, limit: int = 4096) -> bytes | None:
        """The start of the file ``name`` in the dir, if the dir and it pass the checks."""
        try:
            fd = self.open()
        except RuntimeDirError:
            return None
        try:
            got = read_file(fd, name, limit)
        finally:
            os.close(fd)
        return got[0] if got is not None else None

    def read_token(self) -> str:
        data = self.read("token")
        try:
            return data.decode("ascii").strip() if data else ""
        except UnicodeDecodeError:
            return ""

    def read_pid(self) -> int | None:
        data = self.read("daemon.pid", 32)
        try:
            return int(data.strip()) if data else None
        except ValueError:
            return None
