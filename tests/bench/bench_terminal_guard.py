"""Throughput of the terminal guard (broker.cli.terminal_guard) on its own, in MB/s.

    python tests/bench/bench_terminal_guard.py [--mb 100] [--slow-mb 10] [--chunk 65536]

Each input is made once (about ``--mb`` MB), cut into chunks of ``--chunk`` bytes (as a
relay reads them) and fed through one guard; the figure is the best of three passes.
Inputs: plain ASCII text; UTF-8 text (mixed scripts); ``ls --color``-like and
``git diff --color``-like output (an SGR every few bytes); a full-screen program's
redraws (cursor moves, erases, private modes); and adversarial ones: every sequence a
query or clipboard write, ESC bytes alone, endless unterminated strings, an over-long
CSI, random bytes, and all of it fed one byte at a time (the slowest a command can make
its output, costing a syscall per byte on its side). The inputs that cost Python code
per sequence or per byte (queries, random bytes) are ``--slow-mb`` MB.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from broker.cli.terminal_guard import TerminalGuard  # noqa: E402


def _repeat(unit: bytes, size: int) -> bytes:
    return unit * (size // len(unit) + 1)


def inputs(size: int) -> dict[str, bytes]:
    rng = random.Random(1)
    words = [b"main", b"src", b"README.md", b"build", b"tests", b"setup.py", b"node_modules", b"a.out"]
    ls = b"".join(b"\x1b[01;34m" + rng.choice(words) + b"\x1b[0m  " + rng.choice(words) + b"  \x1b[01;32m"
                  + rng.choice(words) + b"\x1b[0m\n" for _ in range(2000))
    diff = (b"\x1b[1mdiff --git a/x.py b/x.py\x1b[m\n\x1b[36m@@ -1,4 +1,4 @@\x1b[m\n"
            b" def f(x):\n\x1b[31m-    return x + 1\x1b[m\n\x1b[32m+    return x + 2\x1b[m\n     pass\n")
    screen = b"".join(b"\x1b[%d;1H\x1b[K\x1b[7m %5d root  20   0 %7d S  0.0  python3 \x1b[m" % (i % 40 + 1, i, i * 7)
                      for i in range(500)) + b"\x1b[?25l\x1b[?1049h\x1b[H\x1b[2J\x1b[?25h"
    text = b"The quick brown fox jumps over the lazy dog. 0123456789\n"
    utf8 = "Grüße, 世界! Привет, мир. Ελληνικά. こんにちは ✓ ✜ 本\n".encode()
    return {
        "plain ASCII text": _repeat(text, size),
        "UTF-8 text (mixed scripts)": _repeat(utf8, size),
        "ls --color": _repeat(ls, size),
        "git diff --color": _repeat(diff, size),
        "full-screen redraws": _repeat(screen, size),
        "adversarial: queries, OSC 52": _repeat(b"\x1b[c\x1b[6n\x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07\x9b6n"
                                                b"\xc2\x9d0;t\x07x", size),
        "adversarial: ESC bytes alone": _repeat(b"\x1b", size),
        "adversarial: unterminated OSC": b"\x1b]52;c;" + _repeat(b"QUFB", size),
        "adversarial: over-long CSI": b"\x1b[" + _repeat(b"1;", size),
        "adversarial: random bytes": rng.randbytes(size),
    }


SLOW = ("adversarial: queries, OSC 52", "adversarial: random bytes")


def throughput(data: bytes, chunk: int) -> float:
    pieces = [data[i:i + chunk] for i in range(0, len(data), chunk)]
    best = float("inf")
    for _ in range(3):
        guard = TerminalGuard()
        start = time.process_time()
        for piece in pieces:
            guard.feed(piece)
        guard.flush()
        best = min(best, time.process_time() - start)
    return len(data) / best / 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--slow-mb", type=int, default=10)
    parser.add_argument("--chunk", type=int, default=65536)
    args = parser.parse_args()
    size = args.mb * 1_000_000
    print(f"terminal guard, {args.mb} MB per input ({args.slow_mb} MB for those marked *), "
          f"{args.chunk}-byte chunks, best of 3, CPU time")
    slow = inputs(args.slow_mb * 1_000_000)
    for name, data in inputs(size).items():
        if name in SLOW:
            data, name = slow[name], name + " *"
        print(f"  {name:36s} {throughput(data, args.chunk):9.0f} MB/s")
    sample = inputs(1_000_000)
    for name in ("git diff --color", "adversarial: queries, OSC 52"):
        print(f"  {name + ', 1-byte chunks':36s} {throughput(sample[name], 1):9.1f} MB/s")


if __name__ == "__main__":
    main()
