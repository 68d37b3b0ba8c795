"""Every area's benchmark in one run, on one page: each figure beside its goal.

    python -m benchmarks.report [--quick] [--only AREA ...] [--out docs/benchmarks-report.md]
                                [--png docs/benchmarks-report.png] [--json]

Runs ``python -m benchmarks.<area> --json`` for each area, one after the other (each in
its own process, so none disturbs another), keeps the JSON object each prints, and
writes a Markdown page: per goal the figure, its baseline from the same run where the
figure is a ratio, the goal and whether it is met; then every area's full output.  The
PNG beside it (matplotlib) draws each figure as a share of its goal: a bar under 1 is a
goal met.  ``--quick`` runs smaller samples (a check that everything runs, not figures
to quote).  ``--json`` prints the collected results as one object instead.

An area that fails (no engine, an error) is listed with its error; the page is still
written, and the command exits 1.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Goal:
    area: str
    key: str
    goal: float
    #: "max": the figure must stay at or below the goal; "min": at or above it
    kind: str
    what: str
    #: the key of the baseline the ratio is taken against (same run), if any
    baseline: str = ""

    def met(self, value: float) -> bool:
        return value <= self.goal if self.kind == "max" else value >= self.goal

    def share(self, value: float) -> float:
        """The figure as a share of its goal: under 1 is met (for "min": the inverse)."""
        if self.kind == "max":
            return value / self.goal
        return self.goal / value if value else float("inf")


#: Issue 34's goals first (what a person waits for), then each area's own.
GOALS = (
    Goal("startup", "ratio_cli_start_vs_bare_p50", 3.0, "max",
         "`fluffy start` until it returns, vs a bare container", "bare_container_p50_ms"),
    Goal("startup", "stop_p50_ms", 300.0, "max", "`fluffy stop` until it returns (ms)"),
    Goal("startup", "ratio_start_vs_bare_p50", 2.0, "max",
         "kernel start to healthy, vs a bare container", "bare_container_p50_ms"),
    Goal("startup", "restart_to_healthy_p50_ms", 600.0, "max",
         "crash to a healthy replacement (ms)"),
    Goal("tools", "ratio_ipc_vs_echo_p50", 1.1, "max",
         "`kernel.ping` on the real kernel, vs a raw asyncio echo", "ipc_echo_rtt_p50_us"),
    Goal("session", "round_of_10_calls_overhead_p50_ms", 5.0, "max",
         "a model's round of 10 calls: the kernel's share (ms)"),
    Goal("tools", "ratio_fs_write_burst_vs_exec_p50", 1.0, "max",
         "fs.write in a turn of writes back to back, vs `docker exec`", "raw_exec_p50_ms"),
    Goal("tools", "ratio_fs_write_vs_exec_p50", 0.2, "max",
         "fs.write after a model's think time, vs `docker exec`", "raw_exec_p50_ms"),
    Goal("audit", "ratio_buffered_vs_raw", 0.8, "min",
         "buffered audit entries per s, vs raw SQLite inserts", "raw_sqlite_per_s"),
    Goal("audit", "ratio_sync_vs_raw", 0.8, "min",
         "synchronous audit entries per s, vs raw SQLite commits", "raw_sqlite_sync_per_s"),
    Goal("ipc", "ratio_vs_echo_p50", 1.5, "max",
         "the bare kernel server's round trip, vs a raw echo", "echo_rtt_p50_us"),
    Goal("sandbox", "ratio_vs_raw_engine_p50", 1.15, "max",
         "sandbox create → ready → destroyed, vs the raw engine", "raw_engine_p50_ms"),
    Goal("tools", "test_run_overhead_ratio", 1.3, "max",
         "test.run vs the same pytest started directly", "test_run_direct_p50_ms"),
    Goal("mcp", "ratio_vs_direct_p50", 1.5, "max",
         "an MCP tool call through the kernel, vs direct", "direct_p50_ms"),
)  # fmt: skip

#: (area, its arguments for --quick); the full run takes each module's defaults.
AREAS = (
    ("startup", ["--n", "3"]),
    ("tools", ["--n", "300", "--plugin-n", "10", "--test-files", "200"]),
    ("session", ["--rounds", "10", "--proxy-n", "20"]),
    ("audit", ["--entries", "5000", "--sync-entries", "300", "--verify-entries", "20000"]),
    ("ipc", ["--n", "2000"]),
    ("sandbox", ["--n", "5"]),
    ("images", ["--n", "3"]),
    ("policy", ["--n", "200"]),
    ("mcp", ["--n", "20"]),
)


def run_area(area: str, args: list[str], timeout_s: float) -> dict[str, Any]:
    """One area's JSON object, or ``{"error": ...}``."""
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", f"benchmarks.{area}", "--json", *args],
            cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish within {timeout_s:.0f} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-600:]}"}
    result: dict[str, Any] = json.loads(lines[-1])
    result["_seconds"] = round(time.monotonic() - started, 1)
    return result


