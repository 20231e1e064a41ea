"""agent: the model-agent process (``python -m agent``).

It hosts Codex sessions: turns Submissions into Events, talks to the model over HTTP
(httpx, SSE), and runs every command through the broker's executors. Imports
broker.protocol and broker.client, never the broker's or executor's internals.
"""
