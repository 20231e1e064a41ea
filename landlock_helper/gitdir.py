"""Whether a new ``.git`` directory is one git itself made, which nothing can make run.

A sandboxed command that leaves a new ``.git`` where the user will run git (the
workspace, or one of its direct subdirectories) could have planted something git runs
with the user's rights: a hook, or a config key naming a program (``core.fsmonitor``,
``core.hooksPath``, ``core.sshCommand``, an alias, a filter or a diff or merge driver,
a credential helper, an ``include``...). ``git clone`` and ``git init`` leave none of
that: only git's ``*.sample`` hooks, and a config of a few keys that name no program.
So a new ``.git`` is let through when it holds exactly that (:func:`refusal` says None),
and moved aside otherwise (by :mod:`landlock_helper.mounts`).

The config is read with a grammar stricter than git's: a line this module does not
understand in full (quoting, escapes, continuation lines, comments after a header)
refuses the directory, so git can never read a key here that this module did not see.
Only keys on :data:`ALLOWED` pass; URLs must name no transport helper
(``ext::sh -c ...``, ``foo::...``, ``foo://`` for an unknown ``foo``), since git would
run ``git-remote-foo``.

Everything is read through directory fds opened once without following a symlink (the
``.git`` itself must still be the directory the caller listed): a command of the same
session still running may rename things meanwhile, and what is checked is what was
opened. A link (a config that is a symlink, or a hard link with a second name a later
command could write through) is refused: the read-only view later commands get covers
the ``.git`` directory, not where a link leads. Stdlib only.
"""

from __future__ import annotations

import os
import re
import stat

# section (a "*" stands for any subsection) -> the keys git clone / git init write.
ALLOWED = {
    "core": {"repositoryformatversion", "filemode", "bare", "logallrefupdates", "symlinks", "ignorecase",
             "precomposeunicode", "sparsecheckout", "sparsecheckoutcone"},
    "remote.*": {"url", "fetch", "tagopt", "mirror", "promisor", "partialclonefilter"},
    "branch.*": {"remote", "merge"},
    "submodule": {"active"},
    "submodule.*": {"url", "active"},
    "extensions": {"objectformat", "refstorage", "partialclone", "worktreeconfig"},
}
# A submodule's git directory (``.git/modules/NAME``) names its work tree.
ALLOWED_IN_MODULE = {"core": ALLOWED["core"] | {"worktree"}}
URL_KEYS = {"remote.*.url", "submodule.*.url"}
# Transports git speaks itself; any other ``X://`` runs a helper, ``git-remote-X``.
SCHEMES = ("file", "git", "ssh", "git+ssh", "ssh+git", "http", "https", "ftp", "ftps")

# Files that would make git read a config from elsewhere.
ELSEWHERE = ("commondir",)
# Legacy remote definitions git still reads; a clone leaves these empty if at all.
LEGACY_REMOTES = ("remotes", "branches")

MAX_CONFIG = 64 * 1024
MAX_DEPTH = 8
# Entries listed in all (hooks, modules): a clone has a few dozen.
MAX_ENTRIES = 10_000

_SECTION = re.compile(r'\[([A-Za-z0-9-]+)(?: "([^"\\]*)")?\]')
_ENTRY = re.compile(r"([A-Za-z][A-Za-z0-9-]*)(?:[ \t]*=[ \t]*([^\"\\#;]*))?")

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Never blocks on a FIFO, never takes a terminal as ours.
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class Refused(Exception):
    """Why the directory is not let through, for a person."""


def refusal(parent_fd: int, name: str, identity: tuple[int, int]) -> str | None:
    """None when ``name`` in the directory ``parent_fd`` is a git directory as git makes
    it, and is the directory (``identity``: device, inode) the caller listed; else why not."""
    try:
        fd = os.open(name, _DIR, dir_fd=parent_fd)
    except OSError as e:
        return f"it could not be opened ({e.strerror})"
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != tuple(identity):
            return "it changed while sluice looked at it"
        _check_gitdir(fd, module=False, budget=[MAX_ENTRIES])
    except Refused as e:
        return str(e)
    except OSError as e:
        return f"it could not be read ({e.strerror})"
    finally:
        os.close(fd)
    return None


