"""The CONNECT proxy's cost per fresh HTTPS connection, and loopback servers to measure it.

``measure_proxy_overhead(n)`` runs, in one process and one run:

- an HTTPS server on 127.0.0.1 (a self-signed certificate made with the ``openssl`` CLI);
- the kernel's :class:`~fluffy.kernel.net.proxy.ConnectProxy` on a Unix socket, in its
  own asyncio loop in a thread (audit: an in-memory list);
- the sandbox's :class:`~fluffy.sandboxes.ai.forwarder.Forwarder` on 127.0.0.1.

Each sample is a fresh connection: TCP connect, (CONNECT through forwarder and proxy,)
TLS handshake, ``GET /``, read to the end.  Direct and proxied samples alternate so the
machine's drift hits both alike.  Keys: direct_p50_ms/_p90_ms/_p99_ms, via_proxy_p50_ms/
_p90_ms/_p99_ms, direct_per_s, via_proxy_per_s, proxy_overhead_p50_ms (target <= 5 ms).

The servers and the proxy thread are reused by tests/unit/kernel/net/test_net_proxy.py and
tests/unit/sandboxes/ai/test_ai_transport.py.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from benchmarks._stats import percentile
from fluffy.kernel.net.allowlist import AllowList
from fluffy.kernel.net.proxy import ConnectProxy, ProxyRecord
from fluffy.sandboxes.ai.forwarder import Forwarder


def make_cert(folder: Path) -> tuple[Path, Path]:
    """A self-signed P-256 certificate for localhost and 127.0.0.1: (cert, key)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("the openssl command is needed to make a test certificate")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2",
            "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = f"hello from {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(size)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client refusing our certificate is a test's point, not noise


@contextmanager
def loopback_server(tls: tuple[Path, Path] | None = None) -> Iterator[int]:
    """An HTTP(S) server on 127.0.0.1 in a thread: GET echoes the path, POST the body."""
    server = _Server(("127.0.0.1", 0), _Handler)
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(tls[0]), str(tls[1]))
        # the handshake happens in the request's thread, not in the accepting one
        server.socket = context.wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class ProxyThread:
    """A :class:`ConnectProxy` in its own event loop thread, driven from sync code."""

    def __init__(self, allow: list[str], **options: Any) -> None:
        self.records: list[ProxyRecord] = []
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

        async def audit(record: ProxyRecord) -> None:
            self.records.append(record)

        async def build() -> ConnectProxy:
            return ConnectProxy(AllowList.from_entries(allow), audit, **options)

        self.proxy = self.call(build())

    def call(self, coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout=10)

    def start(self, path: Path, tag: str = "bench") -> Path:
        self.call(self.proxy.start(path, tag=tag))
        return path

    def close(self) -> None:
        self.call(self.proxy.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.loop.close()


def _get(sock: socket.socket, context: ssl.SSLContext) -> bytes:
    with context.wrap_socket(sock, server_hostname="localhost") as tls:
        tls.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        chunks = []
        while chunk := tls.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _direct(port: int, context: ssl.SSLContext) -> bytes:
    return _get(socket.create_connection(("127.0.0.1", port)), context)


def _via(forwarder_port: int, port: int, context: ssl.SSLContext) -> bytes:
    sock = socket.create_connection(("127.0.0.1", forwarder_port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)  # byte by byte: nothing of the tunnel may be swallowed
        if not chunk:
            raise RuntimeError("the proxy closed during CONNECT")
        head += chunk
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"the proxy refused: {head!r}")
    return _get(sock, context)


def _summary(prefix: str, samples: list[float], total_s: float) -> dict[str, float]:
    return {
        f"{prefix}_p50_ms": round(percentile(samples, 0.50), 3),
        f"{prefix}_p90_ms": round(percentile(samples, 0.90), 3),
        f"{prefix}_p99_ms": round(percentile(samples, 0.99), 3),
        f"{prefix}_per_s": round(len(samples) / total_s, 1),
    }


@contextmanager
def gate_dialler(folder: Path, allow: list[str]) -> Iterator[Path]:
    """The engine gate's dialler (fluffy.gate.net) on a real Unix socket, in a thread."""
    from fluffy.gate.net import Dialler

    rules = [[r.host, r.port, r.wildcard] for r in AllowList.from_entries(allow).rules]
    (folder / "net.json").write_text(json.dumps({"rules": rules}))
    server = Dialler(folder / "net.sock", folder / "net.json", lambda *_: None)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield folder / "net.sock"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def measure_proxy_overhead(n: int = 200, warmup: int = 10) -> dict[str, Any]:
    """Fresh HTTPS connections, direct vs through forwarder + kernel proxy (see above),
    and through the proxy as it runs in L1: its upstream dialled by the gate's dialler."""
    from fluffy.kernel.net.dial import gate_dial

    with ExitStack() as stack:
        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="fluffy-proxy-"))
        cert, key = make_cert(Path(folder))
        context = ssl.create_default_context(cafile=str(cert))
        with loopback_server((cert, key)) as port:
            allow = [f"127.0.0.1:{port}"]
            net = stack.enter_context(gate_dialler(Path(folder), allow))
            proxy = ProxyThread(allow)
            gated = ProxyThread(allow, dial=lambda h, p, t: gate_dial(str(net), h, p, t))
            try:
                path = proxy.start(Path(folder) / "proxy.sock")
                gated_path = gated.start(Path(folder) / "gated.sock")
                with Forwarder(str(path)) as forwarder, Forwarder(str(gated_path)) as via_gate:
                    runs: dict[str, Callable[[], bytes]] = {
                        "direct": lambda: _direct(port, context),
                        "via_proxy": lambda: _via(forwarder.port, port, context),
                        "via_gate": lambda: _via(via_gate.port, port, context),
                    }
                    samples: dict[str, list[float]] = {name: [] for name in runs}
                    totals = dict.fromkeys(runs, 0.0)
                    for i in range(warmup + n):
                        for name, fn in runs.items():
                            t0 = time.perf_counter()
                            body = fn()
                            elapsed = time.perf_counter() - t0
                            if not body.endswith(b"hello from /"):
                                raise RuntimeError(f"{name}: unexpected answer {body[-80:]!r}")
                            if i >= warmup:
                                samples[name].append(elapsed * 1000)
                                totals[name] += elapsed
            finally:
                proxy.close()
                gated.close()
    result: dict[str, Any] = {"n": n}
    for name in runs:
        result.update(_summary(name, samples[name], totals[name]))
    result["proxy_overhead_p50_ms"] = round(result["via_proxy_p50_ms"] - result["direct_p50_ms"], 3)
    # what L1's lack of a network costs per tunnel: the gate's round trip and fd pass
    result["gate_dial_p50_ms"] = round(result["via_gate_p50_ms"] - result["via_proxy_p50_ms"], 3)
    result["tunnels_audited"] = sum(1 for r in proxy.records if r.phase == "close")
    return result
