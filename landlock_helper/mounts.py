"""The command's view of the filesystem, built in the sandbox's own mount namespace.

What a command may change is decided twice: Landlock says which files it may write,
and this view makes everything else read-only at the mount level, which also covers
what Landlock has no right for (mode, owner, times, xattrs of files it can read).

The trusted side (the executor, before it hands a command over) resolves the command's
directory and writable roots once, to canonical paths with their device and inode
(:func:`pin`). Inside the sandbox nothing is resolved by name again: each pinned path is
opened without following any symlink and must be the very directory that was checked,
or the command does not start. So swapping a directory for a symlink between two
commands (or during one's start) changes nothing.

The view is built in two steps, and nothing of it reaches the host (every mount is
private to the sandbox's namespace):

warm, by the sandbox's init before any command is known (:func:`prepare`)
    a fresh /proc; a private /dev (a tmpfs with the harmless nodes bound from the host,
    a devpts instance of its own, so no other terminal is visible, and its own
    /dev/shm); an empty read-only tmpfs over every hidden path; sluice's own /tmp in
    place of the host's (see :func:`scratch_dir`); then the whole tree read-only.
per command, in the command's process before exec (:func:`apply`)
    each writable root gets a read-write clone of itself mounted on top of it, which
    also makes it a mount point: it cannot be renamed or removed, so the workspace keeps
    its shape; ``.git`` and ``.sluice`` in each root and in its direct subdirectories
    (and the targets of a ``.git`` symlink or ``gitdir:`` file inside a root) get a
    read-only clone on top; /tmp goes read-only unless the policy writes temp folders;
    /dev/shm is bounded by the command's memory limit (:func:`bound_shm`).

Host /tmp is never visible: it holds other programs' sockets (tmux, X11, ssh-agent),
credentials (Kerberos ticket caches), other repositories and other sluice daemons'
runtime dirs. A command's directory or writable root that lies in the host's /tmp is
bound in at the same path, and so is a readable root (``--readable``, read-only): a
virtual environment or a tool the user unpacked there. sluice's /tmp is one directory
per user on the host, shared by every sandboxed command of that user, so one command's
/tmp files are there for the next.

Stdlib and ctypes only, like the rest of the sandbox layer.
"""

from __future__ import annotations

import ctypes
import os
import stat
import time
from collections import namedtuple

from landlock_helper import _libc, gitdir
from landlock_helper.host_tmp import TMP, in_tmp, scratch_path
from landlock_helper.policy import PROTECTED_SUBDIRS, SandboxPolicy, is_beneath, root_refusal

OPEN_TREE_CLONE = 1
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOVE_MOUNT_T_EMPTY_PATH = 0x40
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08

# A bounded /dev/shm still holds this many files (lock files, POSIX semaphores) at least.
SHM_MIN_INODES = 1024

# Device nodes bound into the private /dev; everything else of the host's /dev
# (disks, other terminals, consoles, /dev/vcs*) does not exist inside.
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
DEV_LINKS = (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
             ("stderr", "/proc/self/fd/2"), ("ptmx", "pts/ptmx"))


class PinError(ValueError):
    """A directory cannot be used as asked (refused root, changed under us); for a person."""


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _b(path: str) -> bytes:
    return os.fsencode(path)


def open_tree(dirfd: int, path: str, flags: int) -> int:
    return _libc.syscall(_libc.nr("open_tree"), ctypes.c_int(dirfd), _b(path), ctypes.c_uint(flags))


def move_mount(from_fd: int, to_fd: int) -> None:
    _libc.syscall(_libc.nr("move_mount"), ctypes.c_int(from_fd), b"", ctypes.c_int(to_fd), b"",
                  ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH))


def mount_setattr(dirfd: int, path: str, flags: int, *, set_: int = 0, clear: int = 0) -> None:
    attr = _MountAttr(set_, clear, 0, 0)
    _libc.syscall(_libc.nr("mount_setattr"), ctypes.c_int(dirfd), _b(path), ctypes.c_uint(flags),
                  ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))


def open_pinned(dirfd: int, path: str, *, beneath: bool = False, directory: bool = True) -> int:
    """An O_PATH fd for ``path``, refusing every symlink on the way (openat2)."""
    flags = os.O_PATH | os.O_CLOEXEC | (os.O_DIRECTORY if directory else os.O_NOFOLLOW)
    how = _OpenHow(flags, 0, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | (RESOLVE_BENEATH if beneath else 0))
    return _libc.syscall(_libc.nr("openat2"), ctypes.c_int(dirfd), _b(path), ctypes.byref(how),
                         ctypes.c_size_t(ctypes.sizeof(how)))


