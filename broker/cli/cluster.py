"""``sluice ray up|status|down``: sluice on the Ray cluster this machine is part of
(:mod:`broker.ray`, the ``ray`` extra; the frontend commands' ``--ray`` is in :mod:`.base`).

Ray is imported only here, once one of these is asked for: the rest of ``sluice`` never
pays for it, and without the extra each says so in one line.
"""

from __future__ import annotations

import json
from dataclasses import asdict

from broker.cli.base import NO_RAY, CliExit, fail, print_error, whole_number
from broker.wire.results import EXIT_NOT_RUNNING, EXIT_SLUICE, EXIT_USAGE


def add_ray_args(parser) -> None:
    actions = parser.add_subparsers(dest="ray_action", metavar="{up,status,down}", required=True)
    up = actions.add_parser("up", help="start the daemon and an executor on every node",
                            description="Start sluice's daemon (on this node, or --node) and one executor per "
                                        "alive node of the Ray cluster, each a Ray actor; keys are made and handed "
                                        "out through Ray. On a cluster where sluice is up, restart its daemon if "
                                        "it died.")
    down = actions.add_parser("down", help="revoke the keys, stop the executors and the daemon")
    status = actions.add_parser("status", help="executors by node: slots, busy, queued, lost; the autoscaler request")
    status.add_argument("--json", action="store_true", help="one JSON object")
    for p in (up, down, status):
        p.add_argument("--address", metavar="ADDRESS", default=None,
                       help="the Ray cluster (host:port of its head; default: Ray's auto, this machine's cluster)")
    up.add_argument("--node", metavar="NODE", default=None,
                    help="the node for the daemon: a Ray node id or a node's IP address (default: this one)")
    up.add_argument("--slots-per-cpu", metavar="N", type=whole_number(1), default=2,
                    help="commands each executor runs at once per CPU of its node (default: 2)")
    up.add_argument("--min-executors", metavar="N", type=whole_number(1), default=1,
                    help="wait until this many executors joined (default: 1)")
    up.add_argument("--max-executors", metavar="N", type=whole_number(1), default=None,
                    help="place executors on at most N nodes (default: every node)")
    up.add_argument("--scale-after", metavar="SECONDS", type=_seconds, default=10.0,
                    help="ask the autoscaler for CPUs once commands waited this long for a slot (default: 10)")
    up.add_argument("--release-after", metavar="SECONDS", type=_seconds, default=60.0,
                    help="withdraw that request once nothing ran or waited this long (default: 60)")
    up.add_argument("--max-cpus", metavar="N", type=whole_number(1), default=None,
                    help="never ask the autoscaler for more CPUs in all than this")


def _seconds(text: str) -> float:
    import argparse

    try:
        n = float(text)
    except ValueError:
        n = -1.0
    if not n > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {text!r}")
    return n


def _ray():
    try:
        import broker.ray
        import broker.ray.cluster  # noqa: F401 - imports Ray itself: fails here without the extra
    except ImportError:
        raise CliExit(fail(NO_RAY, EXIT_USAGE)) from None
    return broker.ray


def ray_main(args) -> int:
    # A mistake in the flags is said as such, with or without the extra.
    if args.ray_action == "up" and args.max_executors is not None and args.min_executors > args.max_executors:
        return fail("--min-executors is more than --max-executors", EXIT_USAGE)
    ray = _ray()
    try:
        if args.ray_action == "up":
            settings = ray.Settings(slots_per_cpu=args.slots_per_cpu, max_executors=args.max_executors,
                                    scale_after_s=args.scale_after, release_after_s=args.release_after,
                                    max_cpus=args.max_cpus)
            current = ray.up(args.address, node=args.node, settings=settings, min_executors=args.min_executors)
            if current["settings"] != asdict(settings):
                print_error("note: sluice is up already on this cluster, with the settings it was started with "
                            "(kept); `sluice ray down` first to change them")
            print(describe(current), flush=True)
            return 0
        if args.ray_action == "status":
            try:
                current = ray.status(args.address)
            except ray.RayError as e:
                fail(str(e), EXIT_NOT_RUNNING)
                return EXIT_NOT_RUNNING
            print(json.dumps(current) if args.json else describe(current), flush=True)
            return 0 if current["daemon"]["running"] else EXIT_NOT_RUNNING
        if not ray.down(args.address):
            print("sluice was not up on this Ray cluster", flush=True)
            return 0
        print("sluice is down: keys revoked, executors and daemon stopped", flush=True)
        return 0
    except ray.RayError as e:
        return fail(str(e), EXIT_SLUICE)


def describe(status: dict) -> str:
    """``sluice ray status`` for a person: the daemon, then one line per node."""
    daemon = status["daemon"]
    head = (f"daemon at {status['endpoint']} on node {status['ip']} (pid {daemon['pid']})" if daemon["running"]
            else f"daemon NOT running: {daemon['exit'] or 'stopped'}")
    lines = [head, f"queued: {status['queued']}"]
    for node in status["nodes"]:
        lines.append(f"  {node['executor']:<32} {node['state']:<9} slots {node['slots']:>4}  busy {node['busy']:>4}"
                     f"  ({node['cpus']} CPU, node {node['node_id'][:12]})")
    for lost in status["lost"]:
        lines.append(f"  {lost['executor']:<32} lost      (node {lost['node_id'][:12]} left the cluster)")
    scaling = status["scaling"]
    if scaling:
        asked = f"{scaling['cpus']} CPU(s) in all" if scaling["cpus"] else "nothing (request withdrawn)"
        lines.append(f"autoscaler: asked for {asked}: {scaling['why']}")
    else:
        lines.append("autoscaler: nothing asked")
    return "\n".join(lines)
