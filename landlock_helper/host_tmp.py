"""The host's /tmp and the sandbox's: what a person must be told before a command runs.

Inside a restricted sandbox ``/tmp`` is sluice's own directory (:func:`scratch_path`),
not the host's (:mod:`landlock_helper.mounts` says why). Of the host's /tmp a command
sees only its directory, its writable roots and its readable roots, each at its own
path. That is right, and it surprises: a virtual environment or a tool in the host's
/tmp is not there, and a write to a host /tmp path lands in sluice's directory. So the
trusted side, before the command runs, works out from its arguments alone:

- :func:`hidden_program`: the program the command names (a path, or a name found on
  its ``PATH``) lies in the host's /tmp where the sandbox will not show it: it would not
  be found inside, or another one would run (a venv's ``python`` on ``PATH``, then the
  system's). The caller refuses the run, naming ``--readable``.
- :func:`note`: the one line that says /tmp inside is sluice's own and where it is on
  the host, when the command's directory or program lies in the host's /tmp.

Stdlib only, and cheap: ``sluice run`` imports it on its fast path.
"""

from __future__ import annotations

import os

from landlock_helper.policy import is_beneath

TMP = "/tmp"


def in_tmp(path: str) -> bool:
    return path == TMP or path.startswith(TMP + "/")


def scratch_path(uid: int | None = None) -> str:
    """The host directory that is /tmp inside every sandbox of user ``uid`` (made, and
    checked, by :func:`landlock_helper.mounts.scratch_dir`)."""
    return f"{TMP}/sluice-tmp-{os.geteuid() if uid is None else uid}"


def program_path(program: str, cwd: str, env) -> str | None:
    """Where exec would find ``program`` on the host: a path (with a ``/``) taken from
    ``cwd``, else the first executable of that name on the command's ``PATH``."""
    if "/" in program:
        return os.path.normpath(os.path.join(cwd, program))
    for entry in (env.get("PATH") or os.defpath).split(os.pathsep):
        candidate = os.path.join(os.path.join(cwd, entry) if entry else cwd, program)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.normpath(candidate)
    return None


def _shown(path: str, visible) -> bool:
    # Only a directory in the host's /tmp is bound in; /tmp itself (the policy's temp
    # folder) is sluice's /tmp, not the host's.
    return not in_tmp(path) or any(in_tmp(root) and root != TMP and is_beneath(path, root) for root in visible)


def hidden_program(program: str, cwd: str, env, visible) -> str | None:
    """A line for a person when ``program`` lies in the host's /tmp outside the
    ``visible`` directories (the command's directory, writable and readable roots; all
    absolute) and sluice's /tmp has nothing there either; None otherwise. (When sluice's
    /tmp has a file there, that one runs: :func:`note` says whose /tmp it is.)"""
    path = program_path(program, cwd, env)
    if path is None or _shown(path, visible) or path == TMP:
        return None
    if os.path.lexists(scratch_path() + path[len(TMP):]):
        return None
    top = os.path.dirname(path)
    if os.path.basename(top) == "bin" and os.path.dirname(top) != TMP:
        top = os.path.dirname(top)  # a venv's or a prefix's bin: show the whole of it
    what = path if program == path else f"{program} is {path}, which"
    return (f"{what} lies in the host's /tmp, which the sandbox does not show (its /tmp is sluice's own, "
            f"{scratch_path()} on the host); show it read-only with --readable {top}")


def note(program: str, cwd: str, env) -> str | None:
    """The line that says whose /tmp the command sees, when its directory or its
    program lies in the host's /tmp; None otherwise."""
    path = program_path(program, cwd, env)
    if not (in_tmp(cwd) or path is not None and in_tmp(path)):
        return None
    return (f"/tmp inside the sandbox is sluice's own ({scratch_path()} on the host); of the host's /tmp it shows "
            "only the command's directory and the --writable and --readable directories")
