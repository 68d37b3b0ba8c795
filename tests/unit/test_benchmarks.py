"""Benchmark modules import and parse their options (their figures: docs/benchmarks.md)."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

import benchmarks
from benchmarks._stats import measure, percentile

MODULES = sorted(
    m.name
    for m in pkgutil.iter_modules([str(Path(benchmarks.__file__).parent)])
    if not m.name.startswith("_")
)


def test_there_are_benchmarks_for_images_and_sandboxes() -> None:
    assert {"images", "sandbox"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_each_benchmark_has_a_json_flag(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    module = importlib.import_module(f"benchmarks.{name}")
    with pytest.raises(SystemExit) as info:
        module.main(["--help"])
    assert info.value.code == 0
    assert "--json" in capsys.readouterr().out


def test_percentiles_interpolate() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([5.0], 0.99) == 5.0
    stats = measure(lambda: None, 5, warmup=0)
    assert stats["n"] == 5 and stats["p50_ms"] <= stats["p99_ms"]
