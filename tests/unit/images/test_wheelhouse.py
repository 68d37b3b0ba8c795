from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from fluffy.errors import WheelhouseError
from fluffy.images import wheelhouse
from fluffy.images.wheelhouse import ensure_wheelhouse, linux_arch, platform_args, target_args


def test_engine_arch_names_map_to_wheel_arch() -> None:
    assert linux_arch("amd64") == "x86_64"
    assert linux_arch("arm64") == "aarch64"
    with pytest.raises(WheelhouseError):
        linux_arch("s390x")


def test_platforms_cover_every_manylinux_up_to_the_base_glibc() -> None:
    tags = platform_args("x86_64")[1::2]
    assert "manylinux_2_36_x86_64" in tags and "manylinux_2_17_x86_64" in tags
    assert "manylinux2014_x86_64" in tags and "manylinux1_x86_64" in tags
    assert not any("2_37" in t for t in tags)
    assert all(t.endswith("aarch64") for t in platform_args("aarch64")[1::2])


def test_target_is_binary_only_cpython_311() -> None:
    args = target_args("x86_64")
    assert "--only-binary=:all:" in args
    assert args[args.index("--python-version") + 1] == "3.11"


def _lock(tmp_path: Path, text: str = "msgspec==0.22.0\n") -> Path:
    lock = tmp_path / "demo.lock"
    lock.write_text(text)
    return lock


def test_download_once_then_cached(
    tmp_path: Path, fluffy_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []

    def fake_run(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        dest = Path(cmd[cmd.index("--dest") + 1])
        (dest / "msgspec-0.22.0-cp311-cp311-manylinux_2_17_x86_64.whl").write_bytes(b"w")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(wheelhouse.subprocess, "run", fake_run)
    lock = _lock(tmp_path)
    first = ensure_wheelhouse(lock, "x86_64")
    second = ensure_wheelhouse(lock, "x86_64")
    assert first == second and len(calls) == 1
    assert "--no-deps" in calls[0] and str(lock) in calls[0]
    assert [p.name for p in first.glob("*.whl")] == [
        "msgspec-0.22.0-cp311-cp311-manylinux_2_17_x86_64.whl"
    ]
    assert first.is_relative_to(fluffy_home)
    # another lock or arch is another folder
    assert ensure_wheelhouse(_lock(tmp_path, "msgspec==0.21.0\n"), "x86_64") != first
    assert len(calls) == 2


def test_pip_failure_is_reported_with_its_message_and_leaves_no_half_folder(
    tmp_path: Path, fluffy_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution for x")

    monkeypatch.setattr(wheelhouse.subprocess, "run", failing)
    lock = _lock(tmp_path)
    with pytest.raises(WheelhouseError) as info:
        ensure_wheelhouse(lock, "x86_64")
    assert "No matching distribution" in info.value.why
    assert not wheelhouse.wheelhouse_dir(lock, "x86_64").exists()
