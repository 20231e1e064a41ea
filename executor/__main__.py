"""``python -m executor``: parse flags, read the token, run the worker until it stops."""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import signal
import socket
import sys

from executor.errors import StartupError

PR_SET_PDEATHSIG = 1
DEFAULT_SLOTS = 256


def _slots(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"--slots must be a positive integer, got {text!r}")
    return n


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m executor", description="Run sandboxed commands for a sluice broker.")
    p.add_argument("--connect", required=True, metavar="ENDPOINT", help="the broker's endpoint (ipc:// or tcp://)")
    p.add_argument("--token-file", required=True, metavar="PATH", help="file holding the broker's auth token")
    p.add_argument("--name", default="", help="this executor's name (default: host:pid)")
    p.add_argument("--slots", type=_slots, default=DEFAULT_SLOTS, help="commands run at once (default %(default)s)")
    p.add_argument("--hide", action="append", default=[], metavar="PATH", help="path commands must not see (repeatable)")
    p.add_argument("--die-with-parent", action="store_true", help="get SIGKILLed when the parent process dies")
    return p.parse_args(argv)


def fail(message: str) -> int:
    print(f"executor: {message}", file=sys.stderr)
    return 2


def read_token(path: str) -> str:
    # The token comes only from a file: argv and the environment are visible to others.
    try:
        with open(path, encoding="ascii") as f:
            token = f.read().strip()
    except OSError as e:
        raise StartupError(f"cannot read token file {path}: {e.strerror}") from None
    except ValueError:
        raise StartupError(f"token file {path} is not ASCII text") from None
    if not token:
        raise StartupError(f"token file {path} is empty")
    return token


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


def start_spawner(hidden: tuple[str, ...]):
    """The warm-sandbox pool, made first: its zygote is a fork of this process as it is
    now, before zmq, msgspec and structlog are loaded, and before the token is read."""
    if not sys.platform.startswith("linux"):
        return None
    from landlock_helper.spawn import Spawner

    return Spawner(hidden)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.die_with_parent:
            die_with_parent()
    except StartupError as e:
        return fail(str(e))
    hidden = tuple(os.path.abspath(p) for p in args.hide)
    spawner = start_spawner(hidden)

    from executor.log import configure
    from executor.worker import Worker

    try:
        token = read_token(args.token_file)
    except StartupError as e:
        if spawner is not None:
            spawner.close()
        return fail(str(e))
    configure()
    name = args.name or f"{socket.gethostname()}:{os.getpid()}"
    worker = Worker(args.connect, token, name=name, slots=args.slots, hidden_paths=hidden, spawner=spawner)
    try:
        return asyncio.run(worker.run())
    except StartupError as e:
        return fail(str(e))
    finally:
        worker.close()


if __name__ == "__main__":
    sys.exit(main())
