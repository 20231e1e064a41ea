"""Checking the arguments of a run before anything is sent: :func:`make_request`."""

from __future__ import annotations

from collections.abc import Iterable

from broker.client.errors import UsageError
from broker.wire import frames as wire
from broker.wire.run_args import MAX_CAPTURE_LIMIT, RunArgsError, check_run
from landlock_helper.limits import Limits

__all__ = ["MAX_CAPTURE_LIMIT", "make_request", "winsize"]


def make_request(argv: Iterable[str], *, check_paths: bool = True, limits: Limits | None = None,
                 **args) -> wire.RunRequest:
    """Validate the arguments of :meth:`Client.submit` (the names and defaults of ``args``:
    :class:`broker.wire.run_args.RunArgs`); raises :class:`UsageError`.

    ``readable``: directories shown read-only inside at their own path, for those in the
    host's /tmp, which the sandbox's own /tmp covers (a virtual environment, a tool).

    ``check_paths=False`` skips checking that ``cwd`` and the writable paths exist here
    and that none is a root every executor refuses (``/``, the home directory or above it,
    a ``.git``), for a command bound for another host's executor (which checks them there).

    ``env`` (default: ours) loses its secrets here, before it is sent
    (:mod:`landlock_helper.env`), except the names in ``env_passthrough``;
    ``landlock_helper.env.split_env(env, env_passthrough)[1]`` lists what goes.

    Resource limits, docker's spelling: ``memory`` (bytes, or ``"512M"``, ``"1G"``),
    ``pids_limit`` (processes and threads), ``file_size`` (largest file written, a size),
    ``cpu_time`` (seconds of CPU per process, or ``"5m"``); 0 or ``"unlimited"``: no
    limit; None: the executor's default. They override the fields ``limits`` sets (a
    :class:`landlock_helper.limits.Limits`, e.g. from a configuration file).

    ``stdin=True``: the caller feeds the command's stdin (:meth:`Client.write_stdin`,
    :meth:`Client.close_stdin`); otherwise it reads /dev/null.

    ``tty=(rows, cols)`` (or a :class:`broker.wire.frames.Winsize`): a pty of that size,
    made by the executor outside the sandbox, is the command's stdin, stdout and stderr
    and its controlling terminal; all its output arrives as stream 1, what is written to
    its stdin is typed into it (``b"\\x03"`` is Ctrl-C), and :meth:`Client.resize`
    changes its size. Without ``stdin=True`` nothing can be typed into it.

    ``interactive=True``: the command waits for input, maybe for long (a shell, a REPL,
    an editor): it takes none of an executor's slots, so it never holds up other
    commands (an executor hosts a bounded number of them).
    """
    tty = args.pop("tty", None)
    try:
        fields = check_run(argv, check_paths=check_paths, limits=limits, **args)
    except RunArgsError as e:
        raise UsageError(str(e)) from None
    return wire.RunRequest(**fields, tty=_winsize(tty))


def winsize(rows, cols) -> wire.Winsize:
    """A checked window size (1..65535 rows and columns); raises :class:`UsageError`."""
    for what, n in (("rows", rows), ("columns", cols)):
        if isinstance(n, bool) or not isinstance(n, int) or not 0 < n < 65536:
            raise UsageError(f"terminal {what} must be a whole number from 1 to 65535, got {n!r}")
    return wire.Winsize(rows=rows, cols=cols)


def _winsize(tty) -> wire.Winsize | None:
    if tty is None:
        return None
    if isinstance(tty, wire.Winsize):
        return winsize(tty.rows, tty.cols)
    if isinstance(tty, (tuple, list)) and len(tty) == 2:
        return winsize(*tty)
    raise UsageError(f"tty must be (rows, columns) or a Winsize, got {tty!r}")
