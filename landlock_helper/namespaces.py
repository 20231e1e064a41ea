"""Namespaces and capabilities: the parts of the sandbox that are not Landlock or mounts.

Each command gets a fresh PID namespace (so it sees, signals and ptraces only its own
tree, and the kernel kills the whole tree when the namespace's init exits), a mount
namespace (its view of the filesystem: see :mod:`landlock_helper.mounts`), a private
SysV IPC namespace, without network a network namespace (with only a loopback that is
down: the sandbox's abstract unix socket names are its own, so nothing outside can
connect to a name a command listens on, nor a command take a name first that a host
service uses), and, when not root, a user namespace that maps the caller's uid and gid
to themselves (needed to create the others without privilege; the command still runs as
the caller, and the user namespace owns the others).

As root, the command keeps uid 0 but loses every capability: the bounding set is
emptied before exec, so exec cannot grant any back.
"""

from __future__ import annotations

import ctypes

from landlock_helper import _libc


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def unshare_flags(as_root: bool, mount: bool = True, net: bool = False) -> int:
    flags = _libc.CLONE_NEWPID | _libc.CLONE_NEWIPC | (_libc.CLONE_NEWNS if mount else 0)
    if net:
        flags |= _libc.CLONE_NEWNET
    if not as_root:
        flags |= _libc.CLONE_NEWUSER
    return flags


def enter(uid: int, gid: int, as_root: bool, *, mount: bool = True, net: bool = False) -> None:
    """Unshare the namespaces; the caller's *next child* is the new PID namespace's init.
    ``mount=False``: all but the mount namespace, which that child then unshares itself
    (the caller keeps the host's view). ``net``: a network namespace of the sandbox's own
    (for a command without network)."""
    _libc.unshare(unshare_flags(as_root, mount, net))
    if not as_root:
        _libc.write_file("/proc/self/setgroups", "deny")
        _libc.write_file("/proc/self/uid_map", f"{uid} {uid} 1\n")
        _libc.write_file("/proc/self/gid_map", f"{gid} {gid} 1\n")


def last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 40


def drop_bounding(cap_last: int) -> None:
    """Empty the bounding set: no exec can grant a capability again. The caps in force
    (the effective set) stay, so a warm sandbox does this before it knows its command."""
    for cap in range(cap_last + 1):
        try:
            _libc.prctl(_libc.PR_CAPBSET_DROP, cap)
        except OSError:
            pass  # EINVAL: the kernel does not know that cap


def drop_capabilities(cap_last: int, *, bounding: bool = True) -> None:
    """Empty the bounding (unless already done), ambient, inheritable, permitted and
    effective sets."""
    if bounding:
        drop_bounding(cap_last)
    try:
        _libc.prctl(_libc.PR_CAP_AMBIENT, _libc.PR_CAP_AMBIENT_CLEAR_ALL)
    except OSError:
        pass
    hdr, data = capability_structs()
    _libc.syscall(_libc.nr("capset"), ctypes.byref(hdr), ctypes.byref(data))


def capability_structs():
    """capset's arguments for "no capability at all"."""
    return _CapHeader(0x20080522, 0), (_CapData * 2)()  # _LINUX_CAPABILITY_VERSION_3
