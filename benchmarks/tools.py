"""The tool path's overhead, beside the raw IPC round trip, in one run.

    python -m benchmarks.tools --json [--n 2000] [--plugin-n 10]

A real ``fluffy kernel serve`` on a copy of the demo project (a git repository):

- ipc_rtt: ``kernel.ping`` round trip on the same connection (the floor);
- fs_read: ``tool.call fs.read`` of a small file end to end: client -> kernel ->
  availability and policy -> fast path -> sanitiser -> audit -> reply;
- round_of_10_reads: one ``tool.batch`` of 10 fs.read calls (one AI turn);
- plugin_call_overhead: ``git.status`` through a git-tool sandbox, end to end as the
  client sees it, minus the sandbox's creation (create + start + the host's start-up
  until it asks for work) and minus the tool's own run time as the plugin host
  measured it — what is left is the kernel's dispatch, IPC both ways, sanitising and
  auditing (design budget 50 ms; target 15 ms).  Needs an engine; null without one.

Keys: fs_read_p50_us, fs_read_p90_us, fs_read_p99_us, fs_read_per_s, ipc_rtt_p50_us,
ipc_rtt_p99_us, ratio_fs_read_vs_ipc_p50, round_of_10_reads_p50_ms / _p99_ms,
plugin_call_overhead_p50_ms / _p90_ms, plugin_sandbox_ready_p50_ms, plugin_call_total_p50_ms,
fs_write_p50_ms / _p90_ms (an ``fs.write`` end to end, as the model sees it),
raw_exec_p50_ms / _p90_ms (``<engine> exec`` of ``true`` into a running container, same
run), ratio_fs_write_vs_exec_p50 (issue 20's goal: <= 0.5), engine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._stats import percentile
from fluffy.demo_session import init_repository
from fluffy.ipc.client import SyncClient

DEMO = Path(__file__).resolve().parents[1] / "examples" / "demo-project"
FLUFFY = [sys.executable, "-m", "fluffy"]


def _us(samples: list[float], q: float) -> float:
    return round(percentile(samples, q) * 1e6, 1)


def _ms(samples: list[float], q: float) -> float:
    return round(percentile(samples, q) * 1e3, 2)


def _timed(fn: Any, n: int, warmup: int = 50) -> list[float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


def _engine() -> str | None:
    from fluffy.errors import FluffyError
    from fluffy.images.builder import build_images
    from fluffy.kernel.containers.engine import connect

    try:
        with connect(timeout=10) as engine:
            build_images(engine)
            return str(engine.name)
    except FluffyError:
        return None


def _project(root: Path) -> Path:
    project = root / "project"
    shutil.copytree(DEMO, project)
    init_repository(project)
    for path in [root, project, *project.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return project


def run(n: int, plugin_n: int) -> dict[str, Any]:
    engine = _engine() if plugin_n else None
    root = Path(tempfile.mkdtemp(prefix="fluffy-bench-tools-"))
    sock = root / "run" / "kernel.sock"
    project = _project(root)
    env = {**os.environ, **({"FLUFFY_RUNTIME": engine} if engine else {})}
    proc = subprocess.Popen(
        [*FLUFFY, "kernel", "serve", "--socket", str(sock), "--state-dir",
         str(root / "state"), "--project", str(project)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the kernel did not start: {proc.stderr.read()!r}")  # type: ignore[union-attr]
            time.sleep(0.02)
        with SyncClient(str(sock), timeout=600) as client:
            sid = client.call("session.create")["session_id"]
            read = {
                "session_id": sid,
                "tool": "fs.read",
                "args": {"path": "src/democonfig/config.py"},
            }
            batch = {"session_id": sid, "calls": [{"tool": "fs.read", "args": read["args"]}] * 10}
            assert client.call("tool.call", read)["ok"]
            ping = _timed(lambda: client.call("kernel.ping"), n)
            reads = _timed(lambda: client.call("tool.call", read), n)
            rounds = _timed(lambda: client.call("tool.batch", batch), max(50, n // 10), 10)
            result: dict[str, Any] = {
                "n": n,
                "ipc_rtt_p50_us": _us(ping, 0.5),
                "ipc_rtt_p99_us": _us(ping, 0.99),
                "fs_read_p50_us": _us(reads, 0.5),
                "fs_read_p90_us": _us(reads, 0.9),
                "fs_read_p99_us": _us(reads, 0.99),
                "fs_read_per_s": round(len(reads) / sum(reads), 1),
                "ratio_fs_read_vs_ipc_p50": round(
                    percentile(reads, 0.5) / percentile(ping, 0.5), 2
                ),
                "round_of_10_reads_p50_ms": _ms(rounds, 0.5),
                "round_of_10_reads_p99_ms": _ms(rounds, 0.99),
                "engine": engine,
            }
            overheads, ready, totals = [], [], []
            status = {"session_id": sid, "tool": "git.status", "args": {}}
            for _ in range(plugin_n if engine else 0):
                t0 = time.perf_counter()
                answer = client.call("tool.call", status)
                total = (time.perf_counter() - t0) * 1000
                assert answer["ok"], answer
                timings = answer["timings"]
                ready.append(timings["ready_ms"] / 1000)
                totals.append(total / 1000)
                overheads.append((total - timings["ready_ms"] - timings["tool_ms"]) / 1000)
            writes = _fs_writes(client, sid, plugin_n if engine else 0)
            raw = _raw_execs(engine, plugin_n) if engine else []
            result.update(
                fs_write_p50_ms=_ms(writes, 0.5) if writes else None,
                fs_write_p90_ms=_ms(writes, 0.9) if writes else None,
                raw_exec_p50_ms=_ms(raw, 0.5) if raw else None,
                raw_exec_p90_ms=_ms(raw, 0.9) if raw else None,
                ratio_fs_write_vs_exec_p50=round(percentile(writes, 0.5) / percentile(raw, 0.5), 2)
                if writes and raw
                else None,
                plugin_n=len(overheads),
                plugin_call_overhead_p50_ms=_ms(overheads, 0.5) if overheads else None,
                plugin_call_overhead_p90_ms=_ms(overheads, 0.9) if overheads else None,
                plugin_sandbox_ready_p50_ms=_ms(ready, 0.5) if ready else None,
                plugin_call_total_p50_ms=_ms(totals, 0.5) if totals else None,
            )
            return result
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
        shutil.rmtree(root, ignore_errors=True)


def _fs_writes(client: SyncClient, sid: str, n: int) -> list[float]:
    """``fs.write`` of a small test file end to end, as the model sees it (test_writing:
    a fresh fs-tool sandbox per call, the file sent back over its socket, staged)."""
    if not n:
        return []
    client.call("session.message", {"session_id": sid, "text": "benchmark writes"})  # planning
    planned = client.call(
        "tool.call", {"session_id": sid, "tool": "plan.complete", "args": {"summary": "bench"}}
    )
    assert planned["ok"], planned
    samples = []
    for i in range(n):
        args = {"path": f"tests/test_bench_{i}.py", "content": f"def test_{i}():\n    pass\n"}
        t0 = time.perf_counter()
        answer = client.call("tool.call", {"session_id": sid, "tool": "fs.write", "args": args})
        samples.append(time.perf_counter() - t0)
        assert answer["ok"], answer
    return samples


def _raw_execs(engine: str, n: int) -> list[float]:
    """Baseline: ``<engine> exec <container> true`` into one running code-executor
    container (what a reused sandbox would cost per call), same run."""
    from fluffy.images.builder import build_images
    from fluffy.kernel.containers.engine import connect

    with connect(timeout=10) as connected:
        image = {status.name: status.ref for status in build_images(connected)}["code-executor"]
    started = subprocess.run(
        [engine, "run", "-d", "--rm", "--network", "none", "--entrypoint", "sleep", image, "600"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    try:
        subprocess.run([engine, "exec", started, "true"], check=True)  # warm-up
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            subprocess.run([engine, "exec", started, "true"], check=True)
            samples.append(time.perf_counter() - t0)
        return samples
    finally:
        subprocess.run([engine, "rm", "-f", started], capture_output=True, check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tools")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--plugin-n", type=int, default=10)
    args = parser.parse_args(argv)
    result = run(args.n, args.plugin_n)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:32} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
