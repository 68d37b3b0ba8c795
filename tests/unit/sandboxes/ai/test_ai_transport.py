"""The sandbox side: httpx client -> (forwarder ->) kernel proxy -> loopback servers.

Everything is real: the kernel's ConnectProxy on a Unix socket (in its own loop thread),
the in-sandbox Forwarder on 127.0.0.1, an HTTP and an HTTPS server (a self-signed
certificate made with the openssl CLI) on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from benchmarks._proxy import ProxyThread, loopback_server, make_cert
from fluffy.sandboxes.ai.forwarder import Forwarder
from fluffy.sandboxes.ai.transport import ProxyAddress, ProxyRefused, make_client

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make a test certificate")
    return make_cert(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def http_port() -> Iterator[int]:
    with loopback_server() as port:
        yield port


@pytest.fixture(scope="module")
def https_port(cert: tuple[Path, Path]) -> Iterator[int]:
    with loopback_server(cert) as port:
        yield port


@pytest.fixture
def kernel_proxy(tmp_path: Path, http_port: int, https_port: int) -> Iterator[ProxyThread]:
    proxy = ProxyThread([f"127.0.0.1:{http_port}", f"127.0.0.1:{https_port}"])
    proxy.start(tmp_path / "proxy.sock", tag="ai-1")
    yield proxy
    proxy.close()


@pytest.fixture
def forwarder(kernel_proxy: ProxyThread) -> Iterator[Forwarder]:
    [path] = kernel_proxy.proxy.paths
    with Forwarder(str(path)) as running:
        yield running


def tunnels(proxy: ProxyThread) -> list[tuple[str, int]]:
    return [(r.host, r.port) for r in proxy.records if r.phase == "decision"]


def test_plain_http_is_tunnelled_through_forwarder_and_proxy(
    forwarder: Forwarder, kernel_proxy: ProxyThread, http_port: int
) -> None:
    with make_client(forwarder.url, timeout_s=5) as client:
        first = client.get(f"http://127.0.0.1:{http_port}/v1/models")
        echoed = client.post(f"http://127.0.0.1:{http_port}/echo", content=b"x" * 100_000)
    assert (first.status_code, first.text) == (200, "hello from /v1/models")
    assert echoed.content == b"x" * 100_000
    # both requests went through one CONNECT tunnel (the pool keeps the connection)
    assert tunnels(kernel_proxy) == [("127.0.0.1", http_port)]


def test_https_is_tunnelled_with_tls_end_to_end(
    forwarder: Forwarder, kernel_proxy: ProxyThread, https_port: int, cert: tuple[Path, Path]
) -> None:
    with make_client(forwarder.url, timeout_s=5, ca_file=str(cert[0])) as client:
        answer = client.get(f"https://127.0.0.1:{https_port}/secure")
    assert answer.text == "hello from /secure"
    assert tunnels(kernel_proxy) == [("127.0.0.1", https_port)]
    # the proxy does not terminate TLS: without the server's CA the client refuses it
    with (
        make_client(forwarder.url, timeout_s=5) as client,
        pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"),
    ):
        client.get(f"https://127.0.0.1:{https_port}/secure")


def test_the_kernel_socket_can_be_used_directly_as_a_unix_proxy_url(
    kernel_proxy: ProxyThread, https_port: int, cert: tuple[Path, Path]
) -> None:
    [path] = kernel_proxy.proxy.paths
    with make_client(f"unix://{path}", timeout_s=5, ca_file=str(cert[0])) as client:
        assert client.get(f"https://127.0.0.1:{https_port}/u").text == "hello from /u"
    assert ProxyAddress.parse(f"unix://{path}").unix_path == str(path)


def test_a_host_that_is_not_allow_listed_raises_proxy_refused_with_the_proxy_s_reason(
    forwarder: Forwarder, kernel_proxy: ProxyThread
) -> None:
    with make_client(forwarder.url, timeout_s=5) as client:
        with pytest.raises(ProxyRefused) as info:
            client.get("https://api.not-allowed.example/v1/chat")
        with pytest.raises(httpx.ProxyError, match=r"^403 "):  # plain http is refused alike
            client.get("http://api.not-allowed.example:8080/")
    error = info.value
    assert (error.status, error.host, error.port) == (403, "api.not-allowed.example", 443)
    assert str(error).startswith("403 Forbidden: api.not-allowed.example:443 is not allow-listed")
    assert "is not in policy.yaml network_whitelist" in error.body
    denied = [r for r in kernel_proxy.records if r.decision == "deny"]
    assert [(r.host, r.port, r.tag) for r in denied] == [
        ("api.not-allowed.example", 443, "ai-1"),
        ("api.not-allowed.example", 8080, "ai-1"),
    ]


def test_the_proxy_comes_from_the_environment_when_not_given(
    monkeypatch: pytest.MonkeyPatch, forwarder: Forwarder, kernel_proxy: ProxyThread, http_port: int
) -> None:
    for name in (
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", forwarder.url)
    with make_client(None, timeout_s=5) as client:
        assert client.get(f"http://127.0.0.1:{http_port}/env").text == "hello from /env"
    assert tunnels(kernel_proxy) == [("127.0.0.1", http_port)]


def test_the_forwarder_passes_half_close_both_ways(tmp_path: Path) -> None:
    proxy = ProxyThread([])

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()  # until the client's EOF crossed forwarder and proxy
        writer.write(data[::-1])
        writer.close()

    try:
        server = proxy.call(asyncio.start_server(serve, "127.0.0.1", 0))
        port = server.sockets[0].getsockname()[1]
        proxy.proxy.reload(type(proxy.proxy.allow).from_entries([f"127.0.0.1:{port}"]))
        path = proxy.start(tmp_path / "p.sock")
        with (
            Forwarder(str(path)) as forwarder,
            socket.create_connection(("127.0.0.1", forwarder.port), timeout=5) as sock,
        ):
            sock.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\nhello ".encode())
            sock.sendall(b"world")
            sock.shutdown(socket.SHUT_WR)
            received = b""
            while chunk := sock.recv(4096):
                received += chunk
        assert received == b"HTTP/1.1 200 Connection established\r\n\r\ndlrow olleh"
        server.close()
    finally:
        proxy.close()


def test_the_forwarder_answers_502_when_the_kernel_socket_is_missing(tmp_path: Path) -> None:
    with Forwarder(str(tmp_path / "missing.sock")) as forwarder:
        with socket.create_connection(("127.0.0.1", forwarder.port), timeout=5) as sock:
            received = b""
            while chunk := sock.recv(4096):
                received += chunk
        port = forwarder.port
    assert received.startswith(b"HTTP/1.1 502 Bad Gateway")
    assert b"network proxy" in received
    with pytest.raises(ConnectionRefusedError):  # closed: it no longer listens
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_proxy_urls_are_checked() -> None:
    assert ProxyAddress.parse("http://127.0.0.1:3128") == ProxyAddress(host="127.0.0.1", port=3128)
    for bad in ("https://127.0.0.1:3128", "socks5://x:1", "unix://", "127.0.0.1:3128"):
        with pytest.raises(ValueError, match="proxy URL"):
            ProxyAddress.parse(bad)
