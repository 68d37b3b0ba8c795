"""Branch sessions started together (`fluffy --branch` twice at once) are all recorded:
the registry is changed by one process at a time and written through a temporary file
of the writer's own, so neither a lost branch nor a half-written file results."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from fluffy.cli.branches import branches, discard, start

pytestmark = pytest.mark.unit


def test_branch_sessions_started_together_are_all_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLUFFY_HOME", str(tmp_path / "home"))
    project = tmp_path / "repo"
    project.mkdir()
    for argv in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "first"]):
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *argv], cwd=project, check=True
        )
    made: list[str] = []
    failed: list[BaseException] = []

    def one() -> None:
        try:
            made.append(start(project, "task").id)
        except BaseException as exc:  # reported below
            failed.append(exc)

    workers = [threading.Thread(target=one) for _ in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert failed == [] and len(made) == 8
    assert sorted(branches(project)) == sorted(made)
    discard(project, made[0])
    assert sorted(branches(project)) == sorted(made[1:])
    leftovers = [p.name for p in (tmp_path / "home" / "branches").iterdir() if p.suffix == ".tmp"]
    assert leftovers == []
