"""bridge-line: how long ``sluice bridge`` takes to read and answer one long input line.

``bridge-line-40m``: a running ``sluice bridge`` (no session yet) is sent one submission
of 40 MiB on its stdin; the figure is the time from the first byte written to its answer
on stdout (Codex's "no session" error for that id): reading the line, decoding its JSON,
writing the event. Median of 3 (quick: 10 MiB, median of 2).

``line-reader-40m``: :class:`broker.cli.session_loop.LineReader` alone reading such a line from
a pipe in this process; its baseline is the reader as it was before, which appended every
read to one growing buffer (copying the line once per 64 KiB read: quadratic).
No targets.
"""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time

from common import Daemon, MiB, Row, Stats, bench_main, log, ratio

from broker.cli.session_loop import MAX_LINE, LineReader
from tests.support.harness import sluice_argv


def big_line(size: int, sub_id: str = "big") -> bytes:
    head = b'{"id":"' + sub_id.encode() + b'","op":{"type":"user_input","items":[{"type":"text","text":"'
    tail = b'"}]}}\n'
    return head + b"x" * (size - len(head) - len(tail)) + tail


class QuadraticLineReader:
    """LineReader.fill as it was: every read appended to the buffer of the line so far."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.lines: list[tuple[int, bytes]] = []
        self.eof = False
        self._buffer = b""

    def fill(self) -> None:
        data = os.read(self.fd, 65536)
        if not data:
            self.eof = True
            if self._buffer:
                self.lines.append((len(self.lines) + 1, self._buffer))
            return
        *complete, self._buffer = (self._buffer + data).split(b"\n")
        self.lines.extend((len(self.lines) + 1 + i, line) for i, line in enumerate(complete))
        if len(self._buffer) > MAX_LINE:
            self._buffer = b""


def time_reader(make, line: bytes) -> int:
    """ns for a reader made by ``make(fd)`` to read ``line`` whole from a pipe."""
    r, w = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(w, line), os.close(w)))
    t0 = time.perf_counter_ns()
    writer.start()
    try:
        reader = make(r)
        while not reader.eof:
            reader.fill()
        elapsed = time.perf_counter_ns() - t0
        assert len(reader.lines[0][1]) == len(line) - 1, "the line was not read whole"
        return elapsed
    finally:
        writer.join()
        os.close(r)


def read_until(fd: int, needle: bytes, timeout: float = 120.0) -> bytes:
    out = b""
    deadline = time.monotonic() + timeout
    while needle not in out:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise RuntimeError(f"no {needle!r} from the bridge within {timeout:g} s; got {out[-300:]!r}")
        chunk = os.read(fd, 65536)
        if not chunk:
            raise RuntimeError(f"the bridge ended its output before {needle!r}; got {out[-300:]!r}")
        out += chunk
    return out


def time_bridge(env: dict[str, str], line: bytes) -> int:
    """ns from writing ``line`` to a ready bridge until its answer is read."""
    proc = subprocess.Popen([*sluice_argv(), "bridge"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    try:
        # Up and connected once it answers a bad line.
        proc.stdin.write(b"{}\n")
        proc.stdin.flush()
        read_until(proc.stdout.fileno(), b'"line 1: ')
        t0 = time.perf_counter_ns()
        writer = threading.Thread(target=lambda: (proc.stdin.write(line), proc.stdin.flush()))
        writer.start()
        read_until(proc.stdout.fileno(), b'{"id":"big","msg":{"type":"error"')
        elapsed = time.perf_counter_ns() - t0
        writer.join()
        proc.stdin.close()
        if proc.wait(30) != 0:
            raise RuntimeError(f"the bridge exited {proc.returncode}")
        return elapsed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        if not proc.stdin.closed:
            proc.stdin.close()


def run(quick: bool) -> list[Row]:
    size = (10 if quick else 40) * MiB
    count = 2 if quick else 3
    name = f"{size // MiB}m"
    line = big_line(size)
    log(f"line reader: {count} x {size // MiB} MiB, and once the way it was (quadratic)")
    linear = Stats.of([time_reader(LineReader, line) for _ in range(count)], 1e6)
    quadratic = Stats.of([time_reader(QuadraticLineReader, line)], 1e6)
    with Daemon(executors=1) as daemon:
        env = daemon.env()
        log(f"sluice bridge: {count} x one line of {size // MiB} MiB")
        bridge = Stats.of([time_bridge(env, line) for _ in range(count)], 1e6)
    return [
        Row(f"bridge-line-{name}", bridge.median, "ms", None, None, None, None, bridge,
            f"sluice bridge: one {size // MiB} MiB submission written until its answer is read"),
        Row(f"line-reader-{name}", linear.median, "ms", quadratic.median, ratio(linear.median, quadratic.median),
            None, None, linear, f"LineReader alone from a pipe; baseline the growing-buffer reader it replaced "
                                f"({quadratic.median / 1000:.1f} s)"),
    ]


if __name__ == "__main__":
    bench_main(run, __doc__)
