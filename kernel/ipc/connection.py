"""One client connection to the kernel's IPC server: framing, handshake, dispatch.

An asyncio protocol (no stream overhead per frame): it reads frames, requires the
handshake first, runs requests concurrently (sync handlers inline, async ones as tasks),
answers them by id, enforces the per-frame deadlines and back-pressure, and hands every
finished call to the server's audit observer.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import TYPE_CHECKING, Any

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
)
from fluffy.ipc.protocol import (
    CONNECTION_ID,
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
from fluffy.ipc.transport import PeerIdentity
from fluffy.kernel.ipc import syscalls
from fluffy.kernel.ipc.context import UNAUDITED, CallContext, CallRecord, Handler, decision_var
from fluffy.pathnames import is_utf8

if TYPE_CHECKING:
    from fluffy.kernel.ipc.server import KernelServer
    from fluffy.kernel.ipc.syscalls import Syscall

log = logging.getLogger("fluffy.kernel.ipc")


class Connection(asyncio.Protocol):
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
            whole = self.reader.whole(data)  # one request in one read: the usual case
            for payload in (whole,) if whole is not None else self.reader.feed(data):
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
                if self.deadline is not None:
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
        noted = decision_var.get() if handled else None
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
        syscall = server.table.syscall(method)
        if syscall is None:
            self.refuse(message, started)
            return
        server.count("requests")
        assert self.context is not None
        try:  # the caller and the params are checked before any handler runs
            params = syscall.accept(self.context, message.params)
        except Exception as exc:
            reply, refused = self.failure(message.id, method, exc)
            self.write(reply)
            self.observe(message, started, error=refused)
            return
        handler: Handler = syscall.handler
        if syscall.is_async:
            self.in_flight[message.id] = None
            task = asyncio.ensure_future(self.run_async(syscall, message, params))
            if message.id in self.in_flight:
                self.in_flight[message.id] = task
            if len(self.in_flight) >= self.limits.max_in_flight and not self.paused:
                self.paused = True
                assert self.transport is not None
                self.transport.pause_reading()
            return
        # a health check (UNAUDITED) notes no decision and is not recorded: neither the
        # context variable nor the observer is touched for it
        token = decision_var.set(None) if method not in UNAUDITED else None
        result, failed = None, None
        try:
            result = handler(self.context, params)
            if syscalls.CHECK_RESULTS:
                syscall.check_result(result)
            reply = encode(IpcMessage(id=message.id, type="response", result=result))
        except Exception as exc:  # every failure becomes a response
            reply, failed = self.failure(message.id, method, exc)
        self.write(reply)
        if token is not None:
            self.observe(message, started, result, failed, handled=True)
            decision_var.reset(token)

    def refuse(self, message: IpcMessage, started: float) -> None:
        """A name the table does not declare: its refusal (``ipc.unknown_method``, or
        the table's own, which may note the decision its audit entry carries)."""
        assert self.context is not None
        method = message.method or ""
        token = decision_var.set(None)
        try:
            self.server.table.refuse(self.context, method)
        except Exception as exc:
            reply, refused = self.failure(message.id, method, exc)
        self.write(reply)
        self.observe(message, started, error=refused, handled=True)
        decision_var.reset(token)

    async def run_async(self, syscall: Syscall[Any], message: IpcMessage, params: Any) -> None:
        started = time.perf_counter()
        decision_var.set(None)  # this task's own copy of the context
        result, failed = None, None
        try:
            result = await syscall.handler(self.context, params)  # type: ignore[arg-type]
            if syscalls.CHECK_RESULTS:
                syscall.check_result(result)
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


def _guess_id(payload: bytes) -> str:
    """The id of a message that failed validation, if one can be read (for correlation)."""
    import msgspec

    try:
        data = msgspec.json.decode(payload)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return UNKNOWN_ID
    value = data.get("id") if isinstance(data, dict) else None
    if not isinstance(value, str) or not 0 < len(value) <= 128 or not is_utf8(value):
        return UNKNOWN_ID
    return value
