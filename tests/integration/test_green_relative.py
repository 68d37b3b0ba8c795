"""Green relative to the base: a test that failed before the change does not block it.

On Docker and Podman, through the real kernel: a repository whose suite has an old
failure (it fails on the person's machine too) gets a change from task to commit, the
old failure named as pre-existing; with `tdd.require_all_green: true` in the policy the
same failure blocks the merge.  A new failure always blocks (issue 33)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import connect_engine
from tests.integration.tool_support import drive
from tests.project_support import GIT

OLD = "def test_the_service_is_up():\n    assert False, 'needs a database that is not here'\n"
TEST = "from calc import sub\n\n\ndef test_sub():\n    assert sub(3, 1) == 2\n"
CODE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"


@pytest.fixture(params=["docker", "podman"])
def runtime(request: pytest.FixtureRequest) -> str:
    from fluffy.images.builder import build_images

    with connect_engine(request.param) as connected:
        build_images(connected)
    return str(request.param)


def repo(root: Path, policy: str | None = None) -> Path:
    (root / "tests").mkdir(parents=True)
    (root / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "tests" / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
    )
    (root / "tests" / "test_old.py").write_text(OLD)
    if policy is not None:
        from fluffy.kernel.project.defaults import render_policy
        from fluffy.kernel.project.layout import detect_layout

        (root / ".fluffy").mkdir()
        (root / ".fluffy" / "policy.yaml").write_text(render_policy(detect_layout(root)) + policy)
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "initial"]):
        subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                       env={**GIT, "PATH": "/usr/bin:/bin"})  # fmt: skip
    return root


def session(tmp_path: Path, project: Path, runtime: str) -> list[dict[str, Any]]:
    steps: list[tuple[str, dict[str, Any]]] = [
        ("plan.complete", {"summary": "sub, test first"}),
        ("fs.write", {"path": "tests/test_sub.py", "content": TEST}),
        ("test.run", {"paths": ["tests/test_sub.py"]}),
        ("fs.write", {"path": "calc.py", "content": CODE}),
        ("test.run", {}),
    ]
    return drive(tmp_path, project, runtime, steps, commit="Add sub")[0]


def test_an_old_failure_is_named_and_does_not_block(tmp_path: Path, runtime: str) -> None:
    project = repo(tmp_path / "repo")
    answers = session(tmp_path, project, runtime)
    green = answers[4]["output"]
    assert green["preexisting"]["ids"] == ["tests/test_old.py::test_the_service_is_up"]
    assert "1 failed before this change too" in green["preexisting"]["note"]
    assert green["failed"] == []  # nothing new is shown as the change's failure
    assert green["review"]["auto_merged"] is True
    assert answers[5]["ok"] and answers[5]["session"]["state"] == "idle"


def test_with_require_all_green_the_old_failure_blocks(tmp_path: Path, runtime: str) -> None:
    project = repo(tmp_path / "repo", "tdd:\n  require_all_green: true\n")
    answers = session(tmp_path, project, runtime)
    green = answers[4]
    assert "preexisting" not in green["output"] and "review" not in green["output"]
    assert green["session"]["state"] == "code_writing"
    assert [f["id"] for f in green["output"]["failed"]] == [
        "tests/test_old.py::test_the_service_is_up"
    ]
    assert "needs a database" in green["output"]["failed"][0]["message"]
