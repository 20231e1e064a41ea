"""Codex 0.169's ``codex exec --json`` events, made from the seed protocol's: a pure translator.

``sluice exec --json=codex`` prints what a script written against ``codex exec --json``
expects, one object per line (:class:`CodexJsonl` turns each seed event into zero or more
of them; no I/O here)::

    {"type":"thread.started","thread_id":"..."}
    {"type":"turn.started"}
    {"type":"item.started","item":{"id":"item_0","type":"command_execution","command":"/bin/bash -lc ls",
     "aggregated_output":"","exit_code":null,"status":"in_progress"}}
    {"type":"item.completed","item":{"id":"item_0",...,"aggregated_output":"a.txt\\n","exit_code":0,
     "status":"completed"}}
    {"type":"item.completed","item":{"id":"item_1","type":"agent_message","text":"One file."}}
    {"type":"turn.completed","usage":{"input_tokens":24,"cached_input_tokens":8,"cache_write_input_tokens":0,
     "output_tokens":14,"reasoning_output_tokens":4}}

What becomes what, as Codex 0.169 prints it (checked against its output on the same scripted
model: tests/golden/codex_json):

- ``session_configured``: ``thread.started`` (the session id; once per run); ``task_started``:
  ``turn.started``.
- Items are numbered ``item_0``, ``item_1``... in the order Codex gives the numbers: an item
  that starts (a command, an MCP call, a patch, the to-do list) gets its number when it
  starts, a message or a reasoning summary when it is complete.
- ``exec_command_begin``/``_end``: a ``command_execution`` started, then completed with its
  ``aggregated_output`` and ``exit_code``; ``completed`` when it exited 0, else ``failed``.
  ``command`` is the argv joined as Codex joins it (:func:`join_command`).
- ``patch_apply_begin``/``_end``: a ``file_change`` (each path with its kind ``add``,
  ``delete`` or ``update``), ``completed`` or ``failed``.
- ``mcp_tool_call_begin``/``_end``: an ``mcp_tool_call`` with the server, tool,
  arguments, and the result's ``content`` and ``structured_content``; ``failed`` when the
  call failed or the result is an error. Codex gives a call that got no result at all
  ``error.message`` instead; sluice's event carries such a failure as an error result,
  so here it is one.
- ``agent_message``: an ``agent_message`` item. ``agent_reasoning``: a ``reasoning`` item;
  the seed sends one event per part of a reasoning summary, Codex one item with the parts
  joined by newlines: the parts that come one after the other are joined here (two
  summaries of one response, with nothing between them, become one item; a token count
  ends a response's).
- ``plan_update``: a ``todo_list`` started, then updated; completed when the turn ends,
  and so is any item still open then (an interactive session left running), as it stands.
- ``token_count``: summed into ``turn.completed``'s ``usage`` (over the counts this run
  saw); sluice has no count of tokens written to the prompt cache, so
  ``cache_write_input_tokens`` is 0.
- The turn's end: ``task_complete`` is ``turn.completed``; an error that ends it is an
  ``error`` line, then ``turn.failed`` with the same message; an aborted turn ends with
  nothing of its own, as in Codex. An error that does not end a turn (a rollout that can
  no longer be written, a warning after the session is configured) is an ``error`` item;
  one before the session is configured, a top-level ``error``.

Nothing else is printed: deltas (Codex's JSON has none either), approval requests (asked on
the terminal, as without ``--json``), sluice's background notes (retry announcements among
them; Codex prints a stream retry as an ``error`` line ``Reconnecting... n/m``), the turn's
diff. Codex's ``web_search`` items and ``item.plan.delta`` have no seed event and never
appear.
"""

from __future__ import annotations

from typing import Any

from broker.cli.turns import TURN_EVENTS, tag_of, turn_end
from broker.wire.protocol import TURN_INTERRUPTED, Event, StepStatus
from broker.wire.results import EXIT_INTERRUPTED, EXIT_OK

Json = dict[str, Any]
_TURN_ENDS = frozenset({"task_complete", "turn_aborted", "error"})

# -- joining a command as Codex shows it ---------------------------------------------

# Codex joins argv with the Rust ``shlex`` crate, whose quoting differs from Python's
# shlex.join: each word is cut into runs, each as long as one way of writing can hold it,
# and written the first way that can: bare, in single quotes, in double quotes (a backslash
# before " and \).
_BARE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-./:@]_")
_NOT_IN_SINGLE = frozenset("'\\^")  # ^ only right after the opening quote: a Bash quirk
_NOT_IN_DOUBLE = frozenset("$`!^")
_BARE_OK, _SINGLE_OK, _DOUBLE_OK = 1, 2, 4
NUL_COMMAND = "<command included NUL byte>"


