"""The warm-sandbox pool's zygote stays small: every sandbox is forked from it, three
processes each, and each fork copies the page tables of what is resident there (and each
exit tears them down), so what the executor has loaded when it makes its Spawner is paid
for by every command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Loaded only after the zygote's fork: each of them would grow what every sandbox copies
# (asyncio alone by about as much as the whole sandbox machinery), and threading registers
# an after-fork hook every sandbox process would run (about 0.4 ms each).
BIG = ("asyncio", "zmq", "structlog", "msgspec", "threading")

_PROBE = """
import json, sys
import executor.__main__ as m

def start_spawner(hidden, nice=None):
    print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
    raise SystemExit(0)

m.start_spawner = start_spawner
m.main(["--connect", "ipc:///nonexistent", "--token-file", "/nonexistent"])
"""


def test_the_executor_makes_its_spawner_before_loading_anything_big():
    with tempfile.TemporaryDirectory(prefix="slt-zyg-") as home:
        env = {**os.environ, "PYTHONPATH": ROOT, "SLUICE_HOME": home}
        proc = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=60)
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stdout.splitlines()[-1]))
    assert "executor" in loaded
    assert not loaded & set(BIG), f"loaded before the zygote is forked: {sorted(loaded & set(BIG))}"