def _check_gitdir(fd: int, *, module: bool, budget: list[int]) -> None:
    # Names are looked up, never listed: a directory of a million entries costs nothing.
    for name in ELSEWHERE:
        if _lstat(fd, name) is not None:
            raise Refused(f"it has a {name} file, which makes git read another directory's config")
    allowed = {**ALLOWED, **ALLOWED_IN_MODULE} if module else ALLOWED
    if _lstat(fd, "config") is None:
        raise Refused("it has no config")
    check_config(_read_config(fd, "config"), allowed)
    if _lstat(fd, "config.worktree") is not None:
        check_config(_read_config(fd, "config.worktree"), allowed)
    if _lstat(fd, "hooks") is not None:
        for entry, kind in _entries(fd, "hooks", budget):
            if not (entry.endswith(".sample") and kind == "file"):
                raise Refused(f"it has a hook, hooks/{entry}")
    for name in LEGACY_REMOTES:
        if _lstat(fd, name) is not None and _entries(fd, name, budget):
            raise Refused(f"its {name}/ is not empty (git reads remotes from it)")
    if _lstat(fd, "modules") is not None:
        _check_modules(fd, "modules", 1, budget)


def _lstat(fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _open(fd: int, name: str, flags: int, how: str = "") -> int:
    try:
        return os.open(name, flags, dir_fd=fd)
    except OSError as e:
        raise Refused(f"its {name} could not be opened{how} ({e.strerror})") from None


def _entries(fd: int, name: str, budget: list[int]) -> list[tuple[str, str]]:
    """(name, "file" | "dir" | "link" | "other") of each entry of the directory ``name``
    in ``fd`` (never a link to one), at most ``budget[0]`` of them in all."""
    sub = _open(fd, name, _DIR, " as a directory")
    entries = []
    try:
        with os.scandir(sub) as it:
            for entry in it:
                budget[0] -= 1
                if budget[0] < 0:
                    raise Refused("it holds more entries than sluice looks through")
                kind = ("link" if entry.is_symlink() else "dir" if entry.is_dir(follow_symlinks=False)
                        else "file" if entry.is_file(follow_symlinks=False) else "other")
                entries.append((entry.name, kind))
    finally:
        os.close(sub)
    return entries


def _read_config(fd: int, name: str) -> bytes:
    f = _open(fd, name, _FILE)
    try:
        st = os.fstat(f)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"its {name} is not a regular file")
        if st.st_nlink != 1:
            raise Refused(f"its {name} has another name (a hard link) a later command could write through")
        if st.st_size > MAX_CONFIG:
            raise Refused(f"its {name} is larger than a clone's ({st.st_size} bytes)")
        data = os.read(f, MAX_CONFIG + 1)
        if len(data) > MAX_CONFIG:
            raise Refused(f"its {name} is larger than a clone's")
        return data
    finally:
        os.close(f)


def check_config(data: bytes, allowed: dict[str, set[str]] = ALLOWED) -> None:
    """Raise :class:`Refused` unless ``data`` is a git config of allowed keys only,
    in a form this module reads exactly as git does."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise Refused("its config is not UTF-8") from None
    if "\r" in text or "\0" in text:
        raise Refused("its config has carriage returns or NUL bytes")
    section = None
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.strip(" \t")
        if not line or line[0] in "#;":
            continue
        header = _SECTION.fullmatch(line)
        if header:
            name, sub = header.group(1).lower(), header.group(2)
            section = name if sub is None else f"{name}.*"
            continue
        entry = _ENTRY.fullmatch(line)
        if entry is None or section is None:
            raise Refused(f"its config has a line sluice does not read as git would (line {number})")
        key = entry.group(1).lower()
        if key not in allowed.get(section, ()):
            shown = section.replace(".*", ".<name>")
            raise Refused(f"its config sets {shown}.{key}, which git clone does not")
        if f"{section}.{key}" in URL_KEYS and not _plain_url(entry.group(2) or ""):
            raise Refused(f"its config's {section.replace('.*', '.<name>')}.{key} names a transport helper")


def _plain_url(url: str) -> bool:
    url = url.strip(" \t")
    if not url or url.startswith("-") or "::" in url:
        return False
    scheme, sep, _ = url.partition("://")
    return not sep or scheme.lower() in SCHEMES


def _check_modules(fd: int, name: str, depth: int, budget: list[int]) -> None:
    """``modules/`` holds the submodules' git directories, at paths of one or more
    components (a submodule's name may have slashes); each is checked as a git directory."""
    if depth > MAX_DEPTH:
        raise Refused("its modules/ nest deeper than sluice looks")
    sub = _open(fd, name, _DIR, " as a directory")
    try:
        if _lstat(sub, "HEAD") is not None:
            _check_gitdir(sub, module=True, budget=budget)
            return
        for entry, kind in _entries(sub, ".", budget):
            if kind == "link":
                raise Refused(f"its modules/ hold a symbolic link, {entry}")
            if kind == "dir":
                _check_modules(sub, entry, depth + 1, budget)
    finally:
        os.close(sub)
