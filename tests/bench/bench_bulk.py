"""bulk-1g: 1 GiB of output through `sluice run`, whole process, against `codex sandbox`;
bulk-1g-null and bulk-1g-file: the same output redirected to /dev/null and to a file.

``sluice run -- head -c 1073741824 /dev/zero`` (the console script of a non-editable
install, see ``installed.py``, against a running, warmed-up daemon) with its stdout a
pipe into ``wc -c``, timed from starting both to both having exited; the peer is
``codex sandbox -- head -c 1073741824 /dev/zero`` the same way (workspace-write, see
``peers.py``). Each run must exit 0 and ``wc -c`` must count exactly 1 GiB, or the row
fails. The note gives the same pipe without any sandbox (``head | wc -c``: what the
counter allows). Target: no slower than Codex (ratio <= 1.0x).

The redirected rows time the same command with its stdout /dev/null (``> /dev/null``)
and a file under the checkout (``> file``, which must hold exactly 1 GiB after each
run), bare, through ``sluice run`` and through Codex. ``sluice run`` gives the command
the sandbox's own /dev/null for ours, and splices its pipe into the file (see
landlock_helper/relay.py). Target: no slower than Codex, as bulk-1g; the note gives bare
and bulk-1g's sluice figure (the same output into a pipe: a file on a slow disk is
slower than a pipe for everyone, bare included).

Alternating blocks, median of 10 (6 for the file: each writes 1 GiB to disk; with
--quick: 256 MiB, 4 runs).
"""

from __future__ import annotations

import os
import subprocess
import tempfile

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


def redirected(argv: list[str], env: dict[str, str] | None, size: int, target: str) -> None:
    """Run ``argv > target``; raise unless it exits 0 (and a file then holds ``size`` bytes)."""
    with open(target, "wb") as out:
        producer = subprocess.run(argv, env=env, cwd=WORK_DIR, stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=subprocess.PIPE, timeout=TIMEOUT_S, check=False)
    got = os.path.getsize(target) if target != os.devnull else size
    if producer.returncode != 0 or got != size:
        err = producer.stderr.decode(errors="replace")
        raise RuntimeError(f"`{argv[0].rsplit('/', 1)[-1]} ... head -c {size} > {target}` exited "
                           f"{producer.returncode}, wrote {got} (expected {size}): {' '.join(err.split())[-200:]}")


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
        redirects = {}
        for row_id, target, n in (("bulk-1g-null", os.devnull, count), ("bulk-1g-file", None, 4 if quick else 6)):
            with tempfile.TemporaryDirectory(dir=WORK_DIR, prefix=".bench-bulk-") as tmp:
                target = target or os.path.join(tmp, "out")
                redirects[row_id] = _redirected_samples(cases, size, target, n)
    stats = {name: Stats.of(s, 1e6) for name, s in samples.items()}
    rate = {name: f"{size / (s.median / 1e3) / 1e6:,.0f} MB/s" for name, s in stats.items()}
    bare = stats.get("bare")
    note = (f"{size // MiB} MiB into wc -c, count checked; sluice run ({cli.kind}) {rate.get('sluice', '-')}, "
            f"codex {rate.get('codex', '-')}; no sandbox (head | wc -c) "
            f"{fmt(bare.median) if bare else '-'} ms, {rate.get('bare', '-')}")
    rows = [peer_row("bulk-1g", "ms", stats.get("sluice"), stats.get("codex"), peer="codex",
                     max_ratio=TARGET_RATIO, failures=failures["sluice"] + failures.get("codex", []),
                     skipped=peer.unavailable, note=note)]
    for row_id, (r_samples, r_failures) in redirects.items():
        r_stats = {name: Stats.of(s, 1e6) for name, s in r_samples.items() if s}
        where = "/dev/null" if row_id.endswith("null") else "a file"
        pipe = stats.get("sluice")
        r_note = (f"{size // MiB} MiB > {where}; bare {fmt(r_stats['bare'].median) if 'bare' in r_stats else '-'} ms; "
                  f"sluice run into a pipe (bulk-1g) {fmt(pipe.median) if pipe else '-'} ms")
        rows.append(peer_row(row_id, "ms", r_stats.get("sluice"), r_stats.get("codex"), peer="codex",
                             max_ratio=TARGET_RATIO, failures=r_failures["sluice"] + r_failures.get("codex", []),
                             skipped=peer.unavailable, note=r_note))
    return rows


def _redirected_samples(cases: dict, size: int, target: str, count: int):
    """Each of ``cases`` (bare, sluice, codex) timed ``count`` times with its stdout ``target``."""
    failures: dict[str, list[str]] = {name: [] for name in cases}
    timed = {}
    for name, (argv, env) in cases.items():
        try:
            redirected(argv, env, size, target)  # warm-up, and a check of each way
        except RuntimeError as err:
            failures[name].append(str(err))
            continue
        timed[name] = recording(failures[name], lambda a=argv, e=env: redirected(a, e, size, target))
    log(f"bulk: {count} x {size // MiB} MiB > {target} ({', '.join(timed)})")
    return alternate(timed, count, block=2), failures


if __name__ == "__main__":
    bench_main(run, __doc__)
