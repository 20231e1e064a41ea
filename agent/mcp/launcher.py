"""MCP servers as sandboxed processes: the :data:`~agent.mcp.manager.Launcher` of a session.

A server is an untrusted program like any command the model runs, so it runs the same
way: a long-lived interactive run in an executor (:meth:`CommandRunner.start_interactive`,
pipes, no terminal, no slot taken), in the sandbox of :func:`server_policy`, its stdout
carrying MCP to the client and its stderr going to the log. It dies with its whole
process tree when stopped, when the session shuts down, or when the agent goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping

from agent.exec_runner import CommandRunner, ExecResult, InteractiveProcess
from agent.mcp.client import McpError
from agent.mcp.manager import Launcher, Streams
from broker.wire.protocol import ExecOutputStream, McpServerConfig
from landlock_helper.limits import Limits
from landlock_helper.policy import NETWORK, WRITE_FOLDER, Permission, SandboxPolicy


def server_policy(server: McpServerConfig, session: SandboxPolicy) -> SandboxPolicy:
    """The session's policy without network (or the server's ``sandbox`` mode instead),
    plus what the server's configuration grants: network, more writable roots."""
    base = SandboxPolicy.from_mode(server.sandbox) if server.sandbox is not None else session
    if base.unrestricted and server.sandbox == "danger-full-access":
        return base  # the user asked for no sandbox for this server, in its config
    permissions = [p for p in base.permissions if p != NETWORK]
    permissions += [Permission(WRITE_FOLDER, root) for root in server.writable_roots]
    if server.network:
        permissions.append(NETWORK)
    return SandboxPolicy.of(permissions)


def describe_end(result: ExecResult | None) -> str:
    """How a server's process ended, as the rest of a sentence ("MCP server X ...")."""
    if result is None:
        return "ended"
    if result.error:
        return f"could not run: {result.error}" if result.exit_code is None else \
            f"exited with status {result.exit_code}: {result.error}"
    if result.signal is not None:
        return f"was killed by signal {result.signal}"
    return f"exited with status {result.exit_code}"


class _Server:
    """What the manager holds of a running server: its stdin, and a way to stop it."""

    def __init__(self, process: InteractiveProcess) -> None:
        self.process = process

    async def write(self, data: bytes) -> None:
        if not await self.process.write(data):
            raise McpError(describe_end(self.process.result))

    async def stop(self, grace_s: float = 0.0) -> None:
        if grace_s > 0 and not self.process.done:
            self.process.close_stdin()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.process.wait()), grace_s)
        if not self.process.done:
            await self.process.cancel()
        await self.process.wait()

    def hold_output(self, held: bool) -> None:
        self.process.hold_output(held)


def sandboxed_launcher(runner: CommandRunner, *, session_policy: SandboxPolicy, cwd: str, sandbox_cwd: str,
                       env: Mapping[str, str] | None = None, env_passthrough=(), limits: Limits | None = None) -> Launcher:
    """Start servers through ``runner`` for a session whose commands run under
    ``session_policy`` in ``cwd`` (``sandbox_cwd`` being the writable one), with the
    session's command environment ``env`` (None: the agent's own; the runner filters
    secrets out of it) plus the server's own ``env``, which passes as the user set it."""

    async def launch(server: McpServerConfig, streams: Streams) -> _Server:
        def on_output(stream: ExecOutputStream, chunk: bytes) -> None:
            (streams.stdout if stream == ExecOutputStream.STDOUT else streams.stderr)(chunk)

        process = await runner.start_interactive(
            server.argv, server.cwd or cwd, server_policy(server, session_policy), on_output,
            tty=None, stdin=True, on_exit=lambda result: streams.exited(describe_end(result)),
            env={**(os.environ if env is None else env), **server.env}, sandbox_cwd=sandbox_cwd,
            env_passthrough=[*env_passthrough, *server.env], limits=limits,
        )
        if process.done:
            raise McpError(f"MCP server {server.name} {describe_end(process.result)}")
        return _Server(process)

    return launch
