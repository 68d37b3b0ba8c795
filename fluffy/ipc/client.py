"""Clients: :class:`AsyncClient` (many concurrent requests, events) and
:class:`SyncClient` (blocking, for scripts and health checks).

Both handshake on connect and raise the server's errors as fluffy errors with the same
code (an unknown code becomes :class:`~fluffy.errors.IpcError`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import Callable
from typing import Any

from fluffy.errors import (
    ConnectionClosed,
    FluffyError,
    InvalidPayload,
    IpcError,
    all_error_classes,
)
from fluffy.ipc.protocol import (
    CONNECTION_ID,
    CURRENT_API_VERSION,
    DEFAULT_MAX_FRAME,
    HEADER,
    ErrorBody,
    FrameReader,
    HandshakeRequest,
    HandshakeResponse,
    IpcMessage,
    decode_handshake_response,
    decode_message,
    encode,
)
from fluffy.pathnames import not_utf8

_BY_CODE = {cls.code: cls for cls in all_error_classes()}


def raise_error(body: ErrorBody) -> None:
    cls = _BY_CODE.get(body.code)
    error: FluffyError | None = None
    if cls is not None and issubclass(cls, Exception):
        try:
            error = (
                cls(body.what, why=body.why or None, fix=body.fix or None)
                if body.what
                else cls(body.message)
            )
        except TypeError:  # a class that needs more than what/why/fix (ToolUnavailable)
            error = None
    if error is None:  # still the kernel's parts: a why may hold " (" (a diff's code)
        error = (
            IpcError(body.what, why=body.why or None, fix=body.fix or None)
            if body.what
            else IpcError(body.message)
        )
    error.wire_code = body.code  # type: ignore[attr-defined]
    error.wire_parts = bool(body.what)  # type: ignore[attr-defined]
    raise error


def _handshake(name: str, version: str, api_version: int) -> bytes:
    return encode(HandshakeRequest("handshake", name, version, api_version))


def _check_ack(reply: HandshakeResponse | IpcMessage) -> HandshakeResponse:
    if isinstance(reply, IpcMessage):
        if reply.error is not None:
            raise_error(reply.error)
        raise IpcError(
            "the kernel answered the handshake with something else",
            why="the socket is not a fluffy kernel of a compatible version, or the kernel is "
            "broken",
            fix="Check `fluffy status`; restart the kernel with `fluffy stop` then `fluffy start`.",
        )
    return reply


def _request(message_id: str, method: str, params: Any) -> bytes:
    """A request's frame, or :class:`InvalidPayload` for text that is not UTF-8."""
    try:
        return encode(IpcMessage(id=message_id, type="request", method=method, params=params))
    except UnicodeEncodeError as exc:  # a name or argument with bytes that are not UTF-8
        near = not_utf8(exc)
        if near is None:
            raise
        raise InvalidPayload(
            f"cannot send {method} to the kernel: text that is not UTF-8 ({near})",
            why="fluffy's requests are UTF-8 JSON; this text came from a file name, an "
            "argument or a script read as bytes that are not UTF-8",
            fix="Give that text as UTF-8 (rename the file, or re-save the script as UTF-8).",
        ) from None


class _ClientProtocol(asyncio.Protocol):
    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.reader = FrameReader(DEFAULT_MAX_FRAME)

    def data_received(self, data: bytes) -> None:
        for payload in self.reader.feed(data):
            self.client._received(payload)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client._lost()


class AsyncClient:
    """An asyncio client.  ``await AsyncClient.connect(path)``, then ``await call(...)``."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.pending: dict[str, asyncio.Future[Any]] = {}
        self.ack: HandshakeResponse | None = None
        self._ack_future: asyncio.Future[HandshakeResponse | IpcMessage] | None = None
        self.on_event: Callable[[IpcMessage], None] | None = None
        self.events: asyncio.Queue[IpcMessage] = asyncio.Queue()

    @classmethod
    async def connect(
        cls,
        path: str,
        *,
        plugin_name: str = "fluffy-cli",
        plugin_version: str = "0",
        api_version: int = CURRENT_API_VERSION,
    ) -> AsyncClient:
        client = cls()
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_unix_connection(lambda: _ClientProtocol(client), path)
        assert isinstance(transport, asyncio.Transport)
        client.transport = transport
        client._ack_future = loop.create_future()
        transport.write(_handshake(plugin_name, plugin_version, api_version))
        client.ack = _check_ack(await client._ack_future)
        return client

    def _received(self, payload: bytes) -> None:
        if self._ack_future is not None and not self._ack_future.done():
            self._ack_future.set_result(decode_handshake_response(payload))
            return
        message = decode_message(payload)
        if message.type == "event":
            if self.on_event is not None:
                self.on_event(message)
            else:
                self.events.put_nowait(message)
            return
        if message.id == CONNECTION_ID and message.error is not None:
            for pending in list(self.pending.values()):  # the kernel closes: all fail
                if not pending.done():
                    try:
                        raise_error(message.error)
                    except FluffyError as exc:
                        pending.set_exception(exc)
            self.pending.clear()
            return
        future = self.pending.pop(message.id, None)
        if future is None or future.done():
            return
        if message.error is not None:
            try:
                raise_error(message.error)
            except FluffyError as exc:
                future.set_exception(exc)
        else:
            future.set_result(message.result)

    def _lost(self) -> None:
        for future in list(self.pending.values()):
            if not future.done():
                future.set_exception(ConnectionClosed("the kernel closed the connection"))
        self.pending.clear()
        if self._ack_future is not None and not self._ack_future.done():
            self._ack_future.set_exception(ConnectionClosed("closed during the handshake"))

    async def call(self, method: str, params: Any = None) -> Any:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionClosed("not connected")
        message_id = str(uuid.uuid4())
        frame = _request(message_id, method, params)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[message_id] = future
        self.transport.write(frame)
        return await future

    async def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None
        await asyncio.sleep(0)


class SyncClient:
    """A blocking client (one request at a time)."""

    def __init__(
        self,
        path: str,
        *,
        timeout: float | None = 10.0,
        plugin_name: str = "fluffy-cli",
        plugin_version: str = "0",
        api_version: int = CURRENT_API_VERSION,
    ) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(path)
            self.sock.sendall(_handshake(plugin_name, plugin_version, api_version))
            self.ack = _check_ack(decode_handshake_response(self._read_frame()))
        except BaseException:
            self.sock.close()
            raise

    def _read_exact(self, size: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < size:
            chunk = self.sock.recv(size - len(chunks))
            if not chunk:
                raise ConnectionClosed("the kernel closed the connection")
            chunks += chunk
        return bytes(chunks)

    def _read_frame(self) -> bytes:
        (length,) = HEADER.unpack(self._read_exact(4))
        if length == 0 or length > DEFAULT_MAX_FRAME:
            raise IpcError(
                f"the kernel sent a frame of {length} bytes",
                why="a frame of that size is empty or over the protocol's limit: the stream is "
                "corrupt",
                fix="Retry; if it persists, restart the kernel with `fluffy stop` then `fluffy "
                "start`.",
            )
        return self._read_exact(length)

    def call(self, method: str, params: Any = None) -> Any:
        message_id = str(uuid.uuid4())
        frame = _request(message_id, method, params)
        try:
            self.sock.sendall(frame)
        except (BrokenPipeError, ConnectionResetError):  # not the CLI's own output's
            raise ConnectionClosed("the kernel closed the connection") from None
        while True:
            message = decode_message(self._read_frame())
            if message.type == "event":
                continue
            if message.id != message_id:
                continue
            if message.error is not None:
                raise_error(message.error)
            return message.result

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
