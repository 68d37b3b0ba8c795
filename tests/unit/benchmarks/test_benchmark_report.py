"""benchmarks.report's page: each goal judged from the areas' JSON, errors kept, a chart."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import report
from benchmarks.report import GOALS, Goal, chart, markdown

pytestmark = pytest.mark.unit


def test_a_maximum_and_a_minimum_are_judged_each_their_way() -> None:
    cap = Goal("a", "k", 2.0, "max", "x")
    floor = Goal("a", "k", 0.8, "min", "x")
    assert cap.met(2.0) and not cap.met(2.01) and cap.share(1.0) == 0.5
    assert floor.met(0.8) and not floor.met(0.79) and floor.share(1.6) == 0.5


def test_the_page_shows_each_goal_its_baseline_and_a_failed_area(tmp_path: Path) -> None:
    results = {
        "startup": {"ratio_cli_start_vs_bare_p50": 2.5, "bare_container_p50_ms": 200.0,
                    "stop_p50_ms": 350.0},
        "audit": {"error": "exit 1: no disk"},
    }  # fmt: skip
    page = markdown(results, "python -m benchmarks.report", str(tmp_path / "c.png"))
    rows = {line.split("|")[2]: line for line in page.splitlines() if line.startswith("| ")}
    cli = next(v for k, v in rows.items() if "ratio_cli_start_vs_bare_p50" in k)
    assert "| 2.50 | 200 | ≤ 3 | **yes** |" in cli
    stop = next(v for k, v in rows.items() if "stop_p50_ms" in k)
    assert stop.rstrip().endswith("| no |")
    audit = next(v for k, v in rows.items() if "buffered audit entries" in k)
    assert audit.endswith("| — | — | ≥ 0.8 | error |")
    assert "Failed: exit 1: no disk" in page
    assert "![each figure as a share of its goal](c.png)" in page


def test_the_chart_is_a_png(tmp_path: Path) -> None:
    path = tmp_path / "chart.png"
    chart({"ipc": {"ratio_vs_echo_p50": 0.9}, "audit": {"ratio_sync_vs_raw": 0.5}}, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_goal_names_an_area_the_report_runs() -> None:
    areas = {area for area, _ in report.AREAS}
    assert {goal.area for goal in GOALS} <= areas
