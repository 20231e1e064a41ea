"""The controller actor: sluice's daemon on one node of a Ray cluster, and its executors
on every node.

One detached actor, named :data:`~broker.ray.names.CONTROLLER` in the ``sluice``
namespace and pinned to its node, holds in memory the three CurveZMQ key pairs of the
cluster (the daemon's, the executors', the frontends'), writes on its node only what the
daemon needs as files (its key pair and the two allow lists, under sluice's home, hidden
from every sandbox), and runs ``sluice daemon --executors 0 --listen tcp://NODE_IP:PORT``
as its child. Once a second it:

- places a :class:`~broker.ray.node.NodeExecutor` on every alive node that has none
  (node affinity, not soft; detached; restarted by Ray on its node if it crashes), up to
  ``max_executors``; a node that is gone is remembered as lost;
- asks the daemon (as a local frontend) for its executors and queue, and hands that to
  :class:`~broker.ray.scaling.Scaler`, sending the autoscaler what it decides.

Executors and frontends get their key pair from :meth:`Controller.executor_credentials`
and :meth:`Controller.frontend_credentials` through Ray; :meth:`Controller.down`
revokes both (the allow lists are emptied, the executors and the daemon stopped, the
files removed).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass

import ray
import zmq
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from broker.client import Client, DaemonError
from broker.net.keys import write_key_file
from broker.net.runtime import RuntimeDir
from broker.ray.children import niceness, private_dir, ray_home, remove_dir, spawn_bound, stop
from broker.ray.names import NAMESPACE, executor_actor, executor_name, node_of
from broker.ray.node import NodeExecutor
from broker.ray.scaling import Scaler

TICK_S = 1.0
# The daemon's heartbeat here: a host that powers off closes no connection, so only the
# heartbeat notices it; ten silent heartbeats (3.5 s) fail its commands, within 5 s with
# room for a loaded head node (at 0.45 s a heartbeat, a run of the suite took 5.0 s).
HEARTBEAT_S = 0.35
# Nodes lost, the latest, that status lists.
LOST_KEPT = 100
_EXECUTOR = ray.remote(NodeExecutor)


@dataclass(frozen=True)
class Settings:
    """What ``sluice ray up`` was asked for."""

    slots_per_cpu: int = 2
    max_executors: int | None = None
    port: int = 0
    # Commands waiting this long for a slot make the controller ask for CPUs...
    scale_after_s: float = 10.0
    # ...given back once nothing ran or waited this long.
    release_after_s: float = 60.0
    max_cpus: int | None = None


def _free_port(ip: str) -> int:
    """A port free on ``ip`` now (the daemon binds it a moment later; restarts keep it)."""
    with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


class Controller:
    def __init__(self, settings: dict) -> None:
        self.settings = Settings(**settings)
        self.node_id = ray.get_runtime_context().get_node_id()
        self.ip = ray.util.get_node_ip_address()
        self._daemon_pair = zmq.curve_keypair()
        self._executor_pair = zmq.curve_keypair()
        self._frontend_pair = zmq.curve_keypair()
        self.dir = private_dir(os.path.join(ray_home(), "daemon"))
        self.runtime = RuntimeDir(os.path.join(self.dir, "run"))
        self._key = os.path.join(self.dir, "daemon.key_secret")
        self._allow = os.path.join(self.dir, "allow")
        self._allow_executors = os.path.join(self.dir, "allow-executors")
        write_key_file(self._key, *self._daemon_pair)
        for directory, (public, _) in ((self._allow, self._frontend_pair),
                                       (self._allow_executors, self._executor_pair)):
            os.makedirs(directory, mode=0o700)
            write_key_file(os.path.join(directory, "ray.key"), public)
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        self.endpoint = f"tcp://{host}:{self.settings.port or _free_port(self.ip)}"
        self._lock = threading.Lock()
        self._daemon = None
        self._daemon_exit = ""
        self._client: Client | None = None
        self._placed: dict[str, dict] = {}  # node id -> {"actor", "ip", "cpus", "since"}
        self._lost: list[dict] = []
        self._info = None
        self._scaler = Scaler(wait_s=self.settings.scale_after_s, idle_s=self.settings.release_after_s,
                              slots_per_cpu=self.settings.slots_per_cpu, max_cpus=self.settings.max_cpus)
        self._closing = threading.Event()
        self._start_daemon()
        self._thread = threading.Thread(target=self._loop, name="sluice-controller", daemon=True)
        self._thread.start()

    # -- the daemon ----------------------------------------------------------------------

    def _start_daemon(self, timeout: float = 60.0) -> None:
        """Start the daemon and wait until it answers; on a restart it listens where the
        first one did, so executors and frontends find it again by themselves."""
        env = {"SLUICE_RUNTIME_DIR": self.runtime.path}
        self._daemon = spawn_bound(
            ["daemon", "--executors", "0", "--heartbeat", str(HEARTBEAT_S), "--listen", self.endpoint, "--key", self._key,
             "--allow", self._allow, "--allow-executors", self._allow_executors], env=env, nice=niceness()[0])
        self._daemon_exit = ""
        deadline = time.monotonic() + timeout
        while True:
            if self._daemon.poll() is not None:
                self._daemon_exit = f"the daemon exited with status {self._daemon.returncode} as it started"
                raise RuntimeError(f"{self._daemon_exit}; see the controller's log in Ray's log directory")
            try:
                self._client = Client.connect(self.runtime, autostart=False, timeout=5.0, name="sluice ray")
                break
            except DaemonError:
                if time.monotonic() > deadline:
                    stop(self._daemon)
                    raise RuntimeError(f"the daemon did not answer within {timeout:g} s") from None
                time.sleep(0.2)

    def _daemon_running(self) -> bool:
        """Whether the daemon runs; once it exited, why is kept for :meth:`status`."""
        if self._daemon is None:
            return False
        if self._daemon.poll() is None:
            return True
        if not self._daemon_exit:
            self._daemon_exit = f"the daemon exited with status {self._daemon.returncode}; `sluice ray up` restarts it"
        return False

    def restart(self) -> dict:
        """Start the daemon again if it died (``sluice ray up`` on a cluster where sluice is up)."""
        with self._lock:
            if self._daemon is None or self._daemon.poll() is not None:
                self._close_client()
                self._start_daemon()
        return self.status()

    def _close_client(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None

    # -- credentials, through Ray --------------------------------------------------------

    def executor_credentials(self) -> tuple[str, bytes, bytes, bytes]:
        return (self.endpoint, self._daemon_pair[0], *self._executor_pair)

    def frontend_credentials(self) -> tuple[str, bytes, bytes, bytes]:
        return (self.endpoint, self._daemon_pair[0], *self._frontend_pair)

    # -- the loop ------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._closing.wait(TICK_S):
            try:
                with self._lock:
                    self._tick()
            except Exception as e:  # one bad turn (the GCS busy, a node racing away) is logged, not fatal
                print(f"sluice ray controller: {type(e).__name__}: {e}", flush=True)

    def _tick(self) -> None:
        if not self._daemon_running():
            self._close_client()
        self._place()
        if self._client is None:
            self._info = None
            return
        try:
            self._info = self._client.daemon_info(timeout=5.0)
        except DaemonError as e:
            self._info = None
            self._close_client()
            with contextlib.suppress(Exception):
                self._client = Client.connect(self.runtime, autostart=False, timeout=2.0, name="sluice ray")
            print(f"sluice ray controller: {e}", flush=True)
            return
        self._scale(self._info)

    def _place(self) -> None:
        now = time.time()
        alive = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
        for node_id in list(self._placed):
            if node_id not in alive:
                placed = self._placed.pop(node_id)
                self._lost.append({"node_id": node_id, "ip": placed["ip"], "at": now,
                                   "executor": executor_name(placed["ip"], node_id)})
                del self._lost[:-LOST_KEPT]
                with contextlib.suppress(Exception):
                    ray.kill(placed["actor"], no_restart=True)
        limit = self.settings.max_executors
        for node_id, node in sorted(alive.items()):
            if node_id in self._placed or (limit is not None and len(self._placed) >= limit):
                continue
            cpus = int(node.get("Resources", {}).get("CPU", 1)) or 1
            actor = _EXECUTOR.options(
                name=executor_actor(node_id), namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
                max_restarts=-1, num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
            ).remote(max(1, cpus * self.settings.slots_per_cpu))
            self._placed[node_id] = {"actor": actor, "ip": node["NodeManagerAddress"], "cpus": cpus, "since": now}

    def _scale(self, info) -> None:
        busy = sum(e.busy for e in info.executors)
        cpus = sum(p["cpus"] for p in self._placed.values())
        request = self._scaler.observe(time.monotonic(), queued=info.queued, busy=busy, cluster_cpus=cpus)
        if request is not None:
            from ray.autoscaler.sdk import request_resources

            request_resources(num_cpus=request.cpus)
            print(f"sluice ray controller: asked the autoscaler for {request.cpus} CPU(s): {request.why}", flush=True)

    # -- status and down -----------------------------------------------------------------

    def status(self) -> dict:
        """Executors by node (slots, busy, state), the queue, lost nodes, the autoscaler request."""
        with self._lock:
            info = self._info
            joined = {node_of(e.name): e for e in (info.executors if info else []) if node_of(e.name)}
            nodes = []
            for node_id, placed in sorted(self._placed.items(), key=lambda kv: kv[1]["ip"]):
                executor = joined.get(node_id[:8])
                nodes.append({
                    "node_id": node_id, "ip": placed["ip"], "cpus": placed["cpus"],
                    "executor": executor.name if executor else executor_name(placed["ip"], node_id),
                    "state": "joined" if executor else "starting",
                    "slots": executor.slots if executor else 0, "busy": executor.busy if executor else 0,
                })
            request = self._scaler.current
            return {
                "endpoint": self.endpoint, "node_id": self.node_id, "ip": self.ip,
                "settings": asdict(self.settings),
                "daemon": {"running": self._daemon_running(),
                           "pid": self._daemon.pid if self._daemon else None, "exit": self._daemon_exit},
                "nodes": nodes, "queued": info.queued if info else 0, "lost": list(self._lost),
                "scaling": asdict(request) if request else None,
            }

    def down(self) -> None:
        """Revoke the keys and stop everything: allow lists emptied first (no new
        connection gets in), then the executors (their commands killed, their key files
        removed), then the daemon; the actor itself is killed by the caller."""
        self._closing.set()
        self._thread.join()
        with self._lock:
            for directory in (self._allow, self._allow_executors):
                remove_dir(directory)
            stops = []
            for placed in self._placed.values():
                with contextlib.suppress(Exception):
                    stops.append(placed["actor"].stop.remote())
            with contextlib.suppress(Exception):
                ray.wait(stops, num_returns=len(stops), timeout=30)
            for placed in self._placed.values():
                with contextlib.suppress(Exception):
                    ray.kill(placed["actor"], no_restart=True)
            self._placed.clear()
            self._close_client()
            stop(self._daemon)
            remove_dir(self.dir)
            if self._scaler.current is not None and self._scaler.current.cpus:
                from ray.autoscaler.sdk import request_resources

                with contextlib.suppress(Exception):
                    request_resources(num_cpus=0)
