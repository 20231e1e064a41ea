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
3. Without network: ``socket`` and ``socketpair`` only for AF_UNIX. The domain is
   compared on the low 32 bits of the argument, because the kernel reads it as an int:
   a value like ``0x1_0000_0002`` must not pass as "not AF_INET".

Everything else is allowed; Landlock and the namespaces do the rest.
"""

from __future__ import annotations

import ctypes
import errno
import sys

from landlock_helper import _libc

BPF_LD_W_ABS = 0x20
BPF_JEQ_K = 0x15
BPF_JGE_K = 0x35
BPF_RET_K = 0x06

RET_KILL_PROCESS = 0x80000000
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000

AF_UNIX = 1

OFF_NR = 0
OFF_ARCH = 4
# seccomp_data.args[0] starts at 16; its low 32 bits come first on little-endian.
OFF_ARG0_LO = 16 if sys.byteorder == "little" else 20

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
    for name in DENIED:
        prog += [(BPF_JEQ_K, 0, 1, _libc.nr(name)), (BPF_RET_K, 0, 0, deny)]
    if not network:
        # if nr in (socket, socketpair): allow only AF_UNIX
        prog += [
            (BPF_JEQ_K, 1, 0, _libc.nr("socket")),
            (BPF_JEQ_K, 0, 4, _libc.nr("socketpair")),
            (BPF_LD_W_ABS, 0, 0, OFF_ARG0_LO),
            (BPF_JEQ_K, 1, 0, AF_UNIX),
            (BPF_RET_K, 0, 0, RET_ERRNO | errno.EPERM),
            (BPF_RET_K, 0, 0, RET_ALLOW),
        ]
    prog.append((BPF_RET_K, 0, 0, RET_ALLOW))
    return prog


def compile_program(prog: list[Insn]):
    """A ctypes array ready for :func:`install` (built before fork: no work in the child)."""
    arr = (_SockFilter * len(prog))(*[_SockFilter(*insn) for insn in prog])
    fprog = _SockFprog(len(prog), ctypes.cast(arr, ctypes.POINTER(_SockFilter)))
    return fprog, arr  # keep arr alive as long as fprog


def install(compiled) -> None:
    """Load the filter on the calling thread; needs PR_SET_NO_NEW_PRIVS first."""
    fprog, _arr = compiled
    _libc.prctl_ptr(_libc.PR_SET_SECCOMP, _libc.SECCOMP_MODE_FILTER, ctypes.byref(fprog))
