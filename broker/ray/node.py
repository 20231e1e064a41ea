"""The executor actor: one per node, pinned there, running ``sluice executor`` for the
cluster's daemon.

It is created by the controller (:mod:`broker.ray.controller`) as a detached actor named
for its node, so a node never gets two; Ray restarts it on its node if it crashes
(``max_restarts=-1``), and it then asks the controller for the executor key pair again:
the secret travels through Ray to this process and is written only here, in a 0600 file
in sluice's home (hidden from every sandbox), and is never part of the actor's creation
arguments (which Ray keeps in its control store to restart it).
"""

from __future__ import annotations

import os
import signal
import threading

import ray

from broker.net.keys import write_key_file
from broker.ray.children import niceness, private_dir, ray_home, remove_dir, spawn_bound, stop
from broker.ray.names import CONTROLLER, NAMESPACE, executor_name


class NodeExecutor:
    def __init__(self, slots: int) -> None:
        self._stopping = False
        context = ray.get_runtime_context()
        self.node_id = context.get_node_id()
        self.ip = ray.util.get_node_ip_address()
        self.name = executor_name(self.ip, self.node_id)
        controller = ray.get_actor(CONTROLLER, namespace=NAMESPACE)
        endpoint, server_public, public, secret = ray.get(controller.executor_credentials.remote())
        self.dir = private_dir(os.path.join(ray_home(), f"executor-{self.node_id[:12]}"))
        server_key = os.path.join(self.dir, "daemon.key")
        key = os.path.join(self.dir, "executor.key_secret")
        write_key_file(server_key, server_public)
        write_key_file(key, public, secret)
        services, tasks = niceness()
        # The executor answers heartbeats as a service of the node; its commands run where Ray runs tasks.
        argv = ["executor", "--connect", endpoint, "--server-key", server_key, "--key", key,
                "--slots", str(slots), "--name", self.name, "--nice", str(tasks)]
        # Ray's own sockets and files on this node (raylet, object store, logs): not for commands.
        temp_dir = _ray_temp_dir(context)
        if temp_dir:
            argv += ["--hide", temp_dir]
        # SIGTERM when this actor dies: the executor kills its commands and its connection
        # closes, so the daemon fails them at once, naming this executor (and so this node).
        self.proc = spawn_bound(argv, death_signal=signal.SIGTERM, nice=services)
        threading.Thread(target=self._watch, name="sluice-executor-watch", daemon=True).start()

    def _watch(self) -> None:
        """An executor that exits by itself takes this actor with it, for Ray to restart both."""
        code = self.proc.wait()
        if not self._stopping:
            print(f"sluice executor {self.name} exited ({code}); the actor ends for Ray to restart it", flush=True)
            os._exit(1)

    def describe(self) -> dict:
        return {"node_id": self.node_id, "ip": self.ip, "name": self.name, "pid": self.proc.pid,
                "running": self.proc.poll() is None}

    def stop(self) -> None:
        """End the executor (its commands killed) and remove its key files."""
        self._stopping = True
        stop(self.proc)
        remove_dir(self.dir)


def _ray_temp_dir(context) -> str | None:
    try:
        return context.get_temp_dir()
    except Exception:  # older Ray: the default is under /tmp, which sandboxes see privately anyway
        return None
