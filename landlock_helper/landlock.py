"""Landlock: filesystem, TCP and scope restrictions from a sandbox policy.

Best effort up to the running kernel's ABI, but never below :data:`MIN_ABI`: under it
we refuse to run (fail closed) rather than run a command less contained than the
policy says. ABI 3 is the floor because before it ``truncate(2)`` is not governed by
Landlock, so a "read-only" command could still empty any file it can reach.

What each ABI adds and how we use it:

- 1: filesystem rights. Read+execute beneath the readable paths, everything beneath
  the writable roots.
- 2: ``REFER``. Handled always, granted on writable roots only, so a link or rename
  can never move a file to where it would gain rights (the hard-link escape).
- 3: ``TRUNCATE``.
- 4: TCP bind/connect. Handled without rules when the network is off: all denied.
- 5: ``IOCTL_DEV``. Granted only on the few device nodes a command may use.
- 6: scopes. Signals and abstract unix sockets cannot reach outside the sandbox.

The plan (:class:`LandlockPlan`) says which rights and rules; the ruleset is built in the
child between fork and exec and only opens paths and makes syscalls: a warm sandbox
creates the ruleset of the usual shape ahead of time (:func:`prepare_ruleset`) and adds
only the writable roots once it knows the command (:func:`finish_ruleset`).
"""

from __future__ import annotations

import ctypes
import os
import stat
from collections import namedtuple

from landlock_helper import _libc

MIN_ABI = 3

CREATE_RULESET_VERSION = 1 << 0
RULE_PATH_BENEATH = 1

FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13
FS_TRUNCATE = 1 << 14
FS_IOCTL_DEV = 1 << 15

NET_BIND_TCP = 1 << 0
NET_CONNECT_TCP = 1 << 1

SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1

# Every filesystem right each ABI knows.
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}

READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
# Rights that make sense on a file (the kernel rejects directory rights on a file rule).
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV

# Device nodes a command may use; /dev as a whole stays unreadable (raw disks are
# owned by root, and a root command with no capabilities is still their owner).
DEV_READ = ("/dev/random", "/dev/urandom")
DEV_READ_WRITE = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/ptmx")
DEV_DIRS_WRITE = ("/dev/pts", "/dev/shm")
DEV_LINKS = ("/dev/fd", "/dev/stdin", "/dev/stdout", "/dev/stderr")

# Read-only system paths when the policy does not grant full disk read.
MINIMAL_READ = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc", "/sys")


class LandlockUnavailable(OSError):
    """Landlock cannot enforce the policy on this kernel; the message says why."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_abi_cache: int | None = None


def abi_version() -> int:
    """The kernel's Landlock ABI, or 0 when Landlock is missing or disabled."""
    global _abi_cache
    if _abi_cache is None:
        try:
            _abi_cache = _libc.syscall(_libc.nr("landlock_create_ruleset"), None, ctypes.c_size_t(0),
                                       ctypes.c_uint32(CREATE_RULESET_VERSION))
        except OSError:
            _abi_cache = 0
    return _abi_cache


def fs_rights(abi: int) -> int:
    return _FS_BY_ABI[max(k for k in _FS_BY_ABI if k <= abi)]


def require_abi() -> int:
    abi = abi_version()
    if abi == 0:
        raise LandlockUnavailable(
            "Landlock is not available in this kernel (needs Linux 5.13+ with 'landlock' in the lsm= list); "
            "refusing to run a command unsandboxed"
        )
    if abi < MIN_ABI:
        raise LandlockUnavailable(
            f"Landlock ABI {abi} is below the minimum {MIN_ABI} (Linux 6.2+) that the sandbox needs; "
            "refusing to run a command less contained than its policy"
        )
    return abi


class LandlockPlan(namedtuple("LandlockPlan", "abi handled_fs handled_net scoped rules")):
    """Everything :func:`apply` needs, computed before fork: the ABI, the handled
    filesystem and network rights, the scopes, and ``rules``, (path or fd, rights) pairs
    (paths that do not exist at apply time are skipped). A named tuple: see
    :class:`landlock_helper.outcome.Outcome` for why not a dataclass."""

    __slots__ = ()


def _readable_top_level(all_fs: int) -> list[tuple[str, int]]:
    """Read rules for every entry of / except /dev, which gets node-by-node rules."""
    rules: list[tuple[str, int]] = []
    try:
        names = sorted(os.listdir("/"))
    except OSError:
        names = []
    for name in names:
        if name == "dev":
            continue
        rules.append(("/" + name, READ & all_fs))
    return rules


