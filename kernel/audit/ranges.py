"""Parallel fast check of a large audit file: are all hashes and links intact?

Each worker recomputes the hashes of one seq range and checks the links inside it;
the caller stitches the ranges (first prev_hash = the previous range's last hash).
Only a yes/no: when anything is off, :mod:`~fluffy.kernel.audit.verify` runs its
sequential scan, which locates and classifies the problem.

Speed (``python -m benchmarks.audit``): the table stores each entry as the bytes its
hash covers (:mod:`.store`), so a row is four values and one SHA-256 of the stored
bytes, with no encoding in SQL or Python.  What the hash does not cover is checked
against the entry with one ``startswith``: the entry must begin
``[seq,timestamp,"prev_hash","event_type",`` with ``seq`` the row id, ``timestamp`` and
``event_type`` the table's copies (indexed; the event type one the log writes, so the
copy cannot reach past its quote) and ``prev_hash`` the hash just computed for the
entry before.  Entries the log wrote pass; anything else (a copy that differs,
a value of another type, an entry that is not canonical JSON) makes the range not
intact and the sequential scan, which decodes every entry, says what and where.  Past
the witnessed head, entries hashed by whoever appended them are decoded by the scan's
own pass (:mod:`~fluffy.kernel.audit.verify`).  The caller must have checked that
``seq`` is the table's row id (distinct integers).
Rows are fetched in small batches that stay in the CPU cache and the garbage collector
is paused while they stream past (only tuples of strings and numbers: nothing to
collect, yet every 700 tuples it would scan them).  The file is cut into many more
ranges than there are CPUs; a pool of processes (``fork`` from a single-threaded
caller, else ``forkserver``) takes them from the front while the calling process (when
it is the main thread, e.g. ``fluffy audit verify``) takes them from the back, so
nobody waits for the pool to start and the last ranges end together.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import sqlite3
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import msgspec

from fluffy.kernel.audit.entry import _BASE, EVENT_TYPES, SPECIAL_EVENTS
from fluffy.kernel.audit.store import SELECT_ROWS, connect_ro

PARALLEL_MIN_ROWS = 200_000
CHUNK_ROWS = 10_000  # one unit of work: ~25 ms (small: the last ones end together)
FETCH_ROWS = 256  # rows per fetchmany: a batch that stays in the CPU cache
MAX_RANGES = 4096  # a span of numbers with few rows in it (a forged head) costs little


class Range(msgspec.Struct, frozen=True):
    first_seq: int
    first_prev: str
    last_seq: int
    last_hash: str
    count: int
    intact: bool
    specials: tuple[int, ...] = ()  # the seqs of audit_archive_deleted / audit_chain_break


def _broken(lo: int) -> Range:
    return Range(lo, "", lo - 1, "", 0, False)


def _walk(conn: sqlite3.Connection, lo: int, hi: int) -> Range | None:
    cursor = conn.execute(SELECT_ROWS + " WHERE seq BETWEEN ? AND ? ORDER BY seq", (lo, hi))
    fetch = cursor.fetchmany
    copy = _BASE.copy
    types = EVENT_TYPES
    special = SPECIAL_EVENTS
    specials: list[int] = []
    batch = fetch(FETCH_ROWS)
    if not batch:
        return None
    first_seq, entry = batch[0][0], batch[0][3]
    if type(entry) is not bytes:
        return _broken(lo)
    quote = entry.find(b'"')  # the first entry names the previous range's last hash
    prev = entry[quote + 1 : quote + 65]
    first_prev, next_seq, count = prev.decode("ascii", "replace"), first_seq, 0
    while batch:
        # seq is the rowid and comes in order: the batch is contiguous iff its ends are
        if batch[0][0] != next_seq or batch[-1][0] - next_seq != len(batch) - 1:
            return _broken(lo)
        for seq, timestamp, event_type, entry, stored in batch:
            # %d would take a float: seq's and timestamp's types are checked; an event type
            # is one the log writes (a copy holding '",' could match a longer prefix);
            # entry.startswith() raises unless the entry is bytes (caught by the caller)
            if (
                type(seq) is not int
                or type(timestamp) is not int
                or event_type not in types
                or not entry.startswith(
                    b'[%d,%d,"%b","%b",' % (seq, timestamp, prev, event_type.encode())
                )
            ):
                return _broken(lo)
            digest = copy()
            digest.update(entry)
            computed = digest.hexdigest()
            if computed != stored:
                return _broken(lo)
            prev = computed.encode()
            if event_type in special:
                specials.append(seq)
        count += len(batch)
        next_seq += len(batch)
        batch = fetch(FETCH_ROWS)
    return Range(first_seq, first_prev, next_seq - 1, prev.decode(), count, True, tuple(specials))


def check_range(path: str, lo: int, hi: int) -> Range | None:
    """Hashes and links of the entries ``lo..hi`` (None when there are none)."""
    conn = connect_ro(Path(path))
    collecting = gc.isenabled()
    gc.disable()  # see the module's docstring
    try:
        return _walk(conn, lo, hi)
    except (sqlite3.Error, AttributeError, TypeError):  # a read error, a wrong type
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
    bounds = _bounds(lo, hi, min(MAX_RANGES, max(cpus * 2, -(-rows // CHUNK_ROWS))))
    parts = _check_all(path, bounds, cpus)
    previous: Range | None = None
    total = 0
    specials: list[int] = []
    for part in parts:
        if part is None or not part.intact:
            return None
        if previous is not None and (
            part.first_prev != previous.last_hash or part.first_seq != previous.last_seq + 1
        ):
            return None
        total += part.count
        specials += part.specials
        previous = part
    first = parts[0]
    assert first is not None and previous is not None
    return Range(
        first.first_seq,
        first.first_prev,
        previous.last_seq,
        previous.last_hash,
        total,
        True,
        tuple(specials),
    )
