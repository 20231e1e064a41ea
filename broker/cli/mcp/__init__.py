"""``sluice mcp``: sluice as an MCP server, over stdio.

Any MCP client (Claude Code, Cursor, Codex, ...) starts ``sluice mcp`` and gets tools
that run commands through the sluice daemon, each in the kernel sandbox: ``run`` (one
command, its exit status and output) and interactive sessions (``session_start``,
``session_write``, ``session_read``, ``session_close``). The policy (sandbox mode,
workspace, writable roots, network, resource limits) comes from our flags and the config
file when the server starts; no tool argument can change it.

The protocol is JSON-RPC 2.0, one message per line (the MCP stdio transport), spoken here
by hand: it is small, and the official SDK would bring pydantic, starlette and uvicorn
into the one process that must start fast and stay out of the sandbox's way.

One thread does everything but connecting: an event loop that waits, through the client
library's :meth:`~broker.client.Client.wait_io`, on the daemon's socket, our stdin and a
wake-up pipe at once, so a long ``run`` never blocks ``ping``, ``tools/list`` or another
``run``. Connecting (which may start a daemon, a second or so) runs on a thread of its own
and hands the client over; the client is used from the loop's thread only. Stdout carries
only protocol messages, written under a lock from one function; logs go to stderr.
"""

from __future__ import annotations

import broker.client as C
from broker.cli.base import env_report, print_error
from broker.wire.results import EXIT_USAGE


def mcp_main(args) -> int:
    from broker.cli.mcp.tools import Policy

    try:
        policy = Policy(args)
    except C.UsageError as e:
        print_error(f"error: {e}")
        return EXIT_USAGE
    if args.env_report:
        env_report(args.env)
    from broker.cli.mcp.server import Server

    return Server(policy).serve()
