"""``python -m executor``: parse flags, read the credentials, run the worker until it stops.

Two ways to join a broker:

- local, as the daemon spawns it: ``--connect ipc://... --token-file PATH`` (usually with
  ``--die-with-parent``). A broker that goes silent ends the executor.
- remote, as ``sluice executor`` on another host: ``--connect tcp://HOST:PORT --server-key
  FILE --key FILE``, CurveZMQ instead of a token. A broker that goes silent, or forgets
  the executor, has its commands killed here and is joined again until it answers.
  SIGINT/SIGTERM end the commands, say bye and exit 0. Sandboxed commands see neither
  the key file, nor sluice's home on this host, nor this host's sluice runtime dir.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import sys

from broker.net.runtime import TokenError, read_token
from executor.errors import StartupError

PR_SET_PDEATHSIG = 1
DEFAULT_SLOTS = 256
# Descriptors one command holds here at most (its output pipes, stdin, control socket, two
# pidfds, its cgroups' report, the stdio a direct run hands over), and what the executor
# needs besides its commands (zmq, the zygote and its warm sandboxes, logs).
FDS_PER_COMMAND = 8
FDS_OWN = 64


def slots_within(slots: int, fd_limit: int) -> int:
    """``slots``, or as many commands as ``fd_limit`` descriptors hold (at least one): past
    it a command would fail with "too many open files" where it can wait its turn."""
    return max(1, min(slots, (fd_limit - FDS_OWN) // FDS_PER_COMMAND))


class _UsageError(Exception):
    pass


def _slots(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"--slots must be a positive integer, got {text!r}")
    return n


def _niceness(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = None
    if n is None or not -20 <= n <= 19:
        raise argparse.ArgumentTypeError(f"--nice must be a whole number from -20 to 19, got {text!r}")
    return n


def niceness_refused(nice: int) -> str | None:
    """Why commands cannot run at niceness ``nice`` here, or None. Below this process's own
    it takes the privilege to raise a priority (CAP_SYS_NICE, or RLIMIT_NICE): tried on
    this process, and undone (going back up is always allowed)."""
    own = os.getpriority(os.PRIO_PROCESS, 0)
    if nice >= own:
        return None
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError as e:
        return (f"--nice {nice}: this executor runs at niceness {own}, and going below it needs "
                f"CAP_SYS_NICE or RLIMIT_NICE ({e.strerror})")
    os.setpriority(os.PRIO_PROCESS, 0, own)
    return None


def parse_args(argv: list[str] | None = None, prog: str = "python -m executor") -> argparse.Namespace:
    class Parser(argparse.ArgumentParser):
        def error(self, message):  # one line instead of usage + message
            raise _UsageError(f"{message} (see `{self.prog} --help`)")

    p = Parser(prog=prog, description="Run sandboxed commands for a sluice daemon on another host, joining its "
                                      "executor pool over tcp (the daemon started with --listen and "
                                      "--allow-executors).")
    p.add_argument("--connect", required=True, metavar="tcp://HOST:PORT",
                   help="the daemon (with --server-key and --key)")
    p.add_argument("--server-key", metavar="FILE", help="the daemon's public key file")
    p.add_argument("--key", metavar="FILE", help="this executor's key pair (NAME.key_secret from `sluice keys new`)")
    p.add_argument("--name", default="", help="this executor's name (default: host:pid)")
    p.add_argument("--slots", type=_slots, default=DEFAULT_SLOTS,
                   help="commands run at once (default %(default)s; fewer if the descriptor limit cannot hold them)")
    p.add_argument("--nice", type=_niceness, default=None, metavar="N",
                   help="commands run at niceness N, -20 to 19 (default: this executor's own); below the "
                        "executor's needs CAP_SYS_NICE")
    # How the daemon starts its own executors (ipc://, a token file); not for people.
    p.add_argument("--token-file", metavar="PATH", help=argparse.SUPPRESS)
    p.add_argument("--hide", action="append", default=[], metavar="PATH", help=argparse.SUPPRESS)
    p.add_argument("--die-with-parent", action="store_true", help=argparse.SUPPRESS)
    # The daemon's end of a socketpair that brings direct runs' stdio (broker.wire.direct).
    p.add_argument("--fd-channel", type=int, metavar="FD", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.connect.startswith("tcp://"):
        if args.token_file:
            raise _UsageError("--token-file is for ipc://; over tcp the key pair is the credential")
        if not args.server_key or not args.key:
            raise _UsageError("--connect tcp://... needs --server-key FILE (the daemon's public key) "
                              "and --key FILE (this executor's NAME.key_secret)")
    else:
        if args.server_key or args.key:
            raise _UsageError("--server-key and --key go with --connect tcp://HOST:PORT")
        if not args.token_file:
            raise _UsageError(f"--connect {args.connect} needs --token-file PATH")
    return args


def die_with_parent() -> None:
    """Have the kernel SIGKILL us when the parent dies, so a crashed daemon leaves no executors."""
    parent = os.getppid()
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise StartupError(f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(ctypes.get_errno())}")
    if os.getppid() != parent:  # the parent died before the prctl took effect
        os._exit(1)


def start_spawner(hidden: tuple[str, ...], nice: int | None = None):
    """The warm-sandbox pool, made first: its zygote is a fork of this process as it is
    now, before zmq, msgspec and structlog are loaded, and before the token or key is read.
    ``nice``: its commands' niceness (None: ours)."""
    if not sys.platform.startswith("linux"):
        return None
    from landlock_helper.spawn import Spawner

    return Spawner(hidden, nice=nice)


