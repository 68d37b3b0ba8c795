"""Real JavaScript/TypeScript projects (tests/fixtures/projects, ADR-072): the host's run of
each suite beside ``test.run``, environment builds and a session from task to commit.

    python -m benchmarks.node_projects --json [--engine docker] [--only NAME]

Per project, in one run (keys as in ``benchmarks.real_projects``):

- host: the project's own install (``host_install``: ``npm ci`` / pnpm, install scripts
  off) with fluffy's Node on the PATH, then the suite with the runner fluffy picks and its
  JUnit reporter: ``host_passed``/``host_failed``/``host_skipped`` and the baseline
  ``raw_runner_s`` (the runner's wall time alone);
- ``env_build_cold_s``: ``ensure_environment`` in a fresh state folder and a fresh
  ``FLUFFY_HOME`` (no archive cache, no Node wheel: every download is in it);
  ``env_build_warm_s``: the same call again, median of 5 (a cache hit);
- ``testrun_*`` / ``testrun_s``: ``test.run`` of the whole suite through a real
  ``fluffy kernel serve``; ``equal``: the same counts on both sides;
- ``session_s`` / ``session_landed``: a session from ``session.create`` to the commit (a
  test importing a module not written yet: natural red; the module; the suite green and
  the merge; ``git.commit``).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks._kernel import kernel
from benchmarks.real_projects import call_tool, cli, environment_times, run_measured
from fluffy.ipc.client import SyncClient
from tests.node_projects_support import (
    NodeProject,
    host_run,
    node_projects,
    node_session_steps,
    session_places,
    with_config,
)
from tests.real_projects_support import unpack


def _sandbox(work: Path, repo: Path, engine: str) -> dict[str, Any]:
    steps = node_session_steps(session_places(repo))
    with kernel(work, repo, engine) as sock, SyncClient(str(sock), timeout=1800) as client:
        sid = client.call("session.create")["session_id"]
        client.call("session.message", {"session_id": sid, "text": "run the tests"})
        call_tool(client, sid, "plan.complete", summary="run the suite")
        t0 = time.perf_counter()
        counts = call_tool(client, sid, "test.run")["output"]["counts"]
        testrun_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        sid = client.call("session.create")["session_id"]
        client.call("session.message", {"session_id": sid, "text": "add fluffyTriple"})
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
    return {
        "testrun_passed": counts["passed"],
        "testrun_failed": counts["failed"] + counts["error"],
        "testrun_skipped": counts["skipped"],
        "testrun_s": round(testrun_s, 2),
        "session_s": round(session_s, 2),
        "session_landed": landed and head == "Add fluffyTriple",
    }


def measure(project: NodeProject, engine: str, root: Path) -> dict[str, Any]:
    work = root / project.name
    work.mkdir()
    work.chmod(0o755)  # the sandbox user reads the project
    host_tree = unpack(project, work / "host", git=False)  # type: ignore[arg-type]
    on_host = host_run(project, host_tree, work)
    repo = unpack(project, work / "repo")  # type: ignore[arg-type]
    with_config(project, repo)
    cold, warm = environment_times(engine, repo, work / "state")
    sandbox = _sandbox(work, repo, engine)
    got = {k: sandbox[f"testrun_{k}"] for k in ("passed", "failed", "skipped")}
    return {
        "name": project.name,
        "version": project.version,
        "shape": project.shape,
        **{f"host_{k}": v for k, v in on_host.counts.items()},
        **{f"testrun_{k}": v for k, v in got.items()},
        "equal": got == on_host.counts,
        "raw_runner_s": on_host.seconds,
        "testrun_s": sandbox["testrun_s"],
        "host_install_s": on_host.install_s,
        "env_build_cold_s": round(cold, 2),
        "env_build_warm_s": round(warm, 3),
        "session_s": sandbox["session_s"],
        "session_landed": sandbox["session_landed"],
    }


def run(engine: str, only: list[str]) -> dict[str, Any]:
    chosen = [p for p in node_projects() if not only or p.name in only]
    return run_measured(engine, chosen, measure, "fluffy-bench-node-")


def main(argv: list[str] | None = None) -> int:
    return cli("python -m benchmarks.node_projects", run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
