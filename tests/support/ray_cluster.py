"""A simulated Ray cluster on this machine for sluice's Ray tests and benchmark: N nodes
with ``ray.cluster_utils.Cluster``, every address on 127.0.0.1, Ray's files in a short
private directory, sluice's home and runtime dir in it too; this process joined as a driver.

Import it only once Ray is known to be there; it sets, before importing Ray, the one
variable Ray reads at import to keep a loopback address as it is.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator

# Read by Ray when it is imported: without it, Ray replaces a loopback address given to
# ray.init with the machine's outward one ("remotely reachable"), where nothing of a
# one-machine cluster listens, and the driver waits for minutes. Only Ray reads it.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from tests.support.harness import ROOT, short_tempdir  # noqa: E402

LOOPBACK = "127.0.0.1"
NODE = {"num_cpus": 1, "node_ip_address": LOOPBACK, "include_dashboard": False}
WORKER_NICENESS = 1


class ClusterStartError(RuntimeError):
    """Ray could not start a cluster on this machine."""


class Sim:
    """The cluster, its private dirs, and the node ids the caller removed."""

    def __init__(self, cluster: Cluster, base: str) -> None:
        self.cluster = cluster
        self.base = base
        self.home = os.path.join(base, "home")
        self.removed: list[str] = []

    @property
    def address(self) -> str:
        return self.cluster.address

    def node_ids(self) -> list[str]:
        return [n.node_id for n in self.cluster.list_all_nodes()]

    def add_node(self):
        return self.cluster.add_node(**NODE)


@contextlib.contextmanager
def simulated_cluster(nodes: int = 3) -> Iterator[Sim]:
    """Start the cluster and join it; on the way out, stop sluice on it (if it was up),
    leave it, stop every node and remove every file. ClusterStartError if Ray cannot start."""
    base = short_tempdir("sl-ray-")
    saved = dict(os.environ)
    os.environ.update({
        # Ray's sessions, sockets (paths under 107 bytes) and address file here, not in
        # /tmp/ray, which every Ray user of the machine shares.
        "RAY_TMPDIR": base,
        "RAY_USAGE_STATS_ENABLED": "0",
        # Ray runs its workers at niceness 15, to keep a node's services ahead of its tasks.
        # These nodes share two cores with the rest of the suite, whose processes run at 0:
        # at 15 a worker starting (an actor: Python and Ray imported) gets a thirtieth of
        # their share and takes a minute, and the tests would time the suite, not sluice.
        # At 1 they still run below Ray's services (and sluice's: see broker.ray.children).
        "RAY_worker_niceness": str(WORKER_NICENESS),
        "SLUICE_HOME": os.path.join(base, "home"),
        "SLUICE_RUNTIME_DIR": os.path.join(base, "rt"),
        # The actors' processes import sluice (and the test helpers) from this checkout.
        "PYTHONPATH": ROOT + (os.pathsep + saved["PYTHONPATH"] if saved.get("PYTHONPATH") else ""),
    })
    cluster = None
    try:
        try:
            cluster = Cluster(initialize_head=True, head_node_args=NODE)
            for _ in range(nodes - 1):
                cluster.add_node(**NODE)
            ray.init(address=cluster.address, _node_ip_address=LOOPBACK, namespace="sluice-tests",
                     log_to_driver=False)
        except Exception as e:  # whatever keeps Ray from starting here
            raise ClusterStartError(f"{type(e).__name__}: {e}") from e
        yield Sim(cluster, base)
    finally:
        if ray.is_initialized():
            try:
                import broker.ray

                broker.ray.down(timeout=60)
            finally:
                ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(base, ignore_errors=True)
