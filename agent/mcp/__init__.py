"""MCP servers as the agent's tools: the client (:mod:`agent.mcp.client`), the tools as the
model sees them (:mod:`agent.mcp.tools`), the configuration (:mod:`agent.mcp.config`) and
the servers of one session (:mod:`agent.mcp.manager`)."""
