"""The ``notify`` hook: run the user's program after each completed turn, fire and forget.

``configure_session.notify`` is an argv; the notification goes as one more argument, a
JSON object in Codex's shape (``UserNotification``, kebab-case)::

    {"type":"agent-turn-complete","turn-id":"3","input-messages":["fix the tests"],
     "last-assistant-message":"All tests pass now."}

The program runs detached (own session, stdin/stdout/stderr on /dev/null) and is never
waited for by the turn; a reaper task collects its exit status so no zombie is left. A
program that cannot be started is logged and otherwise ignored.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import structlog

log = structlog.get_logger("agent.notify")

_reapers: set[asyncio.Task[None]] = set()


def turn_complete_payload(turn_id: str, input_messages: Sequence[str], last_assistant_message: str | None) -> str:
    return json.dumps(
        {
            "type": "agent-turn-complete",
            "turn-id": turn_id,
            "input-messages": list(input_messages),
            "last-assistant-message": last_assistant_message,
        },
        ensure_ascii=False,
        separators=(",", ":"),
    )


async def _reap(process: asyncio.subprocess.Process) -> None:
    await process.wait()


async def spawn_notifier(argv: Sequence[str], payload: str) -> asyncio.subprocess.Process | None:
    """Start ``argv + [payload]``; returns the process (or None if it could not start)."""
    if not argv:
        return None
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            payload,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as err:
        log.warning("could not start the notify program", program=argv[0], error=err.strerror or str(err))
        return None
    reaper = asyncio.get_running_loop().create_task(_reap(process))
    _reapers.add(reaper)
    reaper.add_done_callback(_reapers.discard)
    return process
