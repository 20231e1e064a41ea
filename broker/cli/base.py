"""What every ``sluice`` command shares: one-line errors, exit by exception, the
``--connect`` options, writing to a descriptor, the command after ``--``.

Imports stay light here (no zmq until a command connects): ``sluice sandbox`` and
``sluice run`` both start from this module."""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import stat
import sys
from typing import NoReturn

from broker.wire.results import EXIT_NOT_FOUND, EXIT_SLUICE, EXIT_USAGE

USAGE_RUN = "sluice run [options] -- CMD ARGS..."
USAGE_SANDBOX = "sluice sandbox [options] -- CMD ARGS..."


class CliExit(Exception):
    """Leave a CLI command with this exit code (its message was already printed)."""

    def __init__(self, code: int) -> None:
        self.code = code


def print_error(message: str) -> None:
    """One line on stderr, never a traceback."""
    try:
        sys.stderr.write(f"sluice: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def fail(message: str, code: int) -> int:
    print_error(f"error: {message}")
    return code


JSON_FORMATS = ("seed", "codex")
JSON_HELP = ("print events, one JSON object per line: the seed protocol's (--json, --json=seed), "
             "or Codex 0.169's `codex exec --json` schema (--json=codex)")


def take_json_format(argv: list[str]) -> tuple[list[str], str]:
    """``--json=FORMAT`` taken out of ``argv``: ``argv`` with a plain ``--json`` in its place,
    and FORMAT (``seed`` without one). Only the ``=`` spelling names a format: after a bare
    ``--json`` often comes the prompt, which argparse would take as the value.
    :class:`CliExit` (2) for a format that is neither of :data:`JSON_FORMATS`."""
    out: list[str] = []
    chosen = "seed"
    for i, word in enumerate(argv):
        if word == "--":
            out += argv[i:]
            break
        if word.startswith("--json="):
            chosen = word.partition("=")[2]
            if chosen not in JSON_FORMATS:
                print_error(f"error: --json={chosen}: the format is seed (the default) or codex")
                raise CliExit(EXIT_USAGE)
            word = "--json"
        out.append(word)
    return out, chosen


NO_RAY = "this needs Ray: install sluice with the ray extra (pip install 'sluice[ray]')"


def whole_number(minimum: int, what: str = "a whole number", floor: str | None = None):
    """An argparse type: an int of at least ``minimum`` (said as ``floor``, if given)."""
    def parse(text: str) -> int:
        from argparse import ArgumentTypeError  # here: the fast paths parse without argparse

        try:
            value = int(text)
        except ValueError:
            raise ArgumentTypeError(f"not {what}: {text!r}") from None
        if value < minimum:
            raise ArgumentTypeError(f"must be {floor or minimum} or more, got {value}")
        return value
    return parse


def add_connect_args(parser) -> None:
    """``--connect tcp://HOST:PORT --server-key FILE --key FILE``: a remote daemon (CurveZMQ)."""
    parser.add_argument("--connect", metavar="tcp://HOST:PORT", default=None,
                        help="a daemon on another host (started with --listen) instead of the local one")
    parser.add_argument("--server-key", metavar="FILE", default=None, help="with --connect: the daemon's public key file")
    parser.add_argument("--key", metavar="FILE", default=None,
                        help="with --connect: your key pair (NAME.key_secret from `sluice keys new NAME`)")
    parser.add_argument("--ray", action="store_true",
                        help="the daemon of the Ray cluster this machine is part of (`sluice ray up`), with keys "
                             "from the cluster (needs the ray extra)")


def remote_from_args(args):
    """The :class:`broker.net.keys.Remote` that ``--connect/--server-key/--key`` name, the
    Ray cluster's daemon with ``--ray``, or None for the local daemon. Mistakes are printed
    as one line and raised as :class:`CliExit`."""
    if getattr(args, "ray", False):
        if args.connect or args.server_key or args.key:
            raise CliExit(fail("--ray and --connect are two ways to reach a daemon: use one", EXIT_USAGE))
        try:
            from broker.ray import cluster
        except ImportError:
            raise CliExit(fail(NO_RAY, EXIT_USAGE)) from None
        try:
            return cluster.remote()
        except cluster.RayError as e:
            raise CliExit(fail(str(e), EXIT_SLUICE)) from None
    if getattr(args, "connect", None):
        from broker.net.keys import KeyFileError, Remote

        try:
            return Remote.from_files(args.connect, args.server_key, args.key)
        except KeyFileError as e:
            raise CliExit(fail(str(e), EXIT_USAGE)) from None
    if getattr(args, "server_key", None) or getattr(args, "key", None):
        raise CliExit(fail("--server-key and --key go with --connect tcp://HOST:PORT", EXIT_USAGE))
    return None


def connect_client(args, *, name: str, autostart: bool = True):
    """A :class:`broker.client.Client` for the frontend command ``args`` came from.

    The local daemon (started if needed and ``autostart``), or the one ``--connect``
    names. Failures are printed as one line and raised as :class:`CliExit`.
    """
    import broker.client as C  # here: `sluice sandbox` imports this module and needs no zmq

    remote = remote_from_args(args)
    try:
        client = C.Client.connect(autostart=autostart, remote=remote, name=name)
    except C.DaemonError as e:
        raise CliExit(fail(str(e), EXIT_SLUICE)) from None
    announce(client)
    return client


def hold_closed_stdio() -> None:
    """Put /dev/null on whichever of our stdin, stdout and stderr was closed (``>&-``,
    ``2>&-``). Otherwise the first socket or pipe we open takes its number, and what is
    meant for stdout goes into it; this way, what we (or a command of ours) write to a
    closed stream is lost, as it is for a shell program whose output cannot go anywhere,
    and a closed stdin reads as empty, as /dev/null does."""
    for fd in (0, 1, 2):
        try:
            os.get_inheritable(fd)
            continue  # open
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:  # the lower ones are open by now, so it is fd itself
            os.dup2(null, fd)
            os.close(null)
        os.set_inheritable(fd, True)
        if fd and getattr(sys, ("stdout", "stderr")[fd - 1]) is None:
            # Python made no stream for a closed descriptor; print() and flush() want one.
            setattr(sys, ("stdout", "stderr")[fd - 1], open(fd, "w", errors="backslashreplace", closefd=False))


def leave(code: int) -> NoReturn:
    """End the process now with exit code ``code``: stdout and stderr flushed, the client's
    sockets closed with what they still hold sent (:func:`broker.client.close_sockets`, if
    the command loaded the client), but without the interpreter's teardown of every module
    and object, which costs a short ``sluice run`` a sixth of its time (``sluice sandbox``
    more). Only for a command that has put back everything it changed (its terminal's
    mode, its signal handlers) and runs no thread of its own."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    client = sys.modules.get("broker.client")
    if client is not None:
        client.close_sockets()
    os._exit(code)


def running_version(version: str) -> str:
    """How a peer's sluice version reads in a sentence ("" from one too old to tell)."""
    return f"sluice {version}" if version else "an older sluice (one that does not tell its version)"


def announce(client) -> None:
    """What a person should know about the daemon a command just connected to, one line
    each on stderr: that it was started in the background just now (and how to stop it),
    and that it runs an older sluice than this command (and how to restart it)."""
    if client.started_daemon is not None and client.runtime is not None:
        print_error(f"started the sluice daemon in the background (pid {client.started_daemon}, log "
                    f"{client.runtime.log_path}); it keeps running for the next commands: stop it with "
                    "`sluice daemon stop`")
        say_weak_limits()
    announce_version(client.daemon_version, client.remote)


def say_weak_limits() -> None:
    """One line on stderr, when a daemon was just started here, if its commands will get
    no default memory or process limit because this host gives this user no cgroups for
    them (the executor's log says it too, where few look)."""
    from landlock_helper import limits

    found = limits.mechanism()
    missing = [c for c in ("memory", "pids") if found.cgroup_for(c) is None]
    if missing:
        print_error(f"no {' or '.join(missing)} cgroup for this user here ({found.reason}): commands get no default "
                    "memory or process limit, only rlimits when asked (--memory, --pids-limit); see docs/faults.md, "
                    "\"Resources: limits per command\"")


def announce_version(daemon_version: str, remote) -> None:
    """One line on stderr if the daemon (``remote``'s, or the local one for None) runs an
    older sluice than this command, and how to restart it."""
    from broker.wire.version import SLUICE_VERSION, version_key

    if version_key(daemon_version) < version_key(SLUICE_VERSION):
        where = "the daemon" if remote is None else f"the daemon at {remote.endpoint}"
        how = ("restart it to use this version: `sluice daemon stop`, then run your command again (or "
               "`sluice daemon start`)") if remote is None else "restart it there to use this version"
        print_error(f"{where} runs {running_version(daemon_version)}, this command is "
                    f"{SLUICE_VERSION}: {how}")


def write_all(fd: int, data) -> None:
    """Write all of ``data`` to ``fd``, waiting out a non-blocking tty or pipe."""
    while data:
        try:
            n = os.write(fd, data)
        except BlockingIOError:  # a non-blocking tty or pipe handed to us: wait until writable
            select.select([], [fd], [])
            continue
        if n == len(data):
            return
        data = memoryview(data)[n:]


class ConfigError(ValueError):
    """A key of config.toml that a command reads holds what it may not (one line)."""


def config_path(env=None) -> str:
    """``$SLUICE_HOME/config.toml`` (``env``: the environment to read, default ours)."""
    from broker.net.runtime import sluice_home

    return os.path.join(sluice_home(env), "config.toml")


def read_config(word: bytes) -> tuple[str, dict]:
    """``$SLUICE_HOME/config.toml``, parsed, and its path: for the few keys ``sluice run``
    and ``sluice sandbox`` read. An empty table when the file cannot be read or never
    mentions ``word`` (then it is not parsed: these commands' start-up is timed). Raises
    :class:`ConfigError` when it is not TOML."""
    path = config_path()
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return path, {}
    if word not in data:
        return path, {}
    import tomllib

    try:
        return path, tomllib.loads(data.decode("utf-8", "replace"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None


# The config.toml table whose roots ``sluice run`` and ``sluice sandbox`` take, as the
# agent takes its writable_roots (Codex's name for it).
ROOTS_TABLE = "sandbox_workspace_write"


def config_roots() -> tuple[list[str], list[str]]:
    """``[sandbox_workspace_write]`` ``writable_roots`` and ``readable_roots`` of
    config.toml, each a list of absolute paths (``~/...``: in the home directory); empty
    without them. Raises :class:`ConfigError` when one is not a list of such paths."""
    path, table = read_config(b"_roots")
    section = table.get(ROOTS_TABLE, {})
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: {ROOTS_TABLE} must be a table")
    lists = []
    for key in ("writable_roots", "readable_roots"):
        roots = section.get(key, [])
        if not isinstance(roots, list) or not all(isinstance(r, str) for r in roots):
            raise ConfigError(f"{path}: [{ROOTS_TABLE}] {key} must be a list of paths")
        out = []
        for root in roots:
            full = os.path.expanduser(root)
            if not os.path.isabs(full):
                raise ConfigError(f"{path}: [{ROOTS_TABLE}] {key}: {root!r} is not an absolute path (or ~/...)")
            out.append(os.path.normpath(full))
        lists.append(out)
    return lists[0], lists[1]


def run_roots(args, *, local: bool = True) -> tuple[list[str], list[str]]:
    """The writable and readable directories of a run: its flags', then config.toml's
    (:func:`config_roots`; its writable_roots only for ``workspace-write``, as the
    table's name says). ``local``: the command runs on this host, where a configured
    directory that does not exist is left out (a ready list names every tool's cache)."""
    writable, readable = config_roots()
    if args.sandbox != "workspace-write":
        writable = []
    if local:
        writable = [r for r in writable if os.path.isdir(r)]
        readable = [r for r in readable if os.path.isdir(r)]
    return [*args.writable, *writable], [*args.readable, *readable]


def host_tmp_check(command: list[str], cwd: str, env, policy, readable) -> int | None:
    """Before a restricted run on this host: refuse a program that lies in the host's
    /tmp where the sandbox will not show it (EXIT_NOT_FOUND, naming ``--readable``); on
    a terminal, say once whose /tmp the command sees when its directory or program
    lies in the host's /tmp (:mod:`landlock_helper.host_tmp`)."""
    if policy.unrestricted:
        return None
    from landlock_helper import host_tmp

    visible = [cwd, *policy.writable_roots(cwd, env), *readable]
    problem = host_tmp.hidden_program(command[0], cwd, env, visible)
    if problem:
        return fail(problem, EXIT_NOT_FOUND)
    if os.isatty(2):
        line = host_tmp.note(command[0], cwd, env)
        if line:
            print_error(line)
    return None


# A pipe of ours is widened to this (the most an unprivileged process may, by default).
PIPE_SIZE = 1024 * 1024


def widen_pipe(fd: int) -> None:
    """Widen ``fd`` to :data:`PIPE_SIZE` if it is a pipe, so that it moves big chunks in one
    read or write rather than in 64 KiB pieces (best effort)."""
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_SIZE)
    except OSError:
        pass  # above the system's limit, or not ours to change: the default size works too


def read_stdin(fd: int, size: int, *, terminal: bool = False) -> bytes:
    """Up to ``size`` bytes of our stdin for the command; b"" at its end, and after a read
    error, which is said (the command then gets end of file), but for a ``terminal`` (ours
    in raw mode), whose error is that it hung up. BlockingIOError: nothing yet."""
    try:
        return os.read(fd, size)
    except BlockingIOError:
        raise
    except OSError as e:
        if not terminal:
            print_error(f"reading stdin failed: {e.strerror}; the command gets end of file")
        return b""


def env_report(passthrough: list[str]) -> None:
    """``--env-report``: the names (never the values) of the variables the command will
    not get, on stderr."""
    from landlock_helper.env import describe_dropped, split_env

    print_error(f"environment: {describe_dropped(split_env(os.environ, passthrough)[1])}")


def command_of(args, usage: str) -> list[str]:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print_error(f"error: missing command; usage: {usage}")
        raise CliExit(EXIT_USAGE)
    return command
