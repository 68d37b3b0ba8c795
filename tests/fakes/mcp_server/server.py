"""A small stdio MCP server (stdlib only) for fluffy's tests: one JSON-RPC message per
line, the methods a client needs (initialize, tools/list, tools/call, ping).

Its tools do what a hostile or broken server would: ``connect`` tries the network and
reports the errno, ``fetch`` makes an HTTP GET through ``HTTP_PROXY`` (tunnelled, as
the kernel's proxy wants), ``crash`` exits mid-call, ``shout`` answers with a long text, and
``echo`` is the well-behaved one.  Run as ``python3 server.py`` (``--path`` of `fluffy
mcp add`), or imported by unit tests through its file path.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import sys
import time
import urllib.parse

TOOLS = [
    {
        "name": "echo",
        "description": "Say the text back.",
        "inputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "connect",
        "description": "Open a TCP connection to host:port and say what happened.",
        "inputSchema": {
            "type": "object",
            "properties": {"host": {"type": "string"}, "port": {"type": "integer"}},
            "required": ["host", "port"],
        },
    },
    {
        "name": "interfaces",
        "description": "The network interfaces this process can see.",
        "inputSchema": {"type": "object", "properties": {}},
    },
    {
        "name": "fail",
        "description": "Answer with a JSON-RPC error (invalid params).",
        "inputSchema": {"type": "object", "properties": {}},
    },
    {
        "name": "crash",
        "description": "Exit at once, without an answer.",
        "inputSchema": {"type": "object", "properties": {}},
    },
    {
        "name": "fetch",
        "description": "GET http://host:port/path through HTTP_PROXY; the status and body.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "host": {"type": "string"},
                "port": {"type": "integer"},
                "path": {"type": "string"},
            },
            "required": ["host", "port"],
        },
    },
    {
        "name": "sleep",
        "description": "Wait that many seconds, then answer.",
        "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}},
    },
]


def _connect(host: str, port: int) -> dict[str, object]:
    try:
        with socket.create_connection((host, port), timeout=3):
            return {"connected": True}
    except OSError as exc:
        return {"connected": False, "errno": exc.errno, "error": type(exc).__name__}


def _fetch(host: str, port: int, path: str) -> dict[str, object]:
    """A GET through the proxy of HTTP_PROXY, tunnelled (CONNECT) as the proxy wants."""
    proxy = os.environ.get("HTTP_PROXY") or os.environ.get("http_proxy")
    if not proxy:
        return {"ok": False, "error": "no HTTP_PROXY"}
    where = urllib.parse.urlsplit(proxy)
    connection = http.client.HTTPConnection(where.hostname or "", where.port, timeout=5)
    connection.set_tunnel(host, port)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read().decode("utf-8", "replace")
        return {"ok": True, "status": response.status, "body": body[:2000], "proxy": proxy}
    except OSError as exc:
        return {"ok": False, "error": str(exc)[:500], "proxy": proxy}
    finally:
        connection.close()


def _call(name: str, args: dict[str, object]) -> dict[str, object]:
    if name == "echo":
        return {"content": [{"type": "text", "text": str(args.get("text"))}]}
    if name == "connect":
        found = _connect(str(args.get("host")), int(args.get("port") or 0))  # type: ignore[call-overload]
        return {"content": [{"type": "text", "text": json.dumps(found)}],
                "structuredContent": found}  # fmt: skip
    if name == "fetch":
        got = _fetch(str(args.get("host")), int(args.get("port") or 0),  # type: ignore[call-overload]
                     str(args.get("path") or "/"))  # fmt: skip
        return {"content": [{"type": "text", "text": json.dumps(got)}], "structuredContent": got}
    if name == "interfaces":
        with open("/proc/net/dev") as dev:
            names = sorted(line.split(":")[0].strip() for line in dev.readlines()[2:])
        return {"content": [{"type": "text", "text": ",".join(names)}]}
    if name == "crash":
        os._exit(3)
    if name == "sleep":
        time.sleep(float(args.get("seconds") or 0))  # type: ignore[arg-type]
        return {"content": [{"type": "text", "text": "awake"}]}
    return {"content": [{"type": "text", "text": f"no tool {name}"}], "isError": True}


def answer(message: dict[str, object]) -> dict[str, object] | None:
    method = message.get("method")
    if "id" not in message:
        return None  # a notification
    params = message.get("params") or {}
    assert isinstance(params, dict)
    if method == "initialize" and "--broken-init" in sys.argv:
        return {"jsonrpc": "2.0", "id": message["id"],
                "error": {"code": -32603, "message": "this server cannot start"}}  # fmt: skip
    if method == "tools/call" and params.get("name") == "fail":
        return {"jsonrpc": "2.0", "id": message["id"],
                "error": {"code": -32602, "message": "the arguments make no sense"}}  # fmt: skip
    if method == "initialize":
        result: dict[str, object] = {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "fluffy-test-server", "version": "1.0"},
        }
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call":
        result = _call(str(params.get("name")), dict(params.get("arguments") or {}))
    elif method == "ping":
        result = {}
    else:
        return {"jsonrpc": "2.0", "id": message["id"],
                "error": {"code": -32601, "message": f"no method {method}"}}  # fmt: skip
    return {"jsonrpc": "2.0", "id": message["id"], "result": result}


def main() -> int:
    for line in sys.stdin:
        if not line.strip():
            continue
        reply = answer(json.loads(line))
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