def prime() -> None:
    """Make each mount-API call once, harmlessly, in the process sandboxes are forked from:
    ctypes sets a call up on first use, and paying that in every command's start costs
    more (hundreds of microseconds) than the calls themselves."""
    for call in (lambda: open_pinned(AT_FDCWD, "/"), lambda: open_tree(-1, "", AT_EMPTY_PATH),
                 lambda: move_mount(-1, -1), lambda: mount_setattr(-1, "", AT_EMPTY_PATH)):
        try:
            fd = call()
        except OSError:
            continue
        if isinstance(fd, int):
            os.close(fd)


# -- the trusted side: what the sandbox will be built from ---------------------------------


class Pin(namedtuple("Pin", "path dev ino")):
    """A directory as the trusted side resolved it: canonical path, device, inode.

    This module's records are named tuples and plain classes, not dataclasses: see
    :class:`landlock_helper.outcome.Outcome` for why."""

    __slots__ = ()

    @classmethod
    def of(cls, path: str, *, directory: bool = True) -> Pin:
        """``path`` resolved (symlinks followed) once: the path, device and inode all come
        from the one object opened, read back through /proc/self/fd."""
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if directory and not stat.S_ISDIR(st.st_mode):
                raise PinError(f"{path} is not a directory")
            try:
                real = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:  # no /proc here
                real = os.path.realpath(path)
        finally:
            os.close(fd)
        return cls(real, st.st_dev, st.st_ino)

    def to_spec(self) -> tuple[str, int, int]:
        return (self.path, self.dev, self.ino)


class Plan(namedtuple("Plan", "cwd roots tmp_writable read_only hidden shown before", defaults=((), (), (), None))):
    """The mounts one command needs: its directory (``cwd``), its writable ``roots``, the
    repositories in them to keep ``read_only``, and the host /tmp directories to show
    read-only (``shown``: the readable roots there), all pinned; the paths to hide for
    this command besides those its sandbox hid when made (``hidden``); plus (for the
    trusted side only, never sent) what stood where git looks before the command:
    ``before``, None on the sandbox's side."""

    __slots__ = ()

    def to_spec(self) -> tuple:
        return (self.cwd.to_spec(), [r.to_spec() for r in self.roots], self.tmp_writable,
                [r.to_spec() for r in self.read_only], list(self.hidden), [r.to_spec() for r in self.shown])

    @classmethod
    def from_spec(cls, spec) -> Plan:
        cwd, roots, tmp_writable, read_only, hidden, shown = spec
        return cls(Pin(*cwd), tuple(Pin(*r) for r in roots), tmp_writable, tuple(Pin(*r) for r in read_only),
                   tuple(hidden), tuple(Pin(*r) for r in shown))


def pin(policy: SandboxPolicy, cwd: str, sandbox_cwd: str, env, hidden=(), readable=(), sandbox_hidden=()) -> Plan:
    """Resolve the command's directory, writable and readable roots once (raises
    PinError); ``hidden``: what to hide for this command besides what its sandbox hides
    (``sandbox_hidden``: no readable root may show any of them).

    ``/tmp`` itself (the global temp folder, or $TMPDIR when it is /tmp) is sluice's /tmp,
    not a host directory. Roots that do not exist are left out, as Landlock would.
    """
    roots: list[Pin] = []
    tmp_writable = False
    # The global temp folder, and $TMPDIR when it is /tmp, come out of writable_roots as /tmp.
    for root in policy.writable_roots(sandbox_cwd, env):
        if root == TMP:
            tmp_writable = True
            continue
        try:
            pinned = Pin.of(root)
        except (FileNotFoundError, NotADirectoryError, PinError):
            continue
        if pinned.path == TMP:
            tmp_writable = True
            continue
        refusal = root_refusal(pinned.path)
        if refusal:
            raise PinError(refusal)
        if pinned not in roots:
            roots.append(pinned)
    # Outer roots first: an inner root is then bound on top of the outer one's clone.
    roots.sort(key=lambda r: len(r.path))
    before = {}
    read_only: list[Pin] = []
    for root in roots:
        for rel, identity, target in _protected_entries(root):
            before[(root, rel)] = identity
            if identity[2] != stat.S_IFLNK:  # a link's target is protected instead, if it is ours
                read_only.append(Pin(f"{root.path}/{rel}", identity[0], identity[1]))
            if target and any(is_beneath(target, r.path) for r in roots):
                try:
                    read_only.append(Pin.of(target, directory=False))
                except OSError:
                    pass
    cwd_pin = next((r for r in roots if r.path == cwd), None) or Pin.of(cwd)
    hidden = tuple(os.path.abspath(p) for p in hidden)
    shown = _pin_readable(readable, roots, (*sandbox_hidden, *hidden))
    return Plan(cwd_pin, tuple(roots), tmp_writable, tuple(dict.fromkeys(read_only)), hidden, shown, before)


