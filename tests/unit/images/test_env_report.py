"""The report an environment build leaves is untrusted: the host keeps what has the
expected shape (images.envreport)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fluffy.errors import EnvironmentFailed
from fluffy.images.envreport import read_report, remove_links
from unit.trees import write_tree


def _report(folder: Path, data: object, files: dict[str, str] | None = None) -> Path:
    folder.mkdir(parents=True)
    (folder / "env.json").write_text(json.dumps(data))
    write_tree(folder / "generated", files or {})
    return folder


def test_generated_files_outside_the_build_folder_are_dropped(tmp_path: Path) -> None:
    files = {"src/pkg/_version.py": "v = 1\n", "a/b/c/x": "", "repo/calc.py": "forged\n"}
    named = [
        "src/pkg/_version.py",
        "l/../../../../repo/calc.py",
        "../calc.py",
        "/etc/passwd",
        "src/./pkg/_version.py",
        "missing.py",
        "linked.py",
        ".git/hooks/pre-commit",
    ]
    folder = _report(tmp_path / "report", {"generated": named, "packages": {"a": "1"}}, files)
    (folder / "generated" / "l").symlink_to("a/b/c")
    (folder / "generated" / "linked.py").symlink_to("/etc/passwd")
    remove_links(folder)
    assert not (folder / "generated" / "l").exists()
    assert not (folder / "generated" / "linked.py").is_symlink()
    data = read_report(folder)
    assert data["generated"] == ["src/pkg/_version.py"]
    assert data["packages"] == {"a": "1"}
    assert "7 generated file(s) that are not plain files" in data["warnings"][-1]


@pytest.mark.parametrize(
    "data",
    [
        [1, 2],
        {"packages": {"a": 1}},
        {"generated": "src/x.py"},
        {"project_installed": "yes"},
        {"modules": [None]},
        {"python": "3" * 100},
    ],
)
def test_a_malformed_report_is_refused_with_a_fix(tmp_path: Path, data: object) -> None:
    folder = _report(tmp_path / "report", data)
    with pytest.raises(EnvironmentFailed) as refused:
        read_report(folder)
    assert "env.json" in refused.value.why and "fluffy env build" in refused.value.fix


def test_an_old_report_without_every_key_still_reads(tmp_path: Path) -> None:
    data = read_report(_report(tmp_path / "report", {"packages": {}, "surplus": 1}))
    assert data["generated"] == [] and data["project_installed"] is False
    assert "surplus" not in data


def test_an_oversized_report_is_refused_and_its_warnings_are_shown_as_text(
    tmp_path: Path,
) -> None:
    big = _report(tmp_path / "big", {"modules": ["m" * 4000] * 3000})
    with pytest.raises(EnvironmentFailed, match="cannot use"):
        read_report(big)
    long_name = _report(tmp_path / "long", {"modules": ["m" * 5000]})
    with pytest.raises(EnvironmentFailed):
        read_report(long_name)
    data = read_report(_report(tmp_path / "ok", {"warnings": ["pip said \x1b[2J\x1b]0;pwned\x07"]}))
    assert "\x1b" not in data["warnings"][0] and "\x07" not in data["warnings"][0]
