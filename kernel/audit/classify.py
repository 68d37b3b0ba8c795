"""Where and how the chain broke: the first bad entry, classified.

Given the row the scan stopped at and where the chain stood, tells a modified entry
from a deleted, inserted, reordered or renumbered one, by looking for the hashes and
sequence numbers that would explain it (see :mod:`fluffy.kernel.audit.findings`).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from fluffy.kernel.audit.chainrows import Chain, read_row, read_rows, recompute_hash
from fluffy.kernel.audit.entry import genesis_hash
from fluffy.kernel.audit.findings import Problem
from fluffy.kernel.audit.store import Head


def renumbered(conn: sqlite3.Connection, row: tuple[Any, ...], home: int) -> bool:
    """Is ``row`` the entry ``home`` with only its seq changed (and ``home`` now empty)?"""
    if home == row[0] or recompute_hash((home, *row[1:-1])) != row[-1]:
        return False
    return conn.execute("SELECT 1 FROM audit_log WHERE seq = ?", (home,)).fetchone() is None


def classify(
    conn: sqlite3.Connection,
    name: str,
    row: tuple[Any, ...],
    chain: Chain,
    hash_ok: bool,
    witnessed: tuple[Head | None, ...] = (),
) -> Problem:
    seq = int(row[0])
    stored = row[-1]
    links: dict[Any, int] = {}
    followers = []  # entries naming the hash the chain stopped at (renumbered ones?)
    for other in read_rows(conn):  # one decoding pass over the file
        links[other[2]] = other[0]
        if other[2] == chain.prev_hash:
            followers.append(other)
    if not hash_ok:
        before = conn.execute("SELECT seq FROM audit_log WHERE hash = ?", (row[2],)).fetchone()
        home = before[0] + 1 if before is not None else 1
        if (before is not None or row[2] == genesis_hash(row[1])) and renumbered(conn, row, home):
            return Problem(
                "modified", home, name, f"entry {home}'s sequence number was changed to {seq}"
            )
        holder = links.get(stored)
        if holder is not None and holder != seq + 1:
            return Problem(
                "reordered",
                seq,
                name,
                f"entry {seq} holds the entry that belongs before entry {holder}",
            )
        body = list(row[:-1])
        for delta in (1, 2, 3, -1, -2, -3):
            body[0] = seq - delta
            if recompute_hash(tuple(body)) == stored:
                if delta > 0:
                    return Problem(
                        "inserted",
                        seq - 1,
                        name,
                        f"{delta} entr{'y' if delta == 1 else 'ies'} inserted before entry "
                        f"{seq}; the entries after were renumbered",
                    )
                return Problem(
                    "deleted",
                    seq,
                    name,
                    f"{-delta} entr{'y' if delta == -1 else 'ies'} deleted before entry {seq}; "
                    "the entries after were renumbered",
                )
        return Problem("modified", seq, name, f"entry {seq}'s content does not match its hash")
    if chain.prev_row is not None and seq != chain.prev_seq + 1:
        first, last = chain.prev_seq + 1, seq - 1
        for moved in followers:
            if renumbered(conn, moved, first):
                return Problem(
                    "modified",
                    first,
                    name,
                    f"entry {first}'s sequence number was changed to {moved[0]}",
                )
        span = f"entry {first}" if first == last else f"entries {first}..{last}"
        return Problem("deleted", first, name, f"{span} missing (the chain jumps to {seq})")
    if chain.prev_row is None and seq == 1:
        return Problem(
            "modified",
            1,
            name,
            "the genesis entry's prev_hash is not SHA-256('genesis:' + its timestamp)",
        )
    if chain.prev_row is None and seq < 1:
        return Problem("inserted", seq, name, f"entry {seq} precedes the genesis entry")
    if chain.prev_row is None:
        return Problem(
            "deleted",
            1,
            name,
            f"the chain starts at entry {seq}, which is neither the genesis entry nor "
            "anchored to a recorded archive",
        )
    # hash fine, sequence fine, but it does not name its predecessor
    prev_seq = chain.prev_seq
    pp = conn.execute("SELECT hash FROM audit_log WHERE seq = ?", (prev_seq - 1,)).fetchone()
    if pp is not None and row[2] == pp[0]:
        return Problem("inserted", prev_seq, name, f"entry {prev_seq} was never part of the chain")
    later = conn.execute(
        "SELECT seq FROM audit_log WHERE hash = ? AND seq != ?", (row[2], prev_seq)
    ).fetchone()
    if later is not None:
        twin = read_row(conn, later[0] + 1)
        if twin is not None and twin[2] == row[2]:  # a fork: entry later+1 is the real successor
            return Problem(
                "inserted",
                seq,
                name,
                f"entry {seq} claims to follow entry {later[0]}, which entry {twin[0]} follows",
            )
        return Problem("reordered", seq, name, f"entry {seq} follows entry {later[0]} in the chain")
    if any(h is not None and (h.seq, h.hash) == (prev_seq, chain.prev_hash) for h in witnessed):
        return Problem(
            "inserted",
            seq,
            name,
            f"entry {seq} does not follow entry {prev_seq}, which the checkpoint witnessed",
        )
    return Problem(
        "modified",
        prev_seq,
        name,
        f"entry {prev_seq} was changed and re-hashed (entry {seq} names a different hash)",
    )
