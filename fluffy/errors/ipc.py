"""Errors of the IPC protocol (their codes are on the wire; docs/ipc.md)."""

from __future__ import annotations

from fluffy.errors.tree import FluffyError


class IpcError(FluffyError):
    """The IPC protocol refused a frame or a connection (codes are on the wire)."""

    code = "ipc.error"
    default_fix = "Follow docs/ipc.md: handshake first, one JSON message per length-prefixed frame."


class FrameEmpty(IpcError):
    code = "ipc.frame_empty"
    default_why = "a frame's length prefix was 0; every frame carries one JSON message"


class FrameTooLarge(IpcError):
    code = "ipc.frame_too_large"
    default_why = "the length prefix exceeds the server's maximum frame size"
    default_fix = "Send smaller messages (large contents go through output volumes)."


class FrameTruncated(IpcError):
    code = "ipc.frame_truncated"
    default_why = "the connection ended inside a frame"


class InvalidPayload(IpcError):
    code = "ipc.invalid_payload"
    default_why = "the frame is not valid UTF-8 JSON of the expected message shape"


class HandshakeRequired(IpcError):
    code = "ipc.handshake_required"
    default_why = "the first frame of every connection must be a handshake"
    default_fix = (
        'Send {"type": "handshake", "plugin_name", "plugin_version", "syscall_api_version"} first.'
    )


class VersionUnsupported(IpcError):
    code = "ipc.version_unsupported"
    default_fix = "Use a syscall API version inside the supported range, or upgrade."


class UnknownMethod(IpcError):
    code = "ipc.unknown_method"
    default_why = "the kernel's method table is closed; nothing was run"
    default_fix = "Call one of the methods the message lists (docs/ipc.md, method table)."


class DuplicateId(IpcError):
    code = "ipc.duplicate_id"
    default_why = "a request with the same id is still in flight on this connection"
    default_fix = "Give every request a fresh id (UUIDv4)."


class ReadTimeout(IpcError):
    code = "ipc.read_timeout"
    retryable = True
    default_why = "a frame did not arrive completely within the read deadline"


class TooManyConnections(IpcError):
    code = "ipc.too_many_connections"
    retryable = True
    default_why = "the server is at its connection limit"
    default_fix = "Close idle connections, or retry later."


class PeerRejected(IpcError):
    code = "ipc.peer_rejected"
    default_why = "the peer's credentials (SO_PEERCRED) are not allowed on this socket"
    default_fix = "Connect as the user this socket serves (a sandbox's socket serves that sandbox)."


class ConnectionClosed(IpcError):
    code = "ipc.connection_closed"
    retryable = True
    default_why = "the other side closed the connection"
    default_fix = "Reconnect (and handshake again)."


class InternalError(IpcError):
    code = "ipc.internal"
    retryable = True
    default_why = "the kernel failed while handling the request; it keeps serving"
    default_fix = "Retry; if it persists, report it with the kernel's log."
