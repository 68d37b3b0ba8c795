"""What the canary (ADR-080) adds to a pytest run, beside the same run without it.

    python -m benchmarks.canary --json [--repeat 5]

Two generated suites, each run with the command line the test tool builds (quiet,
cache in /tmp, a JUnit report; no coverage), alternately without and with the run's
canary plugin (``-p fluffy_canary_<token> --maxfail=0``, a new token each run, the
report then read by the kernel's rule):

- ``many_files``: 2,000 files of one test each, the canary's worst case (two canaries
  per file: three times the items);
- ``typical``: 100 files of 10 tests each.

Keys per suite: ``plain_p50_ms``, ``canary_p50_ms`` (wall time of the whole pytest
process, median of ``--repeat`` runs; p90 beside), and ``canary_ratio`` (canary / plain).
The plain run is the baseline: the same interpreter and pytest, in the same loop.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._stats import percentile
from fluffy.junit import parse_junit
from fluffy.kernel.tools.testing.canary import draw, without_canaries
from fluffy.plugins.test_tool.canary import write_plugin

SUITES = {"many_files": (2000, 1), "typical": (100, 10)}


def make_suite(root: Path, files: int, tests: int) -> Path:
    folder = root / "tests"
    folder.mkdir(parents=True)
    body = "".join(f"def test_{n}():\n    assert {n} == {n}\n\n\n" for n in range(tests))
    for n in range(files):
        (folder / f"test_m{n:04d}.py").write_text(body)
    return root


def run_once(project: Path, canary: bool) -> float:
    """One pytest run of ``project`` (ms); with ``canary``, its report must pass the rule."""
    junit = project / "junit.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly",
               "-o", "cache_dir=/tmp/.fluffy-bench-cache", "-o", "junit_family=xunit1",
               f"--junitxml={junit}"]  # fmt: skip
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    token = draw()
    with tempfile.TemporaryDirectory(prefix="fluffy-canary-") as folder:
        if canary:
            command += ["-p", write_plugin(Path(folder), token), "--maxfail=0"]
            env["PYTHONPATH"] = folder
        started = time.perf_counter()
        done = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=600, check=False)  # fmt: skip
        elapsed = (time.perf_counter() - started) * 1000
    if done.returncode != 0:
        raise RuntimeError(f"pytest exited {done.returncode}: {done.stdout[-500:]}")
    cases = parse_junit(junit.read_bytes())
    if canary:
        cases = without_canaries(cases, token, run="the benchmark's run")
    return elapsed


def measure(files: int, tests: int, repeat: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fluffy-bench-") as tmp:
        project = make_suite(Path(tmp), files, tests)
        run_once(project, False)  # warm: the file system's cache, pytest's imports
        plain: list[float] = []
        with_canary: list[float] = []
        for _ in range(repeat):
            plain.append(run_once(project, False))
            with_canary.append(run_once(project, True))
    p50, c50 = percentile(plain, 0.5), percentile(with_canary, 0.5)
    return {
        "files": files,
        "tests_per_file": tests,
        "plain_p50_ms": round(p50, 1),
        "plain_p90_ms": round(percentile(plain, 0.9), 1),
        "canary_p50_ms": round(c50, 1),
        "canary_p90_ms": round(percentile(with_canary, 0.9), 1),
        "canary_ratio": round(c50 / p50, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.canary")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    result = {name: measure(*shape, args.repeat) for name, shape in SUITES.items()}
    if args.json:
        print(json.dumps(result))
    else:
        for name, figures in result.items():
            print(name, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
