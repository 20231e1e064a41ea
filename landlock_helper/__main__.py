"""``python -m landlock_helper [policy flags] -- CMD ARGS...``: run one command sandboxed.

Also reachable as ``sluice sandbox``. No daemon is involved: the policy is applied here
and the command runs in its own sandbox, which this process supervises itself
(``spawn(one_shot=True)``, when run as a program); we wait for it, pass SIGINT,
SIGTERM and SIGHUP on to its whole tree, and exit with its status (128+N when a signal
killed it, 127 when it could not be found). The command gets pipes of ours in place of
our stdin, stdout and stderr (:mod:`landlock_helper.relay`), never our descriptors.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import TYPE_CHECKING

from landlock_helper.env import filter_env
from landlock_helper.policy import MODES, PolicyError, SandboxPolicy
from landlock_helper.relay import Relay
from landlock_helper.spawn import SandboxError, spawn

if TYPE_CHECKING:  # argparse is loaded only to parse: `sluice sandbox` reads its flags without it
    import argparse


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """The policy flags shared by ``sluice sandbox`` and ``sluice run``."""
    parser.add_argument("--sandbox", default="workspace-write", metavar="MODE",
                        help=f"one of {', '.join(MODES)} (default: workspace-write)")
    parser.add_argument("--writable", action="append", default=[], metavar="PATH",
                        help="an extra writable root (repeatable)")
    parser.add_argument("--readable", action="append", default=[], metavar="PATH",
                        help="a directory shown read-only at its own path, where the host's /tmp is not (repeatable)")
    parser.add_argument("--network", action="store_true", help="allow network access")
    parser.add_argument("--cwd", default=None, metavar="DIR", help="working directory (default: current)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME",
                        help="pass this secret-looking variable through anyway (repeatable)")


def policy_from_args(args: argparse.Namespace) -> tuple[SandboxPolicy, str]:
    """Validate the policy flags; raises PolicyError with a message for a person."""
    cwd = os.path.abspath(args.cwd) if args.cwd else os.getcwd()
    if not os.path.isdir(cwd):
        raise PolicyError(f"--cwd {args.cwd}: no such directory")
    roots = []
    for path in args.writable:
        full = os.path.abspath(path)
        if not os.path.isdir(full):
            raise PolicyError(f"--writable {path}: no such directory")
        roots.append(full)
    return SandboxPolicy.from_mode(args.sandbox, writable_roots=roots, network=args.network), cwd


def build_parser(prog: str = "python -m landlock_helper") -> argparse.ArgumentParser:
    import argparse

    parser = argparse.ArgumentParser(prog=prog, description="Run one command under a sandbox policy.")
    add_policy_arguments(parser)
    parser.add_argument("--hide", action="append", default=[], metavar="PATH",
                        help="make this path empty and unreadable inside the sandbox (repeatable)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m landlock_helper") -> int:
    """Run the command line ``argv``; without it, this is the program itself, on its own
    command line, which then supervises the sandbox itself (its namespaces change for good)."""
    one_shot = argv is None
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given; usage: ... -- CMD ARGS...")
    relay = Relay()
    try:
        policy, cwd = policy_from_args(args)
        proc = spawn(command, cwd=cwd, env=filter_env(os.environ, args.env), policy=policy,
                     stdin=relay.input(0), stdout=relay.output(1), stderr=relay.output(2),
                     hidden_paths=args.hide, one_shot=one_shot,
                     readable=[os.path.abspath(p) for p in args.readable])
    except (PolicyError, SandboxError, OSError) as e:
        relay.close()
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    relay.handed_over()

    def forward(signum, _frame):
        proc.terminate()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    done = proc.done_fds
    while proc.poll() is None:
        relay.step(done, None if done else 0.1)
    relay.drain()
    outcome = proc.wait()
    proc.close()
    relay.close()
    if relay.error:
        print(f"{prog}: {relay.error}", file=sys.stderr)
    for note in outcome.notes:
        print(note, file=sys.stderr)
    if outcome.error:
        print(f"{prog}: {outcome.error}", file=sys.stderr)
    if outcome.signal is not None:
        return 128 + outcome.signal
    return outcome.exit_code if outcome.exit_code is not None else 1


if __name__ == "__main__":
    sys.exit(main())
