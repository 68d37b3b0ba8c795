"""`fluffy session merge` never writes over a file of the person's that git does not
track: git itself replaces an *ignored* file (`.env`) when the merged branch has one."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fluffy.cli.branches import branches, merge, start
from fluffy.errors import BranchError

pytestmark = pytest.mark.unit


def _git(cwd: Path, *argv: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *argv],
        cwd=cwd, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return done.stdout.strip()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLUFFY_HOME", str(tmp_path / "home"))
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / ".gitignore").write_text(".env\nlocal/\n")
    (repo / "app.py").write_text("x = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "first")
    (repo / ".env").write_text("SECRET=hunter2\n")  # the person's own, ignored
    (repo / "local").mkdir()
    (repo / "local" / "notes.txt").write_text("mine\n")
    return repo


@pytest.mark.parametrize("path", [".env", "local/notes.txt", ".env/x"])
def test_a_merge_that_would_replace_an_ignored_file_is_refused(project: Path, path: str) -> None:
    mine_at = ".env" if path == ".env/x" else path  # a folder where the person's file is
    made = start(project, "task")
    copy = Path(made.path)
    (copy / "app.py").write_text("x = 2\n")
    (copy / path).parent.mkdir(exist_ok=True)
    (copy / path).write_text("FROM THE SESSION\n")
    _git(copy, "add", "-f", "app.py", path)
    _git(copy, "commit", "-q", "-m", "session")
    before = _git(project, "rev-parse", "HEAD")
    mine = (project / mine_at).read_text()
    with pytest.raises(BranchError) as refused:
        merge(project, made.id)
    assert mine_at in refused.value.what and "does not track" in refused.value.what
    assert (project / mine_at).read_text() == mine
    assert _git(project, "rev-parse", "HEAD") == before
    assert (project / "app.py").read_text() == "x = 1\n"
    assert made.id in branches(project)  # kept: the person decides


def test_a_merge_of_new_and_changed_tracked_files_goes_through(project: Path) -> None:
    made = start(project, "task")
    copy = Path(made.path)
    (copy / "app.py").write_text("x = 2\n")
    (copy / "new.py").write_text("y = 1\n")
    _git(copy, "add", "app.py", "new.py")
    _git(copy, "commit", "-q", "-m", "session")
    done = merge(project, made.id)
    assert done["commits"] == 1
    assert (project / "app.py").read_text() == "x = 2\n"
    assert (project / "new.py").read_text() == "y = 1\n"
    assert (project / ".env").read_text() == "SECRET=hunter2\n"
    assert made.id not in branches(project)
