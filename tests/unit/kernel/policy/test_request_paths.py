"""normalize() resolves request paths exactly as pathlib would, one lstat per part."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluffy.kernel.policy.request_paths import PathEscape, normalize

pytestmark = pytest.mark.unit


def reference(path: str, root: Path) -> str:
    """The pathlib formulation normalize() replaced (lexical, then Path.resolve)."""
    if not path:
        raise PathEscape(path)
    pure = PurePosixPath(path)
    if pure.is_absolute():
        try:
            pure = pure.relative_to(PurePosixPath(root.as_posix()))
        except ValueError:
            raise PathEscape(path) from None
    parts: list[str] = []
    for part in pure.parts:
        if part == "..":
            if not parts:
                raise PathEscape(path)
            parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    base = os.path.realpath(root)
    try:
        resolved = str((Path(base).joinpath(*parts)).resolve())
    except (OSError, RuntimeError):
        raise PathEscape(path) from None
    if resolved == base:
        return "."
    if not resolved.startswith(base + os.sep):
        raise PathEscape(path)
    return resolved[len(base) + 1 :]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret").write_text("x")
    top = tmp_path_factory.mktemp("linked")
    root = top / "project"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "mod.py").write_text("x")
    (root / "src" / "file").write_text("x")
    (root / ".fluffy").mkdir()
    (root / ".fluffy" / "policy.yaml").write_text("x")
    (root / "src" / "to_policy").symlink_to("../.fluffy/policy.yaml")
    (root / "src" / "to_pkg").symlink_to("pkg")
    (root / "out").symlink_to(outside)
    (root / "loop").symlink_to("loop")
    (root / "dangling").symlink_to("nowhere/else")
    (top / "alias").symlink_to(root)  # a project reached through a link of its own
    return root


PART = st.sampled_from(
    ["src", "pkg", "mod.py", "file", "to_policy", "to_pkg", "out", "secret", "loop",
     "dangling", ".fluffy", "policy.yaml", "missing", ".", "..", ""]
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(PART, min_size=1, max_size=6), absolute=st.booleans(), alias=st.booleans())
def test_normalize_agrees_with_pathlib(
    tree: Path, parts: list[str], absolute: bool, alias: bool
) -> None:
    root = tree.parent / "alias" if alias else tree
    path = "/".join(parts)
    if absolute:
        path = f"{root.as_posix()}/{path}"
    try:
        expected: str | type[PathEscape] = reference(path, root)
    except PathEscape:
        expected = PathEscape
    if expected is PathEscape:
        with pytest.raises(PathEscape):
            normalize(path, root)
    else:
        assert normalize(path, root) == expected


def test_links_are_judged_by_what_they_name(tree: Path) -> None:
    assert normalize("src/to_policy", tree) == ".fluffy/policy.yaml"
    assert normalize("src/to_pkg/mod.py", tree) == "src/pkg/mod.py"
    assert normalize("missing/deeper/x.py", tree) == "missing/deeper/x.py"
    for escape in ("out/secret", "loop/x", "../x", "/etc/passwd"):
        with pytest.raises(PathEscape):
            normalize(escape, tree)
