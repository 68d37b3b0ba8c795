"""Scripted fake LLM servers (OpenAI- and Anthropic-compatible) and a refusing proxy.

Each server is a real ``ThreadingHTTPServer`` on loopback (port 0, daemon thread), so
the adapters are tested over real HTTP: chunked transfer, SSE frames split across
network writes, keep-alive, abrupt disconnects.  It answers, in order of precedence:
pending :meth:`fail` failures, then ``respond(request_json)`` if given, then the next
scripted reply, then a final ``Reply("Done.")``.  Requests the real API would reject
(illegal tool names, a tool result answering nothing, roles that do not alternate, ...)
get a 400, so a formatting bug in an adapter fails loudly.

``host`` defaults to 127.0.0.1, which a container on the host network reaches too.
"""

from __future__ import annotations

import json
import socket
import socketserver
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.fakes.llm_wire import (
    Fail,
    Reply,
    Reset,
    anthropic_error,
    anthropic_frames,
    anthropic_json,
    anthropic_problems,
    openai_error,
    openai_frames,
    openai_json,
    openai_problems,
)

__all__ = [
    "Fail",
    "FakeAnthropicServer",
    "FakeOpenAIServer",
    "Recorded",
    "RefusingProxy",
    "Reply",
    "Reset",
]

Respond = Callable[[dict[str, Any]], "Reply | Fail | Reset"]


