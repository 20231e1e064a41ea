"""A hand-built seccomp BPF filter: what Landlock cannot express.

The program, in order:

1. Architecture check. A syscall made through another ABI (32-bit ``int 0x80`` on
   x86_64, or x32 numbers with bit 30 set) would be looked up in another table and
   slip past every number below, so it kills the process.
2. Denied outright with EPERM: ptrace, process_vm_readv/writev (reading or writing
   another process's memory), io_uring (its ring performs syscalls this filter never
   sees), the mount API (Landlock forbids mounts too; this also covers the new
   fsopen/fsmount family), kexec, kernel modules, bpf, and the kernel keyring
   (keyctl/add_key/request_key: keyrings hold credentials).
3. ``socket`` and ``socketpair``: without network only AF_UNIX; with or without it, an
   AF_UNIX socket only of type SOCK_STREAM or SOCK_SEQPACKET (the type compared after
   masking SOCK_NONBLOCK/SOCK_CLOEXEC off; SOCK_RAW is a datagram socket in AF_UNIX).
   A datagram socket can name any socket path in each ``sendto``/``sendmsg``, and the
   sandbox could vet that only by copying every message, so it cannot exist: EPERM.
   Stream and seqpacket sockets ignore or refuse an address on send; they reach a peer
   only through ``connect``. Domain and type are compared on the low 32 bits of the
   argument, because the kernel reads them as ints: a value like ``0x1_0000_0002`` must
   not pass as "not AF_INET".
4. ``connect`` returns SECCOMP_RET_USER_NOTIF: the sandbox's init performs it on the
   command's behalf and refuses peers outside the sandbox (:mod:`.unix_guard`). With
   network, so does ``listen``: the command then shares the host's network namespace,
   where abstract unix names are shared too, and the init refuses to listen on one.
5. No setuid or setgid bit: chmod, fchmod, fchmodat, fchmodat2, open, openat, creat,
   mkdir, mkdirat, mknod and mknodat fail with EPERM when their mode argument has
   ``06000`` set (low 32 bits, ``mode_t`` is 32-bit). ``openat2`` carries its mode in a
   struct a filter cannot read, so it fails with ENOSYS and libc falls back to openat.

Everything else is allowed; Landlock and the namespaces do the rest. The filter reads
arguments only for the calls above, so the kernel's per-syscall cache still allows every
other call without running it.
"""

from __future__ import annotations

import ctypes
import errno
import sys

from landlock_helper import _libc

BPF_LD_W_ABS = 0x20
BPF_ALU_AND_K = 0x54
BPF_JA = 0x05
BPF_JEQ_K = 0x15
BPF_JGE_K = 0x35
BPF_JSET_K = 0x45
BPF_RET_K = 0x06

RET_KILL_PROCESS = 0x80000000
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
RET_USER_NOTIF = 0x7FC00000

AF_UNIX = 1
SOCK_STREAM = 1
SOCK_SEQPACKET = 5
SOCK_TYPE_MASK = 0xF  # the kernel's; the rest of the type argument is SOCK_NONBLOCK/SOCK_CLOEXEC
SETID_BITS = 0o6000

SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
# Once the init has received a notification, only a fatal signal interrupts the waiting
# command: the init's answer (a replaced fd, then the return value) is never half-applied.
SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV = 1 << 5

OFF_NR = 0
OFF_ARCH = 4


def _arg_lo(i: int) -> int:
    """Offset of the low 32 bits of seccomp_data.args[i] (args start at 16)."""
    return 16 + 8 * i + (0 if sys.byteorder == "little" else 4)



# Where the mode argument is, per call that takes one.
MODE_ARG = {
    "chmod": 1, "fchmod": 1, "creat": 1, "mkdir": 1, "mknod": 1,
    "fchmodat": 2, "fchmodat2": 2, "open": 2, "mkdirat": 2, "mknodat": 2,
    "openat": 3,
}

DENIED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "mount",
    "umount2",
    "pivot_root",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "bpf",
    "keyctl",
    "add_key",
    "request_key",
)


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


Insn = tuple[int, int, int, int]


