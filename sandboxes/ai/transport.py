"""An httpx client that sends every request through the kernel's CONNECT proxy.

The ai-provider sandbox has no network: its only way out is the kernel's proxy, which
tunnels ``CONNECT host:port`` and nothing else.  httpx's own proxy support would send
plain ``http://`` requests in absolute form (``GET http://host/...``), which the proxy
refuses, so this module tunnels *every* origin, http and https alike: a
:class:`TunnelBackend` (an httpcore network backend) opens the proxy connection, asks
``CONNECT``, checks the answer and hands the raw stream to httpcore, which then speaks
HTTP/1.1 (and TLS, end to end) over it as if it had dialled the origin itself.

The proxy is ``unix:///run/fluffy/proxy.sock`` (the bind-mounted socket itself) or
``http://127.0.0.1:PORT`` (the in-sandbox :class:`~fluffy.sandboxes.ai.forwarder.Forwarder`
or any other CONNECT proxy).  A refusal raises :class:`ProxyRefused`, an
:class:`httpx.ProxyError` whose text starts with the proxy's status ("403 ...").
"""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

import httpcore
import httpx

#: The proxy's answer head (and a refusal's body) are read up to this many bytes.
MAX_PROXY_HEAD = 16 * 1024
MAX_PROXY_BODY = 4 * 1024
LIMITS = httpx.Limits(max_connections=10, max_keepalive_connections=5)
PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


class ProxyRefused(httpx.ProxyError):
    """The proxy answered CONNECT with something else than 200 (403: not allow-listed)."""

    def __init__(self, status: int, host: str, port: int, body: str) -> None:
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = "(unknown status)"
        said = body.strip() or "(no explanation)"
        if status == 403:
            what = f"{host}:{port} is not allow-listed (policy.yaml network_whitelist)"
        else:
            what = f"the proxy did not open a tunnel to {host}:{port}"
        super().__init__(f"{status} {phrase}: {what}; the proxy said: {said}")
        self.status = status
        self.host = host
        self.port = port
        self.body = body


@dataclass(frozen=True, slots=True)
class ProxyAddress:
    """Where the CONNECT proxy listens: a Unix socket path, or a TCP host and port."""

    unix_path: str | None = None
    host: str = ""
    port: int = 0

    @classmethod
    def parse(cls, url: str) -> ProxyAddress:
        parts = urlsplit(url)
        if parts.scheme == "unix":
            path = parts.path or parts.netloc
            if not path:
                raise ValueError(f"proxy URL {url!r} names no socket path")
            return cls(unix_path=path)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"proxy URL {url!r} is not http://HOST:PORT or unix:///PATH")
        return cls(host=parts.hostname, port=parts.port or 80)

    def __str__(self) -> str:
        return f"unix://{self.unix_path}" if self.unix_path else f"http://{self.host}:{self.port}"


class _Prefixed(httpcore.NetworkStream):
    """A stream that first returns bytes already read past the proxy's answer."""

    def __init__(self, inner: httpcore.NetworkStream, prefix: bytes) -> None:
        self._inner = inner
        self._prefix = prefix

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self._prefix:
            data, self._prefix = self._prefix[:max_bytes], self._prefix[max_bytes:]
            return data
        return self._inner.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        if self._prefix:
            raise httpcore.ProxyError("the target spoke before the TLS handshake")
        return self._inner.start_tls(ssl_context, server_hostname, timeout)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class TunnelBackend(httpcore.NetworkBackend):
    """httpcore's "dial host:port", done as a CONNECT through the proxy."""

    def __init__(self, proxy: ProxyAddress) -> None:
        self.proxy = proxy
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        if self.proxy.unix_path is not None:
            stream = self._inner.connect_unix_socket(self.proxy.unix_path, timeout)
        else:
            stream = self._inner.connect_tcp(self.proxy.host, self.proxy.port, timeout)
        try:
            return self._handshake(stream, host, port, timeout)
        except BaseException:
            stream.close()
            raise

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        raise httpcore.UnsupportedProtocol("only host:port origins go through the proxy")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def _handshake(
        self, stream: httpcore.NetworkStream, host: str, port: int, timeout: float | None
    ) -> httpcore.NetworkStream:
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        request = f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n"
        stream.write(request.encode("ascii"), timeout)
        buf = b""
        while b"\r\n\r\n" not in buf:
            if len(buf) > MAX_PROXY_HEAD:
                raise httpcore.ProxyError(f"the proxy's answer head exceeds {MAX_PROXY_HEAD} bytes")
            chunk = stream.read(MAX_PROXY_HEAD, timeout)
            if not chunk:
                raise httpcore.ProxyError(f"the proxy {self.proxy} closed without answering")
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise httpcore.ProxyError(f"the proxy's answer is not HTTP: {status_line[:80]!r}")
        status = int(parts[1])
        if status == 200:
            return _Prefixed(stream, rest) if rest else stream
        raise ProxyRefused(status, host, port, _read_body(stream, rest, header_lines, timeout))


def _read_body(
    stream: httpcore.NetworkStream, body: bytes, headers: list[str], timeout: float | None
) -> str:
    """A refusal's short explanation (Content-Length, else up to EOF), bounded."""
    length = MAX_PROXY_BODY
    for line in headers:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length" and value.strip().isdigit():
            length = min(int(value), MAX_PROXY_BODY)
    try:
        while len(body) < length:
            chunk = stream.read(length - len(body), timeout)
            if not chunk:
                break
            body += chunk
    except httpcore.NetworkError:
        pass
    return body[:length].decode("utf-8", "replace")


class TunnelTransport(httpx.HTTPTransport):
    """httpx's own transport (exception mapping, streaming) over a :class:`TunnelBackend`."""

    def __init__(
        self,
        proxy: ProxyAddress,
        ssl_context: ssl.SSLContext,
        limits: httpx.Limits = LIMITS,
    ) -> None:
        super().__init__(verify=ssl_context, trust_env=False, limits=limits)
        # httpx builds its pool without a network-backend hook; replace it (same class).
        self._pool.close()
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl_context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=TunnelBackend(proxy),
        )


def proxy_from_env(environ: dict[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    for name in PROXY_ENV:
        if env.get(name):
            return env[name]
    return None


def make_ssl_context(ca_file: str | None = None) -> ssl.SSLContext:
    """certifi's roots (or ``SSL_CERT_FILE``/``SSL_CERT_DIR``), plus ``ca_file`` if given."""
    context = httpx.create_ssl_context()
    if ca_file:
        context.load_verify_locations(cafile=ca_file)
    return context


def make_client(
    proxy_url: str | None,
    timeout_s: float,
    *,
    ca_file: str | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Client:
    """An :class:`httpx.Client` whose every request is a CONNECT tunnel through the proxy.

    ``proxy_url`` falls back to HTTPS_PROXY / HTTP_PROXY / ALL_PROXY.  With no proxy at
    all the client dials directly (useful outside a sandbox; inside one, nothing is
    reachable that way).  The environment's proxy settings are never applied a second
    time (``trust_env=False``): they would route ``http://`` around the tunnel.
    """
    url = proxy_url or proxy_from_env()
    context = make_ssl_context(ca_file)
    timeout = httpx.Timeout(timeout_s)
    if not url:
        return httpx.Client(verify=context, timeout=timeout, trust_env=False, headers=headers)
    transport = TunnelTransport(ProxyAddress.parse(url), context)
    return httpx.Client(transport=transport, timeout=timeout, trust_env=False, headers=headers)
