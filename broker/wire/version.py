"""sluice's version, the one place it is spelled (pyproject.toml's must match: a unit test
checks it). It crosses the wire in :class:`broker.wire.frames.Hello` and ``Welcome``, so a
command line newer than the daemon it talks to can say so."""

from __future__ import annotations

SLUICE_VERSION = "0.1.0"


def version_key(version: str) -> tuple[int, ...]:
    """``"1.10.2"`` as ``(1, 10, 2)`` for comparing; what is not a number counts as 0,
    and an empty version (a peer from before versions were exchanged) as ``()``, older
    than every other."""
    key = []
    for part in version.split(".") if version else ():
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        key.append(int(digits or 0))
    return tuple(key)