def _pin_readable(readable, roots, hidden) -> tuple[Pin, ...]:
    """The readable roots that need a mount: those in the host's /tmp that no writable
    root already shows, outer first. Each is resolved once. Refused: /, the whole host
    /tmp, sluice's own /tmp, and a directory in what the sandbox hides (a sluice runtime
    dir or home, a key directory, the user's runtime dir), or one in the host's /tmp
    around such a directory. (Elsewhere the view shows everything but the hidden paths
    anyway, and they stay hidden.)"""
    refused = {"/", TMP, os.path.realpath(scratch_path())}
    hidden = [os.path.realpath(h) for h in (*hidden, *user_runtime_dirs())]
    shown: list[Pin] = []
    for path in readable:
        try:
            pinned = Pin.of(path)
        except FileNotFoundError:
            raise PinError(f"readable path does not exist: {path}") from None
        except PinError:
            raise PinError(f"readable path is not a directory: {path}") from None
        if pinned.path in refused:
            what = "the root directory" if pinned.path == "/" else "sluice's own /tmp" if pinned.path != TMP \
                else "the whole host /tmp, which sluice keeps private"
            raise PinError(f"refusing to show {pinned.path} ({what}); name the directory the command needs")
        for h in hidden:
            if is_beneath(pinned.path, h) or in_tmp(pinned.path) and is_beneath(h, pinned.path):
                raise PinError(f"refusing to show {pinned.path}: sluice hides {h} from every command "
                               "(a runtime dir, sluice's home or keys)")
        if in_tmp(pinned.path) and not any(is_beneath(pinned.path, r.path) for r in roots) and pinned not in shown:
            shown.append(pinned)
    return tuple(sorted(shown, key=lambda r: len(r.path)))


def user_runtime_dirs(env=None) -> list[str]:
    """Hidden from every restricted command: the user's runtime dir ($XDG_RUNTIME_DIR,
    /run/user/UID), where the session bus, the desktop, key agents and sluice daemons
    keep their sockets and tokens."""
    env = os.environ if env is None else env
    dirs = [f"/run/user/{os.geteuid()}"]
    xdg = env.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(xdg) and os.path.realpath(xdg) not in ("/", "/run", "/tmp"):
        dirs.append(os.path.realpath(xdg))
    return dirs


# -- sluice's /tmp ------------------------------------------------------------------------


def scratch_dir(uid: int | None = None) -> str:
    """The host directory that is /tmp inside every sandbox of this user, made if needed.

    It lies in the host's /tmp, where any local user may have put something first, so
    it is created without following links and used only if it is a real directory of
    ours with mode 0700.
    """
    uid = os.geteuid() if uid is None else uid
    path = scratch_path(uid)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if st.st_uid != uid or stat.S_IMODE(st.st_mode) != 0o700:
            raise PinError(f"{path} is not a private directory of uid {uid} (owner {st.st_uid}, "
                           f"mode {stat.S_IMODE(st.st_mode):o}); remove it and try again")
    finally:
        os.close(fd)
    return path


# -- the sandbox side -------------------------------------------------------------------


class View:
    """What the warm step leaves for the per-command step."""

    __slots__ = ("host_tmp", "tmp", "hidden", "late_hidden")

    def __init__(self, host_tmp: int, tmp: int, hidden: tuple[str, ...], late_hidden: tuple[str, ...]) -> None:
        self.host_tmp = host_tmp  # O_PATH fd of the host's /tmp, under sluice's
        self.tmp = tmp  # O_PATH fd of sluice's /tmp mount
        self.hidden = hidden  # every hidden path
        self.late_hidden = late_hidden  # hidden paths that did not exist when warm


