"""Verify the audit chain from the stored data, and say where and how it broke.

Every entry's hash is recomputed from its stored columns (stored hashes are never
trusted), each entry must name its predecessor's hash, sequence numbers must be
contiguous, the chain must start at the genesis entry (or at an archive whose deletion
the log recorded), and the newest entry must match the head witnessed outside the
table (``audit.head``, or a witness the bootstrap keeps).  The first problem is located
and classified:

modified, deleted, inserted, reordered, truncated, rolled back or replaced (the kinds
are in :mod:`fluffy.kernel.audit.findings`, the classifying in
:mod:`fluffy.kernel.audit.classify`).  Large intact files are checked in parallel first
(:mod:`fluffy.kernel.audit.ranges`).
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from pathlib import Path
from typing import NamedTuple

import msgspec

from fluffy.kernel.audit import ranges
from fluffy.kernel.audit.chainrows import Chain, read_row, read_rows, recompute_hash
from fluffy.kernel.audit.classify import classify
from fluffy.kernel.audit.entry import _BASE, _encode, genesis_hash
from fluffy.kernel.audit.findings import Kind, Problem, Report
from fluffy.kernel.audit.storage import archives
from fluffy.kernel.audit.store import (
    SELECT_ROWS,
    Head,
    connect_ro,
    db_path,
    head_path,
    read_head,
    read_meta,
    unpack,
)
from fluffy.kernel.audit.tablecheck import appended_problem, layout_problem, own_head


def _overlap(conn: sqlite3.Connection, chain: Chain) -> int | None:
    """The last archived seq when this file still holds an exact copy of archived entries.

    A rotation interrupted between renaming the archive and deleting its rows from the
    active file leaves them in both (finished at the next start).  The copy must be a
    linked chain ending in the archive's verified last hash, else it is scanned as usual.
    """
    if chain.prev_row is None or not chain.prev_seq:
        return None
    prev: tuple[int, str] | None = None
    query = SELECT_ROWS + " WHERE seq <= ? ORDER BY seq"
    for row in map(unpack, conn.execute(query, (chain.prev_seq,))):
        if recompute_hash(row[:-1]) != row[-1] or (
            prev is not None and (row[0] != prev[0] + 1 or row[2] != prev[1])
        ):
            return None
        prev = (row[0], row[-1])
    return chain.prev_seq if prev == (chain.prev_seq, chain.prev_hash) else None


def _special(seq: int, event_type: str, raw: str | None, chain: Chain, report: Report) -> None:
    try:
        data = msgspec.json.decode(raw) if raw else {}
    except (msgspec.DecodeError, RecursionError):
        data = None
    if not isinstance(data, dict):  # not what the log writes: shown as it is, never obeyed
        data = {"metadata": raw}
    if event_type == "audit_chain_break":
        report.breaks.append({**data, "id": seq})
    elif isinstance(data.get("last_seq"), str) and _digits(data["last_seq"]):
        last_hash = data.get("last_hash")
        chain.deletions[(int(data["last_seq"]), str(last_hash or ""))] = "recorded"


def _fast(conn: sqlite3.Connection, path: Path, chain: Chain, report: Report) -> bool:
    """Large intact files: check in parallel, then only the edges sequentially."""
    lo, hi = conn.execute("SELECT MIN(seq), MAX(seq) FROM audit_log").fetchone()
    # The writer marks the file's own head with its rows: an intact file ends there (a
    # far-off seq goes to the scan at once).  seq is the row id (_scan checked), and
    # parallel_intact requires every part contiguous and linked to the next: no gap.
    if lo is None or hi - lo + 1 < ranges.PARALLEL_MIN_ROWS:
        return False
    if type(lo) is not int or own_head(conn, _number(read_meta(conn), "head_seq")) != (hi, None):
        return False
    if report.checkpoint is None and report.witness is None:
        return False  # every entry may have been hashed by whoever wrote it: decode all
    first = conn.execute(
        "SELECT timestamp, event_type FROM audit_log WHERE seq = ?", (lo,)
    ).fetchone()
    if chain.prev_hash is None and chain.prev_row is None:
        if lo != 1 or first[1] != "kernel_start":
            return False
        expected: str | None = genesis_hash(first[0])
        expected_seq = 1
    else:
        expected, expected_seq = chain.prev_hash, chain.prev_seq + 1
    whole = ranges.parallel_intact(path, lo, hi)
    if (
        whole is None
        or whole.first_prev != expected
        or (whole.first_seq, whole.last_seq, whole.count) != (expected_seq, hi, hi - lo + 1)
    ):
        return False
    # found by the walk itself, which read every row's event type (an index on them is
    # the file owner's to rebuild without a row: integrity_check sees it, verify would not)
    for seq in whole.specials:
        row = read_row(conn, seq)
        if row is not None:
            _special(row[0], row[3], row[-2], chain, report)
    if report.first_seq is None:
        report.first_seq = lo
    chain.prev_hash, chain.prev_seq, chain.prev_row = whole.last_hash, hi, (hi,)
    report.entries += whole.count
    return True


def _scan(conn: sqlite3.Connection, path: Path, chain: Chain, report: Report) -> bool:
    name = path.name
    chain.fast = False
    problem = layout_problem(conn, name, chain.prev_seq)
    if problem is not None:
        report.fail(problem)
        return False
    ok = _scan_chain(conn, path, chain, report)
    # The fast check hashed stored bytes; past the witnessed head (a few rows: the index
    # on seq finds them) they must also be the canonical encoding the scan rebuilds.
    witnessed = [h.seq for h in (report.checkpoint, report.witness) if h is not None]
    if ok and chain.fast and witnessed:
        appended = appended_problem(conn, name, min(witnessed))
        if appended is not None:
            report.problem = None
            report.fail(appended)
            return False
    return ok


def _scan_chain(conn: sqlite3.Connection, path: Path, chain: Chain, report: Report) -> bool:
    name = path.name
    meta = read_meta(conn)
    if chain.prev_row is None and chain.prev_hash is None and "anchor_seq" in meta:
        # the first file starts after archived entries: the deletion must be on record
        chain.prev_seq = _number(meta, "anchor_seq")
        chain.prev_hash = meta.get("anchor_hash")
        if chain.prev_hash is None:
            raise _Unreadable("audit_meta has anchor_seq but no anchor_hash")
        report.warnings.append(
            f"the chain starts after entry {chain.prev_seq} (older archives deleted)"
        )
        chain.deletions[(chain.prev_seq, chain.prev_hash)] = "pending"
    after = _overlap(conn, chain)
    if after is not None:
        report.warnings.append(
            f"{name} still holds the archived entries up to {after} (a rotation was "
            "interrupted; the next start finishes it)"
        )
    elif _fast(conn, path, chain, report):
        chain.fast = True
        return _head_ok(conn, meta, chain.prev_seq, name, report)
    prev_hash, prev_seq = chain.prev_hash, chain.prev_seq
    prev_row = chain.prev_row
    count = 0
    for row in read_rows(conn, after):
        body = row[:-1]
        digest = _BASE.copy()
        digest.update(_encode(body))
        computed = digest.hexdigest()
        seq = row[0]
        if prev_hash is None and prev_row is None:  # the genesis entry
            prev_hash = genesis_hash(row[1]) if row[3] == "kernel_start" and seq == 1 else None
            prev_seq = 0
        if computed != row[-1] or row[2] != prev_hash or seq != prev_seq + 1:
            chain.prev_hash, chain.prev_seq, chain.prev_row = prev_hash, prev_seq, prev_row
            if prev_row is None and chain.prev_hash is not None and prev_seq > 0:
                chain.prev_row = ()  # anchored start: gaps still count as deletions
            witnessed = (report.checkpoint, report.witness)
            report.fail(classify(conn, name, row, chain, computed == row[-1], witnessed))
            report.entries += count
            return False
        if row[3] == "audit_archive_deleted" or row[3] == "audit_chain_break":
            _special(seq, row[3], row[-2], chain, report)
        if report.first_seq is None:
            report.first_seq = seq
        prev_hash, prev_seq, prev_row = computed, seq, row
        count += 1
    chain.prev_hash, chain.prev_seq, chain.prev_row = prev_hash, prev_seq, prev_row
    report.entries += count
    return _head_ok(conn, meta, prev_seq, name, report)


def _number(meta: dict[str, str], key: str) -> int:
    """A number ``audit_meta`` holds (0 when absent; garbled: the file is not usable)."""
    value = meta.get(key, "0")
    if not _digits(value):
        raise _Unreadable(f"audit_meta.{key} is {value[:40]!r}, not a number")
    return int(value)


def _digits(value: str) -> bool:
    return value.isascii() and value.isdigit() and len(value) < 19  # fits SQLite's INTEGER


class _Unreadable(Exception):
    """The file holds something the log never writes where verify must read a value."""


def _head_ok(
    conn: sqlite3.Connection, meta: dict[str, str], prev_seq: int, name: str, report: Report
) -> bool:
    """Does the file end at its own head?  ``prev_seq``: its last entry (or its anchor)."""
    meta_seq = _number(meta, "head_seq")
    head_seq, mark = own_head(conn, meta_seq)
    if mark is not None:
        report.fail(
            Problem(
                "inserted",
                mark + 1,
                name,
                f"entries {mark + 1}..{prev_seq} follow entry {mark}, the newest the log "
                "marked as written: the log did not append them",
            )
        )
        return False
    if head_seq > prev_seq:
        report.fail(
            Problem(
                "truncated",
                prev_seq + 1,
                name,
                f"entries {prev_seq + 1}..{head_seq} were deleted from the end "
                f"(the database's own head says {head_seq})"
                if meta_seq > prev_seq
                else f"entries after {prev_seq} were deleted from the end (entry {prev_seq} "
                "is not the newest the log marked as written, and no entry is)",
            )
        )
        return False
    return True


def _against(
    head: Head,
    chain_id: str,
    conn: sqlite3.Connection,
    last: int,
    name: str,
    what: str,
    meta_head: int,
    archived: list[Path],
) -> Problem | None:
    if chain_id and head.chain_id and head.chain_id != chain_id:
        return Problem(
            "replaced",
            None,
            name,
            f"the {what} witnessed chain {head.chain_id[:12]}, the database holds chain "
            f"{chain_id[:12]}",
        )
    if head.seq > last:
        kind: Kind = "truncated" if meta_head > last else "rolled_back"
        return Problem(
            kind,
            last + 1,
            name,
            f"the {what} witnessed entry {head.seq}; the database ends at entry {last}",
        )
    query = "SELECT hash FROM audit_log WHERE seq = ?"
    row = conn.execute(query, (head.seq,)).fetchone()
    for older in reversed(archived):  # rotated out of the active file since: still compared
        if row is not None:
            break
        other = connect_ro(older)
        try:
            row = other.execute(query, (head.seq,)).fetchone()
        finally:
            other.close()
    if row is not None and row[0] != head.hash:
        return Problem(
            "rolled_back",
            head.seq,
            name,
            f"entry {head.seq} differs from the one the {what} witnessed (history rewritten "
            "from an older copy)",
        )
    return None


class Found(NamedTuple):
    """What a kernel's files claimed when it started, before its first entry rewrote
    them: the furthest head (``audit.head`` or the database's own) and the database's
    own head seq (which tells a cut-off end from an older copy put back)."""

    head: Head
    own_seq: int


def at_start(state_dir: Path) -> tuple[bool, Found | None]:
    """What ``state_dir``'s files claim before a kernel writes, read in one connection:
    whether the database's own head doubts its end (:func:`_doubts_end`), and the
    furthest of ``audit.head`` and the database's own head (None: they name no head),
    each set by the writer with its rows, so the entry it names must exist with that
    hash."""
    heads: list[Head] = []
    own_seq, doubt = 0, False
    with contextlib.suppress(ValueError, OSError):
        checkpoint = read_head(head_path(state_dir))
        if checkpoint is not None:
            heads.append(checkpoint)
    with contextlib.suppress(sqlite3.Error):
        conn = connect_ro(db_path(state_dir))
        try:
            meta = read_meta(conn)
            doubt = _doubts_end(conn, meta)
            seq, digest = meta.get("head_seq", ""), meta.get("head_hash", "")
            copied = int(seq) if _digits(seq) and digest else 0
            own_seq, mark = own_head(conn, copied)
            named = mark if mark is not None else own_seq
            row = conn.execute("SELECT hash FROM audit_log WHERE seq = ?", (named,)).fetchone()
        finally:
            conn.close()
        chain_id = meta.get("chain_id", "")
        if copied and named == copied:  # audit_meta's copy names it (or an older file's)
            heads.append(Head(chain_id, copied, digest))
        elif row is not None and isinstance(row[0], str):  # the marked row
            heads.append(Head(chain_id, named, row[0]))
    furthest = max(heads, key=lambda head: head.seq, default=None)
    return doubt, (Found(furthest, own_seq) if furthest is not None else None)


def _doubts_end(conn: sqlite3.Connection, meta: dict[str, str]) -> bool:
    """Does the database's own head say that its end was cut off, or that rows follow
    the newest the log marked?  The kernel's first commit moves the mark onto its own
    row, so such a start verifies at once (ADR-099); a crash never leaves either (the
    mark commits with its rows; ``audit_meta``'s copy only lags)."""
    with contextlib.suppress(sqlite3.Error, _Unreadable):
        own, mark = own_head(conn, _number(meta, "head_seq"))
        last = conn.execute("SELECT MAX(seq) FROM audit_log").fetchone()[0]
        if last is None:  # no rows: where the anchor (or nothing) says the chain resumes
            anchor = meta.get("anchor_seq", "0")
            last = int(anchor) if _digits(anchor) else 0
        return mark is not None or (type(last) is int and own > last)
    return False


def verify(
    state_dir: Path,
    *,
    witness: Head | None = None,
    checkpoint: bool = True,
    found: Found | None = None,
) -> Report:
    """Verify the archives and the active database of ``state_dir``.

    ``checkpoint=False`` ignores ``audit.head`` (used to judge a restored copy on its own).
    ``found``: the head the files claimed when a kernel started, read before its first
    entry rewrote them (the start verifies while the kernel already writes): the
    database must still hold that entry, with that hash.
    """
    started = time.perf_counter()
    report = Report(witness=witness)
    path = db_path(state_dir)
    chain = Chain()
    try:
        report.checkpoint = read_head(head_path(state_dir)) if checkpoint else None
    except ValueError as exc:
        report.warnings.append(str(exc))
    files = [a.path for a in archives(state_dir)]
    if path.exists():
        files.append(path)
    chain_id, meta_head, intact = "", 0, True
    for file in files:
        report.files.append(file.name)
        conn = connect_ro(file)
        try:
            try:
                conn.execute("BEGIN")  # one snapshot of the file (the kernel may be writing)
                meta = read_meta(conn)
                chain_id = meta.get("chain_id", chain_id)
                meta_head = _number(meta, "head_seq")
                if not _scan(conn, file, chain, report):
                    intact = False
                    break
                meta_head = own_head(conn, meta_head)[0]
                if file == path:
                    report.last_seq = chain.prev_seq or None
                    if chain.prev_seq:
                        report.head = Head(chain_id, chain.prev_seq, chain.prev_hash or "")
                    at_start = found.head if found is not None else None
                    evidence = (
                        ("checkpoint", report.checkpoint),
                        ("witness", witness),
                        ("head found at the kernel's start", at_start),
                    )
                    for what, head in evidence:
                        if head is not None:
                            problem = _against(
                                head,
                                chain_id,
                                conn,
                                chain.prev_seq,
                                file.name,
                                what,
                                found.own_seq if found and head is at_start else meta_head,
                                files[:-1],
                            )
                            if problem is not None:
                                report.fail(problem)
                                break
                            if head is at_start:  # entries after it: the running kernel's
                                continue
                            if head.seq < chain.prev_seq and what == "witness":
                                # the witness lags a running kernel; after a stop it is the head
                                report.unwitnessed = (head.seq + 1, chain.prev_seq)
                            elif head.seq < chain.prev_seq:  # a crash between commit and head
                                report.warnings.append(
                                    f"entries {head.seq + 1}..{chain.prev_seq} are newer than the "
                                    f"{what} (normal after a crash; otherwise they were appended "
                                    "by someone else)"
                                )
            except (
                sqlite3.Error,
                _Unreadable,
                ValueError,
                TypeError,
                OverflowError,
                RecursionError,
            ) as exc:
                # what the log never writes, where a value must be read: reported, not
                # raised; a damaged file (corrupt pages, I/O) is the caller's error to give
                code = getattr(exc, "sqlite_errorcode", None)  # an extended code
                if code is not None and code & 0xFF != sqlite3.SQLITE_ERROR:
                    raise
                report.fail(
                    Problem(
                        "modified", None, file.name, f"the file is not a readable audit log: {exc}"
                    )
                )
                intact = False
                break
        finally:
            conn.close()
    if intact:
        for (seq, hash_), state in chain.deletions.items():
            if state == "pending":
                first = 1 + max(  # after the archives whose deletion is on record
                    (s for (s, _), st in chain.deletions.items() if st == "recorded" and s < seq),
                    default=0,
                )
                report.fail(
                    Problem(
                        "deleted",
                        first,
                        files[0].name if files else "",
                        f"entries {first}..{seq} are gone and no audit_archive_deleted entry "
                        f"records them (anchor {hash_[:12]})",
                    )
                )
    if intact and not path.exists() and report.checkpoint is not None:
        report.fail(
            Problem("truncated", chain.prev_seq + 1, path.name, "the audit database is missing")
        )
    report.seconds = time.perf_counter() - started
    return report
