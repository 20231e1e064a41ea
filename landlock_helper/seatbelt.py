"""macOS: a sandbox policy as a Seatbelt (SBPL) profile run through ``sandbox-exec``.

Usage::

    argv = seatbelt_argv(["make", "-j2"], policy, cwd="/src", env=child_env,
                         hidden_paths=["/Users/me/Library/Caches/sluice"])
    os.execv(argv[0], argv)

Why parameters. Every path (writable roots, protected ``.git``/``.sluice``, hidden
paths) travels as a ``-DNAME=VALUE`` argument to ``sandbox-exec`` and the profile only
says ``(param "NAME")``. The profile text is built from constants alone, so a directory
named ``x")) (allow default) ;`` is just an odd string to match, never policy.

Rule order. In SBPL the last rule that matches an operation decides. The profile is
therefore laid out from broad to narrow:

1. ``(deny default)``, then what any process needs to start and run: fork/exec,
   signals and process info limited to the same sandbox, a list of harmless sysctls,
   a few mach services (user lookups, power management), preferences, PTYs, writes
   to ``/dev/null``-like devices;
2. reads: everything with ``disk-full-read-access``, else the platform's system
   directories plus the writable roots;
3. writes: everything with ``disk-full-write-access``, else each writable root as a
   ``subpath`` (both the spelling given and its realpath: Seatbelt matches resolved
   paths, and ``/tmp`` is really ``/private/tmp``);
4. network: everything with ``network-full-access``, else only creating AF_UNIX
   sockets (socketpair and friends) with no right to bind or connect them anywhere;
5. denials that must win over 3 and 4: ``.git``/``.sluice`` inside writable roots,
   the directories leading to them when those sit inside another writable root (so
   the project cannot be renamed away, edited and put back), and last the hidden
   paths (the daemon's runtime dir: its token and sockets), unreadable, unwritable
   and unconnectable even when everything else is allowed.

What is contained on macOS: file reads and writes by path, signals and process
inspection across the sandbox boundary, network (IP, and unix-socket connect/bind)
unless allowed, most mach services.

What is not:

- Seatbelt has no process-tree kill (the executor tracks descendants itself), no
  resource limits and no syscall filter; the listed mach services and sysctls stay
  reachable.
- ``.git``/``.sluice`` that do not exist when the command starts are not protected
  (as on Linux), nor is the real git dir a ``.git`` pointer file (worktrees) names;
  hard links made earlier to protected files are checked by the path they are
  opened through.
- Terminal ioctls are allowed on ``/dev/ttys*`` so programs see their PTY; a
  command run straight from a person's terminal can therefore push input into it
  (TIOCSTI). The executor gives every command its own PTY or none.
- With ``disk-full-read-access`` (every mode) reads are unconfined apart from the
  hidden paths, and with ``network-full-access`` so is every unix socket (a Docker
  daemon, an ssh-agent), as in Codex.
- ``danger-full-access`` runs the command with no sandbox at all.
"""

from __future__ import annotations

import os

from landlock_helper.policy import PolicyError, SandboxPolicy, is_beneath

SANDBOX_EXEC = "/usr/bin/sandbox-exec"

# Sysctls a compiler, an interpreter or a build tool reads to size itself. Nothing here
# names another process or leaks more than `uname -a` and the CPU model would.
_SYSCTL_NAMES = (
    "hw.activecpu",
    "hw.byteorder",
    "hw.cachelinesize",
    "hw.cachelinesize_compat",
    "hw.cpufamily",
    "hw.cpufrequency",
    "hw.cpufrequency_compat",
    "hw.cpusubtype",
    "hw.cputype",
    "hw.l1dcachesize",
    "hw.l1dcachesize_compat",
    "hw.l1icachesize",
    "hw.l1icachesize_compat",
    "hw.l2cachesize",
    "hw.l2cachesize_compat",
    "hw.l3cachesize",
    "hw.l3cachesize_compat",
    "hw.logicalcpu",
    "hw.logicalcpu_max",
    "hw.machine",
    "hw.memsize",
    "hw.model",
    "hw.ncpu",
    "hw.nperflevels",
    "hw.packages",
    "hw.pagesize",
    "hw.pagesize_compat",
    "hw.physicalcpu",
    "hw.physicalcpu_max",
    "hw.tbfrequency",
    "hw.tbfrequency_compat",
    "hw.vectorunit",
    "kern.argmax",
    "kern.hostname",
    "kern.maxfiles",
    "kern.maxfilesperproc",
    "kern.maxproc",
    "kern.ngroups",
    "kern.osproductversion",
    "kern.osrelease",
    "kern.ostype",
    "kern.osvariant_status",
    "kern.osversion",
    "kern.secure_kernel",
    "kern.usrstack64",
    "kern.version",
    "machdep.cpu.brand_string",
    "sysctl.proc_cputype",
    "sysctl.proc_translated",
    "vm.loadavg",
)
_SYSCTL_PREFIXES = (
    "hw.optional.",
    "hw.perflevel",
    # Process-table lookups (ps, psutil, a runtime asking about itself): what `ps`
    # shows anyway.
    "kern.proc.pgrp.",
    "kern.proc.pid.",
)

