"""The arguments of a run, declared (:class:`RunArgs`) and checked before anything is
sent in one place, for :func:`broker.client.make_request` and for a direct ``sluice run``
(:mod:`broker.wire.direct`). Stdlib only (the sandbox's policy, environment and limit
types are), so the fast path of ``sluice run`` can use it without pyzmq or msgspec."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping

from landlock_helper.env import split_env
from landlock_helper.limits import LimitError, Limits, parse_count, parse_duration, parse_size
from landlock_helper.policy import PolicyError, SandboxPolicy, root_refusal, run_paths

# What a run captures of each stream by default, for its result (the output itself streams).
DEFAULT_CAPTURE_LIMIT = 1024 * 1024
# Largest message the daemon accepts, and so the largest capture limit a run may ask for:
# the exit message carries both captured streams.
MAX_MESSAGE_SIZE = 64 * 1024 * 1024
MAX_CAPTURE_LIMIT = MAX_MESSAGE_SIZE // 4


class RunArgsError(ValueError):
    """A bad argument of a run (unknown mode, missing cwd, relative writable path, ...)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunArgs:
    """The arguments of a run after its command, as a caller gives them: declared here
    once for :meth:`broker.client.Client.submit`, :func:`broker.client.make_request` and
    :func:`check_run` (what each means: :func:`broker.client.make_request`). ``tty`` is
    the client's to check (a window size is a wire type); :func:`check_run` leaves it."""

    cwd: str | None = None
    sandbox: str = "workspace-write"
    writable: Iterable[str] = ()
    readable: Iterable[str] = ()
    network: bool = False
    env: Mapping[str, str] | None = None
    env_passthrough: Iterable[str] = ()
    timeout_ms: int | None = None
    capture_limit: int = DEFAULT_CAPTURE_LIMIT
    memory: int | str | None = None
    pids_limit: int | str | None = None
    file_size: int | str | None = None
    cpu_time: int | str | None = None
    stdin: bool = False
    tty: object = None  # a broker.wire.frames.Winsize or (rows, columns)
    interactive: bool = False


def check_run(argv: Iterable[str], *, check_paths: bool = True, limits: Limits | None = None, **args) -> dict:
    """The fields of a ``RunRequest`` (all but ``tty``) from a caller's arguments
    (:class:`RunArgs`), as :func:`broker.client.make_request` documents them; raises
    :class:`RunArgsError`."""
    r = RunArgs(**args)
    if isinstance(argv, (str, bytes)):
        raise RunArgsError("the command must be a list of arguments, not a string")
    argv = list(argv)
    if not argv:
        raise RunArgsError("missing command")
    if not all(isinstance(a, str) for a in argv):
        raise RunArgsError("every command argument must be a string")
    if not argv[0]:
        raise RunArgsError("the command name is empty")

    try:
        cwd, roots, shown = run_paths(r.cwd, r.writable, r.readable, here=check_paths)
        policy = SandboxPolicy.from_mode(r.sandbox, writable_roots=roots, network=r.network)
    except PolicyError as e:
        raise RunArgsError(str(e)) from None

    timeout_ms, capture_limit = r.timeout_ms, r.capture_limit
    if timeout_ms is not None:
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms <= 0:
            raise RunArgsError(f"timeout must be a positive number of milliseconds, got {timeout_ms!r}")
    if isinstance(capture_limit, bool) or not isinstance(capture_limit, int) or not 0 <= capture_limit <= MAX_CAPTURE_LIMIT:
        raise RunArgsError(f"capture limit must be between 0 and {MAX_CAPTURE_LIMIT} bytes, got {capture_limit!r}")

    passthrough = list(r.env_passthrough)
    for name in passthrough:
        if not isinstance(name, str) or not name or "=" in name:
            raise RunArgsError(f"not an environment variable name: {name!r}")
    if r.env is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in r.env.items()):
        raise RunArgsError("the environment must map names to strings")
    # Filtered here, before it leaves this process: the daemon and the executor (maybe on
    # another host) never see the caller's secrets, only what the command may have.
    env, _ = split_env(os.environ if r.env is None else r.env, passthrough)
    if check_paths:
        _check_roots(policy, cwd, env)

    try:
        asked = Limits(
            memory=None if r.memory is None else parse_size(r.memory, "memory"),
            pids=None if r.pids_limit is None else parse_count(r.pids_limit, "pids limit"),
            file_size=None if r.file_size is None else parse_size(r.file_size, "file size"),
            cpu_time=None if r.cpu_time is None else parse_duration(r.cpu_time, "CPU time"),
        )
    except LimitError as e:
        raise RunArgsError(str(e)) from None
    if limits is not None and not isinstance(limits, Limits):
        raise RunArgsError(f"limits must be a landlock_helper.limits.Limits, got {type(limits).__name__}")
    asked = (limits or Limits()).merged(asked)
    if not isinstance(r.interactive, bool):
        raise RunArgsError(f"interactive must be True or False, got {r.interactive!r}")

    return {
        "argv": argv,
        "cwd": cwd,
        "sandbox": policy,
        "readable": shown,
        "env": env,
        "env_passthrough": passthrough,
        "timeout_ms": timeout_ms,
        "capture_limit": capture_limit,
        "limits": None if asked == Limits() else asked,
        "stdin": bool(r.stdin),
        "interactive": r.interactive,
    }


def _check_roots(policy: SandboxPolicy, cwd: str, env: Mapping[str, str]) -> None:
    """Say now, as a usage error, what the executor would refuse every time: a writable
    root that is / or the home directory (or above it), or inside a ``.git``. (On this
    machine only: a remote executor judges by its own user's home.)"""
    for root in policy.writable_roots(cwd, dict(env)):
        real = os.path.realpath(root)
        refusal = None if real == "/tmp" else root_refusal(real)  # /tmp inside is sluice's own
        if refusal:
            raise RunArgsError(refusal)


def json_fields(fields: dict) -> dict:
    """:func:`check_run`'s fields as plain JSON values (the policy in Codex's form)."""
    limits = fields["limits"]
    return {
        **fields,
        "sandbox": fields["sandbox"].to_json(),
        "limits": None if limits is None else dataclasses.asdict(limits),
    }
