"""Kernel start and crash recovery, beside a bare container of the same image, in one run.

    python -m benchmarks.startup --json [--n 10]

start_to_healthy: from launching ``python3 -m fluffy.bootstrap run`` (warm images) to
the first answered ``kernel.ping`` on the project's socket (the bootstrap creates and
starts L1, the kernel checks its database, opens the audit log and listens).
restart_to_healthy: from SIGKILL of the running kernel container to the first answered
ping of its replacement (the supervisor notices, backs off, starts a new L1).
cli_start: ``fluffy start`` as a person runs it, until the command returns (the CLI's own
start-up, the policy's network list, the bootstrap, the kernel healthy); stop: ``fluffy
stop`` until it returns (the kernel records its shutdown, the container and the gate go).
bare_container: ``docker run --rm --network none`` of the kernel image running ``true``
(create, start, wait, remove), the engine's own floor.
start_with_log: start_to_healthy for a project whose audit log already holds
``--log-entries`` (100,000: months of sessions) valid entries, built directly in its state
folder (not timed); measured ``min(n, 3)`` times.  What a long history adds to a start.

Keys: start_to_healthy_p50_ms / _p90_ms, restart_to_healthy_p50_ms / _p90_ms,
cli_start_p50_ms / _p90_ms, stop_p50_ms / _p90_ms, bare_container_p50_ms / _p90_ms,
ratio_start_vs_bare_p50 (goal <= 2), ratio_cli_start_vs_bare_p50 (goal <= 3),
start_with_log_p50_ms / _p90_ms, log_entries, n, engine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks._stats import percentile
from fluffy.bootstrap import l1
from fluffy.bootstrap.supervisor import paths, read_json
from fluffy.images.builder import build_images
from fluffy.kernel.containers.engine import connect

DEMO = Path(__file__).resolve().parents[1] / "examples" / "demo-project"


def _until_pong(sock: Path, timeout: float = 60.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            l1.ping(str(sock), timeout=1.0)
            return time.perf_counter()
        except (OSError, ValueError):
            time.sleep(0.005)
    raise TimeoutError(f"no pong on {sock} within {timeout:.0f} s")


def _stats(prefix: str, samples: list[float]) -> dict[str, float]:
    return {
        f"{prefix}_p50_ms": round(percentile(samples, 0.5), 1),
        f"{prefix}_p90_ms": round(percentile(samples, 0.9), 1),
    }


@contextlib.contextmanager
def _project(image: str, kind: str) -> Iterator[tuple[Path, dict[str, str], dict[str, Path]]]:
    """A copy of the demo project with its own fluffy home: (project, env, its paths)."""
    with tempfile.TemporaryDirectory() as tmp:
        home, project = Path(tmp) / "home", Path(tmp) / "project"
        subprocess.run(["cp", "-r", str(DEMO), str(project)], check=True)
        env = dict(
            os.environ, FLUFFY_HOME=str(home), FLUFFY_KERNEL_IMAGE=image, FLUFFY_RUNTIME=kind
        )
        yield project, env, paths(home, str(project))


@contextlib.contextmanager
def _launched(project: Path, env: dict[str, str], sock: Path) -> Iterator[float]:
    """``python3 -m fluffy.bootstrap run`` launched (its start time: perf_counter),
    stopped with SIGTERM when the block ends."""
    sock.unlink(missing_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fluffy.bootstrap", "run", "--project", str(project)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield t0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)


def _start_with_log(image: str, kind: str, entries: int, n: int) -> list[float]:
    """Start to healthy, ``n`` times, for a project whose log holds ``entries``."""
    from benchmarks.audit import build_chain

    samples: list[float] = []
    with _project(image, kind) as (project, env, p):
        build_chain(p["state"], entries)
        sock = p["run"] / "kernel.sock"
        for _ in range(n):
            with _launched(project, env, sock) as t0:
                samples.append((_until_pong(sock, timeout=120) - t0) * 1000)
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.startup")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--log-entries", type=int, default=100_000)
    args = parser.parse_args(argv)
    with connect() as engine:
        image = {s.name: s.ref for s in build_images(engine)}["kernel"]
        kind = engine.info.engine
    starts: list[float] = []
    restarts: list[float] = []
    cli_starts: list[float] = []
    stops: list[float] = []
    bare: list[float] = []
    with _project(image, kind) as (project, env, p):
        sock = p["run"] / "kernel.sock"
        for _ in range(args.n):
            with _launched(project, env, sock) as t0:
                starts.append((_until_pong(sock) - t0) * 1000)
                while (read_json(p["status"]) or {}).get("health") != "healthy":
                    time.sleep(0.01)
                container = (read_json(p["status"]) or {})["container"]
                before = (read_json(p["status"]) or {}).get("restarts", 0)
                if before < 2:  # stay below the crash-loop limit: one restart per supervisor
                    t1 = time.perf_counter()
                    subprocess.run(
                        [kind, "kill", "--signal", "KILL", container],
                        capture_output=True,
                        check=True,
                    )
                    while True:  # the old socket may answer nothing; wait for the new kernel
                        status = read_json(p["status"]) or {}
                        if status.get("restarts", 0) > before and status.get("health") == "healthy":
                            break
                        time.sleep(0.002)
                    restarts.append((_until_pong(sock) - t1) * 1000)
            for command, samples in (("start", cli_starts), ("stop", stops)):
                t3 = time.perf_counter()
                subprocess.run(
                    [sys.executable, "-m", "fluffy", command, "--project", str(project)],
                    env=env, stdin=subprocess.DEVNULL, capture_output=True, check=True,
                )  # fmt: skip
                samples.append((time.perf_counter() - t3) * 1000)
            t2 = time.perf_counter()
            subprocess.run(
                [kind, "run", "--rm", "--network", "none", "--entrypoint", "true", image],
                capture_output=True,
                check=True,
            )
            bare.append((time.perf_counter() - t2) * 1000)
    with_log = _start_with_log(image, kind, args.log_entries, min(args.n, 3))
    result: dict[str, Any] = {
        **_stats("start_with_log", with_log),
        "log_entries": args.log_entries,
        **_stats("start_to_healthy", starts),
        **_stats("restart_to_healthy", restarts),
        **_stats("cli_start", cli_starts),
        **_stats("stop", stops),
        **_stats("bare_container", bare),
        "n": args.n,
        "engine": kind,
    }
    for key, figure in (("start", "start_to_healthy"), ("cli_start", "cli_start")):
        result[f"ratio_{key}_vs_bare_p50"] = round(
            result[f"{figure}_p50_ms"] / result["bare_container_p50_ms"], 2
        )
    print(json.dumps(result, sort_keys=True) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
