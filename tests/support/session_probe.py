"""A frontend in a process of its own, for tests that stop it (SIGSTOP) or lose it.

    python tests/session_probe.py RUNTIME_DIR SESSION_ID OUT_FILE [--since N]

Run with this checkout on PYTHONPATH (the daemon fixture's environment has it). Attaches
to the session (``--since`` as :meth:`broker.client.connection.Client.attach` takes it, default 0),
prints ``attached`` on stdout once the daemon answered, then writes one JSON line per
event to OUT_FILE: ``{"seq", "type", "id", "digest"}`` (the digest is a CRC
of the event as msgpack, so two frontends' streams compare exactly without carrying the
bytes around). After the first ``task_complete`` it writes ``{"lagged": n}`` (the
daemon's lagged notices), detaches and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import zlib

from broker.client import Client
from broker.net.runtime import RuntimeDir
from broker.wire.protocol import encode_msgpack

EVENT_TIMEOUT_S = 60.0


def describe(event) -> dict:
    return {
        "seq": event.seq,
        "type": type(event.msg).__struct_config__.tag,
        "id": event.id,
        "digest": zlib.crc32(encode_msgpack(event)),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("runtime")
    parser.add_argument("session")
    parser.add_argument("out")
    parser.add_argument("--since", type=int, default=0)
    args = parser.parse_args()

    with Client.connect(RuntimeDir(args.runtime), autostart=False, name="probe") as client:
        session = client.attach(args.session, since=args.since)
        print("attached", flush=True)
        with open(args.out, "w", encoding="utf-8") as out:
            while True:
                event = session.next_event(EVENT_TIMEOUT_S)
                if event is None:
                    print(f"no event for {EVENT_TIMEOUT_S:g} s", file=sys.stderr)
                    return 1
                line = describe(event)
                out.write(json.dumps(line) + "\n")
                if line["type"] == "task_complete":
                    break
            out.write(json.dumps({"lagged": session.lagged}) + "\n")
        session.detach()
    return 0


if __name__ == "__main__":
    sys.exit(main())
