"""Parallel fast check of a large audit file: are all hashes and links intact?

Each worker recomputes the hashes of one seq range and checks the links inside it;
the caller stitches the ranges (first prev_hash = the previous range's last hash).
Only a yes/no: when anything is off, :mod:`~fluffy.kernel.audit.verify` runs its
sequential scan, which locates and classifies the problem.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from fluffy.kernel.audit.entry import _BASE, _encode
from fluffy.kernel.audit.store import SELECT_ROWS, connect_ro

PARALLEL_MIN_ROWS = 200_000


@dataclass(frozen=True)
class Range:
    first_seq: int
    first_prev: str
    last_seq: int
    last_hash: str
    count: int
    intact: bool


def check_range(path: str, lo: int, hi: int) -> Range | None:
    conn = connect_ro(Path(path))
    try:
        cursor = conn.execute(SELECT_ROWS + " WHERE seq BETWEEN ? AND ? ORDER BY seq", (lo, hi))
        first: tuple[int, str] | None = None
        prev_hash, prev_seq, count = "", 0, 0
        while batch := cursor.fetchmany(4096):
            for row in batch:
                digest = _BASE.copy()
                digest.update(_encode(row[:-1]))
                computed = digest.hexdigest()
                if first is None:
                    first = (row[0], row[2])
                elif row[2] != prev_hash or row[0] != prev_seq + 1:
                    return Range(first[0], first[1], prev_seq, prev_hash, count, False)
                if computed != row[-1]:
                    return Range(first[0], first[1], prev_seq, prev_hash, count, False)
                prev_hash, prev_seq = computed, row[0]
                count += 1
        if first is None:
            return None
        return Range(first[0], first[1], prev_seq, prev_hash, count, True)
    finally:
        conn.close()


def workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def parallel_intact(path: Path, lo: int, hi: int) -> Range | None:
    """One Range for [lo, hi] when every part is intact and the parts link up, else None."""
    count = workers()
    if count < 2 or hi - lo + 1 < PARALLEL_MIN_ROWS:
        result = check_range(str(path), lo, hi)
        return result if result is not None and result.intact else None
    step = (hi - lo + count) // count
    bounds = [(start, min(hi, start + step - 1)) for start in range(lo, hi + 1, step)]
    context = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(max_workers=count, mp_context=context) as pool:
        parts = list(pool.map(check_range, [str(path)] * len(bounds), *zip(*bounds, strict=True)))
    previous: Range | None = None
    total = 0
    for part in parts:
        if part is None or not part.intact:
            return None
        if previous is not None and (
            part.first_prev != previous.last_hash or part.first_seq != previous.last_seq + 1
        ):
            return None
        total += part.count
        previous = part
    first = parts[0]
    assert first is not None and previous is not None
    return Range(
        first.first_seq, first.first_prev, previous.last_seq, previous.last_hash, total, True
    )
