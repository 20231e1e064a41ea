"""What the Ray actors of sluice keep on their node: a private directory in sluice's home,
and one child process (the daemon, or ``sluice executor``) that dies with the actor.

Ray kills an actor's process outright (``ray.kill``, a node removed, ``sluice ray down``);
nothing in it runs then. So the child is bound to it by the kernel: ``PR_SET_PDEATHSIG``
set in a small launcher that then execs the real program (the death signal survives
exec), instead of a ``preexec_fn`` in an actor process that runs threads.

Ray runs its workers, and so its actors, at niceness 15 (``RAY_worker_niceness``), below
its own services (the raylet, at the niceness Ray was started with), so that a node full
of tasks still answers. The daemon and the executor are services too: their heartbeats
decide whether a host is gone. The launcher puts them at the raylet's niceness where the
kernel allows it (root, CAP_SYS_NICE or RLIMIT_NICE; else they stay, and say so on
stderr), and the executor runs its commands where Ray runs tasks.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys

from broker.net.runtime import sluice_home, with_source_root, without_secrets

# Exec ``argv[4:]`` with ``argv[2]`` as the death signal, unless the parent (pid
# ``argv[1]``) is already gone (it died before the prctl took effect); at niceness
# ``argv[3]`` first, unless it is "-" or the kernel refuses (then it says so and goes on).
_LAUNCHER = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, int(sys.argv[2]), 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]): sys.exit(1)\n"
    "if sys.argv[3] != '-':\n"
    "    try: os.setpriority(os.PRIO_PROCESS, 0, int(sys.argv[3]))\n"
    "    except OSError as e: print(f'sluice: stays at niceness {os.getpriority(os.PRIO_PROCESS, 0)}, not '\n"
    "                               f'{sys.argv[3]} as the raylet: {e.strerror}', file=sys.stderr, flush=True)\n"
    "os.execv(sys.argv[4], sys.argv[4:])\n"
)


def ray_home() -> str:
    """``$SLUICE_HOME/ray`` on this node: keys, allow lists and the daemon's runtime dir.
    Inside sluice's home, which every sandbox of sluice hides."""
    return os.path.join(sluice_home(), "ray")


def private_dir(path: str) -> str:
    """``path`` made (with its parents) mode 0700, emptied of what a previous actor left."""
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path, mode=0o700)
    os.chmod(path, 0o700)
    return path


def remove_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def niceness() -> tuple[int, int]:
    """(services, tasks): the niceness of Ray's services on this node (the raylet, whose
    child a worker is) and of its tasks (this worker's). The same if the parent is not
    to be read, or is not above us."""
    tasks = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        return min(tasks, os.getpriority(os.PRIO_PROCESS, os.getppid())), tasks
    except OSError:
        return tasks, tasks


def spawn_bound(args: list[str], *, death_signal: int = signal.SIGTERM, env: dict[str, str] | None = None,
                nice: int | None = None) -> subprocess.Popen:
    """Start ``python -m broker ARGS`` (the ``sluice`` command of this installation) so
    that it gets ``death_signal`` when this process dies; ``env``: variables set on top
    of ours, less any secret; ``nice``: its niceness, if the kernel lets it have it. Its
    output goes where ours goes (the actor's log in Ray's log dir)."""
    env = with_source_root({**without_secrets(), **(env or {})})
    argv = [sys.executable, "-c", _LAUNCHER, str(os.getpid()), str(int(death_signal)),
            "-" if nice is None else str(nice), sys.executable, "-m", "broker", *args]
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=env, cwd="/", close_fds=True)


def stop(proc: subprocess.Popen | None, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; reaped either way."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
