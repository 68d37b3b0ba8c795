"""A fuzz run: 100,000 hostile frames against a live server; it never crashes and ping
is answered throughout.  Generated with a seeded RNG (reproducible)."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

from fluffy.ipc.client import AsyncClient
from fluffy.ipc.protocol import HEADER, SUPPORTED_API_VERSIONS, encode
from fluffy.kernel.ipc.server import KernelServer, Limits
from fluffy.kernel.syscalls.kernel import default_methods

FRAMES = 100_000
HANDSHAKE = encode(
    {
        "type": "handshake",
        "plugin_name": "fuzz",
        "plugin_version": "0",
        "syscall_api_version": SUPPORTED_API_VERSIONS[1],
    }
)


def hostile_payload(rng: random.Random) -> bytes:
    """A frame payload that is wrong in one of many ways (framing stays intact)."""
    kind = rng.randrange(10)
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 64))
    if kind == 1:
        return b"\xff" + rng.randbytes(8)
    if kind == 2:
        return json.dumps(rng.choice([[], 1, "x", None, {"id": rng.random()}])).encode()
    if kind == 3:
        return json.dumps(
            {"id": "x" * rng.randrange(1, 300), "type": "request", "method": "kernel.ping"}
        ).encode()
    if kind == 4:
        return json.dumps(
            {
                "id": str(rng.random()),
                "type": "request",
                "method": rng.choice(["", "fs.rm", "kernel.ping\x00", "x" * 200]),
                "params": {"a": [1] * rng.randrange(5)},
            }
        ).encode()
    if kind == 5:
        return json.dumps({"id": "r", "type": rng.choice(["response", "event", "nope"])}).encode()
    if kind == 6:
        return json.dumps(
            {
                "id": str(rng.random()),
                "type": "request",
                "method": "kernel.ping",
                "params": {"unexpected": True},
            }
        ).encode()
    if kind == 7:
        return b'{"id": "1", "type": "request", "method": "kernel.ping"' + rng.randbytes(3)
    if kind == 8:
        return ("{" * rng.randrange(1, 2000)).encode()
    return json.dumps(
        {
            "type": "handshake",
            "plugin_name": "again",
            "plugin_version": "1",
            "syscall_api_version": 1,
        }
    ).encode()


def hostile_stream(rng: random.Random) -> tuple[bytes, bool]:
    """Bytes that break the connection (the server must refuse and close it), and whether
    the attacker hangs up at once instead of waiting for the answer."""
    kind = rng.randrange(4)
    if kind == 0:
        return HANDSHAKE + HEADER.pack(0), False
    if kind == 1:
        return HEADER.pack(rng.randrange(5 * 2**20, 2**32)), False
    if kind == 2:
        junk = rng.randbytes(rng.randrange(1, 16))
        return HEADER.pack(len(junk)) + junk, False  # a first frame that is no handshake
    return HANDSHAKE + HEADER.pack(20) + b"{", True  # truncated, then hang up


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await writer.wait_closed()
    except ConnectionError:
        pass


def test_hundred_thousand_hostile_frames(tmp_path: Path) -> None:
    async def main() -> None:
        server = KernelServer(default_methods(), Limits(max_frame=4 * 2**20))
        path = str(tmp_path / "run" / "kernel.sock")
        await server.listen(Path(path))
        rng = random.Random(20261122)
        watcher = await AsyncClient.connect(path)
        sent = 0

        async def payload_attack(count: int) -> None:
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(HANDSHAKE)
            batch = bytearray()
            for _ in range(count):
                payload = hostile_payload(rng)
                batch += HEADER.pack(len(payload)) + payload
            writer.write(bytes(batch))
            await writer.drain()
            writer.write(encode({"id": "end", "type": "request", "method": "kernel.ping"}))
            await writer.drain()
            while True:  # read answers until our own final ping comes back
                (length,) = HEADER.unpack(await reader.readexactly(4))
                answer = json.loads(await reader.readexactly(length))
                if answer.get("id") == "end":
                    assert answer["result"]["pong"] is True
                    break
            await _close(writer)

        async def stream_attack() -> None:
            reader, writer = await asyncio.open_unix_connection(path)
            data, hang_up = hostile_stream(rng)
            writer.write(data)
            try:
                await writer.drain()
                if not hang_up:
                    await asyncio.wait_for(reader.read(), 5)
            except (TimeoutError, ConnectionError):
                pass
            writer.close()

        while sent < FRAMES:
            await asyncio.gather(*(payload_attack(2000) for _ in range(4)))
            sent += 8000
            await asyncio.gather(*(stream_attack() for _ in range(50)))
            sent += 50
            assert (await watcher.call("kernel.ping"))["pong"] is True
        await watcher.close()
        await server.close()
        stats = server.stats
        assert stats["ipc.invalid_payload"] > 10_000
        assert stats["ipc.frame_empty"] > 0 and stats["ipc.frame_too_large"] > 0
        assert stats["ipc.handshake_required"] > 0 and stats["ipc.unknown_method"] > 0
        assert stats["ipc.internal"] == 0  # nothing reached a handler and broke it

    asyncio.run(main())