def _dev_rules(all_fs: int) -> list[tuple[str, int]]:
    rw_file = (FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV) & all_fs
    rules = [(p, (FS_READ_FILE | FS_IOCTL_DEV) & all_fs) for p in DEV_READ]
    rules += [(p, rw_file) for p in DEV_READ_WRITE]
    rules += [(p, all_fs) for p in DEV_DIRS_WRITE]
    # /dev itself must be listable for the symlinks (/dev/stdout -> /proc/self/fd/1) to
    # resolve; READ_DIR on it grants listing, not reading the nodes beneath.
    rules.append(("/dev", FS_READ_DIR))
    return rules


def plan(policy, writable_roots: list[str]) -> LandlockPlan:
    """Turn a policy into Landlock rules for this kernel (raises LandlockUnavailable)."""
    abi = require_abi()
    all_fs = fs_rights(abi)
    handled_fs = 0 if policy.full_write else all_fs
    rules: list[tuple[str, int]] = []
    if handled_fs:
        if policy.full_read:
            rules += _readable_top_level(all_fs)
        else:
            rules += [(p, READ & all_fs) for p in MINIMAL_READ]
        rules += _dev_rules(all_fs)
        rules += [(root, all_fs) for root in writable_roots]
    handled_net = 0
    if abi >= 4 and not policy.network:
        handled_net = NET_BIND_TCP | NET_CONNECT_TCP
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    return LandlockPlan(abi, handled_fs, handled_net, scoped, tuple(rules))


def create_ruleset(p: LandlockPlan) -> int | None:
    """A ruleset fd holding the plan's rules (None when the plan restricts nothing)."""
    if not (p.handled_fs or p.handled_net or p.scoped):
        return None
    attr = _RulesetAttr(p.handled_fs, p.handled_net, p.scoped)
    size = 8 if p.abi < 4 else 16 if p.abi < 6 else 24
    ruleset_fd = _libc.syscall(_libc.nr("landlock_create_ruleset"), ctypes.byref(attr), ctypes.c_size_t(size),
                               ctypes.c_uint32(0))
    try:
        add_rules(ruleset_fd, p.handled_fs, p.rules)
    except BaseException:
        os.close(ruleset_fd)
        raise
    return ruleset_fd


def add_rules(ruleset_fd: int, handled_fs: int, rules) -> None:
    """Add path-beneath rules, each for a path or an open fd; paths that do not exist are
    skipped (they grant nothing)."""
    add_rule = _libc.nr("landlock_add_rule")
    beneath = _PathBeneathAttr()
    for path, rights in rules:
        if isinstance(path, int):
            fd = os.dup(path)  # a directory the sandbox already opened and checked
        else:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
        try:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                rights &= FILE_RIGHTS
            beneath.allowed_access = rights & handled_fs
            beneath.parent_fd = fd
            if beneath.allowed_access:
                _libc.syscall(add_rule, ctypes.c_int(ruleset_fd), ctypes.c_int(RULE_PATH_BENEATH),
                              ctypes.byref(beneath), ctypes.c_uint32(0))
        finally:
            os.close(fd)


def restrict_self(ruleset_fd: int | None) -> None:
    """Enforce a ruleset on the calling thread (after PR_SET_NO_NEW_PRIVS)."""
    if ruleset_fd is not None:
        _libc.syscall(_libc.nr("landlock_restrict_self"), ctypes.c_int(ruleset_fd), ctypes.c_uint32(0))


# A warm sandbox prepares a ruleset of the usual shape (read everything, write the
# roots, no network) before it knows the command; only the roots are added at start.


class _UsualShape:
    """The policy questions :func:`plan` asks, answered for the usual shape."""

    full_read = True
    full_write = False
    network = False


def prepare_ruleset() -> tuple[LandlockPlan, int] | None:
    """A ruleset fd of the usual shape (no network), or None without Landlock."""
    try:
        pl = plan(_UsualShape(), [])
        return pl, create_ruleset(pl)
    except (LandlockUnavailable, OSError):
        return None


def finish_ruleset(prepared, policy, writable_roots: list[str]) -> int | None:
    """The ruleset for ``policy``: the prepared one plus the roots, or one made now."""
    if prepared is not None and policy.full_read and not policy.full_write and not policy.network:
        pl, fd = prepared
        add_rules(fd, pl.handled_fs, [(root, pl.handled_fs) for root in writable_roots])
        return fd
    return create_ruleset(plan(policy, writable_roots))
