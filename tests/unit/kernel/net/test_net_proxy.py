"""The kernel's CONNECT proxy on a real Unix socket, against real loopback servers."""

from __future__ import annotations

import asyncio
import socket
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from benchmarks._proxy import loopback_server
from fluffy.errors import ConfigError
from fluffy.kernel.net import AllowList, ConnectProxy, ProxyRecord

pytestmark = pytest.mark.unit

Audit = Callable[[ProxyRecord], Awaitable[None]]


class Recorder:
    def __init__(self) -> None:
        self.records: list[ProxyRecord] = []
        self.changed = asyncio.Event()

    async def __call__(self, record: ProxyRecord) -> None:
        self.records.append(record)
        self.changed.set()

    async def wait_for(self, count: int) -> list[ProxyRecord]:
        async with asyncio.timeout(5):
            while len(self.records) < count:
                self.changed.clear()
                await self.changed.wait()
        return self.records


@asynccontextmanager
async def running(
    tmp_path: Path, allow: list[str], audit: Audit | None = None, **options: Any
) -> AsyncIterator[tuple[ConnectProxy, Path, Recorder]]:
    recorder = Recorder()
    proxy = ConnectProxy(AllowList.from_entries(allow), audit or recorder, **options)
    path = tmp_path / "proxy.sock"
    await proxy.start(path, tag="sandbox-1")
    try:
        yield proxy, path, recorder
    finally:
        await proxy.close()


async def ask(path: Path, data: bytes, *, eof: bool = False) -> bytes:
    """Send ``data``, read the whole answer (the proxy closes after a refusal)."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(data)
    if eof:
        writer.write_eof()
    async with asyncio.timeout(5):
        answer = await reader.read()
    writer.close()
    return answer


async def connect(
    path: Path, authority: str, early: bytes = b""
) -> tuple[bytes, asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode() + early)
    async with asyncio.timeout(5):
        head = await reader.readuntil(b"\r\n\r\n")
    return head, reader, writer


async def get_through(path: Path, port: int, url_path: str = "/x") -> bytes:
    head, reader, writer = await connect(path, f"127.0.0.1:{port}")
    assert head == b"HTTP/1.1 200 Connection established\r\n\r\n"
    writer.write(f"GET {url_path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    async with asyncio.timeout(5):
        answer = await reader.read()
    writer.close()
    return answer


@asynccontextmanager
async def reverser() -> AsyncIterator[int]:
    """Reads until EOF, then answers the bytes reversed and closes (needs half-close)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()
        writer.write(data[::-1])
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # closed: connecting to it is refused


def test_an_allowed_connect_tunnels_and_is_audited_before_and_after(tmp_path: Path) -> None:
    async def main(port: int) -> None:
        async with running(
            tmp_path, [f"127.0.0.1:{port}"], session_of=lambda tag: f"session-of-{tag}"
        ) as (_, path, recorder):
            answer = await get_through(path, port, "/models")
            assert answer.startswith(b"HTTP/1.1 200 OK")
            assert answer.endswith(b"hello from /models")
            decision, close = await recorder.wait_for(2)
        assert (decision.phase, decision.decision, decision.status) == ("decision", "allow", 200)
        assert (decision.host, decision.port, decision.rule) == (
            "127.0.0.1",
            port,
            f"127.0.0.1:{port}",
        )
        assert (decision.tag, decision.session) == ("sandbox-1", "session-of-sandbox-1")
        assert decision.bytes_up == decision.bytes_down == 0
        assert (close.phase, close.decision, close.reason) == ("close", "allow", "closed")
        assert close.bytes_up > 40 and close.bytes_down == len(answer)
        assert close.duration_ms > 0

    with loopback_server() as port:
        asyncio.run(main(port))


def test_a_refused_host_is_audited_before_its_403(tmp_path: Path) -> None:
    async def main() -> None:
        gate = asyncio.Event()
        entered = asyncio.Event()
        records: list[ProxyRecord] = []

        async def slow_audit(record: ProxyRecord) -> None:
            records.append(record)
            entered.set()
            await gate.wait()

        async with running(tmp_path, ["api.openai.com"], slow_audit) as (_, path, _):
            reader, writer = await asyncio.open_unix_connection(str(path))
            writer.write(b"CONNECT evil.example.com:443 HTTP/1.1\r\n\r\n")
            await asyncio.wait_for(entered.wait(), 5)
            with pytest.raises(TimeoutError):  # nothing is answered while the audit waits
                await asyncio.wait_for(reader.read(1), 0.1)
            gate.set()
            async with asyncio.timeout(5):
                answer = await reader.read()
            writer.close()
        assert answer.startswith(b"HTTP/1.1 403 Forbidden\r\n")
        assert answer.endswith(
            b"\r\n\r\nfluffy: evil.example.com:443 is not in policy.yaml network_whitelist\n"
        )
        [record] = records
        assert (record.decision, record.status, record.phase) == ("deny", 403, "decision")
        assert (record.host, record.port, record.rule) == ("evil.example.com", 443, None)

    asyncio.run(main())


