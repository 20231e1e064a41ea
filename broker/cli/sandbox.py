"""``sluice sandbox``: a command in the sandbox, here and now, without the daemon."""

from __future__ import annotations

import os

from broker.cli.base import USAGE_SANDBOX, command_of, env_report, fail, print_error
from broker.net.keys import default_keys_dir
from broker.net.runtime import RuntimeDir, ensure_sluice_home, hidden_paths
from broker.wire.results import EXIT_USAGE
from landlock_helper.__main__ import main as helper_main
from landlock_helper.policy import MODES


def sandbox_main(args) -> int:
    command = command_of(args, USAGE_SANDBOX)
    if args.sandbox not in MODES:
        return fail(f"unknown sandbox mode {args.sandbox!r}; expected one of {', '.join(MODES)}", EXIT_USAGE)
    cwd = os.path.abspath(args.cwd) if args.cwd is not None else None
    if cwd is not None and not os.path.isdir(cwd):
        what = "is not a directory" if os.path.exists(cwd) else "does not exist"
        return fail(f"working directory {cwd} {what}", EXIT_USAGE)
    for path in args.writable:
        if not os.path.isabs(path):
            return fail(f"writable path must be absolute: {path!r}", EXIT_USAGE)
        if not os.path.exists(path):
            return fail(f"writable path does not exist: {path}", EXIT_USAGE)
    helper_argv = ["--sandbox", args.sandbox]
    for path in args.writable:
        helper_argv += ["--writable", path]
    if args.network:
        helper_argv.append("--network")
    if cwd is not None:
        helper_argv += ["--cwd", cwd]
    for name in args.env:
        helper_argv += ["--env", name]
    if args.env_report:
        env_report(args.env)
    # A daemon may be running for this user: its socket and token stay out of reach, and
    # so does sluice's home (config, sessions, CurveZMQ keys), made first if missing so
    # that it can be hidden (and the command cannot make one of its own).
    problem = ensure_sluice_home()
    if problem:
        print_error(f"warning: {problem}")
    for path in hidden_paths(RuntimeDir.default().path, default_keys_dir()):
        helper_argv += ["--hide", path]
    helper_argv += ["--", *command]
    return helper_main(helper_argv, prog="sluice")
