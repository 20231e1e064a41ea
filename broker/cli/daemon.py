"""``sluice daemon``: run the daemon in the foreground, or start, stop or ask after it."""

from __future__ import annotations

import broker.client as C
from broker.cli.base import fail
from broker.cli.keys import listen_argv, listen_from_args
from broker.daemon.listener import ListenError
from broker.daemon.server import DaemonAlreadyRunning, serve
from broker.net.runtime import RuntimeDir, RuntimeDirError
from broker.wire.results import EXIT_NOT_RUNNING


def daemon_main(args) -> int:
    runtime = RuntimeDir.default()
    listen = listen_from_args(args) if args.action in (None, "start") else None
    if args.action is None:
        try:
            return serve(runtime, executors=args.executors, log_json=True if args.log_json else None, listen=listen,
                         suspend_limit_s=args.suspend_limit)
        except DaemonAlreadyRunning as e:
            return fail(str(e) or f"a daemon is already running in {runtime.path}", 1)
        except (RuntimeDirError, ListenError) as e:
            return fail(str(e), 1)

    if args.action == "status":
        try:
            status = C.daemon_status(runtime)
        except C.DaemonError as e:
            return fail(str(e), 1)
        print(f"sluice: {status.describe()}", flush=True)
        return 0 if status.running else EXIT_NOT_RUNNING

    if args.action == "stop":
        try:
            pid = C.stop_daemon(runtime)
        except C.DaemonError as e:
            return fail(str(e), 1)
        print(f"sluice: daemon stopped (pid {pid})" if pid else f"sluice: daemon not running (runtime dir {runtime.path})", flush=True)
        return 0

    # start
    try:
        status = C.daemon_status(runtime)
    except C.DaemonError as e:
        return fail(str(e), 1)
    if status.running:
        print(f"sluice: {status.describe()}", flush=True)
        return 0
    extra = []
    if args.executors is not None:
        extra += ["--executors", str(args.executors)]
    if args.log_json:
        extra.append("--log-json")
    if args.suspend_limit is not None:
        extra += ["--suspend-limit", f"{args.suspend_limit:g}"]
    extra += listen_argv(args)
    try:
        pid = C.start_daemon(runtime, args=extra)
    except C.DaemonError as e:
        return fail(str(e), 1)
    print(f"sluice: daemon started (pid {pid}, socket {runtime.socket_path})", flush=True)
    return 0