def hidden(args, remote: bool) -> tuple[str, ...]:
    """What commands must not see: the ``--hide`` paths, sluice's home (config, sessions,
    keys) and, for a remote broker, this executor's key file and the runtime dir of a local
    daemon (its socket and token)."""
    from broker.net.keys import default_keys_dir
    from broker.net.runtime import default_runtime_dir, hidden_paths

    extra = [args.key, default_runtime_dir()] if remote else []
    return hidden_paths(*args.hide, *extra, default_keys_dir())


def main(argv: list[str] | None = None, prog: str = "python -m executor", error_prefix: str = "executor: ") -> int:
    def fail(message: str) -> int:
        print(f"{error_prefix}{message}", file=sys.stderr)
        return 2

    try:
        args = parse_args(argv, prog)
    except _UsageError as e:
        return fail(str(e))
    remote = args.connect.startswith("tcp://")
    try:
        if args.die_with_parent:
            die_with_parent()
    except StartupError as e:
        return fail(str(e))
    refused = None if args.nice is None else niceness_refused(args.nice)
    if refused:
        return fail(refused)
    from broker.net.runtime import ensure_sluice_home

    # Before the spawner: it hides only what exists when it starts.
    problem = ensure_sluice_home()
    if problem:
        print(f"{prog}: warning: {problem}", file=sys.stderr)
    hide = hidden(args, remote)
    spawner = start_spawner(hide, args.nice)

    # After the zygote's fork: asyncio alone would double what every sandbox's fork copies.
    import asyncio

    from broker.net.fdlimit import raise_fd_limit
    from broker.net.logging import configure
    from executor.worker import Worker, log

    try:
        if remote:
            from broker.net.keys import KeyFileError, Remote

            try:
                link = Remote.from_files(args.connect, args.server_key, args.key)
            except KeyFileError as e:
                raise StartupError(str(e)) from None
            token = ""
        else:
            link = None
            try:
                token = read_token(args.token_file)
            except TokenError as e:
                raise StartupError(str(e)) from None
    except StartupError as e:
        if spawner is not None:
            spawner.close()
        return fail(str(e))
    configure()
    # After the zygote's fork: commands keep the limits they were given, only this process's rises.
    fd_limit = raise_fd_limit()
    slots = slots_within(args.slots, fd_limit)
    if slots < args.slots:
        log.warning("fewer slots than asked: the descriptor limit cannot hold more", slots=slots, asked=args.slots,
                    fd_limit=fd_limit)
    name = args.name or f"{socket.gethostname()}:{os.getpid()}"
    fd_channel = None
    if args.fd_channel is not None and not remote:
        try:
            fd_channel = socket.socket(fileno=args.fd_channel)
        except OSError as e:
            return fail(f"--fd-channel {args.fd_channel}: {e.strerror}")
    worker = Worker(args.connect, token, name=name, slots=slots, hidden_paths=hide, spawner=spawner,
                    remote=link, fd_channel=fd_channel, nice=args.nice)
    try:
        return asyncio.run(worker.run())
    except StartupError as e:
        return fail(str(e))
    finally:
        worker.close()


if __name__ == "__main__":
    sys.exit(main())
