"""Parallel fast check of a large audit file: are all hashes and links intact?

Each worker recomputes the hashes of one seq range and checks the links inside it;
the caller stitches the ranges (first prev_hash = the previous range's last hash).
Only a yes/no: when anything is off, :mod:`~fluffy.kernel.audit.verify` runs its
sequential scan, which locates and classifies the problem.

Speed (``python -m benchmarks.audit``): fetching a row costs more than hashing it.
SQLite builds most of the canonical JSON itself: ``json_array()`` of the text columns
(:data:`SPLICED_ROWS`), so Python handles seven values a row instead of twenty.  Only
the numbers are spliced in by Python (``seq``, ``timestamp``, ``duration_ms``): SQLite
prints a REAL with 15 digits, the canonical JSON with as many as it takes to round-trip,
so a duration SQLite printed could hide a changed last digit.  This path is used only
when SQLite escapes text exactly like the canonical encoder (a probe, once per process:
:func:`sqlite_json_is_canonical`); otherwise every column is fetched and encoded in
Python.  Either way a stored value whose canonical JSON is also that of another value
cannot pass: a BLOB (base64 text in the canonical JSON) or an infinite duration
(``null``) makes the range not intact; a REAL or INTEGER in a text column is a bare
number in SQLite's JSON, never a string or ``null``.  So an entry passes only when it is
what was hashed.  Values of the wrong type in entries hashed *after* the change (appended
past the checkpoint) are :mod:`~fluffy.kernel.audit.verify`'s type pass to find.  The
caller must have checked that ``seq`` is the table's row id (distinct integers).
Rows are fetched in small batches that stay in the CPU cache and the garbage collector
is paused while they stream past (only tuples of strings and numbers: nothing to
collect, yet every 700 tuples it would scan them).  The file is cut into many more
ranges than there are CPUs; a pool of processes (``fork`` from a single-threaded
caller, else ``forkserver``) takes them from the front while the calling process (when
it is the main thread, e.g. ``fluffy audit verify``) takes them from the back, so
nobody waits for the pool to start and the last ranges end together.
"""

from __future__ import annotations

import functools
import gc
import math
import multiprocessing
import os
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from fluffy.kernel.audit.entry import _BASE, COLUMNS, _encode
from fluffy.kernel.audit.store import SELECT_ROWS, connect_ro

PARALLEL_MIN_ROWS = 200_000
CHUNK_ROWS = 40_000  # one unit of work: ~0.2 s
FETCH_ROWS = 256  # rows per fetchmany: a batch that stays in the CPU cache

_DURATION = COLUMNS.index("duration_ms")
assert COLUMNS[:2] == ("seq", "timestamp") and COLUMNS[2] == "prev_hash"
# seq, timestamp, the JSON of prev_hash..output_summary, duration_ms, the JSON of
# sandbox_id and metadata, hash, prev_hash (again, as text: the link to check)
SPLICED_ROWS = (
    "SELECT seq, timestamp, "  # noqa: S608 (constant column names)
    f"CAST(json_array({', '.join(COLUMNS[2:_DURATION])}) AS BLOB), duration_ms, "
    f"CAST(json_array({', '.join(COLUMNS[_DURATION + 1 :])}) AS BLOB), hash, prev_hash "
    "FROM audit_log"
)
# text that exercises every escaping rule: all of ASCII, a NUL, non-ASCII, separators
_PROBE = ("".join(map(chr, range(128))), "é 中 😀 \u2028 \u2029 \ufeff \uffff", "", None, "x")


@functools.cache
def sqlite_json_is_canonical() -> bool:
    """Does this SQLite's ``json_array()`` write text exactly as the canonical encoder?"""
    conn = sqlite3.connect(":memory:")
    try:
        marks = ", ".join("?" * len(_PROBE))
        (made,) = conn.execute(f"SELECT CAST(json_array({marks}) AS BLOB)", _PROBE).fetchone()
    except sqlite3.Error:  # no JSON functions in this build
        return False
    finally:
        conn.close()
    return bool(made == _encode(list(_PROBE)))


@dataclass(frozen=True)
class Range:
    first_seq: int
    first_prev: str
    last_seq: int
    last_hash: str
    count: int
    intact: bool


def _broken(lo: int) -> Range:
    return Range(lo, "", lo - 1, "", 0, False)


