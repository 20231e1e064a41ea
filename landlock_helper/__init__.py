"""landlock_helper: turn a sandbox policy into kernel restrictions around one command.

Public API (stdlib + ctypes only; imports nothing else of sluice)::

    from landlock_helper import SandboxPolicy, filter_env
    from landlock_helper.spawn import SandboxError, spawn

    policy = SandboxPolicy.from_mode("workspace-write", writable_roots=["/srv/out"])
    proc = spawn(["make", "-j2"], cwd="/src", env=filter_env(os.environ),
                 policy=policy, stdout=w_out, stderr=w_err,
                 hidden_paths=["/run/user/1000/sluice"],
                 limits=Limits(memory=512 << 20))   # landlock_helper.limits; unset: defaults
    ...                      # watch proc.done_fds (readable => finished)
    proc.terminate()         # SIGTERM to every process of the command's tree
    proc.signal_command(signal.SIGINT)  # to the command's process group, as Ctrl-C would
    proc.kill()              # SIGKILL: the command's PID namespace is torn down
    outcome = proc.poll()    # None while running; Outcome(exit_code|signal|error, limit)

On Linux each command gets its own PID and mount namespace (and a user namespace when
not root) with a view of the filesystem that is read-only outside the writable roots (a
fresh /proc, a private /dev and /tmp, hidden paths, read-only ``.git``/``.sluice``:
see ``landlock_helper.mounts``), then NO_NEW_PRIVS, dropped capabilities, Landlock and
a seccomp filter. The namespace's init is ours: it reaps,
forwards SIGTERM to the whole namespace, and when the command exits it exits too, which
makes the kernel kill everything the command left behind (setsid and double-forked
escapees included). On macOS the same policy becomes a Seatbelt profile.

Importing the package is cheap (policies and environments only); the spawn machinery
(ctypes, Landlock, seccomp) loads with ``landlock_helper.spawn``, so a frontend that
only builds a policy does not pay for it at start-up.
"""

from landlock_helper.env import filter_env
from landlock_helper.policy import MODES, Permission, PolicyError, SandboxPolicy

__all__ = ["MODES", "Permission", "PolicyError", "SandboxPolicy", "filter_env"]
