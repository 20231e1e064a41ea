"""Resource limits against a real daemon, real executors and the real sandbox.

One command that forks without end or eats memory is held at its own limits, reported
("killed: memory limit 64 MiB reached"), and other clients' commands keep running while
it does. Cgroup tests skip (with the reason) where this host gives us no cgroups; the
rlimit tests run everywhere, on a daemon told not to use cgroups (``SLUICE_NO_CGROUPS``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from landlock_helper import limits as L
from tests.support.harness import ROOT, SANDBOX_PYTHON, short_tempdir, wait_for
from tests.support.sandbox_harness import NOBODY

MECH = L.mechanism()
needs_cgroups = pytest.mark.skipif(
    MECH.cgroup_for("memory") is None or MECH.cgroup_for("pids") is None,
    reason=f"no memory and pids cgroups we may create here: {MECH.describe()}",
)

# Small limits, so the tests stay cheap: the fork bomb stops at 64 tasks, the hog at 64 MiB.
PIDS = 64
MEMORY = "64M"
PYTHON = SANDBOX_PYTHON
HOG = [PYTHON, "-c", "print(open('/proc/self/cgroup').read(), flush=True); x = bytearray(256 << 20); "
       "print('survived')"]
# Every process forks for as long as it lives, whether a fork works or not.
BOMB = [PYTHON, "-c", """
import os
print(open("/proc/self/cgroup").read(), flush=True)
while True:
    try:
        os.fork()
    except OSError:
        pass
"""]


def _cgroup_name(proc_self_cgroup: str) -> str:
    """The name of a command's cgroups, from what it read in /proc/self/cgroup."""
    names = {line.rsplit("/", 1)[-1] for line in proc_self_cgroup.splitlines() if f"/{L.CGROUP_PARENT}/" in line}
    assert len(names) == 1, proc_self_cgroup
    return names.pop()


def _cgroup_dirs(name: str) -> list[str]:
    """The command's cgroups that still exist."""
    return [p for p in (os.path.join(h.parent, name) for h in MECH.hierarchies) if os.path.isdir(p)]


def _gone(name: str) -> None:
    wait_for(lambda: not _cgroup_dirs(name), 10, f"the cgroups {name} to be removed")


def _read_int(path: str) -> int:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


@pytest.fixture(scope="module")
def rlimit_daemon():
    """A daemon whose executors use rlimits only, as on a host without cgroups for us."""
    from tests.support.harness import daemons

    with daemons() as factory:
        yield factory.start(executors=1, env={"SLUICE_NO_CGROUPS": "1"})


# -- cgroups ------------------------------------------------------------------------------


@needs_cgroups
@pytest.mark.timeout(60)
def test_memory_hog_is_killed_at_its_limit_and_says_so(module_daemon):
    c = module_daemon.client()
    r = c.run(HOG, memory=MEMORY, wait_timeout=30)
    assert r.signal == 9 and r.returncode == 137, r
    assert r.limit == "killed: memory limit 64 MiB reached"
    assert b"survived" not in r.stdout
    # Its cgroups went with it.
    _gone(_cgroup_name(r.stdout.decode()))


@needs_cgroups
@pytest.mark.timeout(60)
def test_under_its_limit_a_command_runs_as_before(module_daemon):
    c = module_daemon.client()
    r = c.run([PYTHON, "-c", "x = bytearray(16 << 20); print(len(x))"], memory=MEMORY, pids_limit=PIDS,
              wait_timeout=30)
    assert r.returncode == 0 and r.stdout == b"16777216\n" and r.limit is None, r


@needs_cgroups
@pytest.mark.timeout(60)
def test_the_command_runs_in_a_cgroup_of_its_own(module_daemon):
    c = module_daemon.client()
    r = c.run(["cat", "/proc/self/cgroup"], wait_timeout=30)
    lines = r.stdout.decode().splitlines()
    for controller in ("memory", "pids"):
        h = MECH.cgroup_for(controller)
        mine = [ln for ln in lines if (ln.startswith("0::") if h.version == 2 else f":{controller}:" in ln)]
        assert mine and f"/{L.CGROUP_PARENT}/" in mine[0], (controller, lines)
    _gone(_cgroup_name(r.stdout.decode()))


