"""overload: N concurrent `sluice run --via-broker` against one daemon, and where callers wait.

Starts a daemon with its default executors (one per CPU, 256 slots each), then N callers
at once, each `sluice run --via-broker -- sh -c 'sleep S; echo $0' i`, and samples the
daemon's run queue while they run. Reports how many failed (and why), whether the daemon
gave up on an executor, the wall time, and the most callers that waited for a slot at
once: callers start to wait once more commands run at once than the executors have
slots, and wait (they do not fail) beyond that.

Run as root it puts itself, the daemon and the callers in a cgroup v1 memory and pids
controller (``--memory``, ``--pids``), so a machine too small for N Python processes is
not taken down. Not part of run_all: it measures a limit, not a speed.

    python tests/bench/bench_overload.py --callers 1000
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import subprocess
import sys
import time

from common import Daemon, log

CGROUP_V1 = "/sys/fs/cgroup"


@contextlib.contextmanager
def confined(memory: int, pids: int):
    """This process (and so what it starts) in a cgroup v1 memory and pids controller of its own."""
    made = []
    try:
        for controller, limit_file, limit in (("memory", "memory.limit_in_bytes", memory), ("pids", "pids.max", pids)):
            path = os.path.join(CGROUP_V1, controller, f"sluice-bench-overload-{os.getpid()}")
            try:
                os.mkdir(path)
            except OSError as e:
                log(f"no {controller} cgroup ({e.strerror}): running without that limit")
                continue
            made.append(path)
            with open(os.path.join(path, limit_file), "w") as f:
                f.write(str(limit))
            with open(os.path.join(path, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        yield
    finally:
        for path in made:
            with contextlib.suppress(OSError), open(os.path.join(os.path.dirname(path), "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            for _ in range(100):  # empty once the daemon's tree has exited
                try:
                    os.rmdir(path)
                    break
                except OSError:
                    time.sleep(0.1)


def overload(callers: int, sleep_s: float) -> dict:
    with Daemon() as d:
        env = d.env()
        client = d.handle.client()
        deadline = time.monotonic() + 60
        while len(client.daemon_info().executors) < (os.cpu_count() or 1) and time.monotonic() < deadline:
            time.sleep(0.1)
        slots = sum(e.slots for e in client.daemon_info().executors)
        sluice = [sys.executable, "-m", "broker"]
        t0 = time.monotonic()
        command = ["sh", "-c", f"sleep {sleep_s}; echo $0"]
        procs = [subprocess.Popen([*sluice, "run", "--via-broker", "--", *command, str(i)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/tmp")
                 for i in range(callers)]
        started_s = time.monotonic() - t0
        queued = 0
        while any(p.poll() is None for p in procs):
            with contextlib.suppress(Exception):
                queued = max(queued, client.daemon_info(timeout=30).queued)
            time.sleep(0.2)
        wall_s = time.monotonic() - t0
        failures = collections.Counter()
        for i, p in enumerate(procs):
            out, err = p.communicate()
            if p.returncode != 0 or out != f"{i}\n".encode():
                failures[(err.decode(errors="replace").strip().splitlines() or [f"exit {p.returncode}"])[-1][:160]] += 1
        text = d.handle.log()
        return {
            "callers": callers, "slots": slots, "started_s": round(started_s, 1), "wall_s": round(wall_s, 1),
            "max_waiting": queued, "failed": sum(failures.values()), "failures": dict(failures.most_common(5)),
            "executors_given_up": text.count('"executor hung'), "behind_heartbeats": text.count("behind on its input"),
        }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--callers", type=int, default=1000)
    p.add_argument("--sleep", type=float, default=1.0, help="each command's sleep (s)")
    p.add_argument("--memory", type=int, default=16 << 30, help="cgroup memory limit, bytes")
    p.add_argument("--pids", type=int, default=20_000, help="cgroup pids limit")
    args = p.parse_args()
    with confined(args.memory, args.pids) if os.geteuid() == 0 else contextlib.nullcontext():
        result = overload(args.callers, args.sleep)
    for key, value in result.items():
        print(f"{key}: {value}")
    return 1 if result["failed"] or result["executors_given_up"] else 0


if __name__ == "__main__":
    sys.exit(main())