def _spliced(conn: sqlite3.Connection, lo: int, hi: int) -> Range | None:
    cursor = conn.execute(SPLICED_ROWS + " WHERE seq BETWEEN ? AND ? ORDER BY seq", (lo, hi))
    fetch = cursor.fetchmany
    copy = _BASE.copy
    encode = _encode
    finite = math.isfinite
    batch = fetch(FETCH_ROWS)
    if not batch:
        return None
    first_seq, first_prev = batch[0][0], batch[0][-1]
    prev_hash, next_seq, count = first_prev, first_seq, 0
    while batch:
        # seq is the rowid and comes in order: the batch is contiguous iff its ends are
        if batch[0][0] != next_seq or batch[-1][0] - next_seq != len(batch) - 1:
            return _broken(lo)
        for seq, timestamp, texts, duration, tail, stored, prev in batch:
            if (
                prev != prev_hash
                or type(seq) is not int
                or type(timestamp) is not int
                or type(duration) is bytes
                or (type(duration) is float and not finite(duration))
            ):
                return _broken(lo)
            digest = copy()  # the canonical JSON: "[seq,timestamp,texts...,duration,tail...]"
            digest.update(
                b"[%d,%d,%b,%b,%b" % (seq, timestamp, texts[1:-1], encode(duration), tail[1:])
            )
            prev_hash = digest.hexdigest()
            if prev_hash != stored:
                return _broken(lo)
        count += len(batch)
        next_seq += len(batch)
        batch = fetch(FETCH_ROWS)
    return Range(first_seq, first_prev, next_seq - 1, prev_hash, count, True)


def _columns(conn: sqlite3.Connection, lo: int, hi: int) -> Range | None:
    cursor = conn.execute(SELECT_ROWS + " WHERE seq BETWEEN ? AND ? ORDER BY seq", (lo, hi))
    fetch = cursor.fetchmany
    copy = _BASE.copy
    encode = _encode
    finite = math.isfinite
    first: tuple[int, str] | None = None
    prev_hash, prev_seq, count = "", 0, 0
    while batch := fetch(FETCH_ROWS):
        for row in batch:
            duration = row[_DURATION]
            if (
                bytes in map(type, row)
                or float in map(type, row[:_DURATION])
                or float in map(type, row[_DURATION + 1 :])
                or (type(duration) is float and not finite(duration))
            ):
                return _broken(lo)
            digest = copy()
            digest.update(encode(row[:-1]))
            computed = digest.hexdigest()
            seq = row[0]
            if first is None:
                first = (seq, row[2])
            elif row[2] != prev_hash or seq != prev_seq + 1:
                return _broken(lo)
            if computed != row[-1]:
                return _broken(lo)
            prev_hash, prev_seq = computed, seq
            count += 1
    if first is None:
        return None
    return Range(first[0], first[1], prev_seq, prev_hash, count, True)


def check_range(path: str, lo: int, hi: int) -> Range | None:
    """Hashes and links of the entries ``lo..hi`` (None when there are none)."""
    walk: Callable[[sqlite3.Connection, int, int], Range | None] = (
        _spliced if sqlite_json_is_canonical() else _columns
    )
    conn = connect_ro(Path(path))
    collecting = gc.isenabled()
    gc.disable()  # see the module's docstring
    try:
        return walk(conn, lo, hi)
    except sqlite3.Error:  # json_array() refuses a BLOB; a read error: let the scan tell
        return _broken(lo)
    finally:
        if collecting:
            gc.enable()
        conn.close()


def workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _bounds(lo: int, hi: int, pieces: int) -> list[tuple[int, int]]:
    step = -(-(hi - lo + 1) // pieces)
    return [(start, min(hi, start + step - 1)) for start in range(lo, hi + 1, step)]


def _check_all(path: Path, bounds: list[tuple[int, int]], cpus: int) -> list[Range | None]:
    """check_range over every (lo, hi), in order; stops early when one is broken."""
    here = threading.current_thread() is threading.main_thread()
    # off the main thread (the kernel's start-up check runs in a thread of the event
    # loop's process) this process only waits: holding the GIL would stall the loop
    # fork is cheapest, and safe while this process has one thread (the CLI); a threaded
    # caller (the kernel) uses forkserver, which does not copy its threads' locks.
    single = threading.active_count() == 1
    context = multiprocessing.get_context("fork" if single else "forkserver")
    parts: list[Range | None] = [None] * len(bounds)
    with ProcessPoolExecutor(max_workers=cpus - 1 if here else cpus, mp_context=context) as pool:
        futures: list[Future[Range | None]] = [
            pool.submit(check_range, str(path), a, b) for a, b in bounds
        ]
        try:
            if here:  # take ranges from the back until we meet the pool
                for index in range(len(bounds) - 1, -1, -1):
                    if not futures[index].cancel():
                        break
                    part = check_range(str(path), *bounds[index])
                    if part is None or not part.intact:
                        return [part]
                    parts[index] = part
            for index, future in enumerate(futures):
                if not future.cancelled():
                    part = future.result()
                    if part is None or not part.intact:
                        return [part]
                    parts[index] = part
        finally:
            for future in futures:
                future.cancel()
    return parts


def parallel_intact(path: Path, lo: int, hi: int) -> Range | None:
    """One Range for [lo, hi] when every part is intact and the parts link up, else None."""
    cpus = workers()
    rows = hi - lo + 1
    if cpus < 2 or rows < PARALLEL_MIN_ROWS:
        result = check_range(str(path), lo, hi)
        return result if result is not None and result.intact else None
    bounds = _bounds(lo, hi, max(cpus * 2, -(-rows // CHUNK_ROWS)))
    parts = _check_all(path, bounds, cpus)
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