@needs_cgroups
@pytest.mark.timeout(60)
def test_fork_bomb_is_held_at_its_pids_limit(module_daemon):
    c = module_daemon.client()
    r = c.run(BOMB, pids_limit=PIDS, timeout_ms=2000, wait_timeout=30)
    assert r.timed_out and r.returncode == 124, r
    assert r.limit is not None and r.limit.startswith(f"pids limit {PIDS} reached ("), r.limit
    _gone(_cgroup_name(r.stdout.decode()))


@needs_cgroups
@pytest.mark.timeout(120)
def test_other_clients_keep_running_during_a_fork_bomb_and_a_memory_hog(daemon_factory):
    handle = daemon_factory.start()
    culprit = handle.client()
    seen: dict[str, bytes] = {"bomb": b"", "hog": b""}

    def on_output(name):
        def note(call, stream, chunk):
            seen[name] += bytes(chunk)
        return note

    bomb = culprit.submit(BOMB, pids_limit=PIDS, timeout_ms=60_000, on_output=on_output("bomb"))
    # A hog killed over and over, for as long as it runs.
    hog_loop = ["sh", "-c", f"cat /proc/self/cgroup; while :; do {HOG[0]} -c 'x = bytearray(256 << 20)'; echo killed; done"]
    hog = culprit.submit(hog_loop, memory=MEMORY, timeout_ms=60_000, on_output=on_output("hog"))

    def bomb_at_limit() -> bool:
        culprit.poll(0.05)
        if b"sluice" not in seen["bomb"]:
            return False
        pids = os.path.join(MECH.cgroup_for("pids").parent, _cgroup_name(seen["bomb"].decode()))
        return _read_int(os.path.join(pids, "pids.max")) == PIDS and _read_int(os.path.join(pids, "pids.current")) >= PIDS - 2

    wait_for(bomb_at_limit, 30, "the fork bomb to reach its pids limit")
    wait_for(lambda: culprit.poll(0.05) >= 0 and seen["hog"].count(b"killed") >= 2, 30, "the hog to be killed twice")

    probes_per_client, clients = 10, 4
    results: list = []
    errors: list = []

    def probe() -> None:
        try:
            c = handle.client()
            for _ in range(probes_per_client):
                results.append(c.run(["true"], wait_timeout=30))
        except Exception as e:  # reported below, not lost in the thread
            errors.append(e)

    threads = [threading.Thread(target=probe) for _ in range(clients)]
    started = time.monotonic()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        culprit.poll(0.05)  # keep the culprit's own calls served (acks, pongs)
    elapsed = time.monotonic() - started
    assert not errors, errors
    failed = [r for r in results if r.returncode != 0]
    assert len(results) == probes_per_client * clients and not failed, failed
    # Both were still at it the whole time.
    assert not bomb.done and not hog.done, (bomb.result, hog.result)
    culprit.cancel(bomb)
    culprit.cancel(hog)
    rb, rh = culprit.wait_all([bomb, hog], 30)
    assert rb.aborted and rb.limit and rb.limit.startswith(f"pids limit {PIDS} reached"), rb
    assert rh.aborted and rh.limit == "killed: memory limit 64 MiB reached", rh
    print(f"{len(results)} of {len(results)} probes succeeded in {elapsed:.1f} s during a fork bomb and a memory hog")
    _gone(_cgroup_name(seen["bomb"].decode().split("\n\n")[0]))
    _gone(_cgroup_name(seen["hog"].decode().split("killed")[0]))


