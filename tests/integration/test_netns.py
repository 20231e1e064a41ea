"""Two hosts: network namespaces A and B joined by a veth pair.

The daemon runs in A (no executors of its own, listening on A's address), ``sluice
executor`` in B, frontends in A over ipc. Commands land in B, sandboxed. Then B's link
goes down under a running command: the frontend's call fails with a clear error within a
few heartbeats, and the executor, hearing nothing, kills the command's tree. With the
link back the executor rejoins and takes work again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from broker.client import Client
from broker.wire.liveness import DEAD_AFTER_HEARTBEATS, HEARTBEAT_S
from tests.support.harness import (
    DaemonHandle,
    daemons,
    short_tempdir,
    sluice_argv,
    subprocess_env,
    wait_for,
    wait_ready,
)
from tests.support.remote_helpers import (
    connect_args,
    kill_tree,
    listen_args,
    log_events,
    make_keys,
    marker,
    sleepers,
    start_executor,
)

PORT = 7700


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def _netns_unavailable() -> str | None:
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux only"
    if shutil.which("ip") is None:
        return "needs `ip` (iproute2)"
    if os.geteuid() != 0:
        return "needs root for `ip netns`"
    probe = f"sl-probe-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except (subprocess.CalledProcessError, OSError) as e:
        return f"`ip netns add` failed: {getattr(e, 'stderr', b'') or e}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


_why = _netns_unavailable()
pytestmark = pytest.mark.skipif(_why is not None, reason=_why or "")


class Hosts:
    """Namespaces ``a`` and ``b``, one veth between them (``a_if`` in a, ``b_if`` in b)."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.a, self.b = f"sl-a-{tag}", f"sl-b-{tag}"
        self.a_if, self.b_if = f"sla{tag}", f"slb{tag}"
        self.a_addr, self.b_addr = "10.231.0.1", "10.231.0.2"

    def up(self) -> None:
        _ip("netns", "add", self.a)
        _ip("netns", "add", self.b)
        _ip("link", "add", self.a_if, "type", "veth", "peer", "name", self.b_if)
        _ip("link", "set", self.a_if, "netns", self.a)
        _ip("link", "set", self.b_if, "netns", self.b)
        _ip("-n", self.a, "addr", "add", f"{self.a_addr}/24", "dev", self.a_if)
        _ip("-n", self.b, "addr", "add", f"{self.b_addr}/24", "dev", self.b_if)
        for ns, ifname in ((self.a, self.a_if), (self.b, self.b_if)):
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", ifname, "up")

    def link(self, state: str) -> None:
        """B's end of the link down or up: host B drops off the network, or comes back."""
        _ip("-n", self.b, "link", "set", self.b_if, state)

    def exec_in(self, ns: str) -> list[str]:
        return ["ip", "netns", "exec", ns]

    def down(self) -> None:
        for ns in (self.a, self.b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


@pytest.fixture
def hosts():
    h = Hosts()
    try:
        h.up()
        yield h
    finally:
        h.down()


def _start_daemon_in(factory, hosts: Hosts, keys, endpoint: str) -> DaemonHandle:
    """Like ``factory.start``, but the daemon process lives in namespace A."""
    path = short_tempdir()
    factory.dirs.append(path)
    from broker.net.runtime import RuntimeDir

    runtime = RuntimeDir(path)
    env = subprocess_env(runtime)
    log_path = os.path.join(path, "fixture.log")
    argv = [*hosts.exec_in(hosts.a), sys.executable, "-m", "broker", "daemon", "--executors", "0",
            *listen_args(keys, endpoint)]
    with open(log_path, "ab") as log:
        # `ip netns exec` execs the daemon: the pid is the daemon's.
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd="/",
                                start_new_session=True)
    handle = DaemonHandle(runtime, proc, env, log_path)
    factory.handles.append(handle)
    wait_ready(handle)
    return handle


