"""cli-true and cli-import: what a person pays for typing `sluice run -- true`.

``cli-true``: ``sluice run -- true`` end to end as a subprocess (interpreter start-up,
imports, connecting to an already running daemon, the sandboxed run, exit), median of 20
after warm-up. ``cli-import``: wall time of importing what ``sluice run`` loads before it
connects (argparse, ``broker.cli.main`` and ``broker.cli.run`` with the client), median of 20.
``python -X importtime`` of one ``sluice run -- true`` says where its import time goes.
Baseline of both: ``python -c pass`` (a bare interpreter start-up), in alternating blocks.
No targets.
"""

from __future__ import annotations

import os
import subprocess
import sys

from common import WORK_DIR, Daemon, Row, Stats, alternate, bench_main, log, ratio

# What `sluice run` imports before it connects (the parser's argparse, the command's module).
RUN_IMPORTS = "import argparse, broker.cli.main, broker.cli.run"


def sluice_argv() -> list[str]:
    """The installed console script next to this interpreter, else ``python -m broker``.

    (Not whatever ``sluice`` is first on PATH: a version manager's shim in front of it
    would add its own start-up.)
    """
    script = os.path.join(os.path.dirname(sys.executable), "sluice")
    return [script] if os.access(script, os.X_OK) else [sys.executable, "-m", "broker"]


def run_ok(argv: list[str], env: dict[str, str]) -> None:
    proc = subprocess.run(argv, env=env, cwd=WORK_DIR, stdin=subprocess.DEVNULL, capture_output=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv} exited {proc.returncode}: {proc.stderr.decode(errors='replace')[-300:]}")


def import_profile(argv: list[str], env: dict[str, str], top: int = 4) -> str:
    """What ``python -X importtime`` says sluice's own code imports while ``argv`` runs.

    Counts the top-level entries from the first ``broker`` one on: our modules (their
    nested imports inside their cumulative time) and what they import lazily at run time.
    """
    proc = subprocess.run([sys.executable, "-X", "importtime", *argv], env=env, cwd=WORK_DIR,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, check=True)
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
    count = 8 if quick else 20
    cases = {
        "baseline": [sys.executable, "-c", "pass"],
        "cli-import": [sys.executable, "-c", RUN_IMPORTS],
        "cli-true": [*sluice_argv(), "run", "--", "true"],
    }
    with Daemon() as daemon:
        env = daemon.env()
        for argv in cases.values():
            for _ in range(3):
                run_ok(argv, env)
        log(f"cli: {count} x (python -c pass, {RUN_IMPORTS}, sluice run -- true)")
        samples = alternate({name: lambda argv=argv: run_ok(argv, env) for name, argv in cases.items()},
                            count, block=5)
        imports = import_profile(["-m", "broker", "run", "--", "true"], env)
    base = Stats.of(samples["baseline"], 1e6)
    cli = Stats.of(samples["cli-true"], 1e6)
    imp = Stats.of(samples["cli-import"], 1e6)
    return [
        Row("cli-true", cli.median, "ms", base.median, ratio(cli.median, base.median), None, None, cli,
            f"`{' '.join(os.path.basename(a) for a in cases['cli-true'])}` against a running daemon, "
            f"baseline python -c pass; {imports}"),
        Row("cli-import", imp.median, "ms", base.median, ratio(imp.median, base.median), None, None, imp,
            f"`{RUN_IMPORTS}` costs {imp.median - base.median:.1f} ms over a bare start-up"),
    ]


if __name__ == "__main__":
    bench_main(run, __doc__)
