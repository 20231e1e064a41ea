"""A login shell that keeps the caller's PATH.

``bash -lc SCRIPT`` reads /etc/profile before SCRIPT, and Debian's (like many) sets PATH
outright, so the venv, pyenv or nvm the caller activated is gone by the time SCRIPT
runs. Agents and MCP server configurations use ``bash -lc`` by habit, so sluice gives
the shell it execs one statement before SCRIPT, on the same line (line numbers stay as
they were): ``export PATH='<the command's PATH>';``. The login scripts still run, with
everything else they set; only PATH is the caller's again when SCRIPT starts, as it is
in a terminal where the venv was activated after login.

Codex meets the same trap differently: it captures a login shell's environment once
into a snapshot file and runs each ``-lc`` script as ``-c`` after sourcing it and
re-exporting the caller's explicit variables. A file would have to lie where no
sandboxed command can change it and every sandbox can read it; a literal in the argv
needs neither, and each command gets its own.

Only what sluice itself execs is rewritten, and only a POSIX-family shell asked for a
login shell and a ``-c`` script. ``bash -c``, other programs, and a login shell that a
command starts by itself (a script running ``bash -lc``) are left alone: those are the
command's own business, as on any machine. Stdlib only.
"""

from __future__ import annotations

import os
import re
import shlex

SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash"})

# A cluster of one-letter flags that take no argument (-o and -O take one).
_FLAGS = re.compile(r"-[A-Za-np-zA-NP-Z]+")


def keep_path(argv: list[str], env) -> list[str]:
    """``argv`` with its login shell's script made to start from ``env``'s PATH, or
    ``argv`` itself when it is not a login shell running a ``-c`` script."""
    path = env.get("PATH")
    if not path or len(argv) < 3 or os.path.basename(argv[0]) not in SHELLS:
        return argv
    login = script = False
    at = None  # where the -c script is: the first argument after the options
    for i, arg in enumerate(argv[1:], 1):
        if arg == "--login":
            login = True
        elif arg in ("--noprofile", "--norc"):
            continue
        elif _FLAGS.fullmatch(arg):
            login = login or "l" in arg
            script = script or "c" in arg
        else:
            at = i + 1 if arg in ("-", "--") else i  # "--" (or "-") ends the options
            break
    if not (login and script) or at is None or at >= len(argv):
        return argv
    return [*argv[:at], f"export PATH={shlex.quote(path)}; {argv[at]}", *argv[at + 1:]]
