"""Images and one-shot sandboxes, beside raw-engine baselines measured in the same run.

    python -m benchmarks.images --json [--n 20]

Keys: ``noop_build`` (``build_images`` when every image is current: hashing the inputs
plus one inspect per image) beside ``baseline_inspect`` (the raw SDK inspect of the same
images); ``sandbox_oneshot`` (fluffy's hardened create/start/wait/logs/remove of
``true`` in code-executor) beside ``baseline_docker_run`` (``docker run --rm --network
none IMAGE true`` with the engine's own CLI).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys

from benchmarks._stats import measure
from fluffy.images.builder import build_images, plan_images
from fluffy.kernel.containers.engine import connect
from fluffy.kernel.containers.oneshot import OneShot, run_oneshot


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.images")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--n", type=int, default=20, help="samples per figure")
    args = parser.parse_args(argv)

    with connect() as engine:
        build_images(engine)  # make sure everything is current before timing the no-op
        refs = [status.ref for status in plan_images(engine)]
        image = next(ref for ref in refs if ref.startswith("fluffy/code-executor:"))
        api = engine.client.api
        result: dict[str, object] = {
            "engine": f"{engine.info.engine} {engine.info.version}",
            "noop_build": measure(lambda: build_images(engine), args.n),
            "baseline_inspect": measure(lambda: [api.inspect_image(r) for r in refs], args.n),
            "sandbox_oneshot": measure(
                lambda: run_oneshot(
                    engine, OneShot(image=image, command=["true"], purpose="bench")
                ),
                args.n,
            ),
        }
        cli = shutil.which(engine.info.engine)
        if cli:
            cmd = [cli, "run", "--rm", "--network", "none", image, "true"]
            result["baseline_docker_run"] = measure(
                lambda: subprocess.run(cmd, check=True, capture_output=True), args.n
            )
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in result.items():
            print(f"{key:<22} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
