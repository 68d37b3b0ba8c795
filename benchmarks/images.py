"""Deciding that no image needs building, beside the raw engine, in one run.

    python -m benchmarks.images --json [--n 20]

Keys: ``noop_build`` (``build_images`` when every image is current: hashing the inputs
plus one inspect per image) beside ``baseline_inspect`` (the raw SDK inspect of the same
images), each with p50_ms / p90_ms / p99_ms / mean_ms / throughput_per_s.  Sandbox
start-up is ``benchmarks.sandbox``.
"""

from __future__ import annotations

import argparse
import json
import sys

from benchmarks._stats import measure
from fluffy.images.builder import build_images, plan_images
from fluffy.kernel.containers.engine import connect


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.images")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--n", type=int, default=20, help="samples per figure")
    args = parser.parse_args(argv)

    with connect() as engine:
        build_images(engine)  # make sure everything is current before timing the no-op
        refs = [status.ref for status in plan_images(engine)]
        api = engine.client.api
        result: dict[str, object] = {
            "engine": f"{engine.info.engine} {engine.info.version}",
            "noop_build": measure(lambda: build_images(engine), args.n),
            "baseline_inspect": measure(lambda: [api.inspect_image(r) for r in refs], args.n),
        }
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in result.items():
            print(f"{key:<22} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
