"""Kernel memory defence: thresholds from the cgroup's real files (v1 and v2 layouts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fluffy.kernel.memory_guard import MemoryGuard, level_of, read_memory


def _v2(root: Path, usage: int, limit: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "memory.current").write_text(f"{usage}\n")
    (root / "memory.max").write_text(f"{limit}\n")
    return root


def test_reads_v1_and_v2_and_unlimited(tmp_path: Path) -> None:
    assert read_memory(_v2(tmp_path / "v2", 50, "100")) == (50, 100)
    assert read_memory(_v2(tmp_path / "max", 50, "max")) == (50, None)
    v1 = tmp_path / "v1" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.usage_in_bytes").write_text("30\n")
    (v1 / "memory.limit_in_bytes").write_text("60\n")
    assert read_memory(tmp_path / "v1") == (30, 60)
    assert read_memory(tmp_path / "none") == (None, None)


@pytest.mark.parametrize(
    ("usage", "limit", "level"),
    [
        (79, 100, "ok"),
        (80, 100, "shed"),
        (89, 100, "shed"),
        (90, 100, "evict"),
        (1, None, "unknown"),
    ],
)
def test_levels(usage: int, limit: int | None, level: str) -> None:
    assert level_of(usage, limit) == level


def test_the_guard_sheds_then_evicts_once_and_recovers(tmp_path: Path) -> None:
    root = _v2(tmp_path, 10, "100")
    shed: list[int] = []
    evicted: list[int] = []
    guard = MemoryGuard(
        root, shedders=[lambda: shed.append(1)], evictors=[lambda: evicted.append(1)]
    )
    assert guard.check() == "ok" and guard.accepting_work
    _v2(root, 85, "100")
    assert guard.check() == "shed" and not guard.accepting_work
    _v2(root, 95, "100")
    assert guard.check() == "evict"
    guard.check()
    assert (shed, evicted) == ([1], [1])  # once per crossing, not every tick
    _v2(root, 20, "100")
    assert guard.check() == "ok" and guard.accepting_work