def _styles(char: str) -> int:
    if char.isascii() and char in _BARE:
        return _BARE_OK | _SINGLE_OK | _DOUBLE_OK
    ok = 0
    if char not in _NOT_IN_SINGLE:
        ok |= _SINGLE_OK
    if char not in _NOT_IN_DOUBLE:
        ok |= _DOUBLE_OK
    return ok


def quote_word(word: str) -> str:
    """One argv word as Codex quotes it."""
    if not word:
        return "''"
    out: list[str] = []
    start = 0
    while start < len(word):
        if word[start] == "^":
            ok, end = _SINGLE_OK, start + 1  # a run of its own, opening a single quote
        else:
            ok, end = _BARE_OK | _SINGLE_OK | _DOUBLE_OK, start
        while end < len(word) and ok & _styles(word[end]):
            ok &= _styles(word[end])
            end += 1
        run = word[start:end]
        if ok & _BARE_OK:
            out.append(run)
        elif ok & _SINGLE_OK:
            out.append(f"'{run}'")
        else:
            out.append('"' + run.replace("\\", "\\\\").replace('"', '\\"') + '"')
        start = end
    return "".join(out)


def join_command(argv: list[str]) -> str:
    """``argv`` as one line, as Codex's ``command_execution`` shows it."""
    if any("\0" in word for word in argv):
        return NUL_COMMAND
    return " ".join(quote_word(word) for word in argv)


# -- the translator -------------------------------------------------------------------


