"""The one line that says how to let a tool write under the home directory.

Under ``workspace-write`` the home directory is read-only (and may never be a writable
root: it holds the shell's start-up files, ssh and git config, sluice's own home). Tools
that keep a cache or state there (``npm``'s ``~/.npm``, ``pip install --user``'s
``~/.local``, ``cargo``'s ``~/.cargo``, ``go``'s ``~/go`` and ``~/.cache/go-build``)
then fail, and the person needs to know which directory to allow, and how.

How a refused write is recognised: from the command's output, as it passes through
sluice on its way to a terminal. A line that says a write was refused (``EROFS``, "Read-only
file system", ``EACCES``, "Permission denied", as libc, Node, Python, Rust and Go word
it) and names a path under the home directory outside the run's writable roots, or such
a line and such a path within a few lines of each other (npm prints the path on a line
of its own). The kernel keeps no
record of the writes it refused that sluice could read (Landlock's audit records go to
the kernel's audit log, and only from Landlock ABI 7), so the output is the evidence;
the line is a hint, said after a failed command only, once.
"""

from __future__ import annotations

import collections
import os
import re

from broker.cli.base import config_path
from landlock_helper.policy import PROTECTED_SUBDIRS, is_beneath

# What libc, Node, Python, Rust and Go print for a write the sandbox refused (Node's
# recursive mkdir, npm's, says ENOENT where a directory it would make cannot be made).
_REFUSED = re.compile(rb"EROFS|[Rr]ead-only file system|EACCES|[Pp]ermission denied|ENOENT: [^\n]*, mkdir ")
# A refusal and the path it concerns are taken together within this many lines.
WINDOW = 8
# A line longer than this is looked at in its first part only.
LINE_MAX = 4096
# Directories under the home directory that hold one directory per tool.
_PARENTS = (".cache", ".config", ".local/share", ".local/state")
# The tools' own directories of docs/sandbox.md's ready list, named even before they exist
# (anything else straight in the home directory only once it is a directory: a name like
# nyc's ~/.node-spawn-wrap-PID-RANDOM is new each run, and no flag can allow it).
TOOL_DIRS = (".npm", ".cargo", ".local", "go")


class HomeWrites:
    """Fed the command's output (:meth:`feed`, chunks of each stream as they come); then
    :meth:`hint` is the line to say, or None."""

    def __init__(self, home: str | None = None, writable=()) -> None:
        """``writable``: the run's writable roots (a refusal in one of them is not the
        sandbox's doing: it is said by nobody here)."""
        home = home if home is not None else os.environ.get("HOME", "")
        self.home = os.path.realpath(home) if os.path.isabs(home) and home != "/" else None
        self.writable = [os.path.realpath(r) for r in writable]
        # Never to be allowed, so never named: sluice's home (hidden: reading it is refused
        # too) and a repository's .git or .sluice.
        from broker.net.runtime import sluice_home  # here: a `sluice run` start-up seldom needs it

        self.never = os.path.realpath(sluice_home())
        # The home directory, or a path in it, up to where a message would end it.
        self._paths = re.compile(rb"(?<![\w.-])" + re.escape(os.fsencode(self.home))
                                 + rb"(?:/[^\s'\"`,;:)\]]*|(?![\w.-]))") if self.home else None
        self._partial: dict[object, bytes] = {}  # each stream's unfinished last line
        self._recent: collections.deque[tuple[bool, bytes | None]] = collections.deque(maxlen=WINDOW)
        self._refused_ago: int | None = None  # lines since the last refusal
        self.path: str | None = None

    def feed(self, data, stream: object = 1) -> None:
        if self._paths is None or self.path is not None:
            return
        lines = (self._partial.get(stream, b"") + bytes(data)).split(b"\n")
        self._partial[stream] = lines.pop()[:LINE_MAX]
        for line in lines:
            self._line(line[:LINE_MAX])
            if self.path is not None:
                return

    def _line(self, line: bytes) -> None:
        found = self._paths.search(line)
        path = found.group(0) if found else None
        refused = bool(_REFUSED.search(line))
        if refused:
            self._refused_ago = 0
            # This line's path, else the latest one of the lines just before.
            path = path or next((p for _, p in reversed(self._recent) if p), None)
        elif self._refused_ago is not None:
            self._refused_ago += 1
            if self._refused_ago >= WINDOW:
                self._refused_ago = None
        if path is not None and self._refused_ago is not None:
            found = os.fsdecode(path).rstrip("/.")
            if not (any(is_beneath(found, root) for root in self.writable) or is_beneath(found, self.never)
                    or any(part in PROTECTED_SUBDIRS for part in found.split("/"))):
                self.path = found
        self._recent.append((refused, path))

    def screen(self, inner):
        """A :class:`landlock_helper.relay.Relay` ``terminal_filter`` that watches what
        goes to a terminal, then passes it through ``inner`` (another such filter, or None)."""
        def make():
            passes = inner() if inner is not None else None
            stream = object()

            def feed(data: bytes) -> bytes:
                self.feed(data, stream)
                return data if passes is None else passes(data)

            return feed

        return make

    def hint(self) -> str | None:
        """The line for a person, once the command failed: which directory to allow."""
        for stream in list(self._partial):
            self.feed(b"\n", stream)  # the last lines, if they had no newline
        if self.path is None:
            return None
        rel = self.path[len(self.home):].lstrip("/")
        parts = rel.split("/")
        depth = next((len(p.split("/")) + 1 for p in _PARENTS if rel.startswith(p + "/")), 1)
        if not rel or len(parts) < depth or (depth == 1 and parts[0] not in TOOL_DIRS
                                             and not os.path.isdir(os.path.join(self.home, parts[0]))):
            return (f"the command could not write {self.path}: your home directory is read-only in the sandbox, and "
                    "cannot be made writable; point the tool at a directory of its own there (see docs/sandbox.md, "
                    "'Tools that write under your home') and allow that one with --writable DIR")
        tool_dir = os.path.join(self.home, *parts[:depth])
        short = "~/" + "/".join(parts[:depth])
        make = "" if os.path.isdir(tool_dir) else f" (make it first: mkdir -p {tool_dir})"
        return (f"the command could not write {self.path} (your home directory is read-only in the sandbox): "
                f"allow {short} with --writable {tool_dir}{make}, or for every run with "
                f'writable_roots = ["{short}"] in [sandbox_workspace_write] of {config_path()}')