@pytest.mark.timeout(90)
def test_remote_executor_in_another_namespace_fails_over_the_lost_link_and_rejoins(hosts):
    base = short_tempdir("sl-ns-")
    ex = None
    try:
        keys = make_keys(base)
        endpoint = f"tcp://{hosts.a_addr}:{PORT}"
        with daemons() as factory:
            daemon = _start_daemon_in(factory, hosts, keys, endpoint)
            env = subprocess_env(SLUICE_RUNTIME_DIR=os.path.join(base, "b-runtime"))
            ex_log = os.path.join(base, "executor.log")
            ex = start_executor(hosts.exec_in(hosts.b), [*connect_args(keys, endpoint, "worker"), "--name", "host-b"], env,
                                ex_log)
            frontend = [*hosts.exec_in(hosts.a), *sluice_argv()]

            # A command lands in B, sandboxed: writing outside the workspace fails there.
            client = Client.connect(daemon.runtime, autostart=False)
            started = []
            r = client.run(["sh", "-c", "echo hello from b; touch /etc/sluice-netns-probe; echo touch=$?"], cwd=base,
                           on_started=started.append, wait_timeout=30)
            client.close()
            assert started[0].executor == "host-b"
            assert r.stdout == b"hello from b\ntouch=1\n", r
            assert not os.path.exists("/etc/sluice-netns-probe")
            joined = [e for e in log_events(daemon.log(), "peer joined") if e["name"] == "host-b"]
            assert joined and joined[0]["key"] == keys.public("worker") and joined[0]["role"] == "executor"
            # The sluice command line in A, over ipc, reaches it too.
            r = subprocess.run([*frontend, "run", "--cwd", base, "--", "echo", "via ipc"], env=daemon.env,
                               capture_output=True, text=True, timeout=30)
            assert (r.returncode, r.stdout) == (0, "via ipc\n"), r.stderr

            # B drops off the network while a command runs there.
            mark = marker()
            run = subprocess.Popen([*frontend, "run", "--cwd", base, "--", "sleep", mark], env=daemon.env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            wait_for(lambda: sleepers(mark), 20, "the command to run in B")
            lost_at = time.monotonic()
            hosts.link("down")
            _, err = run.communicate(timeout=30)
            failed_after = time.monotonic() - lost_at
            given_up = DEAD_AFTER_HEARTBEATS * HEARTBEAT_S
            print(f"\nlink lost -> frontend error {failed_after:.2f} s")
            assert run.returncode == 125
            line = err.strip()
            assert line == (f"sluice: error: executor host-b stopped responding (no heartbeat for {given_up:g} s) "
                            "while running this command; the command was not re-run"), err
            assert failed_after < given_up + 5
            # The executor outwaits a stalled daemon (broker.wire.liveness), so its command
            # still runs; back on the network, the daemon tells it it was given up, and it
            # kills the command's tree (never re-run), joins again and takes new work.
            assert sleepers(mark)
            hosts.link("up")
            back_at = time.monotonic()
            wait_for(lambda: not sleepers(mark), 20, "the executor to kill the command's tree")
            print(f"link back -> remote tree killed {time.monotonic() - back_at:.2f} s")
            r = subprocess.run([*frontend, "run", "--cwd", base, "--", "echo", "back"], env=daemon.env,
                               capture_output=True, text=True, timeout=30)
            rejoined_after = time.monotonic() - back_at
            print(f"link back -> rejoined and ran a command {rejoined_after:.2f} s")
            assert (r.returncode, r.stdout) == (0, "back\n"), r.stderr
            assert len([e for e in log_events(daemon.log(), "peer joined") if e["name"] == "host-b"]) == 2
            with open(ex_log, encoding="utf-8") as f:
                rejoins = log_events(f.read(), "lost the broker; cancelling its commands and joining again")
            assert rejoins and rejoins[0]["cancelled"] == 1
            assert ex.poll() is None
    finally:
        if ex is not None:
            kill_tree(ex)
        shutil.rmtree(base, ignore_errors=True)
