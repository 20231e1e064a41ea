"""sluice on a Ray cluster, from any process of it: bring it up, ask how it is, take it
down, and connect a client with no key file in sight.

::

    import broker.ray

    broker.ray.up()                                  # once, e.g. `sluice ray up`
    with broker.ray.connect() as client:             # in any task or actor, on any node
        client.run(["make", "test"])

Each call joins the cluster first if this process has not (``address``, else Ray's
``auto``). Errors are :class:`RayError` (a :class:`broker.client.SluiceError`), one line.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from broker.client import Client, SluiceError
from broker.net.keys import Remote
from broker.ray.controller import Controller, Settings
from broker.ray.names import CONTROLLER, NAMESPACE

_CONTROLLER = ray.remote(Controller)


class RayError(SluiceError):
    """sluice cannot be brought up, found or reached on the Ray cluster; ``str(e)`` is one line."""


def join(address: str | None = None) -> None:
    """Join the Ray cluster at ``address`` (default: the one this machine belongs to), once."""
    if ray.is_initialized():
        return
    try:
        ray.init(address=address or "auto", namespace=NAMESPACE, log_to_driver=False, logging_level="error",
                 configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = address or "auto"
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RayError(f"cannot join the Ray cluster at {where}: {first}") from None


def _controller():
    try:
        return ray.get_actor(CONTROLLER, namespace=NAMESPACE)
    except ValueError:
        raise RayError("sluice is not up on this Ray cluster; run `sluice ray up`") from None


def _node(wanted: str | None) -> str:
    """The node id for ``wanted`` (a node id, or a node's IP address), default this process's node."""
    if not wanted:
        return ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("Alive") and wanted in (node["NodeID"], node["NodeManagerAddress"]):
            return node["NodeID"]
    raise RayError(f"no alive node of the Ray cluster has the id or address {wanted!r}")


def _call(method, timeout: float, what: str):
    try:
        return ray.get(method.remote(), timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise RayError(f"sluice's controller did not answer {what} within {timeout:g} s") from None
    except ray.exceptions.RayActorError as e:
        raise RayError(f"sluice's controller is gone ({_first_line(e)}); run `sluice ray up` again") from None


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    # A Ray error's last line is the cause raised in the actor ("RuntimeError: ..."), its first a banner.
    return lines[-1] if lines else type(e).__name__


def up(address: str | None = None, *, node: str | None = None, settings: Settings | None = None,
       min_executors: int = 1, timeout: float = 120.0) -> dict:
    """Start sluice's controller and daemon on ``node`` (default: this one) and wait until
    ``min_executors`` executors joined; if sluice is up already, restart its daemon if it
    died. Returns :func:`status`."""
    join(address)
    deadline = time.monotonic() + timeout
    try:
        controller = ray.get_actor(CONTROLLER, namespace=NAMESPACE)
        _call(controller.restart, timeout, "the restart")
    except ValueError:
        # Executors of a controller that died hold its keys and endpoint: not to be reused.
        _remove_executor_actors()
        controller = _CONTROLLER.options(
            name=CONTROLLER, namespace=NAMESPACE, lifetime="detached", max_restarts=0, num_cpus=0,
            max_concurrency=8, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=_node(node), soft=False),
        ).remote(asdict(settings or Settings()))
        try:
            _call(controller.status, timeout, "its start")
        except RayError as e:
            with contextlib.suppress(Exception):
                ray.kill(controller)
            raise RayError(f"sluice did not come up: {e}") from None
    while True:
        current = _call(controller.status, max(1.0, deadline - time.monotonic()), "status")
        joined = sum(1 for n in current["nodes"] if n["state"] == "joined")
        if joined >= min_executors:
            return current
        if time.monotonic() > deadline:
            raise RayError(f"sluice is up but only {joined} of {min_executors} executor(s) joined within "
                           f"{timeout:g} s; see `sluice ray status`")
        time.sleep(0.5)


def status(address: str | None = None, timeout: float = 30.0) -> dict:
    """Executors by node (slots, busy, state), queued commands, lost nodes, the daemon,
    and what was asked of the autoscaler and why."""
    join(address)
    return _call(_controller().status, timeout, "status")


def down(address: str | None = None, timeout: float = 120.0) -> bool:
    """Revoke the keys, stop the executors and the daemon, remove the actors; False if
    sluice was not up. Executor actors left by a controller that died are removed too."""
    join(address)
    was_up = True
    try:
        controller = _controller()
    except RayError:
        was_up = False
    else:
        with contextlib.suppress(RayError):
            _call(controller.down, timeout, "down")
        ray.kill(controller, no_restart=True)
    return _remove_executor_actors() or was_up


def _executor_actors() -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == NAMESPACE and a["name"].startswith("executor-")]


def _remove_executor_actors(timeout: float = 30.0) -> bool:
    """Kill every executor actor of sluice on the cluster and wait until their names are
    free (a new controller placing one under a name still taken would get the dying one);
    whether there was one."""
    names = _executor_actors()
    for name in names:
        with contextlib.suppress(Exception):
            ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
    deadline = time.monotonic() + timeout
    while names and _executor_actors():
        if time.monotonic() > deadline:
            raise RayError(f"executor actors still there {timeout:g} s after they were killed: {_executor_actors()}")
        time.sleep(0.2)
    return bool(names)


def remote(address: str | None = None, timeout: float = 30.0) -> Remote:
    """Where the daemon listens and a frontend key pair for it, from the controller."""
    join(address)
    endpoint, server_public, public, secret = _call(_controller().frontend_credentials, timeout, "for keys")
    return Remote(endpoint, server_public, public, secret)


def connect(address: str | None = None, *, timeout: float = 10.0, name: str = "ray") -> Client:
    """A :class:`broker.client.Client` of the cluster's daemon, from any node of it."""
    return Client.connect(remote=remote(address), timeout=timeout, name=name)
