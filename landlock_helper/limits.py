"""Resource limits of one command: processes, memory, file size, CPU time.

A :class:`Limits` says what a command may use. In a request a field left ``None``
means "the default" (:func:`defaults`), and ``0`` means "no limit"; :func:`resolve`
turns a request's limits into the ones that apply. They are enforced by the kernel,
with the best mechanism this host gives us (:func:`mechanism`):

cgroups
    One cgroup per command (in each hierarchy holding a controller we use), under a
    ``sluice`` parent: for cgroup v2, inside the nearest cgroup of ours (or an
    ancestor) that is writable and has the controllers enabled for its children
    (delegated, or everything as root); for cgroup v1, under our own cgroup of each
    controller's hierarchy when it is writable (root). Each sandbox's supervisor makes
    the cgroup and its command process joins it while the sandbox is warm (writes 0 to
    ``cgroup.procs``), so every process the command starts is inside; the trusted side
    sets ``memory.max`` / ``memory.limit_in_bytes`` (swap included) and ``pids.max``
    before it hands the command over. Once the tree is dead, the supervisor reads which
    limit was hit (an OOM kill, refused forks) and removes the cgroup.
rlimits
    File size (``RLIMIT_FSIZE``) and CPU time (``RLIMIT_CPU``, per process) are always
    rlimits. Without a memory cgroup an explicit memory limit becomes ``RLIMIT_AS``
    (address space, per process: an over-estimate of memory, so it is not applied by
    default); without a pids cgroup an explicit process limit becomes ``RLIMIT_NPROC``,
    which the kernel does not enforce for uid 0 at all.

Stdlib only, like the rest of landlock_helper.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import resource
import signal
import time
from dataclasses import dataclass
from typing import NamedTuple

from landlock_helper.outcome import alive

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNLIMITED = ("unlimited", "none", "max", "-1")

FIELDS = ("memory", "pids", "file_size", "cpu_time")
# Defaults (see defaults()): a command may start this many tasks (threads count too),
DEFAULT_PIDS = 1024
# write files up to this size,
DEFAULT_FILE_SIZE = 8 << 30
# and use this fraction of the host's memory (only where a memory cgroup enforces it).
DEFAULT_MEMORY_FRACTION = 0.5
# Seconds between SIGXCPU (the soft limit) and SIGKILL (the hard one).
CPU_GRACE_S = 2


class LimitError(ValueError):
    """A limit a person wrote that does not parse; the message says which and why.
    From :func:`from_table`, ``key`` is the table's key at fault (None: the table itself)."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class Limits:
    """Resource limits of one command. ``None``: the default; ``0``: no limit."""

    memory: int | None = None  # bytes, the tree's (cgroup) or each process's address space (rlimit)
    pids: int | None = None  # processes and threads of the tree (cgroup) or of the uid (rlimit)
    file_size: int | None = None  # bytes, largest file the command may write
    cpu_time: int | None = None  # seconds of CPU, per process

    def __post_init__(self) -> None:
        for name in FIELDS:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise LimitError(f"{name.replace('_', '-')} limit must be a whole number >= 0, got {value!r}")

    def merged(self, other: Limits | None) -> Limits:
        """These limits with every field ``other`` sets taken from ``other``."""
        if other is None:
            return self
        return dataclasses.replace(self, **{f: getattr(other, f) for f in FIELDS if getattr(other, f) is not None})

    def describe(self) -> str:
        """One line for a person: ``memory 512 MiB, pids 1024, file size 8 GiB, CPU time none``."""
        parts = []
        for name in FIELDS:
            value = getattr(self, name)
            if value is None:
                shown = "default"
            elif value == 0:
                shown = "none"
            elif name in ("memory", "file_size"):
                shown = format_size(value)
            elif name == "cpu_time":
                shown = f"{value} s"
            else:
                shown = str(value)
            parts.append(f"{_LABELS[name]} {shown}")
        return ", ".join(parts)


_LABELS = {"memory": "memory", "pids": "pids", "file_size": "file size", "cpu_time": "CPU time"}


