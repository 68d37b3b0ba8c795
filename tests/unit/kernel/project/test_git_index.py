"""The git index read without git, checked against real git's own listing."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluffy.kernel.project.gitindex import NOTHING, parse_index, tracked
from unit.gitrepo import git

pytestmark = pytest.mark.unit


def listed(repo: Path) -> set[str]:
    return {p for p in git(repo, "ls-files", "-z").split("\0") if p}


def repo_with(root: Path, files: list[str]) -> Path:
    git(root.parent, "init", "-q", str(root))
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    git(root, "add", "-A")
    return root


FILES = ["a.txt", "src/mod.py", "tests/certs/server.pem", ".env.test", "c/ünï code.txt"]


@pytest.mark.parametrize("version", ["2", "3", "4"])
def test_every_index_version_names_what_git_lists(tmp_path: Path, version: str) -> None:
    repo = repo_with(tmp_path / "r", FILES + [f"deep/er/f{n}.txt" for n in range(40)])
    git(repo, "update-index", "--index-version", version)
    (repo / ".env").write_text("SECRET=x\n")  # the person's, never added
    found = tracked(repo)
    assert found is not None and found.files == listed(repo)
    assert ".env" not in found and "tests/certs/server.pem" in found


def test_an_intent_to_add_entry_is_tracked(tmp_path: Path) -> None:
    repo = repo_with(tmp_path / "r", FILES)
    (repo / "new.py").write_text("y = 2\n")
    git(repo, "add", "-N", "new.py")  # an extended-flags entry (version 3)
    found = tracked(repo)
    assert found is not None and "new.py" in found and found.files == listed(repo)


def test_a_sparse_index_folder_covers_what_is_under_it(tmp_path: Path) -> None:
    repo = repo_with(tmp_path / "r", ["top.txt", "kept/a.txt", "away/b.txt", "away/c/d.txt"])
    git(repo, "commit", "-q", "-m", "x", "--no-verify")
    git(repo, "sparse-checkout", "init", "--cone", "--sparse-index")
    git(repo, "sparse-checkout", "set", "kept")
    found = tracked(repo)
    assert found is not None
    assert {"top.txt", "kept/a.txt"} <= found.files and "away/" in found.folders
    assert "away/c/d.txt" in found and "awayx.txt" not in found


def test_no_repository_or_no_index_tracks_nothing(tmp_path: Path) -> None:
    assert tracked(tmp_path) == NOTHING
    git(tmp_path, "init", "-q")
    assert tracked(tmp_path) == NOTHING


def test_what_cannot_be_read_is_unknown(tmp_path: Path) -> None:
    repo = repo_with(tmp_path / "r", FILES)
    data = (repo / ".git/index").read_bytes()
    assert parse_index(data[:-1] + bytes([data[-1] ^ 1])) is None  # its checksum
    assert parse_index(b"not an index") is None
    (tmp_path / "w").mkdir()
    (tmp_path / "w/.git").write_text("gitdir: /elsewhere/.git/worktrees/w\n")
    assert tracked(tmp_path / "w") is None
    git(repo, "config", "core.splitIndex", "true")
    git(repo, "update-index", "--split-index")
    assert tracked(repo) is None


_NAME = st.text(string.ascii_letters + string.digits + "._-", min_size=1, max_size=12).filter(
    lambda n: n not in (".", "..", ".git")
)


_PATHS = st.sets(st.lists(_NAME, min_size=1, max_size=4).map("/".join), min_size=1, max_size=30)
_SLOW_OK = [HealthCheck.function_scoped_fixture]


@settings(max_examples=20, deadline=None, suppress_health_check=_SLOW_OK)
@given(paths=_PATHS, version=st.sampled_from(["2", "3", "4"]))
def test_any_tree_reads_as_git_lists_it(
    tmp_path_factory: pytest.TempPathFactory, paths: set[str], version: str
) -> None:
    files = sorted(p for p in paths if not any(q.startswith(p + "/") for q in paths))
    repo = repo_with(tmp_path_factory.mktemp("h") / "r", files)
    git(repo, "update-index", "--index-version", version)
    found = tracked(repo)
    assert found is not None and found.files == listed(repo)


def test_holds_compares_the_content_with_gits_object_name(tmp_path: Path) -> None:
    repo = repo_with(tmp_path / "r", [".env", "certs/a.pem", "kept.txt", "aside.txt", "new.txt"])
    (repo / "link.pem").symlink_to("certs/a.pem")
    git(repo, "add", "link.pem")
    (repo / ".env").write_text("TOKEN=filled-in-by-the-person\n")  # a placeholder, filled
    git(repo, "update-index", "--skip-worktree", "kept.txt")
    git(repo, "update-index", "--assume-unchanged", "aside.txt")
    (repo / "ita.txt").write_text("later\n")
    git(repo, "add", "-N", "ita.txt")
    found = tracked(repo)
    assert found is not None
    assert found.holds(repo, "certs/a.pem") and found.holds(repo, "link.pem")
    assert found.holds(repo, "new.txt") and not found.holds(repo, "untracked.txt")
    for rel in (".env", "kept.txt", "aside.txt", "ita.txt"):
        assert not found.holds(repo, rel), rel
    (repo / "new.txt").unlink()
    assert not found.holds(repo, "new.txt")  # gone from the disk