@needs_cgroups
@pytest.mark.timeout(60)
def test_cli_prints_the_limit_that_killed_the_command(module_daemon, sluice):
    p = subprocess.run([*sluice, "run", "--memory", MEMORY, "--", *HOG], env=module_daemon.env,
                       capture_output=True, timeout=30)
    assert p.returncode == 137, p
    assert p.stderr.decode().splitlines()[-1] == "sluice: killed: memory limit 64 MiB reached", p.stderr


# -- rlimits (everywhere) -----------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["cgroups", "rlimits"])
def test_file_size_limit_kills_at_the_limit(mode, module_daemon, rlimit_daemon):
    handle = module_daemon if mode == "cgroups" else rlimit_daemon
    c = handle.client()
    # Python ignores SIGXFSZ; a command that does not gets it at the limit.
    write = ("import signal; signal.signal(signal.SIGXFSZ, signal.SIG_DFL); "
             "open('big', 'wb').write(b'x' * (3 << 20)); print('wrote')")
    work = short_tempdir("sl-fsize-")
    try:
        r = c.run([PYTHON, "-c", write], cwd=work, file_size="1M", wait_timeout=30)
        assert r.limit == "killed: file size limit 1 MiB reached", r
        assert r.signal == 25 and b"wrote" not in r.stdout
        assert os.path.getsize(os.path.join(work, "big")) == 1 << 20
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.timeout(60)
def test_cpu_time_limit_kills_a_spinning_command(rlimit_daemon):
    c = rlimit_daemon.client()
    started = time.monotonic()
    r = c.run(["sh", "-c", "while :; do :; done"], cpu_time=1, wait_timeout=30)
    assert r.limit == "killed: CPU time limit 1 s reached" and r.signal == 24, r
    assert time.monotonic() - started < 20