class CodexJsonl:
    """Seed events in, Codex 0.169 ``exec --json`` events out (:meth:`event`), in order.

    One instance follows one run: item numbers, open items and token counts are kept
    across its turns, as ``codex exec`` keeps them for its thread. :meth:`finish` gives
    what is still held when the events end without a turn's end.
    """

    def __init__(self) -> None:
        self._next_item = 0
        self._thread_started = False
        self._turn: str | None = None  # the running turn's submission id
        self._open: dict[str, Json] = {}  # call_id -> the started item
        self._left: dict[str, Json] = {}  # the same, of items a turn's end completed
        self._reasoning: list[str] = []  # parts of the summary being received
        self._todo: Json | None = None  # the turn's to-do list item, once planned
        self._usage = {"input_tokens": 0, "cached_input_tokens": 0, "cache_write_input_tokens": 0,
                       "output_tokens": 0, "reasoning_output_tokens": 0}

    def event(self, event: Event) -> list[Json]:
        out: list[Json] = []
        msg = event.msg
        tag = tag_of(event)
        if self._turn is None and (tag == "task_started" or tag in TURN_EVENTS):
            # A turn whose task_started was not seen (attached mid-turn) starts here too.
            self._flush_reasoning(out)
            self._turn = event.id
            self._todo = None
            out.append({"type": "turn.started"})
        if tag == "agent_reasoning":
            self._reasoning.append(msg.text)
            return out
        handler = getattr(self, f"_on_{tag}", None)
        if handler is None and tag not in _TURN_ENDS:
            return out  # nothing Codex prints (deltas, approvals, notes): it holds nothing back
        # Anything else ends the summary being received: it is complete before what follows.
        self._flush_reasoning(out)
        if handler is not None:
            handler(msg, out)
        else:
            self._on_end(event, out)
        return out

    def thread(self, session_id: str) -> list[Json]:
        """``thread.started`` for this session, unless the run has said it already (a
        frontend that joins a session opens with it, and its replay may hold the
        ``session_configured``)."""
        if self._thread_started:
            return []
        self._thread_started = True
        return [{"type": "thread.started", "thread_id": session_id}]

    def finish(self) -> list[Json]:
        out: list[Json] = []
        self._flush_reasoning(out)
        return out

    # -- items --------------------------------------------------------------------------

    def _item_id(self) -> str:
        number = self._next_item
        self._next_item += 1
        return f"item_{number}"

    def _start(self, call_id: str, details: Json, out: list[Json]) -> None:
        item = {"id": self._item_id(), **details}
        self._open[call_id] = item
        out.append({"type": "item.started", "item": item})

    def _started(self, call_id: str) -> Json | None:
        return self._open.get(call_id) or self._left.get(call_id)

    def _complete(self, call_id: str, details: Json, out: list[Json]) -> None:
        self._left.pop(call_id, None)
        started = self._open.pop(call_id, None)
        item_id = started["id"] if started is not None else self._item_id()
        out.append({"type": "item.completed", "item": {"id": item_id, **details}})

    def _completed(self, details: Json, out: list[Json]) -> None:
        out.append({"type": "item.completed", "item": {"id": self._item_id(), **details}})

    def _flush_reasoning(self, out: list[Json]) -> None:
        if not self._reasoning:
            return
        text = "\n".join(self._reasoning)
        self._reasoning = []
        if text.strip():
            self._completed({"type": "reasoning", "text": text}, out)

    # -- seed events ----------------------------------------------------------------------

    def _on_session_configured(self, msg, out: list[Json]) -> None:
        out += self.thread(str(msg.session_id))

    def _on_agent_message(self, msg, out: list[Json]) -> None:
        self._completed({"type": "agent_message", "text": msg.message}, out)

    def _on_token_count(self, msg, out: list[Json]) -> None:
        usage = self._usage
        usage["input_tokens"] += msg.input_tokens
        usage["cached_input_tokens"] += msg.cached_input_tokens or 0
        usage["output_tokens"] += msg.output_tokens
        usage["reasoning_output_tokens"] += msg.reasoning_output_tokens or 0

    def _on_exec_command_begin(self, msg, out: list[Json]) -> None:
        self._start(msg.call_id, _command(join_command(msg.command), "", None, "in_progress"), out)

    def _on_exec_command_end(self, msg, out: list[Json]) -> None:
        started = self._started(msg.call_id)
        command = started["command"] if started is not None else ""
        status = "completed" if msg.exit_code == 0 else "failed"
        self._complete(msg.call_id, _command(command, msg.aggregated_output, msg.exit_code, status), out)

    def _on_patch_apply_begin(self, msg, out: list[Json]) -> None:
        changes = [{"path": path, "kind": change.tag} for path, change in msg.changes.items()]
        self._start(msg.call_id, {"type": "file_change", "changes": changes, "status": "in_progress"}, out)

    def _on_patch_apply_end(self, msg, out: list[Json]) -> None:
        started = self._started(msg.call_id)
        changes = started["changes"] if started is not None else []
        status = "completed" if msg.success else "failed"
        self._complete(msg.call_id, {"type": "file_change", "changes": changes, "status": status}, out)

    def _on_mcp_tool_call_begin(self, msg, out: list[Json]) -> None:
        self._start(msg.call_id, _mcp_call(msg.server, msg.tool, msg.arguments, None, None, "in_progress"), out)

    def _on_mcp_tool_call_end(self, msg, out: list[Json]) -> None:
        started = self._started(msg.call_id) or {"server": "", "tool": "", "arguments": None}
        result = msg.result
        if result is None:
            details = _mcp_call(started["server"], started["tool"], started["arguments"], None,
                                {"message": "the MCP tool call failed"}, "failed")
        else:
            status = "completed" if msg.success and not result.is_error else "failed"
            shown = {"content": result.content, "structured_content": result.structured_content}
            details = _mcp_call(started["server"], started["tool"], started["arguments"], shown, None, status)
        self._complete(msg.call_id, details, out)

    def _on_plan_update(self, msg, out: list[Json]) -> None:
        items = [{"text": step.step, "completed": step.status == StepStatus.COMPLETED} for step in msg.plan]
        if self._todo is None:
            self._todo = {"id": self._item_id(), "type": "todo_list", "items": items}
            out.append({"type": "item.started", "item": self._todo})
        else:
            self._todo = {**self._todo, "items": items}
            out.append({"type": "item.updated", "item": self._todo})

    def _on_end(self, event: Event, out: list[Json]) -> None:
        """``task_complete``, ``turn_aborted``, ``error``."""
        ends = self._turn is not None and event.id in (self._turn, "")
        code = turn_end(event) if ends else None
        if code is None:
            if tag_of(event) == "error":
                self._warning(event.msg.message, out)
            return
        if code not in (EXIT_OK, EXIT_INTERRUPTED):
            out.append({"type": "error", "message": event.msg.message})
        if self._todo is not None:
            out.append({"type": "item.completed", "item": self._todo})
        # What is still open (an interactive session left running) completes as it stands;
        # its end, if it comes later, is another item, as in Codex.
        out += [{"type": "item.completed", "item": item} for item in self._open.values()]
        self._left.update(self._open)
        self._turn, self._todo, self._open = None, None, {}
        if code == EXIT_OK:
            out.append({"type": "turn.completed", "usage": dict(self._usage)})
        elif code != EXIT_INTERRUPTED:
            out.append({"type": "turn.failed", "error": {"message": event.msg.message}})

    def _warning(self, message: str, out: list[Json]) -> None:
        """An error that ends no turn: an item once the thread has started, else a line."""
        if message == TURN_INTERRUPTED:
            return  # turn_aborted follows, and an abort shows as nothing
        if self._thread_started:
            self._completed({"type": "error", "message": message}, out)
        else:
            out.append({"type": "error", "message": message})


def _command(command: str, output: str, exit_code: int | None, status: str) -> Json:
    return {"type": "command_execution", "command": command, "aggregated_output": output,
            "exit_code": exit_code, "status": status}


def _mcp_call(server: str, tool: str, arguments: Any, result: Json | None, error: Json | None, status: str) -> Json:
    return {"type": "mcp_tool_call", "server": server, "tool": tool, "arguments": arguments,
            "result": result, "error": error, "status": status}
