"""A small MCP server over stdio for tests: tools ``echo``, ``add``, ``sleep`` (answers
after ``seconds`` unless cancelled), ``crash`` (exits at once), ``write`` (writes ``text``
to ``path``), ``fail`` (an isError result), ``junk`` (prints lines that are not JSON until
it is stopped), ``picture`` (text and a PNG image); tools/list in pages of two
(``FAKE_MCP_TOOLS=echo,add`` lists only those: Codex refuses a whole server for the
boolean schema of ``fail``). Calls and
cancellations are written to stderr as ``call <id>`` and ``cancelled <id>``."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

TOOLS = [
    {"name": "echo", "description": "Echo the text.",
     "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
    {"name": "add", "description": "Add two numbers.",
     "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
     "outputSchema": {"type": "object", "properties": {"sum": {"type": "number"}}}},
    {"name": "sleep", "description": "Sleep.", "inputSchema": {"type": "object", "properties": {"seconds": {}}}},
    {"name": "crash", "description": "Exit at once.", "inputSchema": {"type": "object"}},
    {"name": "write", "description": "Write a file.",
     "inputSchema": {"properties": {"path": {"type": "string"}, "text": {"type": "string"}}}},
    {"name": "fail", "description": "Fail.", "inputSchema": True},
    {"name": "junk", "description": "Print junk.", "inputSchema": {"type": "object"}},
    {"name": "picture", "description": "Show a picture.", "inputSchema": {"type": "object"}},
]
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
lock = threading.Lock()
cancelled: set = set()


def send(message: dict) -> None:
    with lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def text(t: str, **extra) -> dict:
    return {"content": [{"type": "text", "text": t}], **extra}


def call(request_id, name: str, args: dict) -> None:
    if name == "echo":
        result = text(args.get("text", ""))
    elif name == "add":
        total = args.get("a", 0) + args.get("b", 0)
        result = text(str(total), structuredContent={"sum": total})
    elif name == "sleep":
        deadline = time.monotonic() + float(args.get("seconds", 1))
        while time.monotonic() < deadline:
            if request_id in cancelled:
                return  # no answer to a cancelled request
            time.sleep(0.01)
        result = text("slept")
    elif name == "crash":
        os._exit(3)
    elif name == "write":
        try:
            with open(args["path"], "w") as f:
                f.write(args.get("text", ""))
            result = text("written")
        except OSError as e:
            result = text(f"cannot write: {e.strerror}", isError=True)
    elif name == "fail":
        result = text("it failed", isError=True)
    elif name == "picture":
        result = {"content": [{"type": "text", "text": "a dot"}, {"type": "image", "data": PNG, "mimeType": "image/png"}]}
    elif name == "junk":
        while True:
            with lock:
                sys.stdout.write("not json\n" * 1000)
                sys.stdout.flush()
    else:
        send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32602, "message": f"unknown tool {name}"}})
        return
    send({"jsonrpc": "2.0", "id": request_id, "result": result})


def main() -> None:
    if os.environ.get("FAKE_MCP_SILENT"):
        time.sleep(3600)
    print("fake MCP server starting", file=sys.stderr, flush=True)
    for line in sys.stdin:
        message = json.loads(line)
        method, request_id, params = message.get("method"), message.get("id"), message.get("params") or {}
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": request_id, "result": {
                "protocolVersion": os.environ.get("FAKE_MCP_VERSION", params["protocolVersion"]),
                "capabilities": {"tools": {}}, "serverInfo": {"name": "fake", "version": "1"}}})
        elif method == "tools/list":
            listed = [t for t in TOOLS if t["name"] in os.environ.get("FAKE_MCP_TOOLS", t["name"]).split(",")]
            start = int(params.get("cursor") or 0)
            page = {"tools": listed[start:start + 2]}
            if start + 2 < len(listed):
                page["nextCursor"] = str(start + 2)
            send({"jsonrpc": "2.0", "id": request_id, "result": page})
        elif method == "tools/call":
            print(f"call {request_id}", file=sys.stderr, flush=True)
            threading.Thread(target=call, args=(request_id, params["name"], params.get("arguments") or {}),
                             daemon=True).start()
        elif method == "notifications/cancelled":
            cancelled.add(params.get("requestId"))
            print(f"cancelled {params.get('requestId')}", file=sys.stderr, flush=True)
        elif method == "ping":
            send({"jsonrpc": "2.0", "id": request_id, "result": {}})
        elif request_id is not None:
            send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": "no such method"}})


if __name__ == "__main__":
    main()
