"""The kernel's IPC server on real Unix sockets: protocol, concurrency, hostile input."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import time
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest

from fluffy.errors import (
    ConnectionClosed,
    DuplicateId,
    HandshakeRequired,
    InvalidPayload,
    UnknownMethod,
    VersionUnsupported,
)
from fluffy.ipc.client import AsyncClient, SyncClient
from fluffy.ipc.protocol import HEADER, SUPPORTED_API_VERSIONS, encode
from fluffy.kernel.ipc.server import CallContext, KernelServer, Limits
from fluffy.kernel.ipc.syscalls import NoParams, Syscall, SyscallTable
from fluffy.kernel.syscalls.kernel import default_methods

pytestmark = pytest.mark.anyio  # async tests run on asyncio (tests/conftest.py)

T = TypeVar("T")


class SlowParams(msgspec.Struct, forbid_unknown_fields=True):
    seconds: float
    tag: int | str


async def slow(context: CallContext, params: SlowParams) -> Any:
    await asyncio.sleep(params.seconds)
    return params.tag


async def events(context: CallContext, params: NoParams) -> str:
    for n in range(3):
        context.send_event("test.tick", {"n": n})
    return "sent"


def boom(context: CallContext, params: NoParams) -> None:
    raise RuntimeError("secret internal detail")


METHODS = SyscallTable(
    default_methods(),
    [
        Syscall("test.slow", SlowParams, slow, Any, since=1),
        Syscall("test.events", NoParams, events, str, since=1),
        Syscall("test.boom", NoParams, boom, None, since=1),
    ],
)


async def start(tmp: Path, **limits: Any) -> tuple[KernelServer, str]:
    server = KernelServer(METHODS, Limits(**limits))
    path = tmp / "run" / "kernel.sock"
    await server.listen(path)
    return server, str(path)


def handshake(version: int = SUPPORTED_API_VERSIONS[1]) -> bytes:
    return encode(
        {
            "type": "handshake",
            "plugin_name": "t",
            "plugin_version": "1",
            "syscall_api_version": version,
        }
    )


async def raw(path: str, *frames: bytes, read: int = 1) -> list[dict[str, Any]]:
    """Send raw bytes; read ``read`` frames back (stops early at EOF)."""
    reader, writer = await asyncio.open_unix_connection(path)
    for frame in frames:
        writer.write(frame)
    await writer.drain()
    out: list[dict[str, Any]] = []
    try:
        for _ in range(read):
            header = await asyncio.wait_for(reader.readexactly(4), 5)
            (length,) = HEADER.unpack(header)
            out.append(json.loads(await reader.readexactly(length)))
    except asyncio.IncompleteReadError:
        pass
    writer.close()
    return out


async def closed(path: str, *frames: bytes) -> bool:
    """Whether the server closes the connection after ``frames`` (and their answers)."""
    reader, writer = await asyncio.open_unix_connection(path)
    for frame in frames:
        writer.write(frame)
    try:
        data = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    return data is not None


async def test_a_ping_that_asks_for_no_figures_gathers_none(tmp_path: Path) -> None:
    """A health check (the bootstrap's, ten times a second for as long as the kernel
    runs) asks kernel.ping for no figures: the kernel gathers none and sends none.
    Asked without params, as before, the pong carries them."""
    server, path = await start(tmp_path)
    gathered: list[str] = []

    def memory() -> None:
        gathered.append("memory")

    def scheduler() -> None:
        gathered.append("scheduler")

    server.memory, server.scheduler = memory, scheduler  # type: ignore[assignment]
    client = await AsyncClient.connect(path, plugin_name="tester")
    pong = await client.call("kernel.ping", {"figures": False})
    assert pong["pong"] is True and pong["identity"]["plugin_name"] == "tester"
    assert "memory" not in pong and "scheduler" not in pong and gathered == []
    full = await client.call("kernel.ping")
    assert full["memory"] is None and full["scheduler"] is None
    assert gathered == ["memory", "scheduler"]
    with pytest.raises(InvalidPayload, match="figures"):
        await client.call("kernel.ping", {"figures": "no"})
    await client.close()
    await server.close()


async def test_the_bootstraps_health_check_reaches_a_kernel_from_before_figures(
    tmp_path: Path,
) -> None:
    """The bootstrap's ping asks for no figures; a kernel image built before `figures`
    existed refuses that param (`ipc.invalid_payload`), and the ping asks again without
    it: a host updated before its images still supervises the kernel it launches."""
    from fluffy.bootstrap import l1
    from fluffy.kernel.syscalls.kernel import PingParams, ping

    def old_ping(context: CallContext, params: NoParams) -> Any:
        return ping(context, PingParams())

    old = SyscallTable([Syscall("kernel.ping", NoParams, old_ping, Any, since=0)])
    for n, table in enumerate((old, METHODS)):
        server = KernelServer(table)
        path = tmp_path / str(n) / "kernel.sock"
        await server.listen(path)
        pong = await asyncio.to_thread(l1.ping, str(path))
        assert pong["pong"] is True and pong["identity"]["plugin_name"] == "bootstrap"
        assert ("memory" in pong) == (table is old)  # the old answer, or the health form
        assert server.stats.get("ipc.invalid_payload", 0) == (1 if table is old else 0)
        await server.close()


async def test_handshake_then_ping(tmp_path: Path) -> None:
    server, path = await start(tmp_path)
    client = await AsyncClient.connect(path, plugin_name="tester")
    assert client.ack is not None and client.ack.negotiated_api_version == SUPPORTED_API_VERSIONS[1]
    pong = await client.call("kernel.ping")
    assert pong["pong"] is True
    assert pong["identity"]["peer_pid"] == os.getpid()
    assert pong["identity"]["peer_uid"] == os.getuid()
    assert pong["identity"]["binding"] == "cli" and pong["identity"]["plugin_name"] == "tester"
    await client.close()
    await server.close()
    assert server.stats["handshakes"] == 1 and server.stats["requests"] == 1


async def test_many_concurrent_requests_on_one_connection_are_correlated(tmp_path: Path) -> None:
    server, path = await start(tmp_path)
    client = await AsyncClient.connect(path)
    calls = [client.call("test.slow", {"seconds": (50 - n) / 1000, "tag": n}) for n in range(50)]
    started = time.monotonic()
    assert await asyncio.gather(*calls) == list(range(50))
    assert time.monotonic() - started < 1.0  # concurrent, not 50 sleeps in a row
    await client.close()
    await server.close()


async def test_server_pushes_events(tmp_path: Path) -> None:
    server, path = await start(tmp_path)
    client = await AsyncClient.connect(path)
    assert await client.call("test.events") == "sent"
    ticks = [await asyncio.wait_for(client.events.get(), 2) for _ in range(3)]
    assert [t.params["n"] for t in ticks] == [0, 1, 2]
    assert all(t.type == "event" and t.method == "test.tick" for t in ticks)
    await client.close()
    await server.close()


async def test_unknown_method_runs_nothing_and_keeps_serving(tmp_path: Path) -> None:
    server, path = await start(tmp_path)
    client = await AsyncClient.connect(path)
    with pytest.raises(UnknownMethod) as info:
        await client.call("fs.format_disk")
    assert "kernel.ping" in str(info.value)
    assert (await client.call("kernel.ping"))["pong"] is True
    await client.close()
    await server.close()
    assert server.stats["ipc.unknown_method"] == 1


async def test_handler_failures_are_structured_and_do_not_leak(tmp_path: Path) -> None:
    server, path = await start(tmp_path)
    client = await AsyncClient.connect(path)
    with pytest.raises(Exception) as info:
        await client.call("test.boom")
    assert getattr(info.value, "wire_code", "") == "ipc.internal"
    assert "secret internal detail" not in str(info.value)
    assert (await client.call("kernel.ping"))["pong"] is True
    await client.close()
    await server.close()


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        (
            [encode({"id": "1", "type": "request", "method": "kernel.ping"})],
            "ipc.handshake_required",
        ),
        ([b"\x00\x00\x00\x02{}"], "ipc.handshake_required"),
        ([handshake(99)], "ipc.version_unsupported"),
        ([handshake(-1)], "ipc.version_unsupported"),
        ([HEADER.pack(0)], "ipc.frame_empty"),
        ([handshake(), HEADER.pack(0)], "ipc.frame_empty"),
        ([HEADER.pack(64 * 1024 * 1024)], "ipc.frame_too_large"),
    ],
)
async def test_fatal_input_gets_one_structured_error_then_close(
    tmp_path: Path, frames: list[bytes], code: str
) -> None:
    server, path = await start(tmp_path)
    answers = await raw(path, *frames, read=3)
    assert answers[-1]["error"]["code"] == code
    assert answers[-1]["type"] == "response"
    if code == "ipc.version_unsupported":
        low, high = SUPPORTED_API_VERSIONS
        assert f"{low} to {high}" in answers[-1]["error"]["message"]
    assert len(answers) <= 2  # nothing after the error: closed
    # others are still served
    with_client = await AsyncClient.connect(path)
    assert (await with_client.call("kernel.ping"))["pong"] is True
    await with_client.close()
    await server.close()
    assert server.stats[code] >= 1


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b"\xff\xfe\xfd",
        b'{"id": 5, "type": "request", "method": "kernel.ping"}',
        b'{"type": "request", "method": "kernel.ping"}',
        b'{"id": "x", "type": "response"}',
        b'{"id": "x", "type": "request"}',
        b"[1, 2, 3]",
    ],
)
async def test_bad_payloads_get_an_error_and_the_connection_goes_on(
    tmp_path: Path, payload: bytes
) -> None:
    server, path = await start(tmp_path)
    ping = encode({"id": "p", "type": "request", "method": "kernel.ping"})
    answers = await raw(path, handshake(), HEADER.pack(len(payload)) + payload, ping, read=3)
    assert answers[1]["error"]["code"] == "ipc.invalid_payload"
    assert answers[2]["id"] == "p" and answers[2]["result"]["pong"] is True
    await server.close()


async def test_duplicate_in_flight_id_is_refused(tmp_path: Path) -> None:
    server, path = await start(tmp_path)
    request = encode(
        {
            "id": "same",
            "type": "request",
            "method": "test.slow",
            "params": {"seconds": 0.2, "tag": "first"},
        }
    )
    answers = await raw(path, handshake(), request, request, read=3)
    assert answers[1]["error"]["code"] == DuplicateId.code
    assert answers[2]["result"] == "first"
    await server.close()


async def test_slow_writer_hits_the_frame_deadline(tmp_path: Path) -> None:
    server, path = await start(tmp_path, frame_deadline_s=0.3)
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(handshake())
    writer.write(HEADER.pack(100) + b'{"id":')  # ... and never the rest
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 3)
    assert b"ipc.read_timeout" in data
    writer.close()
    assert server.stats["ipc.read_timeout"] == 1
    await server.close()


async def test_silent_connection_must_handshake_in_time(tmp_path: Path) -> None:
    server, path = await start(tmp_path, handshake_deadline_s=0.3)
    reader, writer = await asyncio.open_unix_connection(path)
    data = await asyncio.wait_for(reader.read(), 3)
    assert b"ipc.read_timeout" in data
    writer.close()
    await server.close()


async def test_truncated_frame_is_counted_and_the_server_goes_on(tmp_path: Path) -> None:
    server, path = await start(tmp_path)
    await raw(path, handshake(), HEADER.pack(50) + b'{"id"', read=1)
    await asyncio.sleep(0.05)
    assert server.stats["ipc.frame_truncated"] == 1
    client = await AsyncClient.connect(path)
    assert (await client.call("kernel.ping"))["pong"] is True
    await client.close()
    await server.close()


async def test_connection_limit_refuses_the_extra_and_serves_the_rest(tmp_path: Path) -> None:
    server, path = await start(tmp_path, max_connections=50)
    idle = [await asyncio.open_unix_connection(path) for _ in range(50)]
    answers = await raw(path, read=1)
    assert answers[0]["error"]["code"] == "ipc.too_many_connections"
    for _, writer in idle[:10]:
        writer.close()
    await asyncio.sleep(0.05)
    client = await AsyncClient.connect(path)
    assert (await client.call("kernel.ping"))["pong"] is True
    await client.close()
    for _, writer in idle[10:]:
        writer.close()
    await server.close()


async def test_peer_uid_not_allowed_is_rejected(tmp_path: Path) -> None:
    server = KernelServer(METHODS)
    path = tmp_path / "s" / "k.sock"
    await server.listen(path, allowed_uids=frozenset({os.getuid() + 4242}))
    answers = await raw(str(path), handshake(), read=2)
    assert answers[0]["error"]["code"] == "ipc.peer_rejected"
    await server.close()


async def test_socket_is_0600_in_a_0700_folder(tmp_path: Path) -> None:
    folder = tmp_path / "loose"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    server = KernelServer(METHODS)
    await server.listen(folder / "k.sock")
    assert stat.S_IMODE((folder / "k.sock").stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    await server.close()
    assert not (folder / "k.sock").exists()


async def test_sync_client_for_scripts_and_health_checks(tmp_path: Path) -> None:
    server, path = await start(tmp_path)
    loop = asyncio.get_running_loop()

    def blocking() -> None:
        with SyncClient(path, timeout=5) as client:
            assert client.call("kernel.ping")["pong"] is True
            with pytest.raises(UnknownMethod):
                client.call("nope")
        with pytest.raises(VersionUnsupported):
            SyncClient(path, api_version=999)

    await loop.run_in_executor(None, blocking)
    await server.close()


def test_sync_client_sees_a_closed_server(tmp_path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    path = tmp_path / "half.sock"
    sock.bind(str(path))
    sock.listen(1)
    with pytest.raises((ConnectionClosed, OSError)):
        SyncClient(str(path), timeout=0.5)
    sock.close()


def test_errors_raised_by_clients_keep_their_codes() -> None:
    assert {HandshakeRequired.code, InvalidPayload.code} <= {
        "ipc.handshake_required",
        "ipc.invalid_payload",
    }


async def test_thousands_of_idle_connections_meet_the_limit_and_ping_still_works(
    tmp_path: Path,
) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * 2200 + 100  # both ends of every connection live in this process
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    total = min(2200, (min(wanted, hard) - 100) // 2)

    try:
        server, path = await start(tmp_path, max_connections=total - 200)
        idle = []
        for _ in range(total):
            idle.append(await asyncio.open_unix_connection(path))
        await asyncio.sleep(0.2)
        assert len(server.connections) == total - 200
        assert server.stats["ipc.too_many_connections"] == 200
        for _, writer in idle:
            writer.close()
        await asyncio.sleep(0.2)
        client = await AsyncClient.connect(path)
        assert (await client.call("kernel.ping"))["pong"] is True
        await client.close()
        await server.close()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_credentials_are_pluggable_for_other_platforms(tmp_path: Path) -> None:
    from fluffy.ipc.transport import PeerIdentity

    server = KernelServer(METHODS, credentials=lambda _sock: PeerIdentity(7, 8, 9))
    await server.listen(tmp_path / "p" / "k.sock")
    client = await AsyncClient.connect(str(tmp_path / "p" / "k.sock"))
    identity = (await client.call("kernel.ping"))["identity"]
    assert (identity["peer_pid"], identity["peer_uid"], identity["peer_gid"]) == (7, 8, 9)
    await client.close()
    await server.close()


async def test_reserved_ids_and_deep_nesting_are_invalid_payloads(tmp_path: Path) -> None:
    server, path = await start(tmp_path)
    reserved = encode({"id": "connection", "type": "request", "method": "kernel.ping"})
    deep = (
        b'{"id": "d", "type": "request", "method": "kernel.ping", "params": '
        + b"[" * 5000
        + b"]" * 5000
        + b"}"
    )
    ping = encode({"id": "p", "type": "request", "method": "kernel.ping"})
    answers = await raw(path, handshake(), reserved, HEADER.pack(len(deep)) + deep, ping, read=4)
    assert [a.get("error", {}).get("code") for a in answers[1:3]] == ["ipc.invalid_payload"] * 2
    assert answers[1]["id"] == "unknown"
    assert answers[3]["result"]["pong"] is True
    await server.close()


async def test_a_peer_that_never_reads_is_cut_off_not_buffered_forever(tmp_path: Path) -> None:
    server, path = await start(tmp_path, max_write_buffer=64 * 1024)
    _reader, writer = await asyncio.open_unix_connection(path)
    writer.write(handshake())
    ping = encode({"id": "p", "type": "request", "method": "kernel.ping"})
    try:
        for _ in range(200):
            writer.write(ping * 500)
            await asyncio.wait_for(writer.drain(), 2)
    except (TimeoutError, ConnectionError):
        pass
    await asyncio.sleep(0.2)
    assert server.stats["ipc.write_buffer_full"] + server.stats["requests"] > 0
    total = sum(c.transport.get_write_buffer_size() for c in server.connections if c.transport)
    assert total <= 64 * 1024 + 65536
    writer.close()
    client = await AsyncClient.connect(path)
    assert (await client.call("kernel.ping"))["pong"] is True
    await client.close()
    await server.close()


async def test_a_big_frame_before_the_handshake_is_refused_at_the_header(tmp_path: Path) -> None:
    server, path = await start(tmp_path)
    answers = await raw(path, HEADER.pack(100_000), read=1)
    assert answers[0]["error"]["code"] == "ipc.frame_too_large"
    await server.close()
