"""The per-session test view: the project plus staged changes in one folder, kept in
step incrementally, hashed exactly as the TDD evidence hashes the view."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from fluffy.kernel.tools.testing.testview import TestViews
from fluffy.kernel.workflow.evidence import snapshot_trees
from unit.trees import write_tree


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tree(folder: Path) -> dict[str, str]:
    found = {}
    for dirpath, _, files in os.walk(folder):
        for name in files:
            path = Path(dirpath, name)
            found[path.relative_to(folder).as_posix()] = (
                "->" + str(path.readlink()) if path.is_symlink() else path.read_text()
            )
    for dirpath, dirs, _ in os.walk(folder):
        for name in dirs:
            path = Path(dirpath, name)
            if path.is_symlink():
                found[path.relative_to(folder).as_posix()] = "->" + str(path.readlink())
    return found


def test_the_view_is_project_plus_staged_and_its_hashes_are_the_evidence(tmp_path: Path) -> None:
    project, staged = tmp_path / "p", tmp_path / "staged"
    write_tree(project, {"src/a.py": "A\n", "tests/test_a.py": "T\n", "old.py": "O\n",
                   ".git/HEAD": "ref\n", ".venv/x.py": "V\n",
                   "src/__pycache__/a.pyc": "C"})  # fmt: skip
    (project / "inside.py").symlink_to("src/a.py")
    (project / "outside").symlink_to("/etc")
    write_tree(staged, {"src/a.py": "A2\n", "tests/test_b.py": "B\n"})
    overlay = {"src/a.py": sha(b"A2\n"), "tests/test_b.py": sha(b"B\n"), "old.py": None}
    views = TestViews(tmp_path / "state", project, os.geteuid())
    synced = views.sync("s1", overlay, staged)
    assert tree(synced.folder) == {"src/a.py": "A2\n", "tests/test_a.py": "T\n",
                                   "tests/test_b.py": "B\n", "inside.py": "->src/a.py"}  # fmt: skip
    tests, sources = snapshot_trees(project, overlay=overlay)
    assert (synced.tests.digest, synced.sources.digest) == (tests.digest, sources.digest)
    assert not (project / ".pytest_cache").exists()  # nothing written into the project


def test_a_second_sync_copies_only_what_changed(tmp_path: Path) -> None:
    project = tmp_path / "p"
    write_tree(project, {f"pkg/m{i}.py": f"{i}\n" for i in range(200)})
    views = TestViews(tmp_path / "state", project, os.geteuid())
    first = views.sync("s", {}, None)
    assert first.copied + first.linked == 200
    again = views.sync("s", {}, None)
    assert (again.copied, again.linked, again.removed) == (0, 0, 0)
    (project / "pkg" / "m3.py").write_text("changed\n")
    (project / "pkg" / "m4.py").unlink()
    (project / "pkg" / "new.py").write_text("n\n")
    third = views.sync("s", {}, None)
    assert third.copied + third.linked == 2 and third.removed == 1
    assert (third.folder / "pkg" / "m3.py").read_text() == "changed\n"
    assert not (third.folder / "pkg" / "m4.py").exists()
    _, sources = snapshot_trees(project)
    assert third.sources.digest == sources.digest


def test_a_write_to_the_view_never_reaches_the_project(tmp_path: Path) -> None:
    """Unchanged files may be hard links; the kernel only ever renames over them."""
    project, staged = tmp_path / "p", tmp_path / "s"
    write_tree(project, {"a.py": "original\n"})
    views = TestViews(tmp_path / "state", project, os.geteuid())
    views.sync("s", {}, None)
    write_tree(staged, {"a.py": "staged\n"})
    synced = views.sync("s", {"a.py": sha(b"staged\n")}, staged)
    assert (synced.folder / "a.py").read_text() == "staged\n"
    assert (project / "a.py").read_text() == "original\n"
    back = views.sync("s", {}, staged)  # unstaged again: the project's content
    assert (back.folder / "a.py").read_text() == "original\n"


def test_generated_files_are_laid_in_but_are_not_evidence(tmp_path: Path) -> None:
    project, generated = tmp_path / "p", tmp_path / "gen"
    write_tree(
        project, {"src/pkg/__init__.py": "from ._version import v\n", "src/pkg/own.py": "x\n"}
    )
    write_tree(generated, {"src/pkg/_version.py": "v = '1.0'\n", "src/pkg/own.py": "not mine\n"})
    views = TestViews(tmp_path / "state", project, os.geteuid())
    synced = views.sync("s", {}, None, generated=generated,
                        generated_files=["src/pkg/_version.py", "src/pkg/own.py"])  # fmt: skip
    assert (synced.folder / "src/pkg/_version.py").read_text() == "v = '1.0'\n"
    assert (synced.folder / "src/pkg/own.py").read_text() == "x\n"  # the project's wins
    assert "src/pkg/_version.py" not in synced.sources.files


def test_a_generated_path_that_climbs_out_is_never_written(tmp_path: Path) -> None:
    """Red team pass 2: a repository's build named `l/../../../../../repo/calc.py` (l a
    link in its generated folder) and the view's sync wrote the project."""
    project, generated = tmp_path / "repo", tmp_path / "gen"
    write_tree(project, {"calc.py": "def add(a, b):\n    return a + b\n"})
    write_tree(generated, {"a/b/c/d/e/x": "", "repo/calc.py": "forged\n", "ok.py": "ok\n"})
    (generated / "l").symlink_to("a/b/c/d/e")
    (generated / "link.py").symlink_to(project / "calc.py")
    views = TestViews(tmp_path / "state", project, os.geteuid())
    climbs = "l/" + "../" * 5 + "repo/calc.py"
    named = [climbs, "../repo/calc.py", str(project / "calc.py"), "link.py", "./ok.py", "ok.py"]
    synced = views.sync("s", {}, None, generated=generated, generated_files=named)
    assert (project / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    assert tree(synced.folder) == {"calc.py": "def add(a, b):\n    return a + b\n", "ok.py": "ok\n"}


def test_a_file_replaced_by_a_folder_and_back(tmp_path: Path) -> None:
    project = tmp_path / "p"
    write_tree(project, {"thing": "file\n"})
    views = TestViews(tmp_path / "state", project, os.geteuid())
    views.sync("s", {}, None)
    (project / "thing").unlink()
    write_tree(project, {"thing/inner.py": "in\n"})
    synced = views.sync("s", {}, None)
    assert (synced.folder / "thing" / "inner.py").read_text() == "in\n"
    (project / "thing" / "inner.py").unlink()
    (project / "thing").rmdir()
    write_tree(project, {"thing": "file again\n"})
    synced = views.sync("s", {}, None)
    assert (synced.folder / "thing").read_text() == "file again\n"


def test_a_view_starts_empty_with_each_kernel(tmp_path: Path) -> None:
    project = tmp_path / "p"
    write_tree(project, {"a.py": "a\n"})
    TestViews(tmp_path / "state", project, os.geteuid()).sync("s", {}, None)
    stray = tmp_path / "state" / "views" / "s" / "tree" / "planted.py"
    stray.write_text("left by an earlier kernel\n")
    synced = TestViews(tmp_path / "state", project, os.geteuid()).sync("s", {}, None)
    assert not (synced.folder / "planted.py").exists()
