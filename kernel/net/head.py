"""Reading and answering a proxy request head: bounded, strict, and small.

The kernel's proxy speaks only enough HTTP/1.x to accept a ``CONNECT host:port`` and
refuse everything else with a short plain-text answer; it never parses what flows
through a tunnel.  (No h11 here: the kernel image does not ship it, and the grammar
needed is a request line plus header lines.)
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from http import HTTPStatus

import msgspec

_METHOD = re.compile(r"[A-Z][A-Z0-9_-]{0,19}\Z")
_VERSIONS = frozenset({"HTTP/1.1", "HTTP/1.0"})


class HeadRejected(Exception):
    """The head cannot be served: ``status`` and a short reason for the body and audit."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class RequestHead(msgspec.Struct, frozen=True):
    method: str
    target: str
    version: str


async def read_head(reader: asyncio.StreamReader, max_bytes: int) -> tuple[bytes, bytes] | None:
    """Read up to the blank line: (head without it, bytes that followed), None on EOF first.

    Never buffers more than ``max_bytes`` + 4; the caller bounds the time.  The bytes
    after the head belong to the tunnel (a client may send its TLS hello eagerly).
    """
    buf = bytearray()
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            if end > max_bytes:
                break
            return bytes(buf[:end]), bytes(buf[end + 4 :])
        if len(buf) > max_bytes:
            break
        chunk = await reader.read(max_bytes + 4 - len(buf))
        if not chunk:
            if not buf:
                return None
            raise HeadRejected(400, "the connection ended inside the request head")
        buf += chunk
    raise HeadRejected(431, f"the request head is larger than {max_bytes} bytes")


def parse_head(head: bytes) -> RequestHead:
    """The request line, after checking that every header line is well-formed."""
    request_line, *headers = head.split(b"\r\n")
    try:
        text = request_line.decode("ascii")
    except UnicodeDecodeError:
        raise HeadRejected(400, "the request line is not ASCII") from None
    parts = text.split(" ")
    if len(parts) != 3 or not all(parts):
        raise HeadRejected(400, "the request line is not 'METHOD target HTTP/1.1'")
    method, target, version = parts
    if not _METHOD.match(method):
        raise HeadRejected(400, "the request method is not an HTTP token")
    if version not in _VERSIONS:
        raise HeadRejected(400, "only HTTP/1.0 and HTTP/1.1 are spoken here")
    for line in headers:
        name, colon, _ = line.partition(b":")
        if not colon or not name or name != name.strip() or not name.isascii():
            raise HeadRejected(400, "a header line is malformed")
    return RequestHead(method, target, version)


async def respond(
    writer: asyncio.StreamWriter,
    status: int,
    body: str,
    headers: tuple[tuple[str, str], ...] = (),
) -> None:
    """Send a complete plain-text answer (the connection is closed after it)."""
    payload = (body + "\n").encode("utf-8", "replace")
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(payload)}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in headers),
    ]
    writer.write("\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + payload)
    with contextlib.suppress(ConnectionError, TimeoutError):
        async with asyncio.timeout(5):
            await writer.drain()


async def linger(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    budget_s: float = 1.0,
    max_bytes: int = 256 * 1024,
) -> None:
    """Half-close after an answer, then discard what the peer still sends (bounded).

    Closing a socket with unread input resets the connection, and the peer may then
    lose the answer it has not read yet (a 431 sent while the head is still coming).
    """
    with contextlib.suppress(Exception):
        if writer.can_write_eof():
            writer.write_eof()
        seen = 0
        async with asyncio.timeout(budget_s):
            while seen < max_bytes and (chunk := await reader.read(64 * 1024)):
                seen += len(chunk)


def clip(text: str, limit: int = 120) -> str:
    """Peer-supplied text for a body or an audit reason: printable, bounded."""
    shown = text.encode("ascii", "backslashreplace").decode("ascii")
    shown = "".join(ch if ch.isprintable() else "?" for ch in shown)
    return shown if len(shown) <= limit else shown[:limit] + "..."
