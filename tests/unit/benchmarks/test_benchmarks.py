"""Benchmark modules import and parse their options (their figures: docs/benchmarks.md)."""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
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


def test_the_audit_benchmark_runs_small_and_reports_its_figures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks import audit
    from fluffy.kernel import process_tuning

    small = ["--entries", "300", "--sync-entries", "16", "--callers", "4", "--repeat", "2"]
    before = sys.getswitchinterval()
    try:
        assert audit.main(["--json", *small, "--sync-warmup", "5", "--verify-entries", "400"]) == 0
        assert sys.getswitchinterval() == pytest.approx(process_tuning.SWITCH_INTERVAL_S)
    finally:
        sys.setswitchinterval(before)  # the rest of the suite keeps the default
    result = json.loads(capsys.readouterr().out)
    assert len(result["buffered_runs_per_s"]) == len(result["verify_runs_per_s"]) == 2
    for key in (
        "buffered_per_s",
        "sync_per_s",
        "sync_concurrent_per_s",
        "raw_sqlite_per_s",
        "raw_sqlite_sync_per_s",
        "ratio_buffered_vs_raw",
        "verify_per_s",
        "raw_scan_per_s",
    ):
        assert result[key] > 0, key
    for prefix in ("sync", "sync_concurrent", "raw_sqlite_sync"):
        assert result[f"{prefix}_p50_ms"] <= result[f"{prefix}_p99_ms"]
    assert result["verify_entries"] == 400


def test_the_tools_benchmark_runs_small_and_reports_its_figures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks import tools

    assert tools.main(["--json", "--n", "60", "--plugin-n", "0"]) == 0
    result = json.loads(capsys.readouterr().out)
    for key in ("fs_read_p50_us", "fs_read_p99_us", "ipc_rtt_p50_us", "round_of_10_reads_p50_ms"):
        assert result[key] > 0, key
    assert result["fs_read_p50_us"] <= result["fs_read_p99_us"]
    assert "plugin_call_overhead_p50_ms" in result  # measured where an engine runs (CI)


def test_the_session_benchmark_runs_small_and_reports_its_figures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks import session

    assert session.main(["--json", "--rounds", "5", "--proxy-n", "5"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["rounds"] == 5  # one gap per round after the first (a warm-up)
    for key in ("round_of_10_calls_overhead_p50_ms", "proxy_overhead_p50_ms", "direct_p50_ms"):
        assert key in result, key
    assert (
        0
        < result["round_of_10_calls_overhead_p50_ms"]
        <= result["round_of_10_calls_overhead_p99_ms"]
    )
    assert result["via_proxy_p50_ms"] > 0 and result["tunnels_audited"] >= 5


def test_the_canary_benchmark_runs_small_and_reports_its_figures() -> None:
    from benchmarks.canary import measure as canary_measure

    figures = canary_measure(files=3, tests=2, repeat=1)
    assert figures["files"] == 3 and figures["tests_per_file"] == 2
    assert figures["plain_p50_ms"] > 0 and figures["canary_p50_ms"] > 0
    assert figures["canary_ratio"] == round(figures["canary_p50_ms"] / figures["plain_p50_ms"], 2)
