"""One daemon's ceiling with its executors on a Ray cluster (docs/benchmarks.md).

A simulated three-node Ray cluster on this machine (tests/support/ray_cluster.py), sluice
up on it (`--slots-per-cpu 8`: 8 slots a node), and TASKS Ray tasks on the cluster, each
a frontend that keeps IN_FLIGHT sandboxed `true` commands in flight until it has run
PER_TASK. Measured over the run:

- commands/s, wall time from the first submit to the last result: on one machine this
  is bounded by the sandboxes' CPU, which in a real cluster is spread over the nodes;
- the daemon's CPU per command (user + system of its process): the router's cost,
  which does not spread: one asyncio process, one core. 1000 / that = the ceiling of
  commands/s one daemon routes, whatever the number of nodes;
- the executors' CPU per command, their sandboxes included (they run on the nodes);
- then how soon a node that joins the cluster gets its executor (JOINS nodes added one
  by one), against the 10 s the design asks for.

Run: ``python tests/bench/bench_ray.py [--tasks N] [--per-task N] [--in-flight N] [--joins N]``
(needs the ray extra; a few minutes here).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.support.ray_cluster import simulated_cluster  # noqa: E402  (first: it sets what Ray reads)

import psutil  # noqa: E402
import ray  # noqa: E402

import broker.ray  # noqa: E402


@ray.remote(num_cpus=0.25)
def frontend(per_task: int, in_flight: int) -> tuple[int, int, str]:
    """Run ``per_task`` `true`s, ``in_flight`` at a time; (succeeded, failed, the first failure)."""
    import broker.ray

    ok = failed = submitted = 0
    first_failure = ""
    with broker.ray.connect(timeout=60) as client:
        pending = []
        while submitted < per_task or pending:
            while submitted < per_task and len(pending) < in_flight:
                pending.append(client.submit(["true"], cwd="/", sandbox="read-only"))
                submitted += 1
            client.poll(1.0)
            still = []
            for call in pending:
                if call.done:
                    if call.result is not None and call.result.returncode == 0:
                        ok += 1
                    else:
                        failed += 1
                        first_failure = first_failure or repr(call.failure or call.result)
                else:
                    still.append(call)
            pending = still
    return ok, failed, first_failure


def cpu(processes: list[psutil.Process]) -> float:
    total = 0.0
    for proc in processes:
        try:
            times = proc.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
        except psutil.NoSuchProcess:
            pass
    return total


def executors(endpoint: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "executor" in cmdline and endpoint in cmdline:
            found += [proc, *proc.children(recursive=True)]
    return found


JOIN_TARGET_S = 10.0


def join_seconds(sim) -> float:
    """Add a node; seconds until `sluice ray status` lists its executor as joined."""
    node = sim.add_node()
    added = time.monotonic()
    while time.monotonic() - added < 120:
        if any(n["node_id"] == node.node_id and n["state"] == "joined" for n in broker.ray.status()["nodes"]):
            return time.monotonic() - added
        time.sleep(0.1)
    raise SystemExit("a node that joined got no executor within 120 s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--per-task", type=int, default=250)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--joins", type=int, default=2)
    args = parser.parse_args()
    with simulated_cluster(3) as sim:
        status = broker.ray.up(settings=broker.ray.Settings(slots_per_cpu=8), min_executors=3)
        daemon = psutil.Process(status["daemon"]["pid"])
        workers = executors(status["endpoint"])
        # Warm: every executor's sandboxes made, every Ray worker started.
        ray.get([frontend.remote(20, 4) for _ in range(args.tasks)])
        daemon_before, executors_before = cpu([daemon]), cpu(workers)
        started = time.monotonic()
        results = ray.get([frontend.remote(args.per_task, args.in_flight) for _ in range(args.tasks)])
        elapsed = time.monotonic() - started
        daemon_cpu, executors_cpu = cpu([daemon]) - daemon_before, cpu(workers) - executors_before
        load = os.getloadavg()
        joins = [join_seconds(sim) for _ in range(args.joins)]
    ok = sum(r[0] for r in results)
    failed = sum(r[1] for r in results)
    total = ok + failed
    print(f"{total} commands ({failed} failed) from {args.tasks} Ray tasks, {args.in_flight} in flight each, "
          f"on 3 simulated nodes (nproc {os.cpu_count()}, load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f})")
    print(f"  wall: {elapsed:.1f} s, {total / elapsed:.0f} commands/s")
    print(f"  daemon CPU: {daemon_cpu * 1000 / total:.2f} ms a command -> ceiling {total / daemon_cpu:.0f} "
          f"commands/s on one core")
    print(f"  executors' CPU (sandboxes included): {executors_cpu * 1000 / total:.2f} ms a command")
    print(f"  a node that joins has its executor after: {', '.join(f'{j:.1f}' for j in joins)} s "
          f"(at most {max(joins) / JOIN_TARGET_S:.2f} of the {JOIN_TARGET_S:g} s asked for)")
    for _, _, failure in results:
        if failure:
            print(f"  first failure: {failure}")
            break
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