def parse_size(text: str | int, what: str = "size") -> int:
    """``512M``, ``1G``, ``1.5g``, ``64MiB``, ``4096`` (bytes): docker's spelling, binary
    units; ``0`` / ``unlimited`` / ``none`` / ``-1``: no limit (0). Raises LimitError."""
    if isinstance(text, bool):
        raise LimitError(f"{what}: not a size: {text!r}")
    if isinstance(text, int):
        if text < -1:
            raise LimitError(f"{what}: must be 0 or more, got {text}")
        return max(text, 0)
    if text.strip().lower() in _UNLIMITED:
        return 0
    found = _SIZE.match(text)
    if not found:
        raise LimitError(f"{what}: not a size: {text!r} (write e.g. 512M, 1G, 64k or a number of bytes)")
    return int(float(found.group(1)) * _UNITS[found.group(2).lower()])


def parse_count(text: str | int, what: str = "number") -> int:
    """A whole number >= 0; ``unlimited`` / ``none`` / ``-1`` (docker's) mean no limit (0)."""
    if isinstance(text, bool):
        raise LimitError(f"{what}: not a whole number: {text!r}")
    if isinstance(text, str):
        if text.strip().lower() in _UNLIMITED:
            return 0
        try:
            text = int(text.strip())
        except ValueError:
            raise LimitError(f"{what}: not a whole number: {text!r}") from None
    if not isinstance(text, int) or text < -1:
        raise LimitError(f"{what}: must be a whole number >= 0, got {text!r}")
    return max(text, 0)


def parse_duration(text: str | int, what: str = "CPU time") -> int:
    """Seconds: ``60``, ``60s``, ``5m``, ``1h``; ``0`` / ``unlimited``: no limit."""
    if isinstance(text, str):
        low = text.strip().lower()
        if low in _UNLIMITED:
            return 0
        found = re.match(r"^(\d+)\s*(s|m|h)?$", low)
        if not found:
            raise LimitError(f"{what}: not a duration: {text!r} (write e.g. 60, 60s, 5m, 1h)")
        return int(found.group(1)) * {None: 1, "s": 1, "m": 60, "h": 3600}[found.group(2)]
    return parse_count(text, what)


def from_table(table: object, where: str = "limits") -> Limits:
    """The ``[limits]`` table of a configuration file: ``memory = "512M"``, ``pids = 256``
    (or ``pids-limit``), ``file_size = "1G"`` (or ``file-size``), ``cpu_time = 60`` (or
    ``cpu-time``). Raises LimitError naming ``where`` and the key."""
    if not isinstance(table, dict):
        raise LimitError(f"{where} must be a table")
    aliases = {"memory": "memory", "pids": "pids", "pids_limit": "pids", "pids-limit": "pids",
               "file_size": "file_size", "file-size": "file_size", "cpu_time": "cpu_time", "cpu-time": "cpu_time"}
    parsers = {"memory": parse_size, "pids": parse_count, "file_size": parse_size, "cpu_time": parse_duration}
    values: dict[str, int] = {}
    for key, value in table.items():
        name = aliases.get(key)
        if name is None:
            reason = "unknown limit (known: memory, pids, file_size, cpu_time)"
            raise LimitError(f"{where}.{key}: {reason}", key)
        try:
            values[name] = parsers[name](value, f"{where}.{key}")
        except LimitError as e:
            raise LimitError(str(e), key) from None
    return Limits(**values)


