"""Shared timing helpers for the benchmark modules."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def measure(fn: Callable[[], object], n: int, warmup: int = 1) -> dict[str, Any]:
    """Run ``fn`` ``warmup`` + ``n`` times; milliseconds per call and calls per second."""
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    started = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    total = time.perf_counter() - started
    return {
        "n": n,
        "p50_ms": round(percentile(samples, 0.50), 2),
        "p90_ms": round(percentile(samples, 0.90), 2),
        "p99_ms": round(percentile(samples, 0.99), 2),
        "mean_ms": round(statistics.fmean(samples), 2),
        "throughput_per_s": round(n / total, 2),
    }
