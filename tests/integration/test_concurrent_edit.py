"""The person edits a file while the model changes it: a merge is three-way or nothing.

Through the real kernel and sandboxes, on Docker and Podman.  While the session works,
the person edits `calc.py` (the file the model is changing):

* an edit elsewhere in the file: the merge combines both, and the commit holds exactly
  the session's change (the person's lines, in that file too, stay uncommitted edits);
* an edit of the same lines: nothing of the change is merged (not even the new test),
  the person's version is kept, the model is told which file and goes back to redo it.

And the person had uncommitted lines in `calc.py` before the session started (the model
edits the file around them): the commit takes the model's change without their lines,
or -- where the model's change touches them -- commits nothing and leaves the whole change
to the person, saying so (a commit never holds the test without its code).
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


def session(tmp_path: Path, project: Path, runtime: str, person_edit: str | None,
            code: tuple[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    steps: list[tuple[str, dict[str, Any]]] = [
        ("plan.complete", {"summary": "sub, test first"}),
        ("fs.write", {"path": "tests/test_sub.py", "content": TEST}),
        ("test.run", {"paths": ["tests/test_sub.py"]}),
        code or ("fs.write", {"path": "calc.py", "content": CODE}),
        ("test.run", {}),
    ]

    def the_persons_edit(number: int) -> None:
        if number == 4 and person_edit is not None:  # saved just before the green run
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
    assert git(project, "show", "HEAD:calc.py") == CODE  # the session's change, not theirs
    assert git(project, "status", "--porcelain") == " M calc.py\n?? .fluffy/\n?? notes.txt\n"
    assert added(project, "calc.py") == ["# the person's header"]  # still their edit


def added(project: Path, rel: str) -> list[str]:
    """The lines `git diff` shows added to ``rel`` (the uncommitted edit)."""
    diff = git(project, "diff", "--", rel).splitlines()
    return [line[1:] for line in diff if line.startswith("+") and not line.startswith("+++")]


#: The model adds sub() after add(), editing the file as it finds it.
SUB = "\n\ndef sub(a, b):\n    return a - b\n"
EDIT = ("fs.edit", {"path": "calc.py", "old_string": "    return a + b\n",
                    "new_string": "    return a + b\n" + SUB})  # fmt: skip


def test_uncommitted_lines_from_before_the_session_stay_out_of_the_commit(
    tmp_path: Path, runtime: str
) -> None:
    project = repo(tmp_path / "repo")
    (project / "calc.py").write_text("# my own note\n" + CALC)  # not committed
    (project / ".env").write_text("TOKEN=mine\n")
    answers = session(tmp_path, project, runtime, None, EDIT)
    assert answers[4]["output"]["review"]["auto_merged"] is True
    assert (project / "calc.py").read_text() == "# my own note\n" + CODE
    assert answers[5]["ok"] and answers[5]["output"].get("left_out", []) == []
    assert git(project, "show", "HEAD:calc.py") == CODE
    assert added(project, "calc.py") == ["# my own note"]
    assert "TOKEN" not in git(project, "show", "HEAD")  # nor the untracked .env
    assert (project / ".env").read_text() == "TOKEN=mine\n"


def test_a_change_touching_uncommitted_lines_is_left_to_the_person(
    tmp_path: Path, runtime: str
) -> None:
    project = repo(tmp_path / "repo")
    mine = CALC.replace("return a + b", "return a + b  # checked by me")
    (project / "calc.py").write_text(mine)  # not committed
    edit = ("fs.edit", {"path": "calc.py", "old_string": "# checked by me\n",
                        "new_string": "# checked by me\n" + SUB})  # fmt: skip
    answers = session(tmp_path, project, runtime, None, edit)
    committed = answers[5]
    assert committed["ok"], committed.get("error")
    assert committed["output"]["commit"] is None  # never the test without its code
    assert committed["output"]["left_out"] == ["calc.py", "tests/test_sub.py"]
    assert "calc.py was left out of the commit" in committed["output"]["notes"][0]
    assert committed["session"]["state"] == "idle"
    assert git(project, "log", "--format=%s") == "initial\n"
    assert (project / "tests" / "test_sub.py").read_text() == TEST  # in the working tree
    assert (project / "calc.py").read_text() == mine.replace(
        "# checked by me\n", "# checked by me\n\n\ndef sub(a, b):\n    return a - b\n"
    )  # both


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
