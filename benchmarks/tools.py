"""The tool path's overhead, beside the raw IPC round trip and raw engine calls, in one run.

    python -m benchmarks.tools --json [--n 2000] [--plugin-n 10] [--think-ms 500]
                                      [--test-files 2000]

A real ``fluffy kernel serve`` on a copy of the demo project (a git repository):

- ipc_rtt: ``kernel.ping`` round trip on the same connection (the floor), as a health
  check asks it (``figures: false``: health, identity and the audit head);
  ``ipc_rtt_figures``: the same with the kernel's memory and scheduler figures (what
  ``fluffy status`` asks);
- fs_read: ``tool.call fs.read`` of a small file end to end: client -> kernel ->
  availability and policy -> fast path -> sanitiser -> audit -> reply;
- round_of_10_reads: one ``tool.batch`` of 10 fs.read calls (one AI turn);
- plugin_call_overhead: ``git.status`` through a git-tool sandbox, end to end as the
  client sees it, minus the wait for its sandbox (``ready_ms``: nearly nothing when the
  warm pool had one) and minus the tool's own run time as the plugin host measured it:
  the kernel's dispatch, IPC both ways, sanitising and auditing (design budget 50 ms).
- ipc_echo_rtt: the same client's round trip to a raw asyncio echo server (the baseline
  of ``kernel.ping``, as in :mod:`benchmarks.ipc`), in blocks of 100 alternating with
  the pings, this process pinned to one CPU and both servers' event loops to another;
- fs_write: an ``fs.write`` end to end as the model sees it, ``--think-ms`` after the
  previous call (a model's turn; the pool refills meanwhile); then a turn of ``--plugin-n``
  writes back to back (``fs_write_first_burst``: the session's first such turn), a pause,
  and another such turn (``fs_write_burst``: the pool sized from the first, ADR-065;
  ``fs_write_cold``: its calls that found no sandbox ready);
- raw_exec: ``<engine> exec <container> true`` into a running container (what reusing
  one sandbox would cost per call), same run;
- pool_idle_memory_mib_per_sandbox: what an idle pool sandbox holds (``<engine> stats``);
- test_run (``--test-files``): ``test.run`` on a generated flat-layout repository of that
  many modules, beside the same pytest started directly in the same image
  (:mod:`benchmarks._testrun`).

Keys: fs_read_p50_us / _p90_us / _p99_us, fs_read_per_s, ipc_rtt_p50_us / _p99_us,
ipc_rtt_figures_p50_us,
ipc_echo_rtt_p50_us, ratio_ipc_vs_echo_p50 (goal <= 1.1), ratio_fs_read_vs_ipc_p50,
round_of_10_reads_p50_ms / _p99_ms, plugin_call_overhead_p50_ms / _p90_ms,
plugin_sandbox_ready_p50_ms, plugin_call_total_p50_ms, fs_write_p50_ms / _p90_ms,
fs_write_warm_share, fs_write_first_burst_p50_ms, fs_write_burst_p50_ms / _p90_ms,
fs_write_burst_warm_share, fs_write_cold_p50_ms, raw_exec_p50_ms / _p90_ms,
ratio_fs_write_vs_exec_p50 (goal <= 0.2), ratio_fs_write_burst_vs_exec_p50 (goal <= 1),
pool_idle_sandboxes, pool_idle_memory_mib_per_sandbox, test_run_files, test_run_p50_ms /
_p90_ms, test_run_warm_share, test_run_direct_p50_ms, test_run_exec_p50_ms,
test_run_overhead_ratio (goal <= 1.3), test_run_vs_exec_ratio, think_ms, engine.
Sandboxed keys need an engine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks import _testrun as testrun
from benchmarks._kernel import idle_memory_mib, kernel
from benchmarks._stats import percentile
from fluffy.demo_session import init_repository
from fluffy.ipc.client import SyncClient
from fluffy.ipc.transport import peer_identity

DEMO = Path(__file__).resolve().parents[1] / "examples" / "demo-project"
#: The figures that need a container engine (null without one).
SANDBOXED = (
    "plugin_n", "plugin_call_overhead_p50_ms", "plugin_call_overhead_p90_ms",
    "plugin_sandbox_ready_p50_ms", "plugin_call_total_p50_ms", "fs_write_p50_ms",
    "fs_write_p90_ms", "fs_write_warm_share", "fs_write_first_burst_p50_ms",
    "fs_write_burst_p50_ms", "fs_write_burst_p90_ms", "fs_write_burst_warm_share",
    "fs_write_cold_p50_ms", "ratio_fs_write_burst_vs_exec_p50",
    "pool_idle_sandboxes", "pool_idle_memory_mib_per_sandbox", "raw_exec_p50_ms",
    "raw_exec_p90_ms", "ratio_fs_write_vs_exec_p50", "test_run_files", "test_run_p50_ms",
    "test_run_p90_ms", "test_run_warm_share", "test_run_direct_p50_ms", "test_run_exec_p50_ms",
    "test_run_overhead_ratio", "test_run_vs_exec_ratio",
)  # fmt: skip


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


def _engine() -> tuple[str | None, str]:
    """The engine's name and its current code-executor image (None, "": no engine)."""
    from fluffy.errors import FluffyError
    from fluffy.images.builder import build_images
    from fluffy.kernel.containers.engine import connect

    try:
        with connect(timeout=10) as engine:
            refs = {status.name: status.ref for status in build_images(engine)}
            return str(engine.name), refs["code-executor"]
    except FluffyError:
        return None, ""


