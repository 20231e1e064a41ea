"""Raw syscalls through ctypes, and the per-architecture numbers we need.

Only what the sandbox uses. Every wrapper raises :class:`OSError` with the real errno,
so callers can say exactly what the kernel refused.
"""

from __future__ import annotations

import ctypes
import os
import struct

_libc = ctypes.CDLL(None, use_errno=True)


def function(name: str, restype, *argtypes):
    """libc's ``name``, declared with its C types: a function object of the caller's own
    (ctypes keeps the types per object)."""
    fn = _libc[name]
    fn.restype = restype
    if argtypes:
        fn.argtypes = argtypes
    return fn


_syscall = function("syscall", ctypes.c_long)
_prctl = function("prctl", ctypes.c_int, ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
_mount = function("mount", ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                  ctypes.c_char_p)
_unshare = function("unshare", ctypes.c_int, ctypes.c_int)

MACHINE = os.uname().machine  # what platform.machine() says, without importing platform

# Syscall numbers that differ between architectures; the generic ones (Landlock,
# io_uring, new mount API) are the same everywhere since they were added late.
_ARCH_TABLES = {
    "x86_64": {
        "audit_arch": 0xC000003E,  # AUDIT_ARCH_X86_64
        "x32_bit": 0x40000000,
        "ptrace": 101,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "socket": 41,
        "socketpair": 53,
        "mount": 165,
        "umount2": 166,
        "pivot_root": 155,
        "kexec_load": 246,
        "kexec_file_load": 320,
        "init_module": 175,
        "finit_module": 313,
        "delete_module": 176,
        "bpf": 321,
        "keyctl": 250,
        "add_key": 248,
        "request_key": 249,
        "capset": 126,
        "connect": 42,
        "listen": 50,
        "seccomp": 317,
        # Calls that take a file mode (the setuid/setgid rule).
        "chmod": 90,
        "fchmod": 91,
        "fchmodat": 268,
        "open": 2,
        "openat": 257,
        "creat": 85,
        "mkdir": 83,
        "mkdirat": 258,
        "mknod": 133,
        "mknodat": 259,
    },
    "aarch64": {
        "audit_arch": 0xC00000B7,  # AUDIT_ARCH_AARCH64
        "x32_bit": None,
        "ptrace": 117,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "socket": 198,
        "socketpair": 199,
        "mount": 40,
        "umount2": 39,
        "pivot_root": 41,
        "kexec_load": 104,
        "kexec_file_load": 294,
        "init_module": 105,
        "finit_module": 273,
        "delete_module": 106,
        "bpf": 280,
        "keyctl": 219,
        "add_key": 217,
        "request_key": 218,
        "capset": 91,
        "connect": 203,
        "listen": 201,
        "seccomp": 277,
        # aarch64 has only the *at forms.
        "fchmod": 52,
        "fchmodat": 53,
        "openat": 56,
        "mkdirat": 34,
        "mknodat": 33,
    },
}
_GENERIC = {
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "pidfd_send_signal": 424,
    "pidfd_open": 434,
    "openat2": 437,
    "pidfd_getfd": 438,
    "mount_setattr": 442,
    "landlock_create_ruleset": 444,
    "landlock_add_rule": 445,
    "landlock_restrict_self": 446,
    "fchmodat2": 452,
}

ARCH = _ARCH_TABLES.get("aarch64" if MACHINE == "arm64" else MACHINE)


def nr(name: str) -> int:
    """The syscall number of ``name`` on this machine."""
    if name in _GENERIC:
        return _GENERIC[name]
    if ARCH is None:
        raise OSError(f"unsupported architecture {MACHINE!r}")
    return ARCH[name]


def has(name: str) -> bool:
    """Whether this machine has syscall ``name`` (aarch64 lacks open, chmod, mkdir, ...)."""
    return name in _GENERIC or (ARCH is not None and name in ARCH)


def check(ret: int, what: str = "") -> int:
    """``ret``, what a libc call returned, or the OSError for its errno if it failed;
    ``what``: the call, to name in the message."""
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}" if what else os.strerror(err))
    return ret


def syscall(number: int, *args) -> int:
    return check(_syscall(ctypes.c_long(number), *args))


def prctl(option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0) -> int:
    return check(_prctl(option, arg2, arg3, arg4, arg5))



def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    check(_mount(
        source.encode() if source is not None else None,
        target.encode(),
        fstype.encode() if fstype is not None else None,
        flags,
        data.encode() if data is not None else None,
    ), f"mount {target}")


_signalfd = function("signalfd", ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
SFD_NONBLOCK = os.O_NONBLOCK
SFD_CLOEXEC = os.O_CLOEXEC
SIGNALFD_SIGINFO_SIZE = 128


# glibc's sigset_t; made once (a ctypes type made in a sandbox's init would cost more than
# the signalfd itself).
_SigSet = ctypes.c_ulong * (128 // ctypes.sizeof(ctypes.c_ulong))


def signalfd(signals) -> int:
    """A non-blocking signalfd for ``signals`` (they must be blocked to be read from it)."""
    mask = _SigSet()
    bits = 8 * ctypes.sizeof(ctypes.c_ulong)
    for sig in signals:
        mask[(int(sig) - 1) // bits] |= 1 << ((int(sig) - 1) % bits)
    return check(_signalfd(-1, ctypes.byref(mask), SFD_NONBLOCK | SFD_CLOEXEC), "signalfd")


# siginfo_t for a queued signal (si_code SI_QUEUE): si_signo, si_errno, si_code, then
# (at 16) si_pid, si_uid and (at 24) the value's int.
_SI_QUEUE = -1
_SIGINFO_SIZE = 128


def pidfd_queue_signal(pidfd: int, sig: int, value: int) -> None:
    """Queue ``sig`` with the int ``value`` to the process of ``pidfd`` (sigqueue(3) by
    pidfd, so a reused pid is never signalled; Python's pidfd_send_signal takes no
    siginfo). The receiver reads ``value`` as ``ssi_int`` from its signalfd."""
    info = ctypes.create_string_buffer(_SIGINFO_SIZE)
    struct.pack_into("iii", info, 0, sig, 0, _SI_QUEUE)
    struct.pack_into("iIi", info, 16, os.getpid(), os.getuid(), value)
    syscall(nr("pidfd_send_signal"), ctypes.c_int(pidfd), ctypes.c_int(sig), info, ctypes.c_uint(0))


# struct signalfd_siginfo: ssi_signo at 0, ssi_int at 44.
SIGNALFD_SSI_INT = 44


def unshare(flags: int) -> None:
    check(_unshare(flags), "unshare")


# prctl options
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4

# unshare / clone flags
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

# mount flags
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18


def trim_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``; nothing
    elsewhere). A process that is forked for every sandbox calls it once: every fork
    copies the page tables of what is resident, and every child's exit tears them down."""
    trim = getattr(_libc, "malloc_trim", None)
    if trim is not None:
        trim(0)


def write_file(path: str, text: str) -> None:
    """One ``write(2)`` of ``text`` to an existing file (a /proc or cgroup control file,
    where the write is the operation: no buffering, no truncation, no creation)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
