"""connect-cost: what vetting every connect() in the sandbox's init costs, and what it
costs a command that never connects.

    python tests/bench/bench_connect.py [--rounds N] [--compare CHECKOUT]

Through ``python -m landlock_helper`` (workspace-write), a Python loop in the command:

- ``connect``: connect + accept + close to a unix socket the command itself listens on;
  per round, sandboxed vs the same loop unsandboxed;
- ``syscalls``: 200k getppid + 20k stat (no connect): per call, sandboxed vs unsandboxed;
- ``start``: wall time of a sandboxed ``true`` (sandbox made on the spot).

``--compare`` runs the sandboxed figures also with another checkout's landlock_helper
(e.g. a worktree of the commit before connect vetting), so "nothing measurable" is a
comparison, not a claim. Runs of the variants alternate, 7 each, and the median is
printed (a shared machine is noisy; alternating spreads the noise evenly). Prints
figures; no targets.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONNECT = """
import socket, sys, time
n = int(sys.argv[1])
srv = socket.socket(socket.AF_UNIX)
srv.bind("bench.sock")
srv.listen(64)
t = time.perf_counter()
for _ in range(n):
    c = socket.socket(socket.AF_UNIX)
    c.connect("bench.sock")
    srv.accept()[0].close()
    c.close()
print((time.perf_counter() - t) / n * 1e6)
"""

SYSCALLS = """
import os, time
t = time.perf_counter()
for _ in range(200000):
    os.getppid()
for _ in range(20000):
    os.stat(".")
print((time.perf_counter() - t) / 220000 * 1e6)
"""


def _run(argv, cwd, pythonpath=None) -> str:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"{argv[:4]} failed: {r.stderr[-500:]}")
    return r.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--compare", help="another checkout whose landlock_helper to measure too")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="slb-connect-", dir="/tmp")
    try:
        for name, code in (("connect.py", CONNECT), ("syscalls.py", SYSCALLS)):
            with open(os.path.join(work, name), "w") as f:
                f.write(code)

        def once(script, extra, checkout=None):
            sock = os.path.join(work, "bench.sock")
            if os.path.exists(sock):
                os.unlink(sock)
            path = os.path.join(work, script)
            if checkout is None:
                return float(_run([sys.executable, path, *extra], work))
            argv = [sys.executable, "-m", "landlock_helper", "--cwd", work, "--", sys.executable, path, *extra]
            return float(_run(argv, checkout, checkout))

        def start(checkout):
            t = time.perf_counter()
            _run([sys.executable, "-m", "landlock_helper", "--cwd", work, "--", "true"], checkout, checkout)
            return (time.perf_counter() - t) * 1e3

        checkouts = [("this", ROOT)] + ([("compare", os.path.abspath(args.compare))] if args.compare else [])
        n = str(args.rounds)
        variants = [("unsandboxed", None)] + [(f"sandboxed ({label})", co) for label, co in checkouts]

        def medians(script, extra):
            samples = {name: [] for name, _ in variants}
            for _ in range(7):
                for name, co in variants:
                    samples[name].append(once(script, extra, co))
            return {name: statistics.median(v) for name, v in samples.items()}

        print(f"connect loop, {n} rounds (connect + accept + close), us per round, median of 7")
        for name, value in medians("connect.py", [n]).items():
            print(f"  {name:22s} {value:8.1f}")
        print("no connect: 200k getppid + 20k stat, us per call, median of 7")
        for name, value in medians("syscalls.py", []).items():
            print(f"  {name:22s} {value:8.3f}")
        print("sandboxed `true` (python -m landlock_helper, cold), ms wall, median of 15")
        starts = {label: [] for label, _ in checkouts}
        for _ in range(15):
            for label, co in checkouts:
                starts[label].append(start(co))
        for label, values in starts.items():
            print(f"  {label:22s} {statistics.median(values):8.1f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
