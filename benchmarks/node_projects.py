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

from pathlib import Path
from typing import Any

from benchmarks.real_projects import cli, environment_times, run_measured, sandbox_run
from tests.node_projects_support import (
    NodeProject,
    host_run,
    node_projects,
    node_session_steps,
    session_places,
    with_config,
)
from tests.real_projects_support import unpack


def measure(project: NodeProject, engine: str, root: Path) -> dict[str, Any]:
    work = root / project.name
    work.mkdir()
    work.chmod(0o755)  # the sandbox user reads the project
    host_tree = unpack(project, work / "host", git=False)  # type: ignore[arg-type]
    on_host = host_run(project, host_tree, work)
    repo = unpack(project, work / "repo")  # type: ignore[arg-type]
    with_config(project, repo)
    cold, warm = environment_times(engine, repo, work / "state")
    sandbox = sandbox_run(work, repo, engine, node_session_steps(session_places(repo)))
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
