"""Two sessions at once, each on a branch of its own; the person's checkout untouched.

`fluffy "task" --branch` runs each session in a copy of the repository on `fluffy/<id>`,
with its own L1 kernel; the person's files, index and HEAD are the same afterwards.
`fluffy session merge ID` brings one branch in, `fluffy session discard ID` drops the
other.  Docker (the engine the rest of the e2e suite proves both ways)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.test_first_run import FLUFFY, PERSONS_STATUS, index, persons_work  # noqa: F401
from tests.project_support import pip_env, session_steps, shape


@pytest.fixture(scope="module")
def kernel_image() -> str:
    from fluffy.images.builder import build_images
    from tests.conftest import connect_engine

    with connect_engine("docker") as connected:
        return {s.name: s.ref for s in build_images(connected)}["kernel"]


def git(project: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "safe.directory=*", "-C", str(project), *args],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip


def test_two_branch_sessions_at_once_and_the_person_keeps_working(
    tmp_path: Path,
    index: str,  # noqa: F811
    kernel_image: str,
) -> None:
    project = tmp_path / "repo"
    where = shape(project, "requirements")
    persons_work(project)
    head, status = git(project, "rev-parse", "HEAD"), git(project, "status", "--porcelain")
    index_file = (project / ".git" / "index").read_bytes()
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump({"task": "add triple", "steps": session_steps(where)}))
    env = pip_env(index, dict(os.environ))
    env.update(FLUFFY_HOME=str(tmp_path / "home"), FLUFFY_KERNEL_IMAGE=kernel_image,
               FLUFFY_RUNTIME="docker")  # fmt: skip
    runs: list[subprocess.CompletedProcess[str]] = []

    def one() -> None:
        runs.append(subprocess.run(
            [FLUFFY, "add triple", "--branch", "--script", str(script), "--yes", "--json"],
            env=env, cwd=project, capture_output=True, text=True, timeout=600,
            stdin=subprocess.DEVNULL,
        ))  # fmt: skip

    workers = [threading.Thread(target=one) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    summaries: list[dict[str, Any]] = []
    for run in runs:
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
        summaries.append(json.loads(run.stdout.strip().splitlines()[-1]))
    assert all(s["type"] == "summary" and s["landed"] for s in summaries)
    assert git(project, "rev-parse", "HEAD") == head  # nothing written while they worked
    assert git(project, "status", "--porcelain") == status
    assert sorted(status.splitlines()) == PERSONS_STATUS
    assert (project / ".git" / "index").read_bytes() == index_file
    assert not (project / where["code"]).exists()
    listed = subprocess.run([FLUFFY, "session", "branches", "--project", str(project), "--json"],
                            env=env, capture_output=True, text=True, check=True)  # fmt: skip
    ids = sorted(b["id"] for b in json.loads(listed.stdout)["branches"])
    assert ids == sorted(s["branch"]["id"] for s in summaries)
    merged = subprocess.run([FLUFFY, "session", "merge", ids[0], "--project", str(project)],
                            env=env, capture_output=True, text=True)  # fmt: skip
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert git(project, "log", "-1", "--format=%s") in (
        "Add triple\n",
        f"Merge branch 'fluffy/{ids[0]}'\n",
    )
    assert (project / where["code"]).read_text() == "def triple(x):\n    return 3 * x\n"
    assert sorted(git(project, "status", "--porcelain").splitlines()) == PERSONS_STATUS
    dropped = subprocess.run([FLUFFY, "session", "discard", ids[1], "--project", str(project)],
                             env=env, capture_output=True, text=True)  # fmt: skip
    assert dropped.returncode == 0, dropped.stdout + dropped.stderr
    assert "fluffy/" not in git(project, "branch", "--list")
    assert not any((tmp_path / "home" / "branches").rglob("*.py"))  # the copies are gone
