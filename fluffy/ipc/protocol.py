"""The wire protocol (design: IPC Wire Protocol), shared by the kernel and every client.

Frame: ``[4 bytes: payload length, uint32 big-endian][payload: UTF-8 JSON]``.  The first
frame on a connection is a :class:`HandshakeRequest`, answered by a
:class:`HandshakeResponse`; every later frame is an :class:`IpcMessage`.  docs/ipc.md is
the reference for third-party implementations.  Standard library + msgspec only (this
module runs inside L2 sandboxes too).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Annotated, Any, Literal

import msgspec

from fluffy._version import __version__
from fluffy.errors import FluffyError, FrameEmpty, FrameTooLarge, InvalidPayload

HEADER = struct.Struct(">I")
#: Default largest payload a peer may send (bytes); larger frames are refused unread.
DEFAULT_MAX_FRAME = 4 * 1024 * 1024
#: Ids of responses that answer no request: an error about the connection itself (then
#: the server closes it), and an error about a request whose id could not be read.
CONNECTION_ID = "connection"
UNKNOWN_ID = "unknown"
#: Syscall API versions: the kernel speaks [current - 1, current] (design: Version
#: Compatibility).  v0 is the floor of the window in the first release.
CURRENT_API_VERSION = 1
SUPPORTED_API_VERSIONS = (CURRENT_API_VERSION - 1, CURRENT_API_VERSION)
KERNEL_VERSION = __version__

MessageId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
MethodName = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]


class ErrorBody(msgspec.Struct, omit_defaults=True):
    """The design's ``IpcError``: machine code, human message, whether to retry."""

    code: str
    message: str
    retryable: bool = False
    # since API 1, optional (non-breaking): the parts of ``message``, for what/why/fix
    what: str = ""
    why: str = ""
    fix: str = ""


class IpcMessage(msgspec.Struct, omit_defaults=True):
    """Every frame after the handshake (design: ``IpcMessage``)."""

    id: MessageId
    type: Literal["request", "response", "event"]
    method: MethodName | None = None
    params: Any = None
    result: Any = None
    error: ErrorBody | None = None


class HandshakeRequest(msgspec.Struct):
    type: Literal["handshake"]
    plugin_name: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    plugin_version: Annotated[str, msgspec.Meta(max_length=64)]
    syscall_api_version: int


class HandshakeResponse(msgspec.Struct):
    type: Literal["handshake_ack"]
    kernel_version: str
    supported_api_versions: tuple[int, int]
    negotiated_api_version: int


_encoder = msgspec.json.Encoder()
_message_decoder = msgspec.json.Decoder(IpcMessage)
_handshake_decoder = msgspec.json.Decoder(HandshakeRequest)
_ack_decoder = msgspec.json.Decoder(HandshakeResponse)


def to_json(value: Any) -> bytes:
    """``value`` as JSON, encoded as a frame's payload encodes it."""
    return _encoder.encode(value)


def encode(message: msgspec.Struct | dict[str, Any]) -> bytes:
    """One frame: length prefix + JSON."""
    payload = _encoder.encode(message)
    return HEADER.pack(len(payload)) + payload


def error_body(error: FluffyError) -> ErrorBody:
    why = f" ({error.why})" if error.why else ""
    fix = f" Fix: {error.fix}" if error.fix else ""
    return ErrorBody(
        error.code,
        error.what + why + fix,
        error.retryable,
        what=error.what,
        why=error.why or "",
        fix=error.fix or "",
    )


def error_response(message_id: str, error: FluffyError) -> bytes:
    return encode(IpcMessage(id=message_id, type="response", error=error_body(error)))


#: What a decoder raises for bytes that are not an acceptable payload (msgspec raises
#: both decode errors; deep nesting exhausts the recursion limit).
_UNDECODABLE = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)


def _refusal(exc: BaseException, what: str) -> InvalidPayload:
    """The :class:`InvalidPayload` a decoder's error ``exc`` stands for."""
    if isinstance(exc, msgspec.ValidationError):
        return InvalidPayload(f"invalid {what}: {exc}")
    if isinstance(exc, RecursionError):
        return InvalidPayload(f"{what} is nested too deeply")
    return InvalidPayload(f"{what} is not valid UTF-8 JSON: {exc}")


def _decode(decoder: msgspec.json.Decoder[Any], payload: bytes | memoryview, what: str) -> Any:
    try:
        return decoder.decode(payload)
    except _UNDECODABLE as exc:  # (ValidationError is a DecodeError)
        raise _refusal(exc, what) from None


def decode_message(payload: bytes | memoryview) -> IpcMessage:
    try:  # inline rather than through _decode: this runs for every frame
        message: IpcMessage = _message_decoder.decode(payload)
    except _UNDECODABLE as exc:
        raise _refusal(exc, "message") from None
    try:  # ids and methods are echoed back: they must be valid UTF-8 (no lone surrogates)
        if not message.id.isascii():  # (isascii is a flag of the string: no scan)
            message.id.encode("utf-8")
        if message.method is not None and not message.method.isascii():
            message.method.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidPayload("id and method must be valid Unicode text") from None
    return message


def decode_handshake(payload: bytes | memoryview) -> HandshakeRequest:
    request: HandshakeRequest = _decode(_handshake_decoder, payload, "handshake")
    return request


def decode_handshake_response(payload: bytes | memoryview) -> HandshakeResponse | IpcMessage:
    """The kernel's answer: an ack, or an error message (then the kernel closes)."""
    try:
        ack: HandshakeResponse = _ack_decoder.decode(payload)
        return ack
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError):
        return decode_message(payload)


class FrameReader:
    """Incremental frame parser: feed bytes, get complete payloads.

    Refuses an empty or oversized frame as soon as its 4-byte header is seen, before any
    buffer for the payload exists.  After a refusal the stream cannot be re-synchronised:
    the caller closes the connection.
    """

    __slots__ = ("_buffer", "max_frame")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self._buffer = bytearray()
        self.max_frame = max_frame

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held (0 between frames)."""
        return len(self._buffer)

    def whole(self, data: bytes) -> bytes | None:
        """``data``'s payload when it is exactly one acceptable frame and nothing is held
        (a client that waits for each answer sends one per read): no buffer, no
        generator.  None otherwise, and :meth:`feed` takes it (and refuses what it must)."""
        if self._buffer or len(data) < 4:
            return None
        (length,) = HEADER.unpack_from(data)
        if len(data) != 4 + length or length == 0 or length > self.max_frame:
            return None
        return data[4:]

    def feed(self, data: bytes) -> Iterator[bytes]:
        buffer = self._buffer
        buffer += data
        while len(buffer) >= 4:
            (length,) = HEADER.unpack_from(buffer)
            if length == 0:
                raise FrameEmpty("empty frame (length 0)")
            if length > self.max_frame:
                raise FrameTooLarge(
                    f"frame of {length} bytes exceeds the maximum of {self.max_frame} bytes"
                )
            end = 4 + length
            if len(buffer) < end:
                return
            payload = bytes(buffer[4:end])
            del buffer[:end]
            yield payload


def negotiate(requested: int) -> int:
    """The version to speak, or :class:`VersionUnsupported` naming the range."""
    from fluffy.errors import VersionUnsupported

    low, high = SUPPORTED_API_VERSIONS
    if low <= requested <= high:
        return requested
    raise VersionUnsupported(
        f"syscall API version {requested} is not supported; this kernel speaks "
        f"versions {low} to {high}",
        why=f"the kernel supports [{low}, {high}] (the latest two versions)",
        fix=f"Request a version from {low} to {high}.",
    )
