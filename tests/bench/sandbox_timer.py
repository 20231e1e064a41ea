"""Times sandboxed `true` through landlock_helper, for bench_sandbox_cost.py.

``python sandbox_timer.py COUNT CWD HIDDEN_PATH`` prints a JSON object of samples (ns):
``pool`` (``Spawner.spawn``), ``cold`` (``spawn``) and ``baseline`` (``subprocess.run``).

A process of its own because a Spawner must be made before its caller loads anything
large (its zygote is a fork of the caller as it is then), as the executor does: so the
Spawner comes first here, before the benchmark helpers are even imported.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from landlock_helper.spawn import Spawner, spawn  # noqa: E402  (stdlib + ctypes only)

count, cwd, hidden = int(sys.argv[1]), sys.argv[2], sys.argv[3]
spawner = Spawner([hidden])

import json  # noqa: E402
import subprocess  # noqa: E402

from common import alternate  # noqa: E402

from landlock_helper import SandboxPolicy, filter_env  # noqa: E402

WARM_UP = 10


def main() -> None:
    policy = SandboxPolicy.from_mode("workspace-write")
    env = filter_env(os.environ)
    devnull = os.open(os.devnull, os.O_WRONLY)

    def sandboxed(start) -> None:
        proc = start(["true"], cwd=cwd, env=env, policy=policy, stdout=devnull, stderr=devnull)
        outcome = proc.wait(30)
        proc.close()
        if outcome is None or outcome.exit_code != 0:
            raise RuntimeError(f"sandboxed `true` did not exit 0: {outcome}")

    def cold(argv, **kw):
        return spawn(argv, hidden_paths=[hidden], **kw)

    ways = {"pool": lambda: sandboxed(spawner.spawn), "cold": lambda: sandboxed(cold),
            "baseline": lambda: subprocess.run(["true"], check=True)}
    try:
        spawner.refill(block=True)
        for fn in ways.values():
            for _ in range(WARM_UP):
                fn()
        samples = alternate(ways, count)
    finally:
        spawner.close()
    json.dump(samples, sys.stdout)


if __name__ == "__main__":
    main()