class _QuietHTTPServer(ThreadingHTTPServer):
    """Clients that hang up (dropped streams, closed pools) are normal here, not noise."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@dataclass(frozen=True)
class Recorded:
    """One request as the server saw it (header names lower-cased)."""

    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class _FakeLLMServer:
    """The common machinery; subclasses render the provider's formats."""

    path = "/"

    def __init__(
        self,
        replies: Iterable[Reply | Fail | Reset] = (),
        *,
        respond: Respond | None = None,
        api_key: str | None = None,
        model: str = "fake-model",
        chunk: int = 5,
        host: str = "127.0.0.1",
        check: bool = True,
    ) -> None:
        self.replies: list[Reply | Fail | Reset] = list(replies)
        self.respond = respond
        self.api_key = api_key  # when set, other keys get the provider's 401
        self.model = model
        self.chunk = chunk  # characters per streamed text/arguments piece
        self.check = check  # validate requests as the real API would
        self.requests: list[Recorded] = []
        self._failures: list[Fail] = []
        self._lock = threading.Lock()
        self._calls = 0
        self._httpd = _QuietHTTPServer((host, 0), self._handler())
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    # -- control -------------------------------------------------------------------------
    def __enter__(self) -> _FakeLLMServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def fail(self, status: int, *, times: int = 1, message: str = "scripted failure") -> None:
        """The next ``times`` requests get ``status``."""
        with self._lock:
            self._failures += [Fail(status, message)] * times

    def queue(self, *replies: Reply | Fail | Reset) -> None:
        with self._lock:
            self.replies += replies

    # -- what subclasses provide ---------------------------------------------------------
    def authorised(self, headers: dict[str, str]) -> tuple[bool, str]:
        raise NotImplementedError

    def problems(self, body: dict[str, Any]) -> list[str]:
        raise NotImplementedError

    def error_body(self, fail: Fail) -> dict[str, Any]:
        raise NotImplementedError

    def json_body(self, reply: Reply, call_ids: list[str]) -> dict[str, Any]:
        raise NotImplementedError

    def frames(self, reply: Reply, call_ids: list[str], body: dict[str, Any]) -> list[bytes]:
        raise NotImplementedError

    def call_id(self, n: int) -> str:
        raise NotImplementedError

    # -- serving -------------------------------------------------------------------------
    def _next(self, body: dict[str, Any]) -> Reply | Fail | Reset:
        with self._lock:
            if self._failures:
                return self._failures.pop(0)
        if self.respond is not None:
            return self.respond(body)
        with self._lock:
            return self.replies.pop(0) if self.replies else Reply(text="Done.")

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("content-length") or 0)
        raw = handler.rfile.read(length)
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            body = {"_unparsable": raw.decode("utf-8", "replace")}
        headers = {k.lower(): v for k, v in handler.headers.items()}
        with self._lock:
            self.requests.append(Recorded(handler.command, handler.path, headers, body))
        if handler.path != self.path:
            self._send_json(handler, 404, self.error_body(Fail(404, f"no route {handler.path}")))
            return
        ok, given = self.authorised(headers)
        if not ok:
            message = f"Incorrect API key provided: {given}"  # real providers echo it
            self._send_json(handler, 401, self.error_body(Fail(401, message)))
            return
        problems = self.problems(body) if self.check else []
        if problems:
            self._send_json(handler, 400, self.error_body(Fail(400, "; ".join(problems))))
            return
        reply = self._next(body)
        if isinstance(reply, Reset):
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            return
        if isinstance(reply, Fail):
            self._send_json(handler, reply.status, self.error_body(reply), reply.headers)
            return
        with self._lock:
            ids = [self.call_id(self._calls + k) for k in range(len(reply.calls))]
            self._calls += len(reply.calls)
        if body.get("stream"):
            frames = list(reply.raw) if reply.raw is not None else self.frames(reply, ids, body)
            self._send_stream(handler, reply, frames)
        elif reply.raw is not None:
            self._send_bytes(handler, 200, b"".join(reply.raw))
        else:
            self._send_json(handler, 200, self.json_body(reply, ids))

    @staticmethod
    def _send_json(
        handler: BaseHTTPRequestHandler,
        status: int,
        data: dict[str, Any],
        headers: dict[str, str] | None = None,
    ) -> None:
        _FakeLLMServer._send_bytes(handler, status, json.dumps(data).encode(), headers)

    @staticmethod
    def _send_bytes(
        handler: BaseHTTPRequestHandler,
        status: int,
        payload: bytes,
        headers: dict[str, str] | None = None,
    ) -> None:
        handler.send_response(status)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", str(len(payload)))
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(payload)

    @staticmethod
    def _send_stream(handler: BaseHTTPRequestHandler, reply: Reply, frames: list[bytes]) -> None:
        if reply.malformed:
            frames.insert(len(frames) // 2, b'data: {"choices": [\n\n')
        handler.send_response(200)
        handler.send_header("content-type", "text/event-stream")
        handler.send_header("cache-control", "no-cache")
        handler.send_header("transfer-encoding", "chunked")
        handler.end_headers()

        def write(data: bytes) -> None:
            handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            handler.wfile.flush()

        for n, frame in enumerate(frames):
            if reply.drop_after is not None and n >= reply.drop_after:
                # an abrupt end: no terminating chunk, the socket just closes
                handler.close_connection = True
                handler.connection.shutdown(socket.SHUT_RDWR)
                return
            half = max(1, len(frame) // 2)  # every event split across two network writes
            write(frame[:half])
            if frame[half:]:
                write(frame[half:])
        handler.wfile.write(b"0\r\n\r\n")
        handler.wfile.flush()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                server._answer(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


class FakeOpenAIServer(_FakeLLMServer):
    """``POST /v1/chat/completions``; ``base_url`` ends in ``/v1`` as clients expect."""

    path = "/v1/chat/completions"

    @property
    def base_url(self) -> str:
        return super().base_url + "/v1"

    def __enter__(self) -> FakeOpenAIServer:
        super().__enter__()
        return self

    def authorised(self, headers: dict[str, str]) -> tuple[bool, str]:
        given = headers.get("authorization", "").removeprefix("Bearer ")
        return self.api_key is None or given == self.api_key, given

    def problems(self, body: dict[str, Any]) -> list[str]:
        return openai_problems(body)

    def error_body(self, fail: Fail) -> dict[str, Any]:
        return openai_error(fail)

    def json_body(self, reply: Reply, call_ids: list[str]) -> dict[str, Any]:
        return openai_json(reply, self.model, call_ids)

    def frames(self, reply: Reply, call_ids: list[str], body: dict[str, Any]) -> list[bytes]:
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return openai_frames(reply, self.model, call_ids, self.chunk, usage)

    def call_id(self, n: int) -> str:
        return f"call_fake{n}"


class FakeAnthropicServer(_FakeLLMServer):
    """``POST /v1/messages``; ``base_url`` is the host, as for api.anthropic.com."""

    path = "/v1/messages"

    def __enter__(self) -> FakeAnthropicServer:
        super().__enter__()
        return self

    def authorised(self, headers: dict[str, str]) -> tuple[bool, str]:
        given = headers.get("x-api-key", "")
        return self.api_key is None or given == self.api_key, given

    def problems(self, body: dict[str, Any]) -> list[str]:
        return anthropic_problems(body)

    def error_body(self, fail: Fail) -> dict[str, Any]:
        return anthropic_error(fail)

    def json_body(self, reply: Reply, call_ids: list[str]) -> dict[str, Any]:
        return anthropic_json(reply, self.model, call_ids)

    def frames(self, reply: Reply, call_ids: list[str], body: dict[str, Any]) -> list[bytes]:
        return anthropic_frames(reply, self.model, call_ids, self.chunk)

    def call_id(self, n: int) -> str:
        return f"toolu_fake{n}"


class RefusingProxy:
    """An HTTP proxy that refuses every CONNECT with 403, as the kernel's does for a host
    outside ``network_whitelist``.  ``.url`` is for ``httpx.Client(proxy=...)``."""

    def __init__(self, *, host: str = "127.0.0.1") -> None:
        self.request_lines: list[str] = []
        proxy = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                line = self.rfile.readline().decode("latin-1").strip()
                proxy.request_lines.append(line)
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                self.wfile.write(
                    b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                )

        self._server = socketserver.ThreadingTCPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> RefusingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
