"""bulk-1g: 1 GiB of output through `sluice run`, whole process, against `codex sandbox`.

``sluice run -- head -c 1073741824 /dev/zero`` (the console script of a non-editable
install, see ``installed.py``, against a running, warmed-up daemon) with its stdout a
pipe into ``wc -c``, timed from starting both to both having exited; the peer is
``codex sandbox -- head -c 1073741824 /dev/zero`` the same way (workspace-write, see
``peers.py``). Each run must exit 0 and ``wc -c`` must count exactly 1 GiB, or the row
fails. The note gives the same pipe without any sandbox (``head | wc -c``: what the
counter allows). Alternating blocks, median of 10 (with --quick: 256 MiB, 4 runs).
Target: no slower than Codex (ratio <= 1.0x).
"""

from __future__ import annotations

import subprocess

from common import WORK_DIR, Daemon, GiB, MiB, Row, Stats, alternate, bench_main, fmt, log, peer_row, recording
from installed import sluice_cli
from peers import announce, codex

TARGET_RATIO = 1.0
TIMEOUT_S = 300


def counted(argv: list[str], env: dict[str, str] | None, size: int) -> None:
    """Run ``argv | wc -c``; raise unless both exit 0 and the count is ``size``."""
    producer = subprocess.Popen(argv, env=env, cwd=WORK_DIR, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    try:
        counter = subprocess.run(["wc", "-c"], stdin=producer.stdout, capture_output=True, text=True,
                                 timeout=TIMEOUT_S, check=False)
    finally:
        producer.stdout.close()
        try:
            producer.wait(TIMEOUT_S)
        except subprocess.TimeoutExpired:
            producer.kill()
            producer.wait()
    err = producer.stderr.read().decode(errors="replace")
    producer.stderr.close()
    count = counter.stdout.strip()
    if producer.returncode != 0 or counter.returncode != 0 or count != str(size):
        raise RuntimeError(f"`{argv[0].rsplit('/', 1)[-1]} ... head -c {size}` exited {producer.returncode}, "
                           f"wc -c counted {count or '?'} (expected {size}): {' '.join(err.split())[-200:]}")


def run(quick: bool) -> list[Row]:
    size = 256 * MiB if quick else GiB
    count = 4 if quick else 10
    head = ["head", "-c", str(size), "/dev/zero"]
    cli = sluice_cli()
    peer = codex()
    if peer.unavailable:
        announce(peer)
    with Daemon() as daemon:
        env = daemon.env()
        cases = {"bare": (head, None), "sluice": ([*cli.argv, "run", "--", *head], cli.env(env))}
        if not peer.unavailable:
            cases["codex"] = (peer.argv(head), peer.environ(env))
        failures: dict[str, list[str]] = {name: [] for name in cases}
        for name, (argv, e) in cases.items():  # warm-up, and a check of each way
            try:
                counted(argv, e, size)
            except RuntimeError as err:
                failures[name].append(str(err))
        timed = {name: recording(failures[name], lambda a=argv, e=e: counted(a, e, size))
                 for name, (argv, e) in cases.items() if not failures[name]}
        log(f"bulk: {count} x {size // MiB} MiB ({', '.join(timed)})")
        samples = alternate(timed, count, block=2)
    stats = {name: Stats.of(s, 1e6) for name, s in samples.items()}
    rate = {name: f"{size / (s.median / 1e3) / 1e6:,.0f} MB/s" for name, s in stats.items()}
    bare = stats.get("bare")
    note = (f"{size // MiB} MiB into wc -c, count checked; sluice run ({cli.kind}) {rate.get('sluice', '-')}, "
            f"codex {rate.get('codex', '-')}; no sandbox (head | wc -c) "
            f"{fmt(bare.median) if bare else '-'} ms, {rate.get('bare', '-')}")
    return [peer_row("bulk-1g", "ms", stats.get("sluice"), stats.get("codex"), peer="codex",
                     max_ratio=TARGET_RATIO, failures=failures["sluice"] + failures.get("codex", []),
                     skipped=peer.unavailable, note=note)]


if __name__ == "__main__":
    bench_main(run, __doc__)
