"""Every logging call in sluice's code, checked on the source: none passes ``event=``.

structlog takes a log call's first argument as ``event``, so ``log.info("...", event=x)``
raises TypeError at the moment it logs (it once ended a turn on a stray SSE line), and
:class:`broker.net.logging.Throttle` takes the same name. A test that had to reach each
such line to find it would miss the rare paths, where they hide.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("landlock_helper", "broker", "executor", "agent", "tests")
LEVELS = {"debug", "info", "warning", "warn", "error", "exception", "critical", "fatal", "msg", "log"}


def _is_log_call(call: ast.Call) -> bool:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name in LEVELS or "throttle" in name.lower()


def test_no_log_call_passes_event_as_a_keyword() -> None:
    found = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and _is_log_call(node) and any(k.arg == "event" for k in node.keywords):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, "log calls passing event= (structlog's own argument): " + ", ".join(found)


def test_the_check_sees_such_a_call() -> None:
    tree = ast.parse('log.debug("x", event=e)\nself._throttle("warning", "y", event=1)\nlog.info("z", kind=1)\n')
    assert [_is_log_call(n) and any(k.arg == "event" for k in n.keywords)
            for n in ast.walk(tree) if isinstance(n, ast.Call)] == [True, True, False]