def format_size(n: int) -> str:
    """``512 MiB``, ``1 GiB``, ``1.5 GiB``, ``100 bytes``."""
    for unit, shift in (("PiB", 50), ("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            value = n / (1 << shift)
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} bytes"


def total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def defaults() -> Limits:
    """What a command gets when nothing is asked: 1024 tasks, half the host's memory,
    files up to 8 GiB, no CPU-time limit (a command's timeout bounds its time)."""
    memory = int(total_memory() * DEFAULT_MEMORY_FRACTION)
    return Limits(memory=memory, pids=DEFAULT_PIDS, file_size=DEFAULT_FILE_SIZE, cpu_time=0)


def resolve(asked: Limits | None, base: Limits | None = None) -> Limits:
    """The limits that apply: ``base`` (default :func:`defaults`) overridden by what
    ``asked`` sets. Every field of the result is set; 0 means no limit."""
    return (base or defaults()).merged(asked)


# --- cgroups ----------------------------------------------------------------------

CGROUP_PARENT = "sluice"
# memory and pids enforce limits; cpu only makes each command one scheduling entity
# (equal weights), so a command's thousand processes share the CPU time of one, and the
# daemon, the executors and other commands keep theirs.
_CONTROLLERS = ("memory", "pids", "cpu")


# Named tuples, not dataclasses: a dataclass costs every `sluice run` half a millisecond
# to make at import (Limits stays one: the wire encodes it).
class _Hierarchy(NamedTuple):
    version: int  # 1 or 2
    parent: str  # the directory command cgroups are made in
    controllers: tuple[str, ...]


class Mechanism(NamedTuple):
    """What enforces each limit on this host (see :func:`mechanism`)."""

    hierarchies: tuple[_Hierarchy, ...] = ()
    reason: str = ""  # why there is no cgroup for some controller, for a person
    as_root: bool = False

    def cgroup_for(self, controller: str) -> _Hierarchy | None:
        for h in self.hierarchies:
            if controller in h.controllers:
                return h
        return None

    def describe(self) -> str:
        """``memory: cgroup v1; pids: cgroup v1; file size, CPU time: rlimits``."""
        parts = []
        for c in _CONTROLLERS:
            h = self.cgroup_for(c)
            if h is not None:
                parts.append(f"{c}: cgroup v{h.version}" + (" (a share per command)" if c == "cpu" else ""))
            elif c == "cpu":
                parts.append("cpu: shared per process (no cpu cgroup)")
            elif c == "memory":
                parts.append("memory: RLIMIT_AS when asked (no memory cgroup)")
            else:
                parts.append("pids: RLIMIT_NPROC when asked" + (" (not enforced for root)" if self.as_root else "")
                             + " (no pids cgroup)")
        parts.append("file size: RLIMIT_FSIZE; CPU time: RLIMIT_CPU per process")
        text = "; ".join(parts)
        return f"{text} ({self.reason})" if self.reason else text


_mechanism: Mechanism | None = None


def mechanism(refresh: bool = False) -> Mechanism:
    """This process's way of enforcing limits, found once (cgroups it may create, else rlimits).

    ``$SLUICE_NO_CGROUPS`` set to a non-empty value: rlimits only (for tests, and for
    hosts where making cgroups is not wanted)."""
    global _mechanism
    if _mechanism is None or refresh:
        _mechanism = _detect()
    return _mechanism


def _detect() -> Mechanism:
    as_root = os.geteuid() == 0
    if os.environ.get("SLUICE_NO_CGROUPS"):
        return Mechanism(reason="cgroups turned off by SLUICE_NO_CGROUPS", as_root=as_root)
    try:
        mounts = _cgroup_mounts()
        own = _own_cgroups()
    except OSError as e:
        return Mechanism(reason=f"cannot read the cgroup layout: {e.strerror}", as_root=as_root)
    found: list[_Hierarchy] = []
    reasons: list[str] = []
    wanted = list(_CONTROLLERS)
    # cgroup v2 first: a controller sits in one hierarchy only, v1 or v2.
    for mountpoint, root, fstype, options in mounts:
        if fstype != "cgroup2" or "" not in own:
            continue
        h, why = _v2_parent(mountpoint, root, own[""], wanted)
        if h is not None:
            found.append(h)
            wanted = [c for c in wanted if c not in h.controllers]
        elif why:
            reasons.append(why)
        break
    for controller in list(wanted):
        for mountpoint, root, fstype, options in mounts:
            if fstype != "cgroup" or controller not in options:
                continue
            h, why = _v1_parent(mountpoint, root, own.get(controller), controller)
            if h is not None:
                found.append(h)
                wanted.remove(controller)
            elif why:
                reasons.append(why)
            break
    if wanted and not reasons:
        reasons.append(f"no usable cgroup for {', '.join(wanted)}")
    return Mechanism(hierarchies=tuple(found), reason="; ".join(reasons) if wanted else "", as_root=as_root)


def _cgroup_mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount point, root inside the hierarchy, fstype, super options) of cgroup mounts."""
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(fields) < 5 or len(rest) < 3 or rest[0] not in ("cgroup", "cgroup2"):
                continue
            out.append((_unescape(fields[4]), _unescape(fields[3]), rest[0], set(rest[2].split(","))))
    return out


def _unescape(path: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def _own_cgroups() -> dict[str, str]:
    """controller -> our cgroup's path in its hierarchy; ``""`` is the v2 hierarchy."""
    own: dict[str, str] = {}
    with open("/proc/self/cgroup", encoding="utf-8", errors="replace") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if not controllers:
                own[""] = path
            for c in controllers.split(","):
                if c:
                    own[c] = path
    return own