# Looked up by libc and common tools even with no network: getpwuid() and friends go
# through opendirectoryd; build tools take power assertions to keep the machine awake.
_BASE_MACH_SERVICES = (
    "com.apple.system.opendirectoryd.libinfo",
    "com.apple.PowerManagement.control",
)

# Name resolution, TLS trust evaluation and proxy settings; only with network.
_NETWORK_MACH_SERVICES = (
    "com.apple.SecurityServer",
    "com.apple.SystemConfiguration.DNSConfiguration",
    "com.apple.SystemConfiguration.configd",
    "com.apple.bsd.dirhelper",
    "com.apple.networkd",
    "com.apple.ocspd",
    "com.apple.system.opendirectoryd.membership",
    "com.apple.trustd",
    "com.apple.trustd.agent",
)

# Without disk-full-read-access a command still has to load its binary, dyld's shared
# cache, libraries, locale and timezone data.
_PLATFORM_READ_SUBPATHS = (
    "/bin",
    "/sbin",
    "/usr",
    "/System",
    "/Library/Apple",
    "/Library/Developer",
    "/Library/Preferences",
    "/Applications/Xcode.app",
    "/opt/homebrew",
    "/private/etc",
    "/private/var/db/timezone",
    # /bin/sh is a trampoline that follows /private/var/select/sh.
    "/private/var/select",
)

_BASE = """\
(version 1)

; Closed unless opened below. Later rules override earlier ones.
(deny default)

; Children inherit this profile; they may only signal and inspect each other.
(allow process-exec)
(allow process-fork)
(allow signal (target same-sandbox))
(allow process-info* (target same-sandbox))

; CoreFoundation preferences (read only).
(allow user-preference-read)

; POSIX semaphores (Python multiprocessing locks).
(allow ipc-posix-sem)

; Java asks to adjust its CPU grade.
(allow sysctl-write (sysctl-name "kern.grade_cputype"))

; Power-management client: build tools hold "don't sleep" assertions.
(allow iokit-open (iokit-registry-entry-class "RootDomainUserClient"))
"""

_DEVICES = """\
; Bit buckets and the caller's own terminal.
(allow file-read* file-write-data
  (literal "/dev/null")
  (literal "/dev/zero")
  (literal "/dev/tty"))
(allow file-read* (literal "/dev/random") (literal "/dev/urandom"))
; /dev/stdout, /dev/fd/N: reopening a descriptor already held grants nothing new.
(allow file-read* file-write-data (regex #"^/dev/fd/[0-9]+$"))

; openpty(): the multiplexer and the slaves this sandbox created; terminals opened
; before sandbox-exec carry no extension but must still answer isatty()/TIOCGWINSZ.
(allow pseudo-tty)
(allow file-read* file-write* file-ioctl (literal "/dev/ptmx"))
(allow file-read* file-write* file-ioctl
  (require-all
    (regex #"^/dev/ttys[0-9]+$")
    (extension "com.apple.sandbox.pty")))
(allow file-ioctl (regex #"^/dev/ttys[0-9]+$"))
"""


def _spellings(paths) -> list[str]:
    """Each path as given (normalised) and, when it differs, its resolved form; each once."""
    spellings: list[str] = []
    for path in paths:
        given = os.path.normpath(path)
        for spelling in (given, os.path.realpath(given)):
            if spelling not in spellings:
                spellings.append(spelling)
    return spellings


class _Params:
    """Collects ``-DNAME=VALUE`` arguments; hands back ``(param "NAME")`` expressions."""

    def __init__(self) -> None:
        self.args: list[str] = []
        self._counts: dict[str, int] = {}

    def add(self, prefix: str, values: list[str]) -> list[str]:
        exprs = []
        for value in values:
            index = self._counts.get(prefix, 0)
            self._counts[prefix] = index + 1
            name = f"{prefix}_{index}"
            self.args.append(f"-D{name}={value}")
            exprs.append(f'(param "{name}")')
        return exprs


def _filters(kind: str, exprs: list[str]) -> str:
    return "\n".join(f"  ({kind} {e})" for e in exprs)


def _absolute(what: str, path: str) -> str:
    if not isinstance(path, str) or not os.path.isabs(path):
        raise PolicyError(f"{what} must be an absolute path, got {path!r}")
    return path


def _protected_parents(protected: list[str], roots: list[str]) -> list[str]:
    """Directories above a protected entry that a writable root would let one rename.

    If the project /tmp/p lives inside the writable /tmp, ``mv /tmp/p /tmp/q`` would
    carry /tmp/p/.git to a path no rule protects. Denying writes to /tmp/p itself
    (the literal directory, not its contents) stops that.
    """
    out: list[str] = []
    for path in protected:
        parent = os.path.dirname(path)
        while parent != os.path.dirname(parent):
            if any(is_beneath(parent, r) and parent != r for r in roots) and parent not in out:
                out.append(parent)
            parent = os.path.dirname(parent)
    return out