def test_non_connect_methods_get_405_with_allow_connect(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, ["example.com:80"]) as (_, path, recorder):
            answer = await ask(
                path, b"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n"
            )
            [record] = await recorder.wait_for(1)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 405 Method Not Allowed")
        assert b"\r\nAllow: CONNECT" in head
        assert b"HTTP_PROXY" in body and b"CONNECT" in body
        assert (record.decision, record.status) == ("deny", 405)
        assert "GET http://example.com/" in record.reason

    asyncio.run(main())


@pytest.mark.parametrize(
    ("request_bytes", "reason"),
    [
        (b"garbage\r\n\r\n", b"request line"),
        (b"CONNECT example.com HTTP/1.1\r\n\r\n", b"no port"),
        (b"CONNECT example.com:443 HTTP/2\r\n\r\n", b"HTTP/1.0"),
        (b"CONNECT [::1:443 HTTP/1.1\r\n\r\n", b"unclosed"),
        (b"CONNECT \xff\xfe:443 HTTP/1.1\r\n\r\n", b"ASCII"),
        (b"CONNECT example.com:443 HTTP/1.1\r\nno colon here\r\n\r\n", b"header"),
        (b"CONNECT example.com:443 HTTP/1.1\r\n", b"ended inside"),
    ],
)
def test_malformed_heads_get_400_with_a_reason(
    tmp_path: Path, request_bytes: bytes, reason: bytes
) -> None:
    async def main() -> None:
        async with running(tmp_path, ["example.com"]) as (_, path, recorder):
            reader, writer = await asyncio.open_unix_connection(str(path))
            writer.write(request_bytes)
            writer.write_eof()
            async with asyncio.timeout(5):
                answer = await reader.read()
            writer.close()
            [record] = await recorder.wait_for(1)
        assert answer.startswith(b"HTTP/1.1 400 Bad Request"), answer
        assert reason in answer.partition(b"\r\n\r\n")[2], answer
        assert (record.decision, record.status) == ("error", 400)

    asyncio.run(main())