def _figure(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def markdown(results: dict[str, dict[str, Any]], command: str, png: str | None) -> str:
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Benchmark report",
        "",
        f"`{command}` — {when}, {platform.node() or 'this machine'}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}. Each ratio's baseline was measured in the "
        "same run; compare figures only within one run.",
        "",
        "| area | figure | value | baseline | goal | met |",
        "|---|---|---:|---:|---:|---|",
    ]
    for goal in GOALS:
        data = results.get(goal.area)
        if data is None:
            continue
        value = data.get(goal.key)
        base = _figure(data.get(goal.baseline)) if goal.baseline else "—"
        sign = "≤" if goal.kind == "max" else "≥"
        if not isinstance(value, int | float):
            met = "error" if "error" in data else "not measured"
            lines.append(
                f"| {goal.area} | {goal.what} | — | {base} | {sign} {goal.goal:g} | {met} |"
            )
            continue
        met = "**yes**" if goal.met(float(value)) else "no"
        lines.append(
            f"| {goal.area} | {goal.what} (`{goal.key}`) | {_figure(value)} | {base} "
            f"| {sign} {goal.goal:g} | {met} |"
        )
    if png:
        lines += ["", f"![each figure as a share of its goal]({Path(png).name})"]
    lines += ["", "## Every area's output", ""]
    for area, data in results.items():
        seconds = data.get("_seconds")
        lines.append(f"### {area}" + (f" ({seconds} s)" if seconds is not None else ""))
        lines.append("")
        if "error" in data:
            lines += [f"Failed: {data['error']}", ""]
            continue
        lines += ["```json", json.dumps(data, sort_keys=True, indent=1), "```", ""]
    return "\n".join(lines)


def chart(results: dict[str, dict[str, Any]], path: Path) -> None:
    """Each goal's figure as a share of the goal (1 = at the goal), one bar per goal."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a file
    import matplotlib.pyplot as plt

    labels, shares, colours = [], [], []
    for goal in GOALS:
        value = results.get(goal.area, {}).get(goal.key)
        if not isinstance(value, int | float):
            continue
        share = goal.share(float(value))
        labels.append(f"{goal.area}: {goal.key}")
        shares.append(share)
        colours.append("#3a7d44" if goal.met(float(value)) else "#c0392b")
    figure, axes = plt.subplots(figsize=(9, 0.45 * max(len(labels), 1) + 1.2))
    axes.barh(labels[::-1], shares[::-1], color=colours[::-1])
    axes.axvline(1.0, color="black", linewidth=1)
    axes.set_xlabel("figure / goal (under 1: met; for a minimum, goal / figure)")
    axes.set_title("fluffy benchmarks against their goals")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report")
    parser.add_argument("--quick", action="store_true", help="small samples: a smoke run")
    parser.add_argument("--only", nargs="*", help="these areas only")
    parser.add_argument("--out", default="docs/benchmarks-report.md")
    parser.add_argument("--png", default="docs/benchmarks-report.png")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--timeout", type=float, default=3600.0, help="per area, seconds")
    args = parser.parse_args(argv)
    known = [area for area, _ in AREAS]
    unknown = sorted(set(args.only or ()) - set(known))
    if unknown:
        parser.error(f"unknown area(s) {', '.join(unknown)}; the areas: {', '.join(known)}")
    results: dict[str, dict[str, Any]] = {}
    for area, quick in AREAS:
        if args.only and area not in args.only:
            continue
        print(f"benchmarks.{area} ...", file=sys.stderr, flush=True)
        results[area] = run_area(area, quick if args.quick else [], args.timeout)
    command = "python -m benchmarks.report" + (" --quick" if args.quick else "")
    png = Path(args.png) if args.png else None
    if png is not None:
        chart(results, png)
    Path(args.out).write_text(markdown(results, command, str(png) if png else None) + "\n")
    if args.json:
        print(json.dumps(results, sort_keys=True))
    else:
        print(f"wrote {args.out}" + (f" and {png}" if png else ""), file=sys.stderr)
    return 1 if any("error" in data for data in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