def seatbelt_profile(
    policy: SandboxPolicy,
    cwd: str,
    env: dict[str, str] | None = None,
    hidden_paths=(),
) -> tuple[str, list[str]]:
    """The SBPL profile for ``policy`` and the ``-DNAME=VALUE`` arguments it refers to.

    ``env`` is the command's environment (for $TMPDIR). The profile text never contains
    a path from the policy, the cwd, the environment or ``hidden_paths``.
    """
    _absolute("cwd", cwd)
    hidden = [_absolute("hidden path", p) for p in hidden_paths]
    params = _Params()
    sections = [_BASE]

    sysctls = [f'  (sysctl-name "{n}")' for n in _SYSCTL_NAMES]
    sysctls += [f'  (sysctl-name-prefix "{p}")' for p in _SYSCTL_PREFIXES]
    sections.append("(allow sysctl-read\n" + "\n".join(sysctls) + ")\n")
    mach = "\n".join(f'  (global-name "{s}")' for s in _BASE_MACH_SERVICES)
    sections.append(f"(allow mach-lookup\n{mach})\n")
    sections.append(_DEVICES)

    roots = _spellings(policy.writable_roots(cwd, env))
    root_exprs = params.add("WRITABLE_ROOT", roots) if roots else []

    # -- reads ------------------------------------------------------------------------
    if policy.full_read:
        sections.append("; Reads: everywhere (disk-full-read-access).\n(allow file-read*)\n")
    else:
        platform = "\n".join(f'  (subpath "{p}")' for p in _PLATFORM_READ_SUBPATHS)
        rules = [
            "; Reads: system directories and the writable roots only.",
            # stat() on any path keeps getcwd(), realpath() and PATH lookups working.
            "(allow file-read-metadata)",
            f'(allow file-read*\n  (literal "/")\n{platform})',
        ]
        if root_exprs:
            rules.append(f"(allow file-read*\n{_filters('subpath', root_exprs)})")
        sections.append("\n".join(rules) + "\n")

    # -- writes -----------------------------------------------------------------------
    protected_exprs: list[str] = []
    parent_exprs: list[str] = []
    if policy.full_write:
        sections.append("; Writes: everywhere (disk-full-write-access).\n(allow file-write*)\n")
    elif root_exprs:
        sections.append(
            "; Writes: beneath each writable root.\n"
            f"(allow file-write*\n{_filters('subpath', root_exprs)})\n"
        )
        protected = _spellings(policy.read_only_subpaths(cwd, env))
        if protected:
            protected_exprs = params.add("READ_ONLY", protected)
            parents = _protected_parents(protected, roots)
            if parents:
                parent_exprs = params.add("PROTECTED_PARENT", parents)
    else:
        sections.append("; Writes: none beyond the devices above.\n")

    # -- network ----------------------------------------------------------------------
    if policy.network:
        mach = "\n".join(f'  (global-name "{s}")' for s in _NETWORK_MACH_SERVICES)
        sections.append(
            "; Network: full (network-full-access).\n"
            "(allow network-outbound)\n"
            "(allow network-inbound)\n"
            "(allow network-bind)\n"
            "(allow system-socket)\n"
            f"(allow mach-lookup\n{mach})\n"
            '(allow sysctl-read (sysctl-name-prefix "net.routetable."))\n'
        )
    else:
        sections.append(
            "; Network: none. Unix sockets may be created (socketpair) but not bound\n"
            "; or connected to any path.\n"
            "(allow system-socket (socket-domain AF_UNIX))\n"
        )

    # -- denials that override everything above ----------------------------------------
    if protected_exprs:
        sections.append(
            "; .git and .sluice inside writable roots stay read-only.\n"
            f"(deny file-write*\n{_filters('subpath', protected_exprs)})\n"
        )
    if parent_exprs:
        sections.append(
            "; Directories holding them cannot be renamed or removed.\n"
            f"(deny file-write*\n{_filters('literal', parent_exprs)})\n"
        )
    if hidden:
        exprs = params.add("HIDDEN", _spellings(hidden))
        sockets = "\n".join(f"  (local unix-socket (subpath {e}))" for e in exprs)
        remotes = "\n".join(f"  (remote unix-socket (subpath {e}))" for e in exprs)
        sections.append(
            "; Hidden: the daemon's runtime files, out of reach whatever was allowed above.\n"
            f"(deny file-read* file-write*\n{_filters('subpath', exprs)})\n"
            f"(deny network-outbound\n{remotes})\n"
            f"(deny network-bind\n{sockets})\n"
        )

    return "\n".join(sections), params.args


def seatbelt_argv(
    argv: list[str],
    policy: SandboxPolicy,
    cwd: str,
    env: dict[str, str] | None = None,
    hidden_paths=(),
) -> list[str]:
    """``argv`` wrapped in ``sandbox-exec``; unchanged for ``danger-full-access``."""
    if policy.unrestricted:
        return list(argv)
    profile, params = seatbelt_profile(policy, cwd, env, hidden_paths)
    return [SANDBOX_EXEC, "-p", profile, *params, "--", *argv]
