"""Project environments and test runs on a large repository, beside their baselines.

    python -m benchmarks.environments --json [--files 2000] [--runs 5]

A generated src-layout repository of ``--files`` files (modules, tests, data), with a
runtime dependency, a test extra and an in-tree build backend, its dependencies served
by a package index on loopback (no PyPI: figures do not depend on the internet):

- env_build_cold_s: ``fluffy env build`` from nothing (empty wheel cache, no image):
  host download + offline image build + the project's own install;
- env_build_warm_ms: the same call again (a cache hit: hashing the dependency files and
  one image lookup), beside raw_image_inspect_ms (that one engine call alone);
- test_run: ``tool.call test.run`` end to end as the model sees it, through a real
  ``fluffy kernel serve`` (view sync, sandbox, JUnit, evidence), in test_writing (where
  no coverage is measured: only red-or-not is judged): the session's first run (the view
  is laid down) and the warm median; baseline: the same pytest command started directly
  in the same image with ``docker run`` on the same files read-only (raw_pytest: the
  session's view, which holds the files the project's install generated);
- green_run_with_coverage: the run that goes green and merges (code_writing; coverage
  measured and summarised for the tech-debt budget), beside the same coverage run and
  summary started directly (raw_coverage_run).

Keys: files, tests, engine, env_build_cold_s, env_build_warm_ms, raw_image_inspect_ms,
test_run_first_ms, test_run_p50_ms, test_run_p90_ms, raw_pytest_p50_ms,
test_run_overhead_ratio (test_run_p50 / raw_pytest_p50), green_run_with_coverage_ms,
raw_coverage_run_p50_ms, ratio_green_run_vs_raw_coverage, runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._kernel import kernel
from benchmarks._stats import percentile
from fluffy.ipc.client import SyncClient
from tests.project_support import BACKEND, GIT, fixture_wheels, local_index, pip_env


def make_repository(root: Path, files: int) -> int:
    """A src-layout project of ``files`` files; the number of tests."""
    modules = max(10, files * 9 // 10)
    (root / "src" / "bigpkg").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "_backend").mkdir()
    (root / "_backend" / "fixture_backend.py").write_text(
        BACKEND.format(name="bigpkg", package="bigpkg", root="src")
    )
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "fixture_backend"\n'
        'backend-path = ["_backend"]\n[project]\nname = "bigpkg"\ndynamic = ["version"]\n'
        'dependencies = ["fixturelib"]\n[project.optional-dependencies]\ntests = ["fixturetest"]\n'
    )
    (root / "src" / "bigpkg" / "__init__.py").write_text("from ._version import __version__\n")
    for i in range(modules):
        (root / "src" / "bigpkg" / f"mod_{i:04d}.py").write_text(
            f"def value_{i}(x):\n    total = 0\n    for k in range(x):\n        total += k * {i}\n"
            "    return total\n"
        )
    test_files = max(1, (files - modules) * 2 // 3)
    per_file = modules // test_files + 1
    tests = 0
    for t in range(test_files):
        lines = ["import fixturelib\n"]
        for i in range(t * per_file, min(modules, (t + 1) * per_file)):
            lines.append(f"from bigpkg.mod_{i:04d} import value_{i}\n")
        for i in range(t * per_file, min(modules, (t + 1) * per_file)):
            lines.append(f"\n\ndef test_{i}():\n    assert value_{i}(50) == {i} * 1225\n")
            tests += 1
        (root / "tests" / f"test_{t:03d}.py").write_text("".join(lines))
    written = sum(1 for p in root.rglob("*") if p.is_file())
    (root / "data").mkdir()
    for d in range(max(0, files - written)):
        (root / "data" / f"sample_{d:04d}.txt").write_text(f"sample {d}\n")
    env = {**os.environ, **GIT}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "big"]):
        subprocess.run(["git", "-C", str(root), *args], check=True, env=env, capture_output=True)
    return tests


def _ms(samples: list[float], q: float) -> float:
    return round(percentile(samples, q) * 1000, 1)


def run(files: int, runs: int) -> dict[str, Any]:
    from fluffy.images.builder import build_images
    from fluffy.images.environment import ensure_environment
    from fluffy.images.spec import REQUIREMENTS_DIR
    from fluffy.images.templates import template_images
    from fluffy.images.wheelhouse import ensure_wheelhouse, linux_arch
    from fluffy.kernel.containers.engine import connect
    from fluffy.kernel.containers.images import ImageStore

    root = Path(tempfile.mkdtemp(prefix="fluffy-bench-env-"))
    with connect() as engine:
        build_images(engine)
        arch = linux_arch(engine.info.arch)
        wheelhouse = ensure_wheelhouse(REQUIREMENTS_DIR / "code-executor.lock", arch)
        base = template_images(engine)["code-executor"]
        kind = engine.name
    project = root / "project"
    tests = make_repository(project, files)
    fixture_wheels(root / "index", wheelhouse)
    state = root / "state"
    saved = dict(os.environ)
    try:
        with local_index(root / "index") as url:
            os.environ.clear()
            os.environ.update(pip_env(url, saved), FLUFFY_HOME=str(root / "home"))
            with connect() as engine:
                t0 = time.perf_counter()
                record, _ = ensure_environment(engine, project, state, base, force=True)
                cold = time.perf_counter() - t0
                warm, inspect = [], []
                for _ in range(20):
                    t0 = time.perf_counter()
                    ensure_environment(engine, project, state, base)
                    warm.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    ImageStore(engine).image_id(record.image)  # type: ignore[union-attr]
                    inspect.append(time.perf_counter() - t0)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert record is not None
    result: dict[str, Any] = {
        "files": sum(1 for p in project.rglob("*") if p.is_file() and ".git" not in p.parts),
        "tests": tests,
        "engine": kind,
        "env_build_cold_s": round(cold, 2),
        "env_build_warm_ms": _ms(warm, 0.5),
        "raw_image_inspect_ms": _ms(inspect, 0.5),
    }
    result.update(_test_runs(root, project, record.image, runs, kind))
    shutil.rmtree(root, ignore_errors=True)
    return result


def _raw(image: str, project: Path, command: list[str], kind: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [kind, "run", "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp",
         "--user", "10001:10001", "-v", f"{project}:/workspace:ro", "-w", "/workspace",
         "-e", "HOME=/tmp", image, *command],
        check=False, capture_output=True,
    )  # fmt: skip
    return time.perf_counter() - t0


def _call(client: SyncClient, sid: str, tool: str, **args: Any) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    answer = client.call("tool.call", {"session_id": sid, "tool": tool, "args": args})
    elapsed = time.perf_counter() - t0
    assert answer["ok"], answer
    return elapsed, answer["output"]


def _test_runs(root: Path, project: Path, image: str, runs: int, kind: str) -> dict[str, Any]:
    from plugins.test_tool.plugin import SUMMARY

    py = "/opt/fluffy/env/bin/python"
    bare = [py, "-m", "pytest", "-q", "-o", "cache_dir=/tmp/c", "-o", "junit_family=xunit1",
            "--junitxml=/tmp/j.xml"]  # fmt: skip
    covered = ["sh", "-c", f"{py} -m coverage run --data-file=/tmp/.c --branch --source=. "
               f"-m pytest -q -o cache_dir=/tmp/c >/dev/null; {py} -c '{SUMMARY}' /tmp/.c "
               "/tmp/c.json"]  # fmt: skip
    with kernel(root, project, kind) as sock, SyncClient(str(sock), timeout=900) as client:
        sid = client.call("session.create")["session_id"]
        client.call("session.message", {"session_id": sid, "text": "benchmark"})
        _call(client, sid, "plan.complete")
        view = root / "state" / "views" / sid / "tree"  # where the kernel keeps it
        samples, raw_bare = [], []
        first = 0.0
        for index in range(runs + 1):  # test_writing: pytest alone (no coverage needed)
            elapsed, out = _call(client, sid, "test.run")
            assert out["exit_code"] == 0, out
            if index == 0:
                first = elapsed
            else:
                samples.append(elapsed)
            # the same pytest on the same files: the session's view (it holds what the
            # environment's install generated, e.g. _version.py; the project does not)
            raw_bare.append(_raw(image, view, bare, kind))
        # a natural red, the code, and the green run that merges (with coverage)
        test = "from bigpkg.newmod import f\n\n\ndef test_f():\n    assert f() == 1\n"
        _call(client, sid, "fs.write", path="tests/test_zz_new.py", content=test)
        _, red = _call(client, sid, "test.run", paths=["tests/test_zz_new.py"])
        assert red.get("red"), red
        _call(client, sid, "fs.write", path="src/bigpkg/newmod.py",
              content="def f():\n    return 1\n")  # fmt: skip
        green_s, green = _call(client, sid, "test.run")
        assert green["coverage_percent"] is not None and "review" in green, green
    raw_cov = [_raw(image, view, covered, kind) for _ in range(3)]
    return {
        "test_run_first_ms": round(first * 1000, 1),
        "test_run_p50_ms": _ms(samples, 0.5),
        "test_run_p90_ms": _ms(samples, 0.9),
        "raw_pytest_p50_ms": _ms(raw_bare, 0.5),
        "test_run_overhead_ratio": round(percentile(samples, 0.5) / percentile(raw_bare, 0.5), 2),
        "green_run_with_coverage_ms": round(green_s * 1000, 1),
        "raw_coverage_run_p50_ms": _ms(raw_cov, 0.5),
        "ratio_green_run_vs_raw_coverage": round(green_s / percentile(raw_cov, 0.5), 2),
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.environments")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    result = run(args.files, args.runs)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:28} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
