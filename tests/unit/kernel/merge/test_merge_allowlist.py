"""What merges without review (ADR-054): the project's source and test folders, and the
paths the policy names; everything else waits for a person, in every mode, even --yes.

The first table is the red-team finding (issue 31): configuration files that tools on the
user's machine read, and run code from, auto-merged in explore mode because the sensitive
list did not name them.  The plan is judged on a real layout found by ``detect_layout``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from fluffy.kernel.confined_files import DEFAULT_SENSITIVE
from fluffy.kernel.merge.merger import DOTFILE, OUTSIDE, Merger
from fluffy.kernel.merge.staging import Staging
from fluffy.kernel.policy.tool_settings import MergeSettings
from fluffy.kernel.project.defaults import default_policy_text, project_policy
from fluffy.kernel.project.layout import detect_layout

pytestmark = pytest.mark.unit

#: Host-executed configuration found auto-merging in explore mode (issue 31, part 7) ...
FOUND = (
    ".claude/settings.json",  # its hooks run shell commands
    ".pylintrc",  # init-hook
    "mypy.ini",  # plugins
    ".coveragerc",
    "pytest.ini",
    ".cursor/rules/style.mdc",
    ".mcp.json",
    ".zed/settings.json",
    "lefthook.yml",
    "mise.toml",
    ".tool-versions",
    "gradle/wrapper/gradle-wrapper.properties",
    ".mvn/wrapper/maven-wrapper.properties",
    ".lfsconfig",
)
#: ... the ones docs/SECURITY.md's explore row names ...
KNOWN = (
    ".pre-commit-config.yaml",
    ".husky/pre-commit",
    ".vscode/settings.json",
    ".devcontainer/devcontainer.json",
    ".envrc",
    "tox.ini",
    "noxfile.py",
    ".npmrc",
    "Makefile",
)
#: ... and ones no list names: an allow-list catches them anyway.
UNNAMED = (
    "CLAUDE.md",
    "AGENTS.md",
    ".editorconfig",
    "tasks.py",
    "sitecustomize.py",
    "newmodule.py",  # the code lives under src/: a module at the top is not the project's
    "docs/conf.d/extra.py",
    "some/tool/config.toml",
    "src/mypkg/.pylintrc",  # a dot-file inside the source root
    "tests/.hooks/run.sh",
    "tests/pytest.ini",  # pytest reads it when run from tests/: sensitive everywhere
    "src/mypkg/.env",  # sensitive inside the roots too
)
#: Code, tests and package data: these merge without review.
INSIDE = (
    "src/mypkg/core.py",
    "src/mypkg/sub/new.py",
    "src/mypkg/data/table.csv",
    "src/mypkg/templates/page.html",
    "tests/test_core.py",
    "tests/data/fixture.json",
    "tests/unit/helpers.py",  # (a conftest.py is inside too, but test-support: ADR-057)
)


def _src_project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "src" / "mypkg").mkdir(parents=True)
    (root / "src" / "mypkg" / "__init__.py").write_text("")
    (root / "tests").mkdir()
    return root


def _plan(root: Path, tmp_path: Path, paths: tuple[str, ...], **options: Any) -> Any:
    layout = detect_layout(root)
    staging = Staging(tmp_path / "state" / "staging" / "s1", root)
    for path in paths:
        staging.stage(path, b"x = 1\n")
    merger = Merger(root, tmp_path / "state", roots=layout.merge_globs, **options)
    return merger.plan(staging, tests_pass=True)


@pytest.mark.parametrize("path", FOUND + KNOWN + UNNAMED)
def test_a_change_outside_the_code_and_tests_waits_for_review(tmp_path: Path, path: str) -> None:
    plan = _plan(_src_project(tmp_path), tmp_path, (path,))
    assert not plan.auto
    assert any(path in reason for reason in plan.reasons), plan.reasons
    assert path in plan.outside or path in plan.sensitive


@pytest.mark.parametrize("path", FOUND + KNOWN)
def test_the_review_names_each_file_and_why(tmp_path: Path, path: str) -> None:
    plan = _plan(_src_project(tmp_path), tmp_path, (path, "src/mypkg/core.py"))
    why = DOTFILE if any(part.startswith(".") for part in path.split("/")) else OUTSIDE
    assert f"{path}: {why}" in plan.reasons
    assert plan.outside == [path]  # a person decides: --yes does not stand in (reviews.py)


def test_the_found_files_are_sensitive_too() -> None:
    """Inside a source or test folder the sensitive list still holds them back."""
    from fluffy.kernel.globs import GlobSet

    sensitive = GlobSet(DEFAULT_SENSITIVE)
    for path in FOUND:
        assert sensitive.match(path), path
        name = path.rsplit("/", 1)[-1]
        if path.count("/") == 0:
            assert sensitive.match(f"tests/{name}"), name


def test_code_tests_and_package_data_merge_without_review(tmp_path: Path) -> None:
    plan = _plan(_src_project(tmp_path), tmp_path, INSIDE)
    assert plan.auto and plan.outside == [] and plan.reasons == []


def test_with_code_at_the_top_only_its_modules_and_packages_merge(tmp_path: Path) -> None:
    root = tmp_path / "project"
    (root / "mypkg").mkdir(parents=True)
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "calc.py").write_text("")
    (root / "test_calc.py").write_text("")
    layout = detect_layout(root)
    assert layout.source_roots == (".",)  # the root is the source root: never "everything"
    inside = ("calc.py", "mypkg/core.py", "mypkg/data/words.txt", "test_calc.py", "tests/t.py")
    assert _plan(root, tmp_path, inside).auto
    assert _plan(root, tmp_path / "new", ("extra.py",)).auto  # a new module beside calc.py
    outside = ("setup.cfg", "README.md", "sub/calc.py", "mypkg/.flake8", "tasks.py", "fabfile.py")
    for path in (*outside, "dodo.py", "sitecustomize.py", "usercustomize.py", "data.json"):
        plan = _plan(root, tmp_path / path.replace("/", "_"), (path,))
        assert not plan.auto and path in plan.outside + plan.sensitive, path


def test_a_project_without_code_merges_its_tests_and_new_modules(tmp_path: Path) -> None:
    root = tmp_path / "project"
    root.mkdir()
    assert _plan(root, tmp_path, ("tests/test_new.py", "calc.py")).auto
    assert _plan(root, tmp_path / "b", ("calc.toml",)).outside == ["calc.toml"]
    assert _plan(root, tmp_path / "c", ("tasks.py",)).outside == ["tasks.py"]


def test_paths_the_policy_names_merge_and_the_sensitive_list_still_wins(tmp_path: Path) -> None:
    root = _src_project(tmp_path)
    named = ["docs/**", ".editorconfig", "Makefile"]
    plan = _plan(root, tmp_path, ("docs/index.md", ".editorconfig"), auto_merge=named)
    assert plan.auto and plan.outside == []
    held = _plan(root, tmp_path / "b", ("Makefile",), auto_merge=named)
    assert not held.auto and held.sensitive == ["Makefile"] and held.outside == []


def test_a_policy_reload_changes_the_named_paths(tmp_path: Path) -> None:
    root = _src_project(tmp_path)
    merger = Merger(root, tmp_path / "state", roots=detect_layout(root).merge_globs)
    assert merger.outside("docs/index.md") == OUTSIDE
    merger.configure((), DEFAULT_SENSITIVE, 500, ["docs/**"])
    assert merger.outside("docs/index.md") is None
    assert merger.outside("docs/.hidden") is None  # named by the policy: its choice


@pytest.mark.parametrize("glob", ["", "   ", "a\nb", "x\0y"])
def test_auto_merge_paths_must_be_globs(glob: str) -> None:
    with pytest.raises(ValidationError, match="auto_merge_paths"):
        MergeSettings(auto_merge_paths=[glob])


def test_the_default_policy_shows_the_setting_and_the_folders(tmp_path: Path) -> None:
    root = _src_project(tmp_path)
    text = default_policy_text(root)
    assert "\nmerge:\n  auto_merge_paths: []" in text
    assert "src/**" in text and "tests/**" in text and "even with --yes" in text
    policy, shown = project_policy(root)
    assert shown == text and policy.merge.auto_merge_paths == []
