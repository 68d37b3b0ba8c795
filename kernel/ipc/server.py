"""The kernel's IPC server: asyncio, Unix sockets, a closed method table.

One :class:`KernelServer` serves any number of listening sockets.  Each listener carries
a *binding*: the identity every connection on it has (``"cli"`` for the kernel's main
socket, a sandbox id for a per-sandbox socket).  Connections must handshake first; then
requests run concurrently (sync handlers inline, async ones as tasks) and are answered
by id; the server may push events.

Hostile input is refused with a structured error or a clean close and counted in
:attr:`KernelServer.stats`; nothing a peer sends can stop the server serving others.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fluffy.errors import (
    DuplicateId,
    FluffyError,
    HandshakeRequired,
    InternalError,
    InvalidPayload,
    IpcError,
    PeerRejected,
    ReadTimeout,
    TooManyConnections,
    UnknownMethod,
)
from fluffy.ipc.protocol import (
    CONNECTION_ID,
    DEFAULT_MAX_FRAME,
    KERNEL_VERSION,
    SUPPORTED_API_VERSIONS,
    UNKNOWN_ID,
    FrameReader,
    HandshakeResponse,
    IpcMessage,
    decode_handshake,
    decode_message,
    encode,
    error_response,
    negotiate,
)
from fluffy.ipc.transport import PeerCredentials, PeerIdentity, container_of_pid, peer_identity

log = logging.getLogger("fluffy.kernel.ipc")


@dataclass(frozen=True)
class Limits:
    max_frame: int = DEFAULT_MAX_FRAME
    max_connections: int = 1024
    frame_deadline_s: float = 5.0  # a started frame must complete within this
    handshake_deadline_s: float = 10.0  # the handshake must arrive within this
    max_in_flight: int = 256  # per connection; reading pauses above it
    handshake_max_frame: int = 4096  # a handshake is ~150 bytes; nothing bigger before it
    max_write_buffer: int = 8 * 1024 * 1024  # a peer that never reads is cut off here


@dataclass
class CallContext:
    """What a handler knows about its caller."""

    binding: str
    peer: PeerIdentity
    plugin_name: str
    plugin_version: str
    api_version: int
    server: KernelServer
    connection: _Connection

    _container_id: str | None = None
    _container_known: bool = False

    @property
    def container_id(self) -> str | None:
        """The container of the peer's pid, where the pid is visible (not across pid ns).

        Read once per connection: a connection's peer process does not change.
        """
        if not self._container_known:
            self._container_id = container_of_pid(self.peer.pid)
            self._container_known = True
        return self._container_id

    def send_event(self, method: str, params: Any = None) -> None:
        self.connection.send_event(method, params)


Handler = Callable[[CallContext, Any], Any]

#: Methods the audit observer does not see (health checks).
UNAUDITED = frozenset({"kernel.ping"})


@dataclass(frozen=True)
class CallRecord:
    """One request the kernel received, as the audit log records it."""

    method: str
    request_id: str
    params: Any
    binding: str
    plugin_name: str
    peer: PeerIdentity
    container_id: str | None
    result: Any
    error: FluffyError | None
    duration_ms: float
    decision: str
    rule: str | None
    reason: str | None
    policy_request: dict[str, Any] | None = None


Observer = Callable[[CallRecord], None]
_Noted = tuple[str, str | None, str | None, dict[str, Any] | None]
_decision: ContextVar[_Noted | None] = ContextVar("fluffy_decision", default=None)


def note_decision(
    decision: str,
    rule: str | None = None,
    reason: str | None = None,
    request: dict[str, Any] | None = None,
) -> None:
    """Called by the policy layer inside a handler: the audit entry carries this decision.

    ``request`` is the policy request as data, so that a later policy change can be
    tried on what the log recorded (meta-policy).
    """
    _decision.set((decision, rule, reason, request))


@dataclass
class Listener:
    path: Path
    binding: str
    allowed_uids: frozenset[int] | None
    server: asyncio.AbstractServer


@dataclass
class KernelServer:
    methods: Mapping[str, Handler]
    limits: Limits = field(default_factory=Limits)
    stats: collections.Counter[str] = field(default_factory=collections.Counter)
    listeners: list[Listener] = field(default_factory=list)
    connections: set[_Connection] = field(default_factory=set)
    credentials: PeerCredentials = peer_identity
    observer: Observer | None = None
    audit_head: Callable[[], dict[str, Any] | None] | None = None
    memory: Callable[[], dict[str, Any]] | None = None
    #: the scheduler's figures (limits, running and queued by template and priority)
    scheduler: Callable[[], dict[str, Any]] | None = None

    async def listen(
        self,
        path: Path,
        *,
        binding: str = "cli",
        allowed_uids: frozenset[int] | None = None,
        mode: int = 0o600,
        owner: tuple[int, int] | None = None,
        folder_mode: int = 0o700,
    ) -> Listener:
        """Listen on ``path``; every connection there gets ``binding`` as its identity.

        ``owner`` gives the socket (and accepts its folder) to another uid: a sandbox's
        own socket belongs to the sandbox user, in a 0700 folder of that user, inside the
        kernel's private state folder.
        """
        _private_dir(path.parent, owner[0] if owner else None, folder_mode)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        loop = asyncio.get_running_loop()
        binding_uids = allowed_uids

        def factory() -> _Connection:
            return _Connection(self, binding, binding_uids)

        # The folder is 0700 (or the sandbox's own): the socket is unreachable by others
        # between bind and chmod.  (No umask games: umask is process-wide.)  It is bound
        # under a short temporary name and renamed into place once it listens, so a
        # client that sees the path never meets a bound-but-not-listening socket.
        staging = path.with_name(f".{len(self.listeners)}.s")
        with contextlib.suppress(FileNotFoundError):
            staging.unlink()
        server = await loop.create_unix_server(factory, str(staging), backlog=512)
        if owner is not None:
            os.chown(staging, *owner)
        staging.chmod(mode)
        staging.replace(path)
        listener = Listener(path, binding, allowed_uids, server)
        self.listeners.append(listener)
        return listener

    async def close(self) -> None:
        for listener in self.listeners:
            listener.server.close()
        for connection in list(self.connections):
            connection.close()
        for listener in self.listeners:
            with contextlib.suppress(Exception):
                await listener.server.wait_closed()
            with contextlib.suppress(FileNotFoundError):
                listener.path.unlink()
        self.listeners.clear()

    def count(self, what: str) -> None:
        self.stats[what] += 1


class _Connection(asyncio.Protocol):
    """One client connection (asyncio protocol: no stream overhead per frame)."""

    def __init__(self, server: KernelServer, binding: str, allowed: frozenset[int] | None):
        self.server = server
        self.binding = binding
        self.allowed = allowed
        self.limits = server.limits
        self.reader = FrameReader(self.limits.handshake_max_frame)
        self.writing_paused = False
        self.transport: asyncio.Transport | None = None
        self.peer = PeerIdentity(0, -1, -1)
        self.context: CallContext | None = None
        self.in_flight: dict[str, asyncio.Task[None] | None] = {}
        self.deadline: asyncio.TimerHandle | None = None
        self.closing = False
        self.paused = False

    # -- connection ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        server = self.server
        server.count("connections")
        if len(server.connections) >= self.limits.max_connections:
            self.fail(TooManyConnections(f"limit of {self.limits.max_connections} reached"))
            return
        server.connections.add(self)
        sock: socket.socket | None = transport.get_extra_info("socket")
        if sock is not None:
            self.peer = self.server.credentials(sock)
        if self.allowed is not None and self.peer.uid not in self.allowed:
            self.fail(PeerRejected(f"uid {self.peer.uid} may not use this socket"))
            return
        self.arm(self.limits.handshake_deadline_s, "handshake")

    def eof_received(self) -> bool:
        if self.transport is not None:
            self.transport.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.reader.pending and not self.closing:
            self.server.count("ipc.frame_truncated")  # the peer hung up inside a frame
        self.closing = True
        self.server.connections.discard(self)
        self.disarm()
        for task in self.in_flight.values():
            if task is not None:
                task.cancel()
        self.in_flight.clear()

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def fail(self, error: IpcError, message_id: str = CONNECTION_ID) -> None:
        """Send one structured error, then close (used when the stream cannot go on).

        The write side is shut first and whatever the peer still sends is discarded for a
        moment, so that the peer reads the error instead of a connection reset.
        """
        self.server.count(error.code)
        self.observe(None, time.perf_counter(), error=error, method="(connection)")
        transport = self.transport
        self.closing = True
        self.disarm()
        if transport is None or transport.is_closing():
            return
        transport.write(error_response(message_id, error))
        if transport.can_write_eof():
            transport.write_eof()
            self.deadline = asyncio.get_running_loop().call_later(1.0, transport.abort)
        else:
            transport.close()

    # -- deadlines -----------------------------------------------------------------
    def arm(self, seconds: float, what: str) -> None:
        self.disarm()
        loop = asyncio.get_running_loop()
        self.deadline = loop.call_later(seconds, self.expired, seconds, what)

    def disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def expired(self, seconds: float, what: str) -> None:
        self.deadline = None
        self.fail(ReadTimeout(f"no complete {what} frame within {seconds:g} s"))

    # -- reading -------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        progressed = False
        try:
            for payload in self.reader.feed(data):
                progressed = True
                self.handle(payload)
                if self.is_closing():
                    return
        except IpcError as error:  # framing broken: cannot resynchronise
            self.fail(error)
            return
        except Exception:  # a bug in the server must cost one connection, never the kernel
            log.exception("IPC connection failed")
            self.fail(InternalError("the kernel could not process this connection's input"))
            return
        if self.context is not None:
            if not self.reader.pending:
                self.disarm()
            elif self.deadline is None or progressed:  # the deadline is per frame
                self.arm(self.limits.frame_deadline_s, "request")

    def handle(self, payload: bytes) -> None:
        if self.context is None:
            self.handshake(payload)
            return
        try:
            message = decode_message(payload)
        except InvalidPayload as error:
            self.server.count(error.code)
            self.write(error_response(_guess_id(payload), error))
            self.observe(
                None, time.perf_counter(), error=error, method="(invalid frame)", raw=payload
            )
            return
        if message.id in (CONNECTION_ID, UNKNOWN_ID):
            problem = InvalidPayload(f"the id {message.id!r} is reserved for server errors")
            self.server.count(problem.code)
            self.write(error_response(UNKNOWN_ID, problem))
            return
        if message.type != "request" or message.method is None:
            problem = InvalidPayload(
                f"a client sends requests only (type 'request' with a method), got "
                f"type {message.type!r}"
            )
            self.server.count(problem.code)
            self.write(error_response(message.id, problem))
            return
        self.dispatch(message)

    def handshake(self, payload: bytes) -> None:
        try:
            request = decode_handshake(payload)
        except InvalidPayload as error:
            self.fail(HandshakeRequired(f"the first frame was not a handshake: {error.what}"))
            return
        try:
            version = negotiate(request.syscall_api_version)
        except IpcError as error:
            self.fail(error)
            return
        self.disarm()
        self.context = CallContext(
            binding=self.binding,
            peer=self.peer,
            plugin_name=request.plugin_name,
            plugin_version=request.plugin_version,
            api_version=version,
            server=self.server,
            connection=self,
        )
        self.server.count("handshakes")
        self.reader.max_frame = self.limits.max_frame
        self.write(
            encode(
                HandshakeResponse(
                    type="handshake_ack",
                    kernel_version=KERNEL_VERSION,
                    supported_api_versions=SUPPORTED_API_VERSIONS,
                    negotiated_api_version=version,
                )
            )
        )

    # -- dispatch ------------------------------------------------------------------
    def observe(
        self,
        message: IpcMessage | None,
        started: float,
        result: Any = None,
        error: FluffyError | None = None,
        method: str | None = None,
        raw: bytes | None = None,
        handled: bool = False,
    ) -> None:
        """Hand the finished call to the audit observer (never lets it break serving)."""
        observer = self.server.observer
        method = method or (message.method if message is not None else None) or ""
        if observer is None or method in UNAUDITED:
            return
        # only a handler notes a decision; anything else ignores the variable, which a
        # transport callback may have inherited from an earlier handler's context
        noted = _decision.get() if handled else None
        if noted is None:
            denied = error is not None and error.code.startswith(("policy.", "ipc.", "workflow."))
            noted = (
                ("denied", "kernel.method_table", error.what if error else None, None)
                if denied
                else ("allowed", "kernel.method_table", None, None)
            )
        context = self.context
        try:
            observer(
                CallRecord(
                    method=method,
                    request_id=message.id
                    if message is not None
                    else (_guess_id(raw) if raw is not None else CONNECTION_ID),
                    params=message.params
                    if message is not None
                    else (raw[:200].decode("utf-8", "replace") if raw is not None else None),
                    binding=self.binding,
                    plugin_name=context.plugin_name if context else "",
                    peer=self.peer,
                    container_id=context.container_id if context else None,
                    result=result,
                    error=error,
                    duration_ms=(time.perf_counter() - started) * 1000,
                    decision=noted[0],
                    rule=noted[1],
                    reason=noted[2],
                    policy_request=noted[3],
                )
            )
        except Exception:
            log.exception("the audit observer failed for %s", method)

    def dispatch(self, message: IpcMessage) -> None:
        server = self.server
        started = time.perf_counter()
        if message.id in self.in_flight:
            error: IpcError = DuplicateId(f"request id {message.id!r} is already in flight")
            server.count(error.code)
            self.write(error_response(message.id, error))
            self.observe(message, started, error=error)
            return
        method = message.method or ""
        handler = server.methods.get(method)
        if handler is None:
            error = UnknownMethod(
                f"unknown method {method!r}; methods: {', '.join(sorted(server.methods))}"
            )
            server.count(error.code)
            self.write(error_response(message.id, error))
            self.observe(message, started, error=error)
            return
        server.count("requests")
        assert self.context is not None
        if inspect.iscoroutinefunction(handler):
            self.in_flight[message.id] = None
            task = asyncio.ensure_future(self.run_async(handler, message))
            if message.id in self.in_flight:
                self.in_flight[message.id] = task
            if len(self.in_flight) >= self.limits.max_in_flight and not self.paused:
                self.paused = True
                assert self.transport is not None
                self.transport.pause_reading()
            return
        token = _decision.set(None)
        result, failed = None, None
        try:
            result = handler(self.context, message.params)
            reply = encode(IpcMessage(id=message.id, type="response", result=result))
        except Exception as exc:  # every failure becomes a response
            reply, failed = self.failure(message.id, method, exc)
        self.write(reply)
        self.observe(message, started, result, failed, handled=True)
        _decision.reset(token)

    async def run_async(self, handler: Handler, message: IpcMessage) -> None:
        started = time.perf_counter()
        _decision.set(None)  # this task's own copy of the context
        result, failed = None, None
        try:
            result = await handler(self.context, message.params)  # type: ignore[arg-type]
            reply = encode(IpcMessage(id=message.id, type="response", result=result))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            reply, failed = self.failure(message.id, message.method or "", exc)
        finally:
            self.in_flight.pop(message.id, None)
            if self.paused and len(self.in_flight) < self.limits.max_in_flight // 2:
                self.paused = False
                if self.transport is not None and not self.closing and not self.writing_paused:
                    self.transport.resume_reading()
        self.write(reply)
        self.observe(message, started, result, failed, handled=True)

    def failure(self, message_id: str, method: str, exc: Exception) -> tuple[bytes, FluffyError]:
        if isinstance(exc, FluffyError):
            self.server.count(exc.code)
            return error_response(message_id, exc), exc
        log.exception("method %s failed", method)
        error = InternalError(f"{method} failed: {type(exc).__name__}")
        self.server.count(error.code)
        return error_response(message_id, error), error

    def write(self, frame: bytes) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(frame)
        if transport.get_write_buffer_size() > self.limits.max_write_buffer:
            self.server.count("ipc.write_buffer_full")
            log.warning("closing a connection that does not read its responses")
            transport.abort()

    # Back-pressure: while the peer does not read, stop reading its requests.
    def pause_writing(self) -> None:
        self.writing_paused = True
        if self.transport is not None and not self.paused:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self.transport is not None and not self.paused and not self.closing:
            self.transport.resume_reading()

    def send_event(self, method: str, params: Any = None) -> None:
        import uuid

        self.write(
            encode(IpcMessage(id=str(uuid.uuid4()), type="event", method=method, params=params))
        )


def _private_dir(folder: Path, owner: int | None = None, mode: int = 0o700) -> None:
    """The socket's folder must be ours (or the socket owner's, a sandbox's) with ``mode``
    (0700; 0711 only for a sandbox's folder that lives inside the kernel's private one)."""
    from fluffy.errors import ConfigError

    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = folder.stat()
    if info.st_uid not in (os.geteuid(), owner):
        raise ConfigError(
            f"the socket folder {folder} belongs to uid {info.st_uid}, not to the kernel",
            why="another user could replace or reach the kernel's socket",
            fix="Use a folder the kernel's user owns (or remove this one).",
        )
    if info.st_mode & 0o777 != mode:
        folder.chmod(mode)


def _guess_id(payload: bytes) -> str:
    """The id of a message that failed validation, if one can be read (for correlation)."""
    import msgspec

    try:
        data = msgspec.json.decode(payload)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return UNKNOWN_ID
    value = data.get("id") if isinstance(data, dict) else None
    if not isinstance(value, str) or not 0 < len(value) <= 128 or not _utf8(value):
        return UNKNOWN_ID
    return value


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a "\ud800" escape
        return False
    return True


AsyncHandler = Callable[[CallContext, Any], Awaitable[Any]]
