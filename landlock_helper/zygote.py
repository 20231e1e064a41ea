"""The zygote: a small process that forks warm sandboxes for one caller (an executor).

:class:`landlock_helper.spawn.Spawner` forks it early, before the caller loads anything
big (forking a small process is several times cheaper), and asks it for sandboxes on a
SEQPACKET socket: ``W`` for one without network, ``N`` for one in the host's network
namespace. It answers each in order, ``S <supervisor pid>`` with the sandbox's control
socket (and, with cgroups, its report pipe), or ``F <message>`` when the system refused
the fork; it exits when the caller goes away. Only :func:`start` runs in the caller.
"""

from __future__ import annotations

import gc
import os
import select
import signal
import socket
import time
from typing import TYPE_CHECKING

from landlock_helper import _libc
from landlock_helper.outcome import SandboxError
from landlock_helper.sandbox_tree import (CGROUP_REMOVE_S, child_main, close_fds_except, die_with_parent,
                                          fork_with_socket, start_supervisor)

if TYPE_CHECKING:
    from landlock_helper.spawn import _Template


def start(template: _Template) -> tuple[int, socket.socket]:
    """Fork the zygote of ``template``'s sandboxes: its pid and our end of its socket."""
    parent = os.getpid()
    pid, mine, theirs = fork_with_socket()
    if pid == 0:
        mine.close()
        child_main(_zygote, None, template, parent, theirs)
    theirs.close()
    return pid, mine


# --- everything below runs in the zygote ---------------------------------------------


def _zygote(template: _Template, parent: int, sock: socket.socket) -> None:
    """Make a warm sandbox for every ``W`` (``N``: with the host's network) received;
    exit when the caller goes away."""
    die_with_parent(parent)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a caller gone is an EOF or EPIPE here
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    close_fds_except({sock.fileno(), wake_r, wake_w})
    # What every sandbox's fork copies and every exit of one of its processes frees is
    # what is resident here: so not the freed memory of the caller's start-up (its reads
    # of source and bytecode, a sixth of the rest); and no garbage collection in a sandbox
    # process walks (and so copies) the objects that were here before it.
    gc.freeze()
    _libc.trim_heap()
    # Reap supervisors as soon as they exit: SIGCHLD wakes the poll through the pipe.
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    sock.setblocking(True)
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        _reap_children()
        for fd, _ in poller.poll():
            if fd == wake_r:
                try:
                    while os.read(wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
                continue
            try:
                msg = sock.recv(64)
            except InterruptedError:
                continue
            except OSError:
                msg = b""
            if msg and not _hand_out(template if msg != b"N" else template._replace(netns=False), sock):
                msg = b""  # the caller is gone
            if not msg:
                if template.cgroups:
                    # Dying now would kill the supervisors (pdeathsig) before they remove
                    # their sandboxes' cgroups: let them finish first.
                    _reap_children(CGROUP_REMOVE_S)
                os._exit(0)


def _hand_out(template: _Template, sock: socket.socket) -> bool:
    """Fork one sandbox and send it to the caller (``F`` if the fork was refused: out of
    processes or memory, the caller decides); False if the caller is gone."""
    try:
        pid, ctl, reported = start_supervisor(template)
    except SandboxError as e:
        try:
            sock.send(f"F {e}".encode())
        except OSError:
            return False
        return True
    try:
        socket.send_fds(sock, [f"S {pid}".encode()], [ctl.fileno()] + ([reported] if reported is not None else []))
    except OSError:
        return False  # this sandbox ends as its ctl closes
    finally:
        # Our copies (we reap our supervisors ourselves).
        ctl.close()
        if reported is not None:
            os.close(reported)
    return True


def _reap_children(timeout: float = 0.0) -> None:
    """Reap the children that have exited; with ``timeout``, until there are none left
    or ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.005)
