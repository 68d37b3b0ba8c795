"""Sandbox create -> ready -> destroyed, beside the raw engine, in one run.

    python -m benchmarks.sandbox --json [--n 30] [--template code-executor]

fluffy: ``ContainerManager.create`` (output folder, labels, seccomp profile, all
hardening; returns when the container runs = ready), then ``wait`` and ``destroy``
(container removed, output folder removed).  Raw engine: the same SDK doing what
``docker run --rm --network none IMAGE true`` does (create, start, wait, remove).
A second baseline, the same raw calls with ``NetworkDisabled`` (no network sandbox at
all, which fluffy also sets and which saves ~130 ms of the engine's network set-up), is
the tightest raw equivalent.  All run ``true`` in the same image, interleaved so drift
hits them alike.

Keys: create_ready_destroy_p50_ms / _p90_ms / _p99_ms, create_to_ready_p50_ms / _p90_ms,
raw_engine_p50_ms / _p90_ms / _p99_ms, ratio_vs_raw_engine_p50,
raw_network_disabled_p50_ms / _p90_ms, ratio_vs_raw_network_disabled_p50,
throughput_per_s (fluffy and raw), engine, n.

The engine gate (L1's only way to the engine, fluffy.gate): the same fluffy sandbox
made through a gate started in this process, interleaved with the direct one;
gate_overhead_p50_ms is the difference of their p50s (goal <= 5 ms per sandbox), and
gate_request_p50_ms / raw_request_p50_ms one inspect through it and direct.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._stats import percentile
from fluffy.images.templates import open_manager
from fluffy.kernel.containers.config import template_config
from fluffy.kernel.containers.engine import Engine, connect
from fluffy.kernel.containers.factory import open_runtime
from fluffy.kernel.containers.manager import ContainerManager


def gated_manager(engine: Engine, images: dict[str, str], folder: Path) -> ContainerManager:
    """A container manager that reaches the engine only through an engine gate."""
    from fluffy.gate.server import start_for
    from fluffy.kernel.tools.sandbox.sandboxes import engine_env

    url = engine.info.url.removeprefix("unix://")
    start_for(folder / "gate", str(folder / "project"), "bench", engine.name, url, (folder,))
    env = {"FLUFFY_ENGINE": engine.name, "FLUFFY_ENGINE_SOCKET": str(folder / "gate/engine.sock")}
    gated = connect(engine_env(env), timeout=60)
    return ContainerManager(
        open_runtime(gated, compat=True), images, root=folder / "sandboxes", labels={}
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sandbox")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--template", default="code-executor")
    args = parser.parse_args(argv)

    with connect() as engine:
        manager = open_manager(engine)
        api = engine.client.api
        image = manager.images[args.template]
        config = template_config(args.template, max_duration="60s")

        def fluffy_once() -> tuple[float, float]:
            t0 = time.perf_counter()
            sandbox = manager.create(config, ["true"])
            ready = time.perf_counter()
            manager.wait(sandbox, config.max_duration_ms)
            manager.destroy(sandbox)
            return (ready - t0) * 1000, (time.perf_counter() - t0) * 1000

        def raw_once(network_disabled: bool = False) -> float:
            t0 = time.perf_counter()
            host = api.create_host_config(network_mode="none")
            cid = api.create_container(
                image, command=["true"], host_config=host, network_disabled=network_disabled
            )["Id"]
            api.start(cid)
            api.wait(cid)
            api.remove_container(cid, force=True)
            return (time.perf_counter() - t0) * 1000

        folder = Path(tempfile.mkdtemp(prefix="fluffy-bench-gate-"))
        (folder / "project").mkdir()
        gated = gated_manager(engine, manager.images, folder)

        def gated_once() -> float:
            t0 = time.perf_counter()
            sandbox = gated.create(config, ["true"])
            gated.wait(sandbox, config.max_duration_ms)
            gated.destroy(sandbox)
            return (time.perf_counter() - t0) * 1000

        def inspect_ms(runtime: object, cid: str) -> float:
            t0 = time.perf_counter()
            runtime.inspect(cid)  # type: ignore[attr-defined]
            return (time.perf_counter() - t0) * 1000

        fluffy_once(), raw_once(), gated_once()  # warm-up
        ready_ms: list[float] = []
        total_ms: list[float] = []
        raw_ms: list[float] = []
        raw_nd_ms: list[float] = []
        gated_ms: list[float] = []
        for _ in range(args.n):
            ready, total = fluffy_once()
            ready_ms.append(ready)
            total_ms.append(total)
            gated_ms.append(gated_once())
            raw_ms.append(raw_once())
            raw_nd_ms.append(raw_once(network_disabled=True))
        probe = gated.create(config, ["sleep", "30"])
        assert probe.container_id is not None
        gate_req = [inspect_ms(gated.runtime, probe.container_id) for _ in range(200)]
        raw_req = [inspect_ms(manager.runtime, probe.container_id) for _ in range(200)]
        gated.destroy(probe)
        manager.close()
        shutil.rmtree(folder, ignore_errors=True)

    def p(samples: list[float], q: float) -> float:
        return round(percentile(samples, q), 1)

    result = {
        "engine": f"{engine.info.engine} {engine.info.version}",
        "template": args.template,
        "n": args.n,
        "create_ready_destroy_p50_ms": p(total_ms, 0.5),
        "create_ready_destroy_p90_ms": p(total_ms, 0.9),
        "create_ready_destroy_p99_ms": p(total_ms, 0.99),
        "create_to_ready_p50_ms": p(ready_ms, 0.5),
        "create_to_ready_p90_ms": p(ready_ms, 0.9),
        "raw_engine_p50_ms": p(raw_ms, 0.5),
        "raw_engine_p90_ms": p(raw_ms, 0.9),
        "raw_engine_p99_ms": p(raw_ms, 0.99),
        "ratio_vs_raw_engine_p50": round(percentile(total_ms, 0.5) / percentile(raw_ms, 0.5), 3),
        "raw_network_disabled_p50_ms": p(raw_nd_ms, 0.5),
        "raw_network_disabled_p90_ms": p(raw_nd_ms, 0.9),
        "ratio_vs_raw_network_disabled_p50": round(
            percentile(total_ms, 0.5) / percentile(raw_nd_ms, 0.5), 3
        ),
        "throughput_per_s": round(1000 * len(total_ms) / sum(total_ms), 2),
        "raw_throughput_per_s": round(1000 * len(raw_ms) / sum(raw_ms), 2),
        "gated_create_ready_destroy_p50_ms": p(gated_ms, 0.5),
        "gated_create_ready_destroy_p90_ms": p(gated_ms, 0.9),
        "gate_overhead_p50_ms": round(percentile(gated_ms, 0.5) - percentile(total_ms, 0.5), 1),
        "gate_request_p50_ms": round(percentile(gate_req, 0.5), 2),
        "raw_request_p50_ms": round(percentile(raw_req, 0.5), 2),
    }
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in result.items():
            print(f"{key:<30} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
