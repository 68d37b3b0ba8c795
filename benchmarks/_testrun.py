"""``test.run`` on a larger repository, beside the same pytest started directly.

The repository has ``files`` modules in one flat package and a small test suite that
imports some of them: collection and start-up dominate, as they do on a real project.
fluffy's run (warm pool, the session's view kept in step rather than copied) is timed
end to end as the model sees it; the baseline is the same pytest command line (the
options test-tool adds: quiet, cache in /tmp, JUnit report) in the same image, started
directly by the engine on the project mounted read-only, and also run by ``exec`` in a
container already running.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._kernel import kernel
from benchmarks._stats import percentile
from fluffy.ipc.client import SyncClient

PYTEST = ["python3", "-m", "pytest", "-q", "-o", "cache_dir=/tmp/.pytest-cache",
          "-o", "junit_family=xunit1", "--junitxml=/tmp/junit.xml"]  # fmt: skip


def make_repository(root: Path, files: int) -> Path:
    """A flat-layout project of ``files`` modules and 20 tests (a git repository)."""
    project = root / "bigrepo"
    package = project / "bigrepo"
    tests = project / "tests"
    package.mkdir(parents=True)
    tests.mkdir()
    (project / "pytest.ini").write_text("[pytest]\ntestpaths = tests\n")
    (package / "__init__.py").write_text('"""A large package."""\n')
    for i in range(files):
        (package / f"mod_{i:04d}.py").write_text(
            f'"""Module {i}."""\n\n\ndef value_{i}(x: int) -> int:\n    return x + {i}\n'
        )
    lines = []
    for i in range(20):
        lines += [f"from bigrepo.mod_{i:04d} import value_{i}", ""]
    for i in range(20):
        lines += ["", f"def test_value_{i}():", f"    assert value_{i}(1) == {i + 1}", ""]
    (tests / "test_values.py").write_text("\n".join(lines))
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "a large repository"]):
        subprocess.run(
            ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", *command],
            cwd=project, check=True, capture_output=True,
        )  # fmt: skip
    for path in [root, project, *project.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return project


def _fluffy_runs(sock: Path, n: int, think_s: float) -> tuple[list[float], int]:
    with SyncClient(str(sock), timeout=600) as client:
        sid = client.call("session.create")["session_id"]
        client.call("session.message", {"session_id": sid, "text": "benchmark test runs"})
        planned = client.call(
            "tool.call", {"session_id": sid, "tool": "plan.complete", "args": {"summary": "b"}}
        )
        assert planned["ok"], planned
        run = {"session_id": sid, "tool": "test.run", "args": {}}
        first = client.call("tool.call", run)  # the view is laid down; the pool learns
        assert first["ok"], first
        samples, warm = [], 0
        for _ in range(n):
            time.sleep(think_s)
            t0 = time.perf_counter()
            answer = client.call("tool.call", run)
            samples.append(time.perf_counter() - t0)
            assert answer["ok"], answer
            warm += bool((answer.get("timings") or {}).get("warm"))
        return samples, warm


def _direct_runs(engine: str, image: str, project: Path, n: int) -> tuple[list[float], list[float]]:
    mount = ["-v", f"{project}:/workspace:ro", "-w", "/workspace", "--network", "none"]
    run, execs = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([engine, "run", "--rm", *mount, image, *PYTEST], check=True,
                       capture_output=True)  # fmt: skip
        run.append(time.perf_counter() - t0)
    started = subprocess.run(
        [engine, "run", "-d", "--rm", *mount, "--entrypoint", "sleep", image, "600"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            subprocess.run([engine, "exec", started, *PYTEST], check=True, capture_output=True)
            execs.append(time.perf_counter() - t0)
    finally:
        subprocess.run([engine, "rm", "-f", started], capture_output=True, check=False)
    return run, execs


def measure(engine: str, image: str, files: int, n: int, think_s: float) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="fluffy-bench-testrun-"))
    try:
        project = make_repository(root, files)
        count = sum(1 for p in project.rglob("*") if p.is_file() and ".git" not in p.parts)
        with kernel(root, project, engine) as sock:
            fluffy, warm = _fluffy_runs(sock, n, think_s)
        direct, execs = _direct_runs(engine, image, project, n)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    p50 = percentile(fluffy, 0.5)
    return {
        "test_run_files": count,
        "test_run_p50_ms": round(p50 * 1000, 1),
        "test_run_p90_ms": round(percentile(fluffy, 0.9) * 1000, 1),
        "test_run_warm_share": round(warm / len(fluffy), 2),
        "test_run_direct_p50_ms": round(percentile(direct, 0.5) * 1000, 1),
        "test_run_exec_p50_ms": round(percentile(execs, 0.5) * 1000, 1),
        "test_run_overhead_ratio": round(p50 / percentile(direct, 0.5), 2),
        "test_run_vs_exec_ratio": round(p50 / percentile(execs, 0.5), 2),
    }
