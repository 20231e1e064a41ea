"""sandbox-true: `sluice sandbox -- true` against bubblewrap with the same isolation.

Both are whole processes started from this process in the checkout (stdin /dev/null,
output captured), no daemon: ``sluice sandbox`` (the console script of a non-editable
install, see ``installed.py``; default policy, workspace-write) sets its sandbox up
in-process and runs ``true``; bubblewrap runs ``true`` with the flags of
``peers.bwrap_argv``: read-only root, the working directory writable, a private /tmp,
/proc and /dev, new user, PID, IPC, network and UTS namespaces, no capabilities,
``--die-with-parent``, ``--new-session``. bubblewrap does *not* apply Landlock or
seccomp, nor protect ``.git``, pin the directories, filter the environment or set
limits (``peers.bwrap_argv`` lists it all): sluice does more for its time.

Before timing, both are checked on a probe directory: a write inside the working
directory works, one outside it fails. Alternating blocks, median of 20 (10 with
--quick), every run must exit 0. Target: ratio <= 5x.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from common import WORK_DIR, Row, Stats, alternate, bench_main, log, peer_row, warmed_runs
from installed import sluice_cli
from peers import Peer, announce, bwrap, check

TARGET_RATIO = 5.0


def run(quick: bool) -> list[Row]:
    count = 10 if quick else 20
    cli = sluice_cli()
    peer = bwrap(WORK_DIR)
    if peer.unavailable:
        announce(peer)
    # No daemon: a runtime dir and a home of its own all the same (sluice sandbox hides both).
    scratch = tempfile.mkdtemp(prefix="slb-sbx-", dir="/tmp")
    try:
        env = cli.env({**os.environ, "SLUICE_RUNTIME_DIR": os.path.join(scratch, "run"),
                       "SLUICE_HOME": os.path.join(scratch, "home")})
        ours = check(Peer("sluice sandbox", [*cli.argv, "sandbox", "--"], env,
                          unset=("PYTHONPATH",) if cli.installed else ()))
        failures: dict[str, list[str]] = {"sluice": [], "bwrap": []}
        if ours.unavailable:
            failures["sluice"].append(ours.unavailable)
        cases = {"sluice": (ours.argv(["true"]), env)}
        if not peer.unavailable:
            cases["bwrap"] = (peer.argv(["true"]), peer.environ())
        timed = warmed_runs(cases, failures)
        log(f"sandbox-true: {count} x ({', '.join(timed)})")
        samples = alternate(timed, count, block=5)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    stats = {name: Stats.of(s, 1e6) for name, s in samples.items()}
    return [peer_row("sandbox-true", "ms", stats.get("sluice"), stats.get("bwrap"), peer="bwrap",
                     max_ratio=TARGET_RATIO, failures=failures["sluice"] + failures["bwrap"],
                     skipped=peer.unavailable,
                     note=f"sluice sandbox -- true ({cli.kind}) vs bwrap with the same namespaces and mounts "
                     "(no Landlock, no seccomp)")]


if __name__ == "__main__":
    bench_main(run, __doc__)
