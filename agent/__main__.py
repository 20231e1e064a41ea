"""``python -m agent --connect ENDPOINT --token-file PATH [--die-with-parent]``: the agent process.

The daemon starts exactly one (see ``broker.daemon.supervisor.AgentSupervisor``; why one:
:mod:`agent`). It connects
as the ``agent`` peer, hosts every session the broker sends it (:mod:`agent.host`) and
runs their commands on the daemon's executors over the same link
(:class:`~agent.exec_runner.BrokerRunner`). It stops on SIGTERM / SIGINT (sessions
aborted, rollouts flushed) or when the daemon goes away.

The auth token is read from a file, never taken from argv or the environment, and API
keys only ever arrive inside ``configure_session``.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m agent", description="Host sluice sessions for a daemon.")
    p.add_argument("--connect", required=True, metavar="ENDPOINT", help="the broker's endpoint (ipc:// or tcp://)")
    p.add_argument("--token-file", required=True, metavar="PATH", help="file holding the broker's auth token")
    p.add_argument("--name", default="agent", help="this peer's name in the daemon's log")
    p.add_argument("--die-with-parent", action="store_true", help="get SIGKILLed when the parent process dies")
    return p.parse_args(argv)


def fail(message: str) -> int:
    print(f"agent: {message}", file=sys.stderr)
    return 2


def die_with_parent() -> None:
    """Have the kernel SIGKILL us when the daemon dies, so a crashed daemon leaves no agent."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the parent died before the prctl took effect
        os._exit(1)


async def serve(endpoint: str, token_file: str, name: str) -> int:
    # Imported once the process is tied to its parent (die_with_parent): a daemon that
    # dies while the agent starts must not leave it loading.
    import structlog

    from agent.exec_runner import BrokerRunner
    from agent.host import SessionHost
    from broker.net.aiolink import PeerLink, Target
    from broker.net.link import LinkError

    log = structlog.get_logger("agent")
    target = Target(endpoint, token_file)
    if not target.read_token():
        return fail(f"cannot read the token file {token_file}")
    try:
        link = await PeerLink.connect(target, name=name)
    except LinkError as err:
        return fail(str(err))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    link.on_broken.append(lambda err: stop.set())
    runner = BrokerRunner(link)
    host = SessionHost(link, runner)
    if not host.start():
        await link.aclose()
        return fail("could not tell the daemon this agent is ready")
    log.info("agent ready", pid=os.getpid(), peer_id=link.peer_id)
    await stop.wait()
    log.info("agent stopping", sessions=len(host.sessions), reason=str(link.broken) if link.broken else "signal")
    await host.aclose()
    await runner.aclose()
    await link.aclose()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.die_with_parent:
        try:
            die_with_parent()
        except OSError as err:
            return fail(str(err))
    from broker.net.fdlimit import raise_fd_limit
    from broker.net.logging import configure

    configure()
    raise_fd_limit()  # a session's files (rollout, history) cost descriptors; hosts may have many
    return asyncio.run(serve(args.connect, args.token_file, args.name))


if __name__ == "__main__":
    sys.exit(main())
