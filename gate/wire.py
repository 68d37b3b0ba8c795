"""HTTP/1.1 to an engine's Unix socket, one request per connection (stdlib only).

Shared by the bootstrap (its own engine calls) and the gate (checks and relays)."""

from __future__ import annotations

import io
import json
import socket
from types import SimpleNamespace
from typing import Any


def send(path: str, method: str, target: str, body: bytes = b"", *,
         content_type: str = "application/json",
         timeout: float | None = None) -> socket.socket:  # fmt: skip
    """A connection to the socket at ``path`` with the request sent, its answer unread."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        head = f"{method} {target} HTTP/1.1\r\nHost: engine\r\nConnection: close\r\n"
        if body or method in ("POST", "PUT"):
            head += f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        sock.sendall(head.encode("latin-1") + b"\r\n" + body)
    except BaseException:
        sock.close()
        raise
    return sock


def parse(data: bytes) -> tuple[int, bytes]:
    """(status, body) of a whole HTTP response (chunked bodies joined)."""
    import http.client  # here: `fluffy stop` and the CLI's other readers of L1 never parse

    read = SimpleNamespace(makefile=lambda *_: io.BytesIO(data))  # what it reads from
    response = http.client.HTTPResponse(read)  # type: ignore[arg-type]
    response.begin()
    return response.status, response.read()


def request(path: str, method: str, target: str, body: bytes = b"",
            timeout: float | None = None) -> tuple[bytes, int, bytes]:  # fmt: skip
    """(the raw response, its status, its body)."""
    with send(path, method, target, body, timeout=timeout) as sock:
        data = b"".join(iter(lambda: sock.recv(65536), b""))
    return (data, *parse(data))


def as_json(body: bytes) -> Any:
    try:
        return json.loads(body) if body[:1] in (b"{", b"[") else None
    except ValueError:
        return None


def userns(path: str) -> dict[str, str]:
    """HostConfig's user namespace for the engine at ``path``: ``keep-id`` on rootless
    Podman (its libpod info says so; the compatible /info does not, on Podman 4.3), so
    container uid N is host uid N -- the user's own, not a subordinate uid locked out of
    the user's 0700 folders and peer-uid checks.  Docker (404), rootful Podman: {}."""
    try:
        info = json.loads(request(path, "GET", "/v4.0.0/libpod/info", timeout=30)[2])
        return {"UsernsMode": "keep-id"} if info["host"]["security"]["rootless"] else {}
    except (OSError, ValueError, KeyError, TypeError):
        return {}