def test_oversized_and_slow_heads_are_refused_and_the_proxy_keeps_serving(tmp_path: Path) -> None:
    async def main(port: int) -> None:
        options: dict[str, Any] = {"max_header_bytes": 1024, "head_timeout_s": 0.3}
        async with running(tmp_path, [f"127.0.0.1:{port}"], **options) as (proxy, path, recorder):
            big = b"CONNECT 127.0.0.1:1 HTTP/1.1\r\nX: " + b"a" * 5000 + b"\r\n\r\n"
            assert (await ask(path, big)).startswith(b"HTTP/1.1 431 ")
            # a client that never finishes its head is answered 408 after head_timeout_s
            slow = await ask(path, b"CONNECT 127.0.0.1:1 HTTP/1.1\r\n")
            assert slow.startswith(b"HTTP/1.1 408 ")
            assert (await ask(path, b"\x00\x01\x02\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
            # an empty connection is not a request: nothing is answered or audited
            assert await ask(path, b"", eof=True) == b""
            assert (await get_through(path, port)).endswith(b"hello from /x")
            records = await recorder.wait_for(5)
        assert [r.status for r in records] == [431, 408, 400, 200, 200]
        assert proxy.stats["empty"] == 1

    with loopback_server() as port:
        asyncio.run(main(port))


def test_an_unreachable_target_gets_502_and_an_error_close_record(tmp_path: Path) -> None:
    async def main() -> None:
        port = free_port()
        async with running(tmp_path, [f"127.0.0.1:{port}"]) as (_, path, recorder):
            answer = await ask(path, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
            decision, close = await recorder.wait_for(2)
        assert answer.startswith(b"HTTP/1.1 502 Bad Gateway")
        assert f"cannot reach 127.0.0.1:{port}".encode() in answer
        assert (decision.decision, decision.status) == ("allow", 200)
        assert (close.phase, close.decision, close.status) == ("close", "error", 502)

    asyncio.run(main())


def test_half_close_passes_through_and_early_data_is_forwarded(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            reverser() as port,
            running(tmp_path, [f"127.0.0.1:{port}"]) as (
                _,
                path,
                recorder,
            ),
        ):
            head, reader, writer = await connect(path, f"127.0.0.1:{port}", early=b"hello ")
            assert head.startswith(b"HTTP/1.1 200")
            writer.write(b"world")
            writer.write_eof()  # the reverser answers only after our EOF reached it
            async with asyncio.timeout(5):
                assert await reader.read() == b"dlrow olleh"
            writer.close()
            close = (await recorder.wait_for(2))[1]
        assert (close.bytes_up, close.bytes_down) == (11, 11)

    asyncio.run(main())


def test_an_audit_that_raises_fails_closed_and_does_not_stop_the_proxy(tmp_path: Path) -> None:
    async def broken(record: ProxyRecord) -> None:
        raise RuntimeError("disk full")

    async def main(port: int) -> None:
        async with running(tmp_path, [f"127.0.0.1:{port}"], broken) as (proxy, path, _):
            refused = await ask(path, b"CONNECT other.example:443 HTTP/1.1\r\n\r\n")
            assert refused.startswith(b"HTTP/1.1 403 ")
            allowed = await ask(path, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
            assert allowed.startswith(b"HTTP/1.1 503 ")
            assert b"audit" in allowed
            assert proxy.stats["audit_failures"] == 2
            proxy._audit = Recorder()  # the log is back: tunnels work again
            assert (await get_through(path, port)).endswith(b"hello from /x")

    with loopback_server() as port:
        asyncio.run(main(port))


def test_tunnels_beyond_the_limit_get_503(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            reverser() as port,
            running(tmp_path, [f"127.0.0.1:{port}"], max_tunnels=1) as (_, path, recorder),
        ):
            head, _, writer = await connect(path, f"127.0.0.1:{port}")
            assert head.startswith(b"HTTP/1.1 200")
            second = await ask(path, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
            assert second.startswith(b"HTTP/1.1 503 ")
            writer.close()
            records = await recorder.wait_for(3)
        assert [(r.decision, r.status) for r in records[:2]] == [("allow", 200), ("error", 503)]

    asyncio.run(main())


def test_idle_tunnels_are_cut(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            reverser() as port,
            running(tmp_path, [f"127.0.0.1:{port}"], idle_timeout_s=0.2) as (_, path, recorder),
        ):
            _, reader, writer = await connect(path, f"127.0.0.1:{port}")
            async with asyncio.timeout(5):
                assert await reader.read() == b""  # the proxy hung up on the idle tunnel
            writer.close()
            close = (await recorder.wait_for(2))[1]
        assert close.reason.startswith("idle")

    asyncio.run(main())


def test_reload_applies_to_new_requests(tmp_path: Path) -> None:
    async def main(port: int) -> None:
        async with running(tmp_path, [f"127.0.0.1:{port}"]) as (proxy, path, _):
            assert (await get_through(path, port)).endswith(b"hello from /x")
            proxy.reload(AllowList.from_entries([]))
            answer = await ask(path, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
            assert answer.startswith(b"HTTP/1.1 403 ")

    with loopback_server() as port:
        asyncio.run(main(port))


def test_sockets_are_tagged_per_sandbox_and_stop_cuts_their_tunnels(tmp_path: Path) -> None:
    async def main() -> None:
        recorder = Recorder()
        async with reverser() as port:
            proxy = ConnectProxy(AllowList.from_entries([f"127.0.0.1:{port}"]), recorder)
            first, second = tmp_path / "a.sock", tmp_path / "b.sock"
            await proxy.start(first, tag="sb-a")
            await proxy.start(second, tag="sb-b", mode=0o600)
            assert stat.S_ISSOCK(first.stat().st_mode)
            assert stat.S_IMODE(first.stat().st_mode) == 0o660
            assert stat.S_IMODE(second.stat().st_mode) == 0o600
            assert sorted(p.name for p in tmp_path.iterdir()) == ["a.sock", "b.sock"]
            _, reader, writer = await connect(first, f"127.0.0.1:{port}")
            _, reader2, writer2 = await connect(second, f"127.0.0.1:{port}")
            await proxy.stop(first)
            async with asyncio.timeout(5):
                assert await reader.read() == b""
            writer.close()
            assert not first.exists() and second.exists()
            await proxy.close()
            assert not second.exists()
            assert await reader2.read() == b""
            writer2.close()
        tags = {(r.tag, r.phase) for r in await recorder.wait_for(4)}
        assert tags == {(t, p) for t in ("sb-a", "sb-b") for p in ("decision", "close")}

    asyncio.run(main())


def test_start_refuses_a_path_that_is_not_a_socket(tmp_path: Path) -> None:
    async def main() -> None:
        proxy = ConnectProxy(AllowList(), Recorder())
        (tmp_path / "proxy.sock").write_text("not a socket")
        with pytest.raises(ConfigError, match="not a socket"):
            await proxy.start(tmp_path / "proxy.sock")

    asyncio.run(main())


def test_a_name_resolving_to_loopback_needs_an_ip_entry(tmp_path: Path) -> None:
    """A hostname rule never reaches the host's own services by way of DNS."""

    async def main(port: int) -> None:
        async with running(tmp_path, [f"localhost:{port}"]) as (_, path, recorder):
            answer = await ask(path, f"CONNECT localhost:{port} HTTP/1.1\r\n\r\n".encode())
            assert answer.startswith(b"HTTP/1.1 403")
            assert b"resolves to a private or loopback address" in answer
            decision, close = await recorder.wait_for(2)
            assert decision.decision == "allow" and close.decision == "deny"
            assert close.status == 403
        both = [f"localhost:{port}", f"127.0.0.1:{port}"]
        async with running(tmp_path, both) as (_, path, _recorder):
            head, _reader, writer = await connect(path, f"localhost:{port}")
            assert head == b"HTTP/1.1 200 Connection established\r\n\r\n"
            writer.close()

    with loopback_server() as port:
        asyncio.run(main(port))


def test_a_socket_with_its_own_hosts_needs_both_lists(tmp_path: Path) -> None:
    """An MCP server's socket: a target must be in the policy's list and in its own."""

    async def main(port: int, other: int) -> None:
        recorder = Recorder()
        policy = [f"127.0.0.1:{port}", f"127.0.0.1:{other}"]
        proxy = ConnectProxy(AllowList.from_entries(policy), recorder)
        narrow, wide = tmp_path / "narrow.sock", tmp_path / "wide.sock"
        own = AllowList.from_entries([f"127.0.0.1:{port}", "api.example.com"])
        await proxy.start(narrow, tag="mcp:web", hosts=own)
        await proxy.start(wide, tag="ai")
        try:
            assert (await get_through(narrow, port)).endswith(b"hello from /x")
            decision, _close = await recorder.wait_for(2)
            assert (decision.rule, decision.host_rule) == (policy[0], f"127.0.0.1:{port}")
            # in the policy's list, not in the socket's own: refused, and audited so
            refused = await ask(narrow, f"CONNECT 127.0.0.1:{other} HTTP/1.1\r\n\r\n".encode())
            assert refused.startswith(b"HTTP/1.1 403 ")
            assert refused.endswith(
                f"fluffy: 127.0.0.1:{other} is not among the hosts mcp:web may reach\n".encode()
            )
            denied = (await recorder.wait_for(3))[2]
            assert (denied.tag, denied.decision, denied.status) == ("mcp:web", "deny", 403)
            assert denied.reason == "not in the sandbox's allowed hosts"
            # in the socket's own list, not in the policy's: the policy's refusal
            refused = await ask(narrow, b"CONNECT api.example.com:443 HTTP/1.1\r\n\r\n")
            assert b"is not in policy.yaml network_whitelist" in refused
            # the other socket keeps the policy's whole list
            assert (await get_through(wide, other)).endswith(b"hello from /x")
            # a reload narrows the policy's list under the socket's own too
            proxy.reload(AllowList.from_entries([f"127.0.0.1:{other}"]))
            refused = await ask(narrow, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
            assert b"is not in policy.yaml network_whitelist" in refused
        finally:
            await proxy.close()

    with loopback_server() as port, loopback_server() as other:
        asyncio.run(main(port, other))


def test_a_name_resolving_to_loopback_needs_an_ip_entry_in_the_sockets_hosts_too(
    tmp_path: Path,
) -> None:
    async def main(port: int) -> None:
        recorder = Recorder()
        both = [f"localhost:{port}", f"127.0.0.1:{port}"]
        proxy = ConnectProxy(AllowList.from_entries(both), recorder)
        await proxy.start(tmp_path / "a.sock", hosts=AllowList.from_entries([both[0]]))
        await proxy.start(tmp_path / "b.sock", hosts=AllowList.from_entries(both))
        try:
            answer = await ask(
                tmp_path / "a.sock", f"CONNECT localhost:{port} HTTP/1.1\r\n\r\n".encode()
            )
            assert answer.startswith(b"HTTP/1.1 403")
            assert b"resolves to a private or loopback address" in answer
            head, _reader, writer = await connect(tmp_path / "b.sock", f"localhost:{port}")
            assert head == b"HTTP/1.1 200 Connection established\r\n\r\n"
            writer.close()
        finally:
            await proxy.close()

    with loopback_server() as port:
        asyncio.run(main(port))