def _on(nrs: list[int], block: list[Insn]) -> list[Insn]:
    """``if nr in nrs: block`` (the block must end in returns; A holds nr otherwise)."""
    if not nrs:
        return []
    prog: list[Insn] = []
    for i, n in enumerate(nrs):
        prog.append((BPF_JEQ_K, len(nrs) - i, 0, n))
    prog.append((BPF_JA, 0, 0, len(block)))
    return prog + block


def build(network: bool) -> list[Insn]:
    """The filter program as (code, jt, jf, k) tuples."""
    arch = _libc.ARCH
    if arch is None:
        raise OSError(f"no seccomp filter for architecture {_libc.MACHINE!r}")
    deny = RET_ERRNO | errno.EPERM
    prog: list[Insn] = [
        (BPF_LD_W_ABS, 0, 0, OFF_ARCH),
        (BPF_JEQ_K, 1, 0, arch["audit_arch"]),
        (BPF_RET_K, 0, 0, RET_KILL_PROCESS),
        (BPF_LD_W_ABS, 0, 0, OFF_NR),
    ]
    if arch["x32_bit"] is not None:
        prog += [(BPF_JGE_K, 0, 1, arch["x32_bit"]), (BPF_RET_K, 0, 0, RET_KILL_PROCESS)]
    prog += _on([_libc.nr(name) for name in DENIED], [(BPF_RET_K, 0, 0, deny)])
    guarded = ["connect", "listen"] if network else ["connect"]
    prog += _on([_libc.nr(name) for name in guarded], [(BPF_RET_K, 0, 0, RET_USER_NOTIF)])
    prog += _on([_libc.nr("openat2")], [(BPF_RET_K, 0, 0, RET_ERRNO | errno.ENOSYS)])
    for index in sorted(set(MODE_ARG.values())):
        names = [n for n, i in MODE_ARG.items() if i == index and _libc.has(n)]
        prog += _on([_libc.nr(n) for n in names], [
            (BPF_LD_W_ABS, 0, 0, _arg_lo(index)),
            (BPF_JSET_K, 0, 1, SETID_BITS),
            (BPF_RET_K, 0, 0, deny),
            (BPF_RET_K, 0, 0, RET_ALLOW),
        ])
    # socket/socketpair: AF_UNIX only as stream or seqpacket; other families only with network.
    prog += _on([_libc.nr("socket"), _libc.nr("socketpair")], [
        (BPF_LD_W_ABS, 0, 0, _arg_lo(0)),
        (BPF_JEQ_K, 0, 6, AF_UNIX),
        (BPF_LD_W_ABS, 0, 0, _arg_lo(1)),
        (BPF_ALU_AND_K, 0, 0, SOCK_TYPE_MASK),
        (BPF_JEQ_K, 2, 0, SOCK_STREAM),
        (BPF_JEQ_K, 1, 0, SOCK_SEQPACKET),
        (BPF_RET_K, 0, 0, deny),
        (BPF_RET_K, 0, 0, RET_ALLOW),
        (BPF_RET_K, 0, 0, RET_ALLOW if network else deny),
    ])
    prog.append((BPF_RET_K, 0, 0, RET_ALLOW))
    return prog


def compile_program(prog: list[Insn]):
    """A ctypes array ready for :func:`install` (built before fork: no work in the child)."""
    arr = (_SockFilter * len(prog))(*[_SockFilter(*insn) for insn in prog])
    fprog = _SockFprog(len(prog), ctypes.cast(arr, ctypes.POINTER(_SockFilter)))
    return fprog, arr  # keep arr alive as long as fprog


def install(compiled) -> int:
    """Load the filter on the calling thread; returns its notification listener fd.

    Needs PR_SET_NO_NEW_PRIVS first. Through seccomp(2), not prctl: only that asks for a
    listener. The listener answers the command's ``connect`` calls; whoever holds it
    decides them, so it must leave this process before exec (see unix_guard).
    """
    fprog, _arr = compiled
    flags = SECCOMP_FILTER_FLAG_NEW_LISTENER | SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV
    return _libc.syscall(_libc.nr("seccomp"), ctypes.c_ulong(SECCOMP_SET_MODE_FILTER), ctypes.c_ulong(flags),
                         ctypes.byref(fprog))
