"""Real projects (tests/fixtures/projects, ADR-063): the host's pytest beside ``test.run``,
environment builds and a session from task to commit.

    python -m benchmarks.real_projects --json [--engine docker] [--only NAME]

Per project, in one run:

- host: a fresh venv in a temp folder, set up from PyPI as projects.json says the
  project's developers would (``host_install``), then ``python -m pytest -q -p
  no:cacheprovider`` with a JUnit report: ``host_passed``/``host_failed``/``host_skipped``
  and the baseline ``raw_pytest_s`` (pytest's wall time alone);
- ``env_build_cold_s``: fluffy's own environment build (``ensure_environment``) in a
  fresh state folder and a fresh ``FLUFFY_HOME`` (no wheel cache: the downloads from PyPI
  are in it), forced (a new image); ``env_build_warm_s``: the same call again, median of 5
  (a cache hit);
- ``testrun_*``: ``test.run`` of the whole suite through a real ``fluffy kernel serve``
  (``testrun_s`` end to end as the model sees it, the session's first run);
- ``equal``: the same passed/failed/skipped on both sides; ``as_recorded``: the same once
  the tests projects.json names in ``expected_differences`` are moved (``recorded``: how
  many);
- ``session_s``: a new session from ``session.create`` to the commit (plan, a test for a
  function not written yet: red; the function; the whole suite green with coverage and
  the merge; ``git.commit``); ``session_landed``: the commit is there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._kernel import kernel
from benchmarks._stats import percentile
from fluffy.ipc.client import SyncClient
from tests.real_projects_support import (
    RealProject,
    expected_counts,
    host_run,
    real_projects,
    real_session_steps,
    session_places,
    unpack,
)


def call_tool(client: SyncClient, sid: str, tool: str, **args: Any) -> dict[str, Any]:
    answer: dict[str, Any] = client.call(
        "tool.call", {"session_id": sid, "tool": tool, "args": args}
    )
    if not answer["ok"]:
        raise SystemExit(f"{tool} failed: {answer.get('error')}")
    return answer


def environment_times(engine_name: str, repo: Path, state: Path) -> tuple[float, float]:
    from fluffy.images.environment import ensure_environment
    from fluffy.images.templates import template_images
    from fluffy.kernel.containers.engine import connect

    with connect({**os.environ, "FLUFFY_RUNTIME": engine_name}) as engine:
        base = template_images(engine)["code-executor"]
        t0 = time.perf_counter()
        record, _ = ensure_environment(engine, repo, state, base, force=True)
        cold = time.perf_counter() - t0
        warm = []
        for _ in range(5):
            t0 = time.perf_counter()
            ensure_environment(engine, repo, state, base)
            warm.append(time.perf_counter() - t0)
    if record is None:
        raise SystemExit(f"{repo.name}: fluffy found nothing to install")
    return cold, percentile(warm, 0.5)


def _sandbox(work: Path, repo: Path, engine: str) -> dict[str, Any]:
    return sandbox_run(work, repo, engine, real_session_steps(session_places(repo)))


def sandbox_run(work: Path, repo: Path, engine: str, steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The whole suite's ``test.run`` in a session, then a new session playing ``steps``
    to its commit (whose message is the last step's): counts, times, landed."""
    subject = str(steps[-1]["args"]["message"])
    with kernel(work, repo, engine) as sock, SyncClient(str(sock), timeout=1800) as client:
        sid = client.call("session.create")["session_id"]
        client.call("session.message", {"session_id": sid, "text": "run the tests"})
        call_tool(client, sid, "plan.complete", summary="run the suite")
        t0 = time.perf_counter()
        whole = call_tool(client, sid, "test.run")["output"]
        testrun_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        sid = client.call("session.create")["session_id"]
        client.call("session.message", {"session_id": sid, "text": subject})
        landed = True
        for step in steps:
            answer = call_tool(client, sid, str(step["tool"]), **step["args"])
            expect = step.get("expect") or {}
            if "state" in expect and answer["session"]["state"] != expect["state"]:
                landed = False
                break
        session_s = time.perf_counter() - t0
    head = subprocess.run(["git", "-C", str(repo), "log", "-1", "--format=%s"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    counts = whole["counts"]
    return {
        "testrun_passed": counts["passed"],
        "testrun_failed": counts["failed"] + counts["error"],
        "testrun_skipped": counts["skipped"],
        "testrun_s": round(testrun_s, 2),
        "session_s": round(session_s, 2),
        "session_landed": landed and head == subject,
    }


def measure(project: RealProject, engine: str, root: Path) -> dict[str, Any]:
    work = root / project.name
    work.mkdir()
    work.chmod(0o755)  # the sandbox user reads the project
    on_host = host_run(project, unpack(project, work / "host", git=False), work)
    repo = unpack(project, work / "repo")
    cold, warm = environment_times(engine, repo, work / "state")
    sandbox = _sandbox(work, repo, engine)
    got = [sandbox[f"testrun_{k}"] for k in ("passed", "failed", "skipped")]
    want = expected_counts(project, on_host)
    return {
        "name": project.name,
        "version": project.version,
        "shape": project.shape,
        "host_passed": on_host.passed,
        "host_failed": on_host.failed,
        "host_skipped": on_host.skipped,
        **{k: sandbox[k] for k in ("testrun_passed", "testrun_failed", "testrun_skipped")},
        "equal": got == [on_host.passed, on_host.failed, on_host.skipped],
        "as_recorded": got == [want["passed"], want["failed"], want["skipped"]],
        "recorded": sum(len(d["tests"]) for d in project.expected_differences),
        "raw_pytest_s": on_host.seconds,
        "testrun_s": sandbox["testrun_s"],
        "host_install_s": on_host.install_s,
        "env_build_cold_s": round(cold, 2),
        "env_build_warm_s": round(warm, 3),
        "session_s": sandbox["session_s"],
        "session_landed": sandbox["session_landed"],
    }


def run_measured(
    engine: str,
    projects: list[Any],
    measure: Callable[[Any, str, Path], dict[str, Any]],
    prefix: str,
) -> dict[str, Any]:
    """Build fluffy's images on ``engine``, then ``measure`` each project in a fresh
    ``FLUFFY_HOME`` (no caches: a cold build downloads everything)."""
    from fluffy.images.builder import build_images
    from fluffy.kernel.containers.engine import connect

    with connect({**os.environ, "FLUFFY_RUNTIME": engine}) as connected:
        build_images(connected)
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o755)
    saved = dict(os.environ)
    os.environ["FLUFFY_HOME"] = str(root / "home")
    try:
        rows = [measure(project, engine, root) for project in projects]
    finally:
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(root, ignore_errors=True)
    return {"engine": engine, "projects": rows}


def run(engine: str, only: list[str]) -> dict[str, Any]:
    chosen = [p for p in real_projects() if not only or p.name in only]
    return run_measured(engine, chosen, measure, "fluffy-bench-real-")


def cli(prog: str, run_: Callable[[str, list[str]], dict[str, Any]], argv: list[str] | None) -> int:
    """``--json``, ``--engine``, ``--only NAME``: one JSON object, or a line per project."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--engine", default=os.environ.get("FLUFFY_RUNTIME", "docker"))
    parser.add_argument("--only", action="append", default=[], metavar="NAME")
    args = parser.parse_args(argv)
    result = run_(args.engine, args.only)
    if args.json:
        print(json.dumps(result))
    else:
        for row in result["projects"]:
            print(" ".join(f"{k}={v}" for k, v in row.items() if k != "shape"))
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli("python -m benchmarks.real_projects", run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
