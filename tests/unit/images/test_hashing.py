from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluffy.images import hashing
from fluffy.images.hashing import content_hash, context_files, fluffy_source_files
from fluffy.images.spec import IMAGES_DIR, get_spec


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    """A copy of images/ that tests may change."""
    copy = tmp_path / "images"
    shutil.copytree(IMAGES_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _hash(name: str, source_dir: Path, parent: str = "base@sha256:1", arch: str = "x86_64") -> str:
    return content_hash(
        replace(get_spec(name), source_dir=source_dir), parent_identity=parent, arch=arch
    )


def test_hash_is_stable(tree: Path) -> None:
    assert _hash("kernel", tree) == _hash("kernel", tree)
    assert len(_hash("kernel", tree)) == hashing.TAG_LENGTH


def test_a_copy_hashes_like_the_original(tree: Path) -> None:
    assert _hash("code-executor", tree) == _hash("code-executor", IMAGES_DIR)


@pytest.mark.parametrize("name", ["python-base", "code-executor"])
def test_one_byte_in_the_dockerfile_changes_the_tag(tree: Path, name: str) -> None:
    before = _hash(name, tree)
    dockerfile = tree / name / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "\n")
    assert _hash(name, tree) != before


def test_lock_change_changes_only_that_image(tree: Path) -> None:
    before = {n: _hash(n, tree) for n in ("kernel", "code-executor")}
    lock = tree / "requirements" / "code-executor.lock"
    lock.write_text(lock.read_text().replace("pytest==", "pytest==0"))
    assert _hash("code-executor", tree) != before["code-executor"]
    assert _hash("kernel", tree) == before["kernel"]


def test_executable_bit_is_part_of_the_hash(tree: Path) -> None:
    extra = tree / "code-executor" / "entry.sh"
    extra.write_text("#!/bin/sh\n")
    before = _hash("code-executor", tree)
    extra.chmod(0o755)
    assert _hash("code-executor", tree) != before


def test_parent_and_arch_are_part_of_the_hash(tree: Path) -> None:
    base = _hash("kernel", tree)
    assert _hash("kernel", tree, parent="base@sha256:2") != base
    assert _hash("kernel", tree, arch="aarch64") != base


def test_fluffy_source_goes_into_images_that_carry_it(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "kernel").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "kernel" / "mod.py").write_text("X = 1\n")
    (pkg / "kernel" / "notes.txt").write_text("not shipped\n")
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "x.pyc").write_bytes(b"\0")
    monkeypatch.setattr(hashing, "package_root", lambda: pkg)
    assert set(fluffy_source_files()) == {"fluffy/__init__.py", "fluffy/kernel/mod.py"}
    kernel, base = _hash("kernel", tree), _hash("python-base", tree)
    (pkg / "kernel" / "mod.py").write_text("X = 2\n")
    assert _hash("kernel", tree) != kernel
    assert _hash("python-base", tree) == base  # the base carries no fluffy code


def test_real_source_tree_follows_the_layer_symlinks() -> None:
    files = fluffy_source_files()
    assert "fluffy/kernel/containers/engine.py" in files
    assert "fluffy/images/builder.py" in files
    assert not any("__pycache__" in rel for rel in files)


def test_context_names_the_lock_and_dockerfile() -> None:
    files = context_files(get_spec("code-executor"))
    assert files["Dockerfile"].name == "Dockerfile"
    assert files["requirements.lock"].name == "code-executor.lock"
    assert files["install.Dockerfile"] == IMAGES_DIR / "stages" / "install.Dockerfile"
    assert "requirements.lock" not in context_files(get_spec("python-base"))
    assert "install.Dockerfile" not in context_files(get_spec("python-base"))


def test_the_shared_install_stage_changes_every_image_that_carries_it(tree: Path) -> None:
    names = ("python-base", "kernel", "code-executor", "policy-sandbox", "ai-provider")
    before = {n: _hash(n, tree) for n in names}
    stage = tree / "stages" / "install.Dockerfile"
    stage.write_text(stage.read_text() + "RUN true\n")
    after = {n: _hash(n, tree) for n in names}
    assert [n for n in names if after[n] != before[n]] == list(names[1:])


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_single_byte_change_in_any_context_file_changes_the_tag(
    tree: Path, data: st.DataObject
) -> None:
    spec = replace(get_spec("code-executor"), source_dir=tree)
    files = sorted(
        rel for rel in context_files(spec) if not rel.startswith("fluffy/")
    )  # the image's own inputs; fluffy's sources are covered by the test above
    rel = data.draw(st.sampled_from(files), label="file")
    path = {
        "Dockerfile": tree / "code-executor" / "Dockerfile",
        "requirements.lock": tree / "requirements" / "code-executor.lock",
        "install.Dockerfile": tree / "stages" / "install.Dockerfile",
    }[rel]
    original = path.read_bytes()
    index = data.draw(st.integers(0, len(original) - 1), label="offset")
    flip = data.draw(st.integers(1, 255), label="xor")
    before = _hash("code-executor", tree)
    try:
        changed = bytearray(original)
        changed[index] ^= flip
        path.write_bytes(bytes(changed))
        assert _hash("code-executor", tree) != before
    finally:
        path.write_bytes(original)


def test_sandbox_images_carry_only_the_in_sandbox_side() -> None:
    l2 = context_files(get_spec("code-executor"))
    assert "fluffy/sandboxes/probe.py" in l2 and "fluffy/seccomp/rules.py" in l2
    assert not any(rel.startswith("fluffy/kernel/") for rel in l2)
    assert not any(rel.startswith("fluffy/cli/") for rel in l2)
    kernel = context_files(get_spec("kernel"))
    assert "fluffy/kernel/containers/manager.py" in kernel


def test_kernel_only_changes_do_not_touch_sandbox_tags(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "pkg"
    for part in ("kernel", "sandboxes"):
        (pkg / part).mkdir(parents=True)
        (pkg / part / "m.py").write_text("X = 1\n")
    monkeypatch.setattr(hashing, "package_root", lambda: pkg)
    before = {n: _hash(n, tree) for n in ("kernel", "code-executor")}
    (pkg / "kernel" / "m.py").write_text("X = 2\n")
    assert _hash("kernel", tree) != before["kernel"]
    assert _hash("code-executor", tree) == before["code-executor"]
    (pkg / "sandboxes" / "m.py").write_text("X = 2\n")
    assert _hash("code-executor", tree) != before["code-executor"]
