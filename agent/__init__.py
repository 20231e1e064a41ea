"""agent: the model-agent process (``python -m agent``).

It hosts Codex sessions: turns Submissions into Events, talks to the model over HTTP
(httpx, SSE), and runs every command through the broker's executors. Imports the wire
(the Codex types, the frames, outcomes and exit codes), the net layer (the peer rules,
the event-loop glue, the runtime dir, logging) and the sandbox's policy and environment
rules; never the daemon, the client library, the executor or the CLI.

- :mod:`agent.__main__`: the process the daemon spawns; :mod:`agent.host` keeps one
  :class:`agent.session.Session` per session id the broker names, over one
  :class:`broker.net.aiolink.PeerLink` shared with the
  :class:`agent.exec_runner.BrokerRunner` that runs the commands.
- One process hosts every session of the daemon, on one event loop: sessions mostly
  wait (the model, commands, MCP servers), and what the loop spends on one session's
  input is bounded (an MCP server's output: :mod:`agent.mcp.client`; a model's stream:
  :mod:`agent.sse`), so sessions do not wait for each other (measured by
  tests/bench/bench_mcp_flood.py: the loop's median lag is the same under a flooding
  server as idle). A process per session would confine a crash of the agent itself, at
  a process per session; docs/agent.md says why sluice has one.
- The configuration (``config.toml``, profiles, ``-c`` overrides) is the frontends'
  (:mod:`broker.cli.config`): ``sluice exec`` resolves it on the caller's side and sends
  the result with ``configure_session``; the agent takes the provider from it
  (:mod:`agent.provider`).
"""