def _local(mountpoint: str, root: str, path: str) -> str | None:
    """Where cgroup ``path`` of a hierarchy is under ``mountpoint`` (mounted at ``root``)."""
    if path.endswith(" (deleted)"):
        return None
    root = root.rstrip("/")
    if root and not (path == root or path.startswith(root + "/")):
        return None  # our cgroup is outside what is mounted here
    return os.path.join(mountpoint, path[len(root):].lstrip("/"))


def _read(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read()


def _v2_parent(mountpoint: str, root: str, path: str, wanted: list[str]) -> tuple[_Hierarchy | None, str]:
    here = _local(mountpoint, root, path)
    if here is None:
        return None, "our cgroup v2 is not visible in its mount"
    try:
        available = set(_read(os.path.join(mountpoint, "cgroup.controllers")).split())
    except OSError:
        available = set()
    usable = [c for c in wanted if c in available]
    if not usable:
        return None, ""  # an empty v2 mount beside v1 controllers (hybrid): nothing to say
    # The nearest cgroup, ours or an ancestor, that we may write and whose children get the
    # controllers: our own one only qualifies when it holds no processes (v2's rule).
    cur = here
    while True:
        try:
            enabled = set(_read(os.path.join(cur, "cgroup.subtree_control")).split())
        except OSError:
            enabled = set()
        have = [c for c in usable if c in enabled]
        if have and os.access(cur, os.W_OK) and os.access(os.path.join(cur, "cgroup.procs"), os.W_OK):
            parent = os.path.join(cur, CGROUP_PARENT)
            try:
                have = _make_v2_parent(parent, have)
            except OSError as e:
                return None, f"cannot make cgroup {parent}: {e.strerror}"
            return _Hierarchy(2, parent, tuple(have)), ""
        if os.path.normpath(cur) == os.path.normpath(mountpoint):
            return None, "no writable cgroup v2 with the memory/pids controllers delegated"
        cur = os.path.dirname(cur)


def _make_v2_parent(parent: str, controllers: list[str]) -> list[str]:
    """Make ``parent`` and give its children ``controllers``; returns those it could give
    (raises OSError when none)."""
    try:
        os.mkdir(parent)
    except FileExistsError:
        pass
    control = os.path.join(parent, "cgroup.subtree_control")
    enabled = set(_read(control).split())
    missing = [c for c in controllers if c not in enabled]
    if missing:
        from landlock_helper import _libc  # here, as in _set_limit

        try:
            _libc.write_file(control, " ".join(f"+{c}" for c in missing))
        except OSError as e:
            for c in missing:  # one by one: keep what can be had
                try:
                    _libc.write_file(control, f"+{c}")
                except OSError:
                    pass
            enabled = set(_read(control).split())
            if not any(c in enabled for c in controllers):
                raise e
            return [c for c in controllers if c in enabled]
    return list(controllers)


def _v1_parent(mountpoint: str, root: str, path: str | None, controller: str) -> tuple[_Hierarchy | None, str]:
    if path is None:
        return None, ""
    here = _local(mountpoint, root, path)
    if here is None:
        return None, f"our {controller} cgroup is not visible in its mount"
    if not os.access(here, os.W_OK):
        return None, f"cgroup v1 {controller} not writable"
    parent = os.path.join(here, CGROUP_PARENT)
    try:
        os.mkdir(parent)
    except FileExistsError:
        pass
    except OSError as e:
        return None, f"cannot make cgroup {parent}: {e.strerror}"
    return _Hierarchy(1, parent, (controller,)), ""


_counter = 0


class CommandCgroup:
    """The cgroup(s) of one sandbox, one per hierarchy, all of one name.

    The sandbox's supervisor makes them (:meth:`make`) before the sandbox's processes
    exist, its command process joins them (:meth:`procs_fds`) while the sandbox is warm,
    the trusted side sets the command's limits (:meth:`set_limits`, files it opens by
    name: no cgroup lock involved) before it hands the command over, and once the tree is
    dead the supervisor reads them (:meth:`counters`) and removes them (:meth:`remove`).
    So the caller (an executor's event loop) never makes or removes a cgroup itself:
    mkdir, rmdir and joining take the kernel's cgroup locks, which a fork bomb in another
    sandbox can keep busy for seconds."""

    def __init__(self, hierarchies, name: str) -> None:
        self.name = name
        self.dirs: list[tuple[_Hierarchy, str]] = [(h, os.path.join(h.parent, name)) for h in hierarchies]
        # The parents, open (from make): reached through these, the cgroups stay reachable
        # after the supervisor's mount namespace has been turned into the sandbox's view.
        self._parent_fds: dict[str, int] = {}

    @classmethod
    def make(cls, hierarchies) -> CommandCgroup:
        """Make the cgroups, named after this process (see :func:`sweep_stale`)."""
        global _counter
        _counter += 1
        cg = cls((), f"{os.getpid()}-{_counter}-{os.urandom(3).hex()}")
        try:
            for h in hierarchies:
                path = os.path.join(h.parent, cg.name)
                cls._mkdir(h, path)
                cg.dirs.append((h, path))
                cg._parent_fds[path] = os.open(h.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            cg.remove()
            raise OSError(e.errno, f"cannot make the command's cgroup: {e.strerror}", e.filename) from None
        return cg

    def set_limits(self, limits: Limits) -> None:
        """Write ``limits`` (resolved) into the cgroups; raises OSError."""
        for h, path in self.dirs:
            for c in h.controllers:
                _set_limit(h.version, path, c, getattr(limits, c, 0) or 0)

    @staticmethod
    def _mkdir(h: _Hierarchy, path: str) -> None:
        for _ in range(3):
            try:
                os.mkdir(path)
                return
            except FileNotFoundError:  # the parent went away (removed when empty): again
                try:
                    if h.version == 2:
                        _make_v2_parent(h.parent, list(h.controllers))
                    else:
                        os.mkdir(h.parent)
                except FileExistsError:
                    pass
        os.mkdir(path)

    def procs_fds(self) -> list[int]:
        """``cgroup.procs`` of each of our cgroups, open for writing: the command process
        writes ``0`` to each (:func:`join`). The caller closes them."""
        fds: list[int] = []
        try:
            for _, path in self.dirs:
                fds.append(os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC))
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        return fds

    def counters(self) -> dict[str, int]:
        """``oom_kill``: processes the memory limit killed; ``pids_max``: forks refused."""
        out = {"oom_kill": 0, "pids_max": 0}
        for h, path in self.dirs:
            if "memory" in h.controllers:
                name = "memory.events" if h.version == 2 else "memory.oom_control"
                out["oom_kill"] = _field(self._at(path, name), "oom_kill", self._parent_fds.get(path))
            if "pids" in h.controllers:
                out["pids_max"] = _field(self._at(path, "pids.events"), "max", self._parent_fds.get(path))
        return out

    def _at(self, path: str, file: str | None = None) -> str:
        """``path`` (or a file in it) relative to its open parent, if we hold one."""
        if path in self._parent_fds:
            path = os.path.basename(path)
        return path if file is None else os.path.join(path, file)

    def remove(self, wait_s: float = 0.0) -> bool:
        """Remove the cgroups (they must be empty: the tree is dead); True when all are gone.
        A cgroup still busy is retried for ``wait_s`` seconds."""
        deadline = time.monotonic() + wait_s
        left = []
        for h, path in self.dirs:
            while True:
                try:
                    os.rmdir(self._at(path), dir_fd=self._parent_fds.get(path))
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if e.errno == errno.EBUSY and time.monotonic() < deadline:
                        time.sleep(0.005)
                        continue
                    left.append((h, path))
                    break
        for _, path in self.dirs:
            if path not in (p for _, p in left) and path in self._parent_fds:
                os.close(self._parent_fds.pop(path))
        self.dirs = left
        return not left


_NAME = re.compile(r"^(\d+)-\d+-[0-9a-f]{6}$")


def sweep_stale(mech: Mechanism | None = None, min_age_s: float = 10.0) -> int:
    """Remove the empty command cgroups of processes that are gone (a sandbox's
    supervisor killed before it could remove them); returns how many. Only those at least ``min_age_s``
    old: a process in another PID namespace that shares the hierarchy may look gone to
    us, and its cgroup, just made, may not have been joined yet."""
    mech = mech or mechanism()
    removed = 0
    now = time.time()
    for h in mech.hierarchies:
        try:
            names = os.listdir(h.parent)
        except OSError:
            continue
        for name in names:
            found = _NAME.match(name)
            if not found or int(found.group(1)) == os.getpid() or alive(int(found.group(1))):
                continue
            path = os.path.join(h.parent, name)
            try:
                if now - os.stat(path).st_mtime < min_age_s:
                    continue
                os.rmdir(path)  # EBUSY while anything is in it
                removed += 1
            except OSError:
                pass
    return removed


def _set_limit(version: int, path: str, controller: str, value: int) -> None:
    # Here, not at the top: a frontend that only parses limits does not load ctypes.
    from landlock_helper import _libc

    if controller == "cpu":
        return  # the default weight: every command the same
    if controller == "pids":
        _libc.write_file(os.path.join(path, "pids.max"), str(value) if value else "max")
    elif controller == "memory":
        if version == 2:
            _libc.write_file(os.path.join(path, "memory.max"), str(value) if value else "max")
            if value and os.path.exists(os.path.join(path, "memory.swap.max")):
                _libc.write_file(os.path.join(path, "memory.swap.max"), "0")
        else:
            text = str(value) if value else "-1"
            _libc.write_file(os.path.join(path, "memory.limit_in_bytes"), text)
            memsw = os.path.join(path, "memory.memsw.limit_in_bytes")
            if os.path.exists(memsw):  # swap counts too (accounting may be off: then it is absent)
                _libc.write_file(memsw, text)


def _field(path: str, key: str, dir_fd: int | None = None) -> int:
    # One read, bytes: this runs in a supervisor forked for one sandbox, where a text
    # file object would cost more (pages of the io machinery copied) than the read.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            text = os.read(fd, 65536)
        finally:
            os.close(fd)
        want = key.encode()
        for line in text.splitlines():
            name, _, value = line.partition(b" ")
            if name == want:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


# --- applying -----------------------------------------------------------------------


def plan_rlimits(limits: Limits, covered, as_root: bool,
                 asked: Limits | None = None) -> list[tuple[int, int, int]]:
    """The rlimits the command process sets before exec: (resource, soft, hard).

    ``limits`` resolved, ``asked`` what the request set, ``covered`` the controllers a
    cgroup of the command enforces. Memory and processes only where no cgroup covers
    them, and only when ``asked`` sets them: a default address-space limit would break
    programs that reserve more than they use (see the module docstring)."""
    out = []
    if limits.file_size:
        out.append((resource.RLIMIT_FSIZE, limits.file_size, limits.file_size))
    if limits.cpu_time:
        out.append((resource.RLIMIT_CPU, limits.cpu_time, limits.cpu_time + CPU_GRACE_S))
    asked = asked or Limits()
    if limits.memory and "memory" not in covered and asked.memory is not None:
        out.append((resource.RLIMIT_AS, limits.memory, limits.memory))
    if limits.pids and "pids" not in covered and not as_root and asked.pids is not None:
        out.append((resource.RLIMIT_NPROC, limits.pids, limits.pids))
    return out


def apply_rlimits(plan) -> None:
    """In the command process, before exec: lower each limit (never above its hard limit now)."""
    for res, soft, hard in plan:
        _, cur_hard = resource.getrlimit(res)
        if cur_hard != resource.RLIM_INFINITY:
            hard = min(hard, cur_hard)
            soft = min(soft, hard)
        resource.setrlimit(res, (soft, hard))


def join(fds) -> None:
    """In the sandbox's command process: move ourselves into its cgroups."""
    for fd in fds:
        os.write(fd, b"0")
        os.close(fd)


def what_hit(limits: Limits, counters: dict[str, int] | None, sig: int | None) -> str | None:
    """The limit the command ran into, for a person (``killed: memory limit 512 MiB
    reached``), from the cgroup's counters and the signal that ended it; None if none."""
    counters = counters or {}
    if counters.get("oom_kill") and limits.memory:
        return f"killed: memory limit {format_size(limits.memory)} reached"
    if sig == signal.SIGXCPU and limits.cpu_time:
        return f"killed: CPU time limit {limits.cpu_time} s reached"
    if sig == signal.SIGXFSZ and limits.file_size:
        return f"killed: file size limit {format_size(limits.file_size)} reached"
    refused = counters.get("pids_max")
    if refused and limits.pids:
        return f"pids limit {limits.pids} reached ({refused} fork{'s' if refused != 1 else ''} refused)"
    return None