@pytest.mark.timeout(60)
def test_without_cgroups_memory_is_an_address_space_limit(rlimit_daemon):
    c = rlimit_daemon.client()
    r = c.run(["cat", "/proc/self/cgroup"], wait_timeout=30)
    assert f"/{L.CGROUP_PARENT}/" not in r.stdout.decode()
    # RLIMIT_AS: the allocation fails (MemoryError) instead of the process being killed,
    # so no limit is reported; the command learns it itself.
    # (256M: room for the interpreter's own address space, whatever its build.)
    hog = [PYTHON, "-c", "x = bytearray(1 << 30); print('survived')"]
    r = c.run(hog, memory="256M", wait_timeout=30)
    assert r.returncode == 1 and b"MemoryError" in r.stderr and b"survived" not in r.stdout, r
    assert r.limit is None
    r = c.run(["sh", "-c", "ulimit -v; ulimit -f"], memory="256M", file_size="1G", wait_timeout=30)
    assert r.stdout.decode().split() == [str(256 << 10), str((1 << 30) // 512)], r


@pytest.mark.timeout(60)
def test_defaults_apply_when_nothing_is_asked(rlimit_daemon):
    c = rlimit_daemon.client()
    r = c.run(["sh", "-c", "ulimit -f; ulimit -t; ulimit -v"], wait_timeout=30)
    # 8 GiB files, no CPU-time limit, no address-space limit (memory is a cgroup's job).
    assert r.stdout.decode().split() == [str(L.DEFAULT_FILE_SIZE // 512), "unlimited", "unlimited"], r
    r = c.run(["sh", "-c", "ulimit -f"], file_size="unlimited", wait_timeout=30)
    assert r.stdout == b"unlimited\n", r


@pytest.mark.timeout(60)
def test_config_file_limits_apply_to_sluice_run(rlimit_daemon, sluice):
    home = short_tempdir("sl-home-")
    with open(os.path.join(home, "config.toml"), "w") as f:
        f.write('[limits]\nfile-size = "2M"\ncpu_time = 30\n')
    env = dict(rlimit_daemon.env, SLUICE_HOME=home)
    p = subprocess.run([*sluice, "run", "--", "sh", "-c", "ulimit -f; ulimit -t"], env=env, capture_output=True,
                       timeout=30)
    assert p.returncode == 0 and p.stdout.decode().split() == ["4096", "30"], p
    # A flag beats the file.
    p = subprocess.run([*sluice, "run", "--file-size", "1M", "--", "sh", "-c", "ulimit -f"], env=env,
                       capture_output=True, timeout=30)
    assert p.stdout == b"2048\n", p
    with open(os.path.join(home, "config.toml"), "w") as f:
        f.write('[limits]\nmemory = "lots"\n')
    p = subprocess.run([*sluice, "run", "--", "true"], env=env, capture_output=True, timeout=30)
    assert p.returncode == 2 and b"[limits].memory: not a size: 'lots'" in p.stderr, p


@pytest.mark.timeout(60)
def test_bad_limit_flags_are_usage_errors(module_daemon, sluice):
    for flag, value in (("--memory", "12 parsecs"), ("--pids-limit", "many"), ("--cpu-time", "1y")):
        p = subprocess.run([*sluice, "run", flag, value, "--", "true"], env=module_daemon.env, capture_output=True,
                           timeout=30)
        assert p.returncode == 2 and p.stderr.startswith(b"sluice: error: "), p


# -- what no rlimit counts: the sandbox's /dev/shm ----------------------------------------

# Runs one command through landlock_helper.spawn with a memory limit (or none), on
# rlimits only (as on a host without cgroups for us, and for any unprivileged user).
SPAWN_DRIVER = """
import os, sys
from landlock_helper.limits import Limits
from landlock_helper.policy import SandboxPolicy
from landlock_helper.spawn import spawn
memory = int(sys.argv[1])
p = spawn(["sh", "-c", sys.argv[2]], cwd=os.getcwd(), env={"PATH": "/usr/bin:/bin"},
          policy=SandboxPolicy.from_mode("workspace-write"), stdout=1, stderr=2,
          limits=Limits(memory=memory) if memory else None)
o = p.wait(60)
p.close()
sys.exit(o.exit_code if o.exit_code is not None else 128)
"""
FILL = "head -c {size} /dev/zero > /dev/shm/fill; stat -c %s /dev/shm/fill; rm /dev/shm/fill"
SHM_SIZE = 'stat -f -c "%b %S %c" /dev/shm'


def _spawn_rlimits_only(cmd: str, memory: int, *, cwd, user: str, nobody) -> str:
    argv = [sys.executable, "-c", SPAWN_DRIVER, str(memory), cmd]
    env = dict(os.environ, SLUICE_NO_CGROUPS="1", PYTHONPATH=ROOT)
    if user == "nobody":
        python, lib = nobody
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python, *argv[1:]]
        env.update(PYTHONPATH=lib, HOME="/nonexistent")
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.timeout(90)
def test_dev_shm_holds_no_more_than_the_memory_limit(as_user, nobody_env, workdir):
    # The host's /dev/shm (and a sandbox's without a memory limit: the tmpfs default)
    # would take far more than a 64 MiB command may use: memory no rlimit counts.
    host = os.statvfs("/dev/shm")
    assert host.f_blocks * host.f_frsize >= 384 << 20
    out = _spawn_rlimits_only(f"{SHM_SIZE}; {FILL.format(size='128M')}", 0, cwd=workdir, user=as_user,
                              nobody=nobody_env)
    blocks, block_size, _, wrote = (int(x) for x in out.split())
    assert blocks * block_size >= 384 << 20 and wrote == 128 << 20, out
    # With --memory 64M: a tmpfs of 64 MiB, one inode per page of it; filling stops there.
    out = _spawn_rlimits_only(f"{SHM_SIZE}; {FILL.format(size='128M')}", 64 << 20, cwd=workdir, user=as_user,
                              nobody=nobody_env)
    blocks, block_size, files, wrote = (int(x) for x in out.split())
    assert (blocks * block_size, files, wrote) == (64 << 20, (64 << 20) // block_size, 64 << 20), out
