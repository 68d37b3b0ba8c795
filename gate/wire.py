# HTTP/1.1 to an engine's Unix socket, one request per connection (stdlib only).
#
# Shared by the bootstrap (its own engine calls) and the gate (checks and relays).

from __future__ import annotations

import functools
import io
import json
import socket
from pathlib import Path
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
    """HostConfig's user namespace for the engine at ``path``: keep-id on rootless Podman."""
    # so that container uid N is the user's own uid N (else {}: Docker, rootful Podman), not
    # a subordinate uid locked out of the user's 0700 folders and the kernel's peer-uid
    # checks.  An answer the engine did not give (an error) is not kept: asked again
    try:
        return dict(_userns(path))  # a copy: callers keep it
    except (OSError, ValueError, KeyError, TypeError):
        return {}


# once per process: the gate and L1's spec both ask, and Podman's libpod info takes
# ~170 ms (it counts the store's images and containers); a process serves one engine
@functools.cache
def _userns(path: str) -> dict[str, str]:
    with send(path, "HEAD", "/_ping", timeout=30) as sock:  # (its answer left unread)
        cred = getattr(socket, "SO_PEERCRED", 0)  # struct ucred {pid, uid, gid}, on Linux
        root = bool(cred) and sock.getsockopt(socket.SOL_SOCKET, cred, 12)[4:8] == bytes(4)
    # uid 0 (in any byte order) seen from the host's user namespace is root, whose Podman
    # is never rootless (a rootless engine's own uid 0 is its user's uid, seen from here)
    if root and Path("/proc/self/uid_map").read_text().split() == ["0", "0", "4294967295"]:
        return {}
    # rootless: its libpod info says so (the compatible /info does not, on Podman 4.3)
    info = json.loads(request(path, "GET", "/v4.0.0/libpod/info", timeout=30)[2])
    return {"UsernsMode": "keep-id"} if info["host"]["security"]["rootless"] else {}
