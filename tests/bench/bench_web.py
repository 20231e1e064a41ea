"""``sluice web``: opening a long session, and what browser tabs cost the daemon.

A real daemon and agent process, a scripted model on loopback whose answers stream text
deltas (one ``agent_message_delta`` event each, as in bench_fanout), ``sluice web`` as a
process, and Debian's chromium driven by Playwright (``pip install '.[browser]'``).

- ``web-open-100k``: a finished session of 100,000 events and a few; the time from
  navigating to the session's page to the page holding its newest event (the page loads
  the tail first: 2,000 events). Target: < 2 s.
- ``web-tabs-20-cpu``: a turn whose command writes 100 lines/s for 10 s, streamed while
  20 tabs show the session, against the same turn with none; the figure is the daemon's
  extra CPU, in percent of one core over the turn. Target: < 5 points.
- ``web-output-1mbps``: a command writing 1 MB/s for 5 s shown in a tab; the figure is
  the page's worst main-thread stall meanwhile (a timer's lateness). No target; the
  note says what the page held.

With --quick: 10,000 events to open, 5 tabs, 2 s of output.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time

import psutil
from bench_fanout import open_session, turn, wait_idle
from common import Daemon, Row, bench_main, error_row, log

CHROMIUM = "/usr/bin/chromium"
OPEN_EVENTS = 100_000
QUICK_OPEN_EVENTS = 10_000
TABS = 20
QUICK_TABS = 5
STREAM_S = 10
TARGET_OPEN_MS = 2000.0
TARGET_CPU_POINTS = 5.0


class Web:
    """``sluice web --port 0`` for the daemon; ``url`` carries the token."""

    def __init__(self, daemon: Daemon) -> None:
        argv = [sys.executable, "-m", "broker", "web", "--port", "0"]
        self.proc = subprocess.Popen(argv, env=daemon.env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        fd = self.proc.stdout.fileno()
        line = b""
        deadline = time.monotonic() + 30
        while b"\n" not in line:
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise RuntimeError("sluice web printed no URL")
            data = os.read(fd, 4096)
            if not data:
                raise RuntimeError("sluice web exited")
            line += data
        self.url = line.decode().split("\n")[0]
        self.base = self.url.split("/?")[0]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.proc.stdout.close()


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def run(quick: bool) -> list[Row]:
    from playwright.sync_api import sync_playwright

    from tests.support.fake_model import FakeModelServer

    rows: list[Row] = []
    with Daemon(executors=2) as daemon, FakeModelServer() as server, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        web = Web(daemon)
        try:
            client, session = open_session(daemon, server)
            # -- opening a long session ----------------------------------------------------
            try:
                events = QUICK_OPEN_EVENTS if quick else OPEN_EVENTS
                turn(server, session, events)
                head = wait_idle(client, session.id, 0)
                page = browser.new_page()
                page.goto(web.url)
                page.wait_for_selector("#status:has-text('connected')")
                started = time.monotonic()
                page.goto(f"{web.base}/#/s/{session.id}")
                # (Selectors, not a JavaScript predicate: the page's CSP forbids eval.)
                page.wait_for_selector(f"#log[data-last='{head}']", timeout=60_000)
                took = (time.monotonic() - started) * 1000
                judged = not quick
                rows.append(Row("web-open-100k", took, "ms", target=f"< {TARGET_OPEN_MS:g} ms",
                                holds=took < TARGET_OPEN_MS if judged else None,
                                note=f"{head} events; the page loads the last 2,000"
                                + ("" if judged else "; not judged (--quick)")))
                page.close()
            except Exception as e:  # noqa: BLE001
                rows.append(error_row("web-open-100k", e))

            # -- tabs against the daemon's CPU -------------------------------------------
            try:
                from broker.wire.protocol import TextInput, UserInput
                from tests.support.fake_model import assistant, call, response

                def turn_cpu() -> float:
                    """The daemon's CPU, in % of one core, over a turn whose command writes a
                    line every 10 ms for STREAM_S (so its length does not depend on the tabs)."""
                    after = wait_idle(client, session.id, 0)
                    script = ("import os, time\nfor i in range(%d):\n    os.write(1, b'line %%d\\n' %% i)\n"
                              "    time.sleep(0.01)\n" % (STREAM_S * 100))
                    server.script(response(call("shell", {"command": ["python3", "-c", script]}, "cpu")),
                                  response(assistant("ok")))
                    before = cpu_seconds(daemon.pid)
                    started = time.monotonic()
                    session.submit(UserInput([TextInput("stream")]))
                    wait_idle(client, session.id, after)
                    return (cpu_seconds(daemon.pid) - before) / (time.monotonic() - started) * 100

                alone = turn_cpu()
                tabs = []
                for _ in range(QUICK_TABS if quick else TABS):
                    tab = browser.new_page()
                    tab.goto(web.url)
                    tab.goto(f"{web.base}/#/s/{session.id}")
                    tabs.append(tab)
                for tab in tabs:
                    tab.wait_for_selector("#log[data-last]", timeout=60_000)
                watched = turn_cpu()
                for tab in tabs:
                    tab.close()
                extra = watched - alone
                rows.append(Row(f"web-tabs-{len(tabs)}-cpu", extra, "points", baseline=alone,
                                target=f"< {TARGET_CPU_POINTS:g} points", holds=extra < TARGET_CPU_POINTS,
                                note=f"daemon CPU {alone:.1f}% of a core with no tab, {watched:.1f}% with "
                                     f"{len(tabs)}, over a turn streaming 100 lines/s for {STREAM_S} s"))
            except Exception as e:  # noqa: BLE001
                rows.append(error_row("web-tabs-cpu", e))

            # -- 1 MB/s of output --------------------------------------------------------
            try:
                from broker.wire.protocol import TextInput, UserInput
                from tests.support.fake_model import assistant, call, response

                seconds = 2 if quick else 5
                script = ("import os, time\nline = b'x' * 99 + b'\\n'\nend = time.monotonic() + %d\n"
                          "while time.monotonic() < end:\n    os.write(1, line * 1000)\n    time.sleep(0.1)\n" % seconds)
                server.script(response(call("shell", {"command": ["python3", "-c", script]}, "out1")),
                              response(assistant("done")))
                page = browser.new_page()
                page.goto(web.url)
                page.goto(f"{web.base}/#/s/{session.id}")
                page.wait_for_selector("#log[data-last]")
                page.evaluate("""() => { window.worst = 0; let last = performance.now();
                    setInterval(() => { const now = performance.now(); window.worst = Math.max(window.worst, now - last - 50);
                    last = now; }, 50); }""")
                after = wait_idle(client, session.id, 0)
                session.submit(UserInput([TextInput("flood")]))
                wait_idle(client, session.id, after, timeout=120)
                page.wait_for_selector(".ev.agent:has-text('done')", timeout=60_000)
                worst = page.evaluate("window.worst")
                nodes = page.evaluate("document.querySelectorAll('#log *').length")
                rows.append(Row("web-output-1mbps", worst, "ms",
                                note=f"{seconds} s at 1 MB/s; the worst timer lateness on the page; "
                                     f"{nodes} elements on the page after it"))
                page.close()
            except Exception as e:  # noqa: BLE001
                rows.append(error_row("web-output-1mbps", e))
            client.close()
        finally:
            web.close()
            browser.close()
            log("done")
    return rows


if __name__ == "__main__":
    bench_main(run, __doc__)
