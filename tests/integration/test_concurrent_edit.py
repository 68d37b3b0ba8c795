"""The person edits a file while the model changes it: a merge is three-way or nothing.

Through the real kernel and sandboxes, on Docker and Podman.  While the session works,
the person edits `calc.py` (the file the model is changing):

* an edit elsewhere in the file: the merge combines both, and the commit holds exactly
  the session's files (the person's other uncommitted work stays out of it);
* an edit of the same lines: nothing of the change is merged (not even the new test),
  the person's version is kept, the model is told which file and goes back to redo it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import connect_engine
from tests.integration.tool_support import drive
from tests.project_support import GIT

CALC = "def add(a, b):\n    return a + b\n"
TEST = "from calc import sub\n\n\ndef test_sub():\n    assert sub(3, 1) == 2\n"
CODE = CALC + "\n\ndef sub(a, b):\n    return a - b\n"


@pytest.fixture(params=["docker", "podman"])
def runtime(request: pytest.FixtureRequest) -> str:
    from fluffy.images.builder import build_images

    with connect_engine(request.param) as connected:
        build_images(connected)
    return str(request.param)


def repo(root: Path) -> Path:
    (root / "tests").mkdir(parents=True)
    (root / "calc.py").write_text(CALC)
    (root / "tests" / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
    )
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "initial"]):
        subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                       env={**GIT, "PATH": "/usr/bin:/bin"})  # fmt: skip
    (root / "notes.txt").write_text("the person's, untracked\n")
    (root / ".fluffy").mkdir()
    (root / ".fluffy" / "config.yaml").write_text("# the person's settings, untracked\n")
    return root


def session(tmp_path: Path, project: Path, runtime: str, person_edit: str) -> list[dict[str, Any]]:
    steps: list[tuple[str, dict[str, Any]]] = [
        ("plan.complete", {"summary": "sub, test first"}),
        ("fs.write", {"path": "tests/test_sub.py", "content": TEST}),
        ("test.run", {"paths": ["tests/test_sub.py"]}),
        ("fs.write", {"path": "calc.py", "content": CODE}),
        ("test.run", {}),
    ]

    def the_persons_edit(number: int) -> None:
        if number == 4:  # the person saves their edit just before the green run
            (project / "calc.py").write_text(person_edit)

    return drive(tmp_path, project, runtime, steps, before=the_persons_edit, commit="Add sub")[0]


def git(project: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "safe.directory=*", "-C", str(project), *args],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip


def test_an_edit_elsewhere_in_the_file_is_merged_three_way(tmp_path: Path, runtime: str) -> None:
    project = repo(tmp_path / "repo")
    mine = "# the person's header\n" + CALC
    answers = session(tmp_path, project, runtime, mine)
    review = answers[4]["output"]["review"]
    assert review["auto_merged"] is True and sorted(review["merged"]) == [
        "calc.py", "tests/test_sub.py"]  # fmt: skip
    assert (project / "calc.py").read_text() == "# the person's header\n" + CODE
    assert answers[5]["ok"], answers[5].get("error")
    assert sorted(git(project, "show", "--name-only", "--format=", "HEAD").split()) == [
        "calc.py", "tests/test_sub.py"]  # fmt: skip
    assert git(project, "status", "--porcelain") == "?? .fluffy/\n?? notes.txt\n"


def test_an_edit_of_the_same_lines_merges_nothing(tmp_path: Path, runtime: str) -> None:
    project = repo(tmp_path / "repo")
    mine = "def add(a, b):\n    return b + a  # the person's\n"
    answers = session(tmp_path, project, runtime, mine)
    green = answers[4]
    review = green["output"]["review"]
    assert review["auto_merged"] is False and review["overlap"]["paths"] == ["calc.py"]
    assert "your change to calc.py" in review["overlap"]["why"]
    assert green["session"]["state"] in ("code_writing", "reviewing")
    assert (project / "calc.py").read_text() == mine  # theirs is kept
    assert not (project / "tests" / "test_sub.py").exists()  # all or nothing
    assert git(project, "log", "--format=%s") == "initial\n"
