"""agent: the model-agent process (``python -m agent``).

It hosts Codex sessions: turns Submissions into Events, talks to the model over HTTP
(httpx, SSE), and runs every command through the broker's executors. Imports the wire
(the Codex types, the frames, outcomes and exit codes), the net layer (the peer rules,
the event-loop glue, the runtime dir, logging) and the sandbox's policy and environment
rules; never the daemon, the client library, the executor or the CLI.

- :mod:`agent.__main__`: the process the daemon spawns; :mod:`agent.host` keeps one
  :class:`agent.session.Session` per session id the broker names, over one
  :class:`agent.broker_link.BrokerLink` shared with the
  :class:`agent.exec_runner.BrokerRunner` that runs the commands.
- :mod:`broker.cli.exec` is a frontend, not part of the process: ``sluice exec``, which
  resolves the configuration (:mod:`agent.config`) on the caller's side and talks to the
  daemon through :mod:`broker.client` only.
"""
