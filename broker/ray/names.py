"""How sluice's actors are found in a Ray cluster, and how its executors are named."""

from __future__ import annotations

# Every actor of sluice is detached, in this namespace, under these names: whoever
# reaches the cluster finds the controller by name, and a node cannot get two executors
# (a second actor of the same name is refused).
NAMESPACE = "sluice"
CONTROLLER = "controller"


def executor_actor(node_id: str) -> str:
    return f"executor-{node_id}"


def executor_name(ip: str, node_id: str) -> str:
    """The executor's name in the daemon, in its errors and in every result it runs
    (``Call.executor``): the node's address and the start of its Ray node id."""
    return f"ray:{ip}:{node_id[:8]}"


def node_of(executor: str) -> str | None:
    """The node id prefix in an executor's name, or None for an executor not placed by Ray."""
    parts = executor.split(":")
    return parts[-1] if len(parts) == 3 and parts[0] == "ray" else None
