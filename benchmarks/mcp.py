"""An MCP server's tool called through fluffy, beside the same server called directly.

    python -m benchmarks.mcp --json [--n 300]

The reference server ``mcp-server-time`` is installed into its sandbox image the way
``fluffy mcp add`` does it (wheels on the host, installed offline) and registered in a
copy of the demo project, whose policy allows ``mcp.time.*``.  A real ``fluffy kernel
serve`` starts it on the first call; then, with the server warm:

- mcp_call: ``tool.call mcp.time.get_current_time`` end to end as a client sees it:
  client -> kernel -> argument check against the tool's schema -> policy -> the relay
  socket -> the server in its sandbox -> back -> sanitiser -> audit -> reply;
- direct: the same server in the same image, started with ``<engine> run -i`` (no
  network, as in its sandbox), called over its stdio with the official ``mcp`` SDK's
  client -- an MCP client on the host using the server without fluffy.

The two are measured call for call in turn, in the same run, so the machine's drift
(this 2-core machine varies ±30 % between runs) hits both alike.

Keys: mcp_call_p50_ms / _p90_ms / _p99_ms, mcp_calls_per_s, direct_p50_ms / _p90_ms /
_p99_ms, direct_calls_per_s, ratio_vs_direct_p50 (goal <= 1.5), mcp_server_start_ms (the
first call: sandbox made, server started, initialised, tools listed), image_build_s, n,
engine.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks._kernel import kernel
from benchmarks._stats import percentile
from fluffy.demo_session import init_repository
from fluffy.ipc.client import SyncClient

DEMO = Path(__file__).resolve().parents[1] / "examples" / "demo-project"
COMMAND = ["mcp-server-time", "--local-timezone", "UTC"]
ARGS = {"timezone": "Europe/Paris"}
RULE = """  - name: time-tools
    match: {syscall: "mcp.time.*"}
    action: allow
"""


def _ms(samples: list[float], q: float) -> float:
    return round(percentile(samples, q) * 1e3, 2)


def _figures(prefix: str, samples: list[float]) -> dict[str, Any]:
    return {
        f"{prefix}_p50_ms": _ms(samples, 0.5),
        f"{prefix}_p90_ms": _ms(samples, 0.9),
        f"{prefix}_p99_ms": _ms(samples, 0.99),
        f"{prefix.replace('_call', '')}_calls_per_s": round(len(samples) / sum(samples), 1),
    }


def _image() -> tuple[str, str, float]:
    """(engine name, the server's image, seconds to build or find it)."""
    from fluffy.images.builder import build_images
    from fluffy.images.mcpenv import ensure_server_image
    from fluffy.kernel.containers.engine import connect

    started = time.perf_counter()
    with connect(timeout=10) as engine:
        refs = {status.name: status.ref for status in build_images(engine)}
        built = ensure_server_image(
            engine, refs["code-executor"], pip=["mcp-server-time"], path=None
        )
        return str(engine.name), built.image, time.perf_counter() - started


def _project(root: Path, image: str) -> Path:
    from fluffy.kernel.mcp.connection import McpConnection  # noqa: F401 - the SDK is here
    from fluffy.kernel.mcp.record import McpServer, McpTool, save_record

    project = root / "project"
    shutil.copytree(DEMO, project)
    policy = project / ".fluffy" / "policy.yaml"
    policy.write_text(policy.read_text() + RULE)
    init_repository(project)
    schema = {"type": "object", "properties": {"timezone": {"type": "string"}},
              "required": ["timezone"]}  # fmt: skip
    server = McpServer(
        name="time",
        command=COMMAND,
        pip=["mcp-server-time"],
        image=image,
        tools=[McpTool(name="get_current_time", input_schema=schema)],
    )
    save_record(project, server)
    for path in [root, project, *project.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return project


class _Direct:
    """The same server in the same image over ``<engine> run -i``, with the official SDK's
    stdio client, in a thread of its own (its event loop): timed inside that loop."""

    def __init__(self, engine: str, image: str) -> None:
        from fluffy.kernel.mcp.connection import SERVER_PATH

        self.command = [engine, "run", "-i", "--rm", "--network", "none", "--user",
                        "10001:10001", "--read-only", "--cap-drop", "ALL", "--env",
                        f"PATH={SERVER_PATH}", image, *COMMAND]  # fmt: skip
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.session: Any = None
        self.stop: asyncio.Event | None = None
        self.done: Any = None

    def __enter__(self) -> _Direct:
        self.thread.start()
        ready = concurrent.futures.Future[None]()
        self.done = asyncio.run_coroutine_threadsafe(self._serve(ready), self.loop)
        ready.result(timeout=120)
        return self

    async def _serve(self, ready: concurrent.futures.Future[None]) -> None:
        from mcp.client.session import ClientSession
        from mcp.client.stdio import StdioServerParameters, stdio_client

        params = StdioServerParameters(command=self.command[0], args=self.command[1:])
        self.stop = asyncio.Event()
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            self.session = session
            ready.set_result(None)
            await self.stop.wait()

    async def _timed(self) -> float:
        started = time.perf_counter()
        result = await self.session.call_tool("get_current_time", ARGS)
        assert not result.is_error
        return time.perf_counter() - started

    def call(self) -> float:
        return asyncio.run_coroutine_threadsafe(self._timed(), self.loop).result(timeout=60)

    def __exit__(self, *exc: object) -> None:
        assert self.stop is not None
        self.loop.call_soon_threadsafe(self.stop.set)
        with contextlib.suppress(Exception):
            self.done.result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _measure(root: Path, project: Path, engine: str, image: str, n: int) -> dict[str, Any]:
    """Both ways, call for call in turn (so drift of the machine hits both alike)."""
    with (
        kernel(root, project, engine) as sock,
        SyncClient(str(sock), timeout=600) as client,
        _Direct(engine, image) as direct,
    ):
        sid = client.call("session.create")["session_id"]
        call = {"session_id": sid, "tool": "mcp.time.get_current_time", "args": ARGS}
        started = time.perf_counter()
        first = client.call("tool.call", call)
        start_ms = (time.perf_counter() - started) * 1000
        if not first.get("ok"):
            raise SystemExit(f"the first call failed: {json.dumps(first)[:2000]}")
        for _ in range(20):  # warm: the server's own first calls import what they use
            client.call("tool.call", call)
            direct.call()
        through: list[float] = []
        plain: list[float] = []
        for _ in range(n):
            t0 = time.perf_counter()
            answer = client.call("tool.call", call)
            through.append(time.perf_counter() - t0)
            assert answer["ok"], answer
            plain.append(direct.call())
    result = {**_figures("mcp_call", through), "mcp_server_start_ms": round(start_ms, 1)}
    result.update(
        direct_p50_ms=_ms(plain, 0.5),
        direct_p90_ms=_ms(plain, 0.9),
        direct_p99_ms=_ms(plain, 0.99),
        direct_calls_per_s=round(len(plain) / sum(plain), 1),
    )
    return result


def run(n: int) -> dict[str, Any]:
    engine, image, build_s = _image()
    root = Path(tempfile.mkdtemp(prefix="fluffy-bench-mcp-"))
    try:
        project = _project(root, image)
        result: dict[str, Any] = {"n": n, "engine": engine, "image_build_s": round(build_s, 1)}
        result.update(_measure(root, project, engine, image, n))
        result["ratio_vs_direct_p50"] = round(
            result["mcp_call_p50_ms"] / result["direct_p50_ms"], 2
        )
        return result
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.mcp")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.n)
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