def prepare(hidden_paths, scratch: str | None) -> View | None:
    """The warm step; runs as the sandbox's init, before the command is forked.

    Without ``scratch`` (danger-full-access) the view stays the host's, read-write, with
    only a fresh /proc, a private /dev/shm and the hidden paths.
    """
    m = _libc.mount
    m(None, "/", None, _libc.MS_REC | _libc.MS_PRIVATE)
    m("proc", "/proc", "proc", _libc.MS_NOSUID | _libc.MS_NODEV | _libc.MS_NOEXEC)
    if scratch is None:
        if os.path.isdir("/dev/shm"):
            m("tmpfs", "/dev/shm", "tmpfs", _libc.MS_NOSUID | _libc.MS_NODEV, "mode=1777")
        for path in hidden_paths:
            _hide(path)
        return None
    _private_dev()
    hidden = (*hidden_paths, *user_runtime_dirs())
    late = tuple(path for path in hidden if not _hide(path))
    host_tmp = os.open(TMP, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    m(scratch, TMP, None, _libc.MS_BIND)
    tmp = os.open(TMP, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    mount_setattr(AT_FDCWD, "/", AT_RECURSIVE, set_=MOUNT_ATTR_RDONLY)
    for path in ("/dev/shm", "/dev/pts", TMP):
        mount_setattr(AT_FDCWD, path, 0, clear=MOUNT_ATTR_RDONLY)
    return View(host_tmp, tmp, hidden, late)


def _private_dev() -> None:
    m = _libc.mount
    nodes = {}
    for name in DEV_NODES:
        try:
            nodes[name] = open_tree(AT_FDCWD, f"/dev/{name}", OPEN_TREE_CLONE | os.O_CLOEXEC)
        except OSError:
            pass  # absent on this host: absent inside
    m("tmpfs", "/dev", "tmpfs", _libc.MS_NOSUID | _libc.MS_NOEXEC, "mode=755,size=64k")
    for name, fd in nodes.items():
        os.close(os.open(f"/dev/{name}", os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600))
        target = os.open(f"/dev/{name}", os.O_PATH | os.O_CLOEXEC)
        try:
            move_mount(fd, target)
        finally:
            os.close(target)
            os.close(fd)
    os.mkdir("/dev/pts", 0o755)
    m("devpts", "/dev/pts", "devpts", _libc.MS_NOSUID | _libc.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")
    os.mkdir("/dev/shm", 0o1777)
    m("tmpfs", "/dev/shm", "tmpfs", _libc.MS_NOSUID | _libc.MS_NODEV, "mode=1777")
    for name, target in DEV_LINKS:
        os.symlink(target, f"/dev/{name}")


def bound_shm(size: int) -> None:
    """Per command, before exec: the sandbox's /dev/shm holds at most ``size`` bytes (the
    command's memory limit) in at most one file per page of it (or SHM_MIN_INODES). A tmpfs is memory that no
    rlimit counts and that outlives the process that wrote it (until the sandbox is gone),
    and each of its inodes is kernel memory that cannot be reclaimed. (With a memory cgroup
    the pages count against the command's limit anyway; the inodes do not.)"""
    page = os.sysconf("SC_PAGE_SIZE")
    pages = max(size // page, 1)
    _libc.mount(None, "/dev/shm", None, _libc.MS_REMOUNT | _libc.MS_NOSUID | _libc.MS_NODEV,
                f"size={pages * page},nr_inodes={max(pages, SHM_MIN_INODES)}")


def _hide(path: str) -> bool:
    """An empty, unreadable, read-only tmpfs over a directory, /dev/null over a file."""
    m = _libc.mount
    if os.path.isdir(path) and not os.path.islink(path):
        m("tmpfs", path, "tmpfs",
          _libc.MS_RDONLY | _libc.MS_NOSUID | _libc.MS_NODEV | _libc.MS_NOEXEC, "size=4k,mode=000")
        return True
    if os.path.lexists(path) and not os.path.islink(path):
        m("/dev/null", path, None, _libc.MS_BIND)
        return True
    return False


def _open_host(view: View, pinned: Pin) -> int:
    """The pinned directory as the host has it (under sluice's /tmp for host /tmp paths)."""
    if in_tmp(pinned.path):
        return _open_checked(view.host_tmp, pinned.path[len(TMP) + 1:], pinned, beneath=True)
    return _open_checked(AT_FDCWD, pinned.path, pinned)


def _mount_point(view: View, pinned: Pin, source: int) -> int:
    """Where a clone of ``source`` goes: the path itself, or a directory made for it in
    sluice's /tmp (never following a link another command may have planted there)."""
    if not in_tmp(pinned.path):
        return os.dup(source)
    fd = os.dup(view.tmp)
    for part in pinned.path[len(TMP) + 1:].split("/"):
        try:
            os.mkdir(part, 0o755, dir_fd=fd)
        except FileExistsError:
            # Sluice's /tmp is the commands' own: a link or file an earlier command left
            # where a directory must go is removed, not followed.
            st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(part, dir_fd=fd)
                os.mkdir(part, 0o755, dir_fd=fd)
        try:
            nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except OSError as e:
            os.close(fd)
            raise PinError(f"cannot make {pinned.path} visible in the sandbox's /tmp: {e.strerror}") from None
        os.close(fd)
        fd = nxt
    return fd


def _clone_onto(source: int, target: int, *, writable: bool | None) -> int:
    """Mount a clone of ``source`` (and the mounts beneath it) on ``target``, read-write,
    read-only, or (``writable=None``) as ``source`` is; returns an O_PATH fd of the new
    mount's root."""
    tree = open_tree(source, "", OPEN_TREE_CLONE | os.O_CLOEXEC | AT_EMPTY_PATH | AT_RECURSIVE)
    try:
        if writable:
            try:
                mount_setattr(tree, "", AT_EMPTY_PATH, clear=MOUNT_ATTR_RDONLY)
            except PermissionError:
                pass  # read-only on the host already (a locked mount): it stays so
        elif writable is not None:
            mount_setattr(tree, "", AT_EMPTY_PATH | AT_RECURSIVE, set_=MOUNT_ATTR_RDONLY)
        move_mount(tree, target)
    except BaseException:
        os.close(tree)
        raise
    return tree


def apply(view: View, plan: Plan) -> tuple[int, list[int]]:
    """The per-command step: O_PATH fds of the command's directory (to fchdir) and of the
    writable roots as mounted (for Landlock's rules), all checked against the plan.

    Raises PinError when a pinned directory is not what the trusted side checked.
    """
    roots: list[int] = []
    cwd = None
    shown: list[int] = []
    try:
        # Read-only first: a writable root inside one is then bound on top of its clone.
        for pinned in plan.shown:
            shown.append(_bind(view, pinned, writable=False))
        for root in plan.roots:
            roots.append(_bind(view, root, writable=True))
        outside_roots = not any(is_beneath(plan.cwd.path, r.path) for r in (*plan.roots, *plan.shown))
        if outside_roots and in_tmp(plan.cwd.path) and plan.cwd.path != TMP:
            cwd = _bind(view, plan.cwd, writable=False)  # a read-only place to run, in sluice's /tmp
        for pinned in plan.read_only:
            _read_only_onto(pinned)
        extra = tuple(path for path in plan.hidden if path not in view.hidden)
        for path in (*view.late_hidden, *extra):
            _hide(path)  # made since the sandbox was warmed, or this command's: hidden now
        for path in (*view.hidden, *extra):
            _pin_way_to(path, plan.roots)
        if not plan.tmp_writable:
            mount_setattr(view.tmp, "", AT_EMPTY_PATH, set_=MOUNT_ATTR_RDONLY)
        # Only now, with every mount in place: a directory opened earlier would lie
        # beneath a later mount (.git bound read-only) and keep its old rights.
        if plan.cwd.path == TMP:
            cwd = os.dup(view.tmp)  # sluice's /tmp, not the host's that was pinned
        elif cwd is None:
            cwd = _open_cwd(plan, roots, shown)
        if plan.tmp_writable:
            roots.append(os.dup(view.tmp))
    except BaseException:
        for fd in (*roots, cwd):
            if fd is not None:
                os.close(fd)
        raise
    finally:
        for fd in shown:
            os.close(fd)
    return cwd, roots


def _open_cwd(plan: Plan, root_fds: list[int], shown_fds: list[int]) -> int:
    """The command's directory, in a writable root, a readable one, or elsewhere in the
    read-only view, opened through whatever is mounted on the way."""
    for root, fd in (*zip(plan.roots, root_fds), *zip(plan.shown, shown_fds)):
        if is_beneath(plan.cwd.path, root.path):
            rel = plan.cwd.path[len(root.path) + 1:] or "."
            return _open_checked(fd, rel, plan.cwd, beneath=True)
    return _open_checked(AT_FDCWD, plan.cwd.path, plan.cwd)


def _is(fd: int, pinned: Pin) -> bool:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (pinned.dev, pinned.ino)


def _open_checked(dirfd: int, path: str, pinned: Pin, *, beneath: bool = False, directory: bool = True) -> int:
    """``path`` opened without following symlinks; it must be what ``pinned`` says."""
    try:
        fd = open_pinned(dirfd, path, beneath=beneath, directory=directory)
    except OSError as e:
        raise PinError(f"{pinned.path} changed while the command was starting ({e.strerror})") from None
    if not _is(fd, pinned):
        os.close(fd)
        raise PinError(f"{pinned.path} changed while the command was starting (something else is there now)")
    return fd


def _bind(view: View, pinned: Pin, *, writable: bool) -> int:
    """A clone of the pinned directory on top of itself; returns an O_PATH fd of it."""
    source = _open_host(view, pinned)
    try:
        target = _mount_point(view, pinned, source)
        try:
            return _clone_onto(source, target, writable=writable)
        finally:
            os.close(target)
    finally:
        os.close(source)


def _pin_way_to(hidden: str, roots) -> None:
    """Every directory on the way from a writable root down to a hidden path in it becomes
    a mount point (a clone of itself, rights unchanged), so the command can rename none of
    them: hiding is by path, and renaming a parent of a hidden directory (a daemon's allow
    list inside a workspace) would move the real one out from under the hiding mount, and
    to where a later command sees and writes it. Nothing is resolved through a symlink: a
    directory on the way that is now a link was swapped by someone, and the command does
    not start (PinError)."""
    for root in roots:
        if hidden == root.path or not is_beneath(hidden, root.path) or not os.path.lexists(hidden):
            continue
        fd = open_pinned(AT_FDCWD, root.path)
        try:
            for part in hidden[len(root.path) + 1:].split("/")[:-1]:
                try:
                    nxt = open_pinned(fd, part, beneath=True)
                except OSError as e:
                    raise PinError(f"{hidden} is hidden from commands, but the way to it changed "
                                   f"({os.fsdecode(part)}: {e.strerror})") from None
                os.close(fd)
                try:
                    fd = _clone_onto(nxt, nxt, writable=None)  # go on from the clone, on top
                finally:
                    os.close(nxt)
        finally:
            os.close(fd)


def _read_only_onto(pinned: Pin) -> None:
    """A read-only clone of a repository's directory (or ``.git`` file) over itself."""
    fd = _open_checked(AT_FDCWD, pinned.path, pinned, directory=False)
    try:
        os.close(_clone_onto(fd, fd, writable=False))
    finally:
        os.close(fd)


# -- after the command: what it planted where git looks ------------------------------------
#
# A writable root without a .git (or with a .git symlink, which can be removed) cannot be
# kept from getting a new one by a mount: there is nothing to mount over. So the trusted
# side notes what stands there before the command, and once the command's whole tree is
# dead, moves aside anything new, before the user's next git command could run it, and
# puts back a .git or .sluice symlink the command removed or replaced. A new .git
# directory that git itself made (git clone, git init: no hooks, no config key that
# names a program; see landlock_helper.gitdir) stays: later commands get it read-only,
# and a command that was already running when it was checked has it checked again when
# it ends (it is not in that command's "before" either).


def _protected_entries(root: Pin):
    """(relative path, identity, link target) of each ``.git``/``.sluice`` that stands in
    ``root`` or in one of its direct subdirectories. The identity is (dev, ino, type,
    link) for what is there; the target is where a ``.git`` symlink or ``gitdir:`` file
    leads (None otherwise)."""
    fd = _open_root(root)
    if fd is None:
        return
    try:
        parents = [""]
        try:
            with os.scandir(fd) as it:
                parents += [e.name for e in it if e.name not in PROTECTED_SUBDIRS and e.is_dir(follow_symlinks=False)]
        except OSError:
            pass
        for parent in parents:
            for name in PROTECTED_SUBDIRS:
                rel = f"{parent}/{name}" if parent else name
                try:
                    st = os.stat(rel, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    continue
                path = f"{root.path}/{rel}"
                kind = stat.S_IFMT(st.st_mode)
                if kind == stat.S_IFLNK:
                    link = os.readlink(rel, dir_fd=fd)
                    yield rel, (st.st_dev, st.st_ino, kind, link), os.path.realpath(path)
                else:
                    target = _gitdir_of(path) if kind == stat.S_IFREG and name == ".git" else None
                    yield rel, (st.st_dev, st.st_ino, kind, None), target
    finally:
        os.close(fd)


def _gitdir_of(git_file: str) -> str | None:
    """The directory a ``.git`` file (worktrees, submodules) points to."""
    try:
        with open(git_file, "rb") as f:
            first = f.read(4096).split(b"\n", 1)[0].decode(errors="replace")
    except OSError:
        return None
    if not first.startswith("gitdir:"):
        return None
    return os.path.realpath(os.path.join(os.path.dirname(git_file), first[len("gitdir:"):].strip()))


def _open_root(root: Pin) -> int | None:
    try:
        fd = os.open(root.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    if not _is(fd, root):
        os.close(fd)
        return None
    return fd


def quarantine_planted(plan: Plan | None) -> list[str]:
    """Move aside every ``.git``/``.sluice`` that is new since the plan was made;
    one line for a person per entry moved."""
    notes = []
    for root in plan.roots if plan is not None else ():
        notes += _quarantine(root, plan.before or {})
    return notes


def _quarantine(root: Pin, before: dict) -> list[str]:
    notes = []
    now = {rel: identity for rel, identity, _ in _protected_entries(root)}
    # A .git symlink has nothing to mount over, so the command could remove or replace
    # it: it is put back as it was, pointing where it pointed.
    links = {rel: was[3] for (r, rel), was in before.items() if r == root and was[2] == stat.S_IFLNK}
    for rel in sorted(set(now) | set(links)):
        was, found = before.get((root, rel)), now.get(rel)
        if found == was:
            continue
        fd = _open_root(root)
        if fd is None:
            continue
        parent, _, name = rel.rpartition("/")
        where = f"{root.path}/{parent}" if parent else root.path
        try:
            pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd) \
                if parent else os.dup(fd)
        except OSError as e:
            notes.append(f"sluice: the command changed {where}/{name}, and sluice could not check it ({e.strerror}): "
                         "check it before running git there")
            continue
        finally:
            os.close(fd)
        try:
            cleared = True
            if found is not None:
                why = None
                if was is None and name == ".git" and found[2] == stat.S_IFDIR:
                    why = gitdir.refusal(pfd, name, found[:2])
                    if why is None:
                        continue  # a repository as git makes it (git clone, git init): kept
                cleared, note = _move_aside(pfd, where, name, "created" if was is None else "replaced", why)
                notes.append(note)
            if rel in links and cleared:
                notes.append(_restore_link(pfd, where, name, links[rel]))
        finally:
            os.close(pfd)
    return notes


_CHECK = "check it before running git there"


def _move_aside(pfd: int, where: str, name: str, what: str, why: str | None = None) -> tuple[bool, str]:
    """Rename ``name`` (in the directory ``pfd``) out of git's way: (done, a line for a person).
    ``why``: what makes a new ``.git`` other than git makes one."""
    aside = f"{name}.sluice-blocked-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    which = (f"which is not a repository as git makes it ({why}; git would run what it holds)" if why else
             "which a sandboxed command may not (git would run what it holds)")
    try:
        os.rename(name, aside, src_dir_fd=pfd, dst_dir_fd=pfd)
    except OSError as e:
        return False, (f"sluice: the command {what} {where}/{name}, {which}, "
                       f"and it could not be moved aside ({e.strerror}): {_CHECK}")
    return True, f"sluice: the command {what} {where}/{name}, {which}; moved it to {where}/{aside}"


def _restore_link(pfd: int, where: str, name: str, target: str) -> str:
    try:
        os.symlink(target, name, dir_fd=pfd)
    except OSError as e:
        return f"sluice: {where}/{name}, a link to {target}, could not be put back ({e.strerror}): {_CHECK}"
    return f"sluice: the command removed {where}/{name}, a link to {target}; put it back"
