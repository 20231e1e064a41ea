"""cli-true: what a person pays for typing `sluice run -- true`, against Codex and srt.

Every way is a whole process, from fork to its exit (interpreter or runtime start-up,
sandbox set-up, the command, exit), started from this process in the checkout, stdin
/dev/null and output captured, in alternating blocks, median of 20 (10 with --quick).
Every run must exit 0, or its row fails.

- ``cli-true``: ``sluice run -- true`` against a running, warmed-up daemon; the
  ``sluice`` is the console script of a non-editable install (see ``installed.py``).
  Peer: ``codex sandbox -- true`` (workspace-write, see ``peers.py``). Target: ratio
  <= 0.5x.
- ``cli-true-srt``: the same ``sluice run -- true`` against Anthropic's ``srt true``
  (the command's directory writable, no network). No target.
- ``cli-import``: wall time of importing what ``sluice run`` loads before it connects
  (argparse, ``broker.cli.main`` and ``broker.cli.run`` with the client), against
  ``python -c pass`` (a bare interpreter start-up). No target.
  ``python -X importtime`` of one ``sluice run -- true`` says where its import time goes.
"""

from __future__ import annotations

import subprocess
import sys

from common import (
    WORK_DIR,
    Daemon,
    Row,
    Stats,
    alternate,
    bench_main,
    log,
    peer_row,
    ratio,
    warmed_runs,
)
from installed import sluice_cli
from peers import announce, codex, srt

TARGET_VS_CODEX = 0.5
# What `sluice run` imports before it connects (the parser's argparse, the command's module).
PEER_COMMANDS = {"codex": "codex sandbox -- true", "srt": "srt true"}
RUN_IMPORTS = "import argparse, broker.cli.main, broker.cli.run"


def import_profile(argv: list[str], env: dict[str, str], top: int = 4) -> str:
    """What ``python -X importtime`` says sluice's own code imports while ``argv`` runs.

    Counts the top-level entries from the first ``broker`` one on: our modules (their
    nested imports inside their cumulative time) and what they import lazily at run time.
    """
    proc = subprocess.run([sys.executable, "-X", "importtime", *argv], env=env, cwd=WORK_DIR,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return f"no import profile: python -X importtime {' '.join(argv)} exited {proc.returncode}"
    ours: list[tuple[int, str]] = []
    for line in proc.stderr.splitlines():
        # "import time: <self us> | <cumulative us> | <name>", nested names indented by 2 more.
        parts = line.removeprefix("import time:").split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        name = parts[2][1:]
        if name.startswith(" "):
            continue
        if ours or name == "broker" or name.startswith("broker."):
            ours.append((int(parts[1]), name))
    total = sum(us for us, _ in ours) / 1000
    largest = ", ".join(f"{name} {us / 1000:.1f}" for us, name in sorted(ours, reverse=True)[:top])
    return f"{total:.1f} ms of imports (largest, ms: {largest})"


def run(quick: bool) -> list[Row]:
    count = 10 if quick else 20
    cli = sluice_cli()
    peers = [codex(), srt()]
    for p in peers:
        if p.unavailable:
            announce(p)
    with Daemon() as daemon:
        env = daemon.env()
        cases = {
            "baseline": ([sys.executable, "-c", "pass"], env),
            "cli-import": ([sys.executable, "-c", RUN_IMPORTS], env),
            "sluice": ([*cli.argv, "run", "--", "true"], cli.env(env)),
        }
        for p in peers:
            if not p.unavailable:
                cases[p.name] = (p.argv(["true"]), p.environ(env))
        failures: dict[str, list[str]] = {name: [] for name in cases}
        timed = warmed_runs(cases, failures)
        log(f"cli: {count} x ({', '.join(timed)})")
        samples = alternate(timed, count, block=5)
        imports = import_profile(["-m", "broker", "run", "--", "true"], env)
    stats = {name: Stats.of(s, 1e6) for name, s in samples.items()}
    ours, base = stats.get("sluice"), stats.get("baseline")
    what = f"sluice run -- true ({cli.kind})"
    if ours and base:
        what += f"; python -c pass {base.median:.1f} ms"
    rows = []
    for p, row_id, max_ratio in ((peers[0], "cli-true", TARGET_VS_CODEX), (peers[1], "cli-true-srt", None)):
        rows.append(peer_row(row_id, "ms", ours, stats.get(p.name), peer=p.name, max_ratio=max_ratio,
                             failures=failures["sluice"] + failures.get(p.name, []), skipped=p.unavailable,
                             note=f"{what}; peer `{PEER_COMMANDS[p.name]}`"))
    imp = stats.get("cli-import")
    if imp and base:
        rows.append(Row("cli-import", imp.median, "ms", base.median, ratio(imp.median, base.median), None, None, imp,
                        f"`{RUN_IMPORTS}` costs {imp.median - base.median:.1f} ms over a bare start-up; "
                        f"sluice run -- true: {imports}"))
    return rows


if __name__ == "__main__":
    bench_main(run, __doc__)
