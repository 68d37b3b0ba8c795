"""IPC round trips and throughput, beside a raw asyncio echo server, in one run.

    python -m benchmarks.ipc --json [--n 10000]

Both servers run in their own process on a Unix socket; the same client
(``fluffy.ipc.client.AsyncClient``) measures both.  The echo server is the baseline the
issue names: an asyncio protocol that decodes each JSON frame and encodes a reply, with
no validation, handshake checks, method table or limits.

Keys: rtt_p50_us, rtt_p90_us, rtt_p99_us (sequential ``kernel.ping`` on one connection),
echo_rtt_p50_us, echo_rtt_p99_us, ratio_vs_echo_p50, pipelined_req_per_s (one connection,
256 in flight), pipelined_8_clients_req_per_s, and the echo server's figures for both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec

from benchmarks._stats import percentile
from fluffy.ipc.client import AsyncClient
from fluffy.ipc.protocol import HEADER, FrameReader


class EchoProtocol(asyncio.Protocol):
    """The baseline: decode each JSON frame, encode a reply."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.reader = FrameReader()

    def data_received(self, data: bytes) -> None:
        for payload in self.reader.feed(data):
            message = msgspec.json.decode(payload)
            if message.get("type") == "handshake":
                reply: dict[str, object] = {
                    "type": "handshake_ack",
                    "kernel_version": "echo",
                    "supported_api_versions": [0, 1],
                    "negotiated_api_version": 1,
                }
            else:
                reply = {"id": message["id"], "type": "response", "result": {"pong": True}}
            body = msgspec.json.encode(reply)
            self.transport.write(HEADER.pack(len(body)) + body)


async def _serve(kind: str, path: str) -> None:
    if kind == "echo":
        loop = asyncio.get_running_loop()
        server = await loop.create_unix_server(EchoProtocol, path)
        async with server:
            await server.serve_forever()
    else:
        from fluffy.kernel.ipc.server import KernelServer
        from fluffy.kernel.syscalls.kernel import default_methods

        kernel = KernelServer(default_methods())
        await kernel.listen(Path(path))
        await asyncio.Event().wait()


def _start(kind: str, path: str) -> subprocess.Popen[bytes]:
    """The server in its own process, once it accepts connections (its socket file is
    there from ``bind``, before ``listen``: a connection then would be refused)."""
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.ipc", "--serve", kind, path])
    deadline = time.monotonic() + 20
    while True:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.connect(path)
            return proc
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{kind} server did not start") from None
            time.sleep(0.02)


async def _rtt(path: str, n: int) -> list[float]:
    client = await AsyncClient.connect(path)
    for _ in range(200):
        await client.call("kernel.ping")
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        await client.call("kernel.ping")
        samples.append((time.perf_counter() - t0) * 1e6)
    await client.close()
    return samples


async def _pipelined(path: str, clients: int, total: int, window: int = 256) -> float:
    connections = [await AsyncClient.connect(path) for _ in range(clients)]
    per_client = total // clients

    async def drive(client: AsyncClient) -> None:
        done = 0
        while done < per_client:
            batch = min(window, per_client - done)
            await asyncio.gather(*(client.call("kernel.ping") for _ in range(batch)))
            done += batch

    t0 = time.perf_counter()
    await asyncio.gather(*(drive(c) for c in connections))
    elapsed = time.perf_counter() - t0
    for client in connections:
        await client.close()
    return per_client * clients / elapsed


def measure(kind: str, n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "run" / "s.sock") if kind == "kernel" else str(Path(tmp) / "s.sock")
        proc = _start(kind, path)
        try:
            samples = asyncio.run(_rtt(path, n))
            one = asyncio.run(_pipelined(path, 1, max(n, 20_000)))
            eight = asyncio.run(_pipelined(path, 8, max(n, 40_000)))
        finally:
            proc.terminate()
            proc.wait(10)
    return {
        "p50": percentile(samples, 0.5),
        "p90": percentile(samples, 0.9),
        "p99": percentile(samples, 0.99),
        "one": one,
        "eight": eight,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ipc")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--n", type=int, default=10_000, help="sequential round trips")
    parser.add_argument("--serve", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(_serve(args.serve[0], args.serve[1]))
        return 0
    echo = measure("echo", args.n)
    kernel = measure("kernel", args.n)
    result = {
        "n": args.n,
        "rtt_p50_us": round(kernel["p50"], 1),
        "rtt_p90_us": round(kernel["p90"], 1),
        "rtt_p99_us": round(kernel["p99"], 1),
        "echo_rtt_p50_us": round(echo["p50"], 1),
        "echo_rtt_p99_us": round(echo["p99"], 1),
        "ratio_vs_echo_p50": round(kernel["p50"] / echo["p50"], 3),
        "pipelined_req_per_s": round(kernel["one"]),
        "echo_pipelined_req_per_s": round(echo["one"]),
        "pipelined_8_clients_req_per_s": round(kernel["eight"]),
        "echo_pipelined_8_clients_req_per_s": round(echo["eight"]),
    }
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in result.items():
            print(f"{key:<36} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
