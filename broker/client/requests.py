"""Checking the arguments of a run before anything is sent: :func:`make_request`."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from broker.client.errors import UsageError
from broker.wire import frames as wire
from landlock_helper.env import split_env
from landlock_helper.limits import LimitError, Limits, parse_count, parse_duration, parse_size
from landlock_helper.policy import PolicyError, SandboxPolicy

# Largest capture limit we ask for: the exit message carries both captured streams and
# must stay under the broker's message size limit.
MAX_CAPTURE_LIMIT = wire.MAX_MESSAGE_SIZE // 4


def make_request(
    argv: Iterable[str],
    *,
    cwd: str | None = None,
    sandbox: str = "workspace-write",
    writable: Iterable[str] = (),
    network: bool = False,
    env: Mapping[str, str] | None = None,
    env_passthrough: Iterable[str] = (),
    timeout_ms: int | None = None,
    capture_limit: int = wire.DEFAULT_CAPTURE_LIMIT,
    check_paths: bool = True,
    memory: int | str | None = None,
    pids_limit: int | str | None = None,
    file_size: int | str | None = None,
    cpu_time: int | str | None = None,
    limits: Limits | None = None,
    stdin: bool = False,
    tty: wire.Winsize | tuple[int, int] | None = None,
    interactive: bool = False,
) -> wire.RunRequest:
    """Validate the arguments of :meth:`Client.submit`; raises :class:`UsageError`.

    ``check_paths=False`` skips checking that ``cwd`` and the writable paths exist here,
    for a command bound for another host's executor (which checks them there).

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
    if isinstance(argv, (str, bytes)):
        raise UsageError("the command must be a list of arguments, not a string")
    argv = list(argv)
    if not argv:
        raise UsageError("missing command")
    if not all(isinstance(a, str) for a in argv):
        raise UsageError("every command argument must be a string")
    if not argv[0]:
        raise UsageError("the command name is empty")

    if cwd is None:
        try:
            cwd = os.getcwd()
        except FileNotFoundError:
            raise UsageError("the current directory no longer exists; cd somewhere else or pass a cwd") from None
    cwd = os.path.abspath(cwd)
    if check_paths and not os.path.isdir(cwd):
        what = "is not a directory" if os.path.exists(cwd) else "does not exist"
        raise UsageError(f"working directory {cwd} {what}")

    roots = []
    for path in writable:
        if not isinstance(path, str) or not os.path.isabs(path):
            raise UsageError(f"writable path must be absolute: {path!r}")
        if check_paths and not os.path.exists(path):
            raise UsageError(f"writable path does not exist: {path}")
        roots.append(path)

    try:
        policy = SandboxPolicy.from_mode(sandbox, writable_roots=roots, network=network)
    except PolicyError as e:
        raise UsageError(str(e)) from None

    if timeout_ms is not None:
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms <= 0:
            raise UsageError(f"timeout must be a positive number of milliseconds, got {timeout_ms!r}")
    if isinstance(capture_limit, bool) or not isinstance(capture_limit, int) or not 0 <= capture_limit <= MAX_CAPTURE_LIMIT:
        raise UsageError(f"capture limit must be between 0 and {MAX_CAPTURE_LIMIT} bytes, got {capture_limit!r}")

    passthrough = list(env_passthrough)
    for name in passthrough:
        if not isinstance(name, str) or not name or "=" in name:
            raise UsageError(f"not an environment variable name: {name!r}")
    if env is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise UsageError("the environment must map names to strings")
    # Filtered here, before it leaves this process: the daemon and the executor (maybe on
    # another host) never see the caller's secrets, only what the command may have.
    env, _ = split_env(os.environ if env is None else env, passthrough)

    try:
        asked = Limits(
            memory=None if memory is None else parse_size(memory, "memory"),
            pids=None if pids_limit is None else parse_count(pids_limit, "pids limit"),
            file_size=None if file_size is None else parse_size(file_size, "file size"),
            cpu_time=None if cpu_time is None else parse_duration(cpu_time, "CPU time"),
        )
    except LimitError as e:
        raise UsageError(str(e)) from None
    if limits is not None and not isinstance(limits, Limits):
        raise UsageError(f"limits must be a landlock_helper.limits.Limits, got {type(limits).__name__}")
    asked = (limits or Limits()).merged(asked)

    winsize = _winsize(tty)
    if not isinstance(interactive, bool):
        raise UsageError(f"interactive must be True or False, got {interactive!r}")

    return wire.RunRequest(
        argv=argv,
        cwd=cwd,
        sandbox=policy,
        env=env,
        env_passthrough=passthrough,
        timeout_ms=timeout_ms,
        capture_limit=capture_limit,
        limits=None if asked == Limits() else asked,
        stdin=bool(stdin),
        tty=winsize,
        interactive=interactive,
    )


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