def _project(root: Path) -> Path:
    project = root / "project"
    shutil.copytree(DEMO, project)
    init_repository(project)
    for path in [root, project, *project.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return project


def run(n: int, plugin_n: int, think_s: float, test_files: int) -> dict[str, Any]:
    engine, image = _engine() if plugin_n else (None, "")
    root = Path(tempfile.mkdtemp(prefix="fluffy-bench-tools-"))
    project = _project(root)
    try:
        with kernel(root, project, engine) as sock, SyncClient(str(sock), timeout=600) as client:
            sid = client.call("session.create")["session_id"]
            read = {
                "session_id": sid,
                "tool": "fs.read",
                "args": {"path": "src/democonfig/config.py"},
            }
            batch = {"session_id": sid, "calls": [{"tool": "fs.read", "args": read["args"]}] * 10}
            assert client.call("tool.call", read)["ok"]
            ping, echo, figures = _ping_and_echo(client, root, n)
            reads = _timed(lambda: client.call("tool.call", read), n)
            rounds = _timed(lambda: client.call("tool.batch", batch), max(50, n // 10), 10)
            result: dict[str, Any] = {
                "n": n,
                "ipc_rtt_p50_us": _us(ping, 0.5),
                "ipc_rtt_p99_us": _us(ping, 0.99),
                "ipc_rtt_figures_p50_us": _us(figures, 0.5),
                "ipc_echo_rtt_p50_us": _us(echo, 0.5),
                "ratio_ipc_vs_echo_p50": round(percentile(ping, 0.5) / percentile(echo, 0.5), 2),
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
                "think_ms": round(think_s * 1000),
            }
            result.update(dict.fromkeys(SANDBOXED))  # null without an engine
            if engine:
                result.update(_plugin_calls(client, sid, plugin_n, think_s))
                result.update(_writes(client, sid, plugin_n, think_s, engine, project))
        if engine:
            raw = _raw_execs(engine, image, plugin_n)
            writes = result["fs_write_p50_ms"]
            result.update(
                raw_exec_p50_ms=_ms(raw, 0.5),
                raw_exec_p90_ms=_ms(raw, 0.9),
                ratio_fs_write_vs_exec_p50=round(writes / (percentile(raw, 0.5) * 1000), 2),
                ratio_fs_write_burst_vs_exec_p50=round(
                    result["fs_write_burst_p50_ms"] / (percentile(raw, 0.5) * 1000), 2
                ),
            )
            if test_files:
                result.update(testrun.measure(engine, image, test_files, plugin_n, think_s))
        return result
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _ping_and_echo(
    client: SyncClient, root: Path, n: int
) -> tuple[list[float], list[float], list[float]]:
    """``kernel.ping`` round trips, and the baseline: the same client's round trips to a
    raw asyncio echo server (benchmarks.ipc's, in its own process), taken in alternating
    blocks of 100 so both see the same machine (a pool refilling, a busy neighbour)."""
    from benchmarks.ipc import _start

    path = str(root / "echo.sock")
    server = _start("echo", path)
    ping: list[float] = []
    echo: list[float] = []
    figures: list[float] = []
    health = {"figures": False}  # the same request to both servers
    try:
        with SyncClient(path, timeout=60) as raw, _pinned(client, raw):
            for start in range(0, n, 100):
                block = min(100, n - start)
                ping += _timed(lambda: client.call("kernel.ping", health), block, warmup=5)
                echo += _timed(lambda: raw.call("kernel.ping", health), block, warmup=5)
                figures += _timed(lambda: client.call("kernel.ping"), block, warmup=5)
        return ping, echo, figures
    finally:
        server.terminate()
        server.wait(timeout=30)


@contextlib.contextmanager
def _pinned(*clients: SyncClient) -> Iterator[None]:
    """This process on one CPU, the servers' event loops (their main threads) on
    another, for the time of the block.  Unpinned, where the OS places three processes
    on two CPUs moves a round trip between ~33 us (same CPU) and ~60 us (a cross-CPU
    wake-up) from one run to the next, whichever server is measured."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        yield
        return
    pids = [_peer_pid(c) for c in clients]
    saved = {pid: os.sched_getaffinity(pid) for pid in (0, *pids)}
    try:
        os.sched_setaffinity(0, {cpus[0]})
        for pid in pids:
            os.sched_setaffinity(pid, {cpus[1]})
        yield
    finally:
        for pid, mask in saved.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(pid, mask)


def _peer_pid(client: SyncClient) -> int:
    return peer_identity(client.sock).pid


def _plugin_calls(client: SyncClient, sid: str, n: int, think_s: float) -> dict[str, Any]:
    """``git.status`` through git-tool sandboxes: the kernel's own share of a call."""
    overheads, ready, totals = [], [], []
    status = {"session_id": sid, "tool": "git.status", "args": {}}
    for _ in range(n):
        time.sleep(think_s)
        t0 = time.perf_counter()
        answer = client.call("tool.call", status)
        total = (time.perf_counter() - t0) * 1000
        assert answer["ok"], answer
        timings = answer["timings"]
        ready.append(timings["ready_ms"] / 1000)
        totals.append(total / 1000)
        overheads.append((total - timings["ready_ms"] - timings["tool_ms"]) / 1000)
    return {
        "plugin_n": len(overheads),
        "plugin_call_overhead_p50_ms": _ms(overheads, 0.5),
        "plugin_call_overhead_p90_ms": _ms(overheads, 0.9),
        "plugin_sandbox_ready_p50_ms": _ms(ready, 0.5),
        "plugin_call_total_p50_ms": _ms(totals, 0.5),
    }


def _writes(
    client: SyncClient, sid: str, n: int, think_s: float, engine: str, project: Path
) -> dict[str, Any]:
    """``fs.write`` of a small test file end to end, as the model sees it (test_writing:
    a single-use fs-tool sandbox per call, the file sent back over its socket, staged):
    paced by ``think_s`` (a model's turn between calls), then back to back (the pool
    cannot keep up: some calls make their own sandbox)."""
    client.call("session.message", {"session_id": sid, "text": "benchmark writes"})  # planning
    planned = client.call(
        "tool.call", {"session_id": sid, "tool": "plan.complete", "args": {"summary": "bench"}}
    )
    assert planned["ok"], planned

    def write(i: int) -> tuple[float, bool]:
        args = {"path": f"tests/test_bench_{i}.py", "content": f"def test_{i}():\n    pass\n"}
        t0 = time.perf_counter()
        answer = client.call("tool.call", {"session_id": sid, "tool": "fs.write", "args": args})
        elapsed = time.perf_counter() - t0
        assert answer["ok"], answer
        return elapsed, bool(answer["timings"].get("warm"))

    paced, warm = [], 0
    for i in range(n):
        time.sleep(think_s)
        elapsed, was_warm = write(i)
        paced.append(elapsed)
        warm += was_warm
    time.sleep(max(think_s, 1.0))  # the pool refills: its idle sandboxes are measured
    memory = idle_memory_mib(engine, project)
    first = [write(n + i) for i in range(n)]  # no turn like it yet: the pool holds few
    time.sleep(max(think_s, 2.0))  # a model's turn: the pool sizes itself for the next
    burst = [write(2 * n + i) for i in range(n)]
    cold = [t for t, was_warm in burst if not was_warm]
    return {
        "fs_write_p50_ms": _ms(paced, 0.5),
        "fs_write_p90_ms": _ms(paced, 0.9),
        "fs_write_warm_share": round(warm / n, 2),
        "fs_write_first_burst_p50_ms": _ms([t for t, _ in first], 0.5),
        "fs_write_burst_p50_ms": _ms([t for t, _ in burst], 0.5),
        "fs_write_burst_p90_ms": _ms([t for t, _ in burst], 0.9),
        "fs_write_burst_warm_share": round((n - len(cold)) / n, 2),
        "fs_write_cold_p50_ms": _ms(cold, 0.5) if cold else None,
        "pool_idle_sandboxes": len(memory),
        "pool_idle_memory_mib_per_sandbox": round(sum(memory) / len(memory), 1) if memory else None,
    }


def _raw_execs(engine: str, image: str, n: int) -> list[float]:
    """Baseline: ``<engine> exec <container> true`` into one running container of the
    code-executor ``image`` (what a reused sandbox would cost per call), same run."""
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
    parser.add_argument(
        "--think-ms", type=float, default=500, help="pause before each sandboxed call"
    )
    parser.add_argument(
        "--test-files", type=int, default=2000, help="modules of test.run's repository (0: skip)"
    )
    args = parser.parse_args(argv)
    result = run(args.n, args.plugin_n, args.think_ms / 1000, args.test_files)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:32} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
