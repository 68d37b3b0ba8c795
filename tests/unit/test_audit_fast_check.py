"""The parallel fast check of large audit files (``kernel/audit/ranges.py``).

Its spliced walk hashes JSON that SQLite built; on an intact file it must reach exactly
the hashes the log wrote, for any text a caller can put in an entry (else every large
log would fall back to the slow scan), and it must agree with the every-column walk.
What it must refuse on a changed file is in ``test_audit_tamper.py``, which runs its
whole matrix through this path too.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluffy.kernel.audit import ranges
from fluffy.kernel.audit.entry import Event, entry_hash, genesis_hash
from fluffy.kernel.audit.store import AUDIT_SCHEMA, INSERT_SQL

# any text a caller could send: every code point but the surrogates (not UTF-8)
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
FREE = st.one_of(st.none(), TEXT)
DURATION = st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False))


@st.composite
def events(draw: st.DrawFn) -> Event:
    return Event(
        "syscall",
        caller=draw(TEXT),
        session_mode=draw(TEXT),
        state_machine_state=draw(TEXT),
        session_id=draw(FREE),
        syscall_type=draw(FREE),
        tool_name=draw(FREE),
        policy_decision=draw(st.sampled_from([None, "allowed", "denied"])),
        policy_rule_name=draw(FREE),
        capability_id=draw(FREE),
        deny_reason=draw(FREE),
        input_summary=draw(TEXT),
        output_summary=draw(FREE),
        duration_ms=draw(DURATION),
        sandbox_id=draw(FREE),
        metadata=draw(st.dictionaries(TEXT, TEXT, max_size=3)),
    )


def _write(path: Path, chained: list[Event]) -> None:
    """A chain as the log writes it (Event.row, entry_hash), after a kernel_start."""
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.executescript(AUDIT_SCHEMA)
        conn.execute("DELETE FROM audit_log")
        timestamp = 1_790_000_000_000
        prev = genesis_hash(timestamp)
        rows = []
        for seq, event in enumerate([Event("kernel_start"), *chained], start=1):
            row = event.row(seq, timestamp + seq, prev)
            prev = entry_hash(row)
            rows.append((*row, prev))
        conn.executemany(INSERT_SQL, rows)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("fast-check") / "fluffy.db"


def test_this_sqlite_writes_text_like_the_canonical_encoder() -> None:
    """Else every check takes the slower every-column walk (still correct)."""
    assert ranges.sqlite_json_is_canonical(), sqlite3.sqlite_version


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chained=st.lists(events(), min_size=1, max_size=8))
def test_both_walks_find_any_honest_chain_intact_with_the_same_hashes(
    db: Path, chained: list[Event]
) -> None:
    _write(db, chained)
    count = len(chained) + 1
    with closing(ranges.connect_ro(db)) as conn:
        spliced = ranges._spliced(conn, 1, count)
        columns = ranges._columns(conn, 1, count)
        (last,) = conn.execute("SELECT hash FROM audit_log WHERE seq = ?", (count,)).fetchone()
    assert spliced is not None and spliced.intact, chained
    assert spliced == columns
    assert (spliced.first_seq, spliced.last_seq, spliced.count) == (1, count, count)
    assert spliced.last_hash == last


def test_a_range_ends_where_the_chain_does_and_parts_link(db: Path) -> None:
    _write(db, [Event("syscall", input_summary=f"call {n}") for n in range(99)])
    whole = ranges.check_range(str(db), 1, 100)
    first, second = ranges.check_range(str(db), 1, 40), ranges.check_range(str(db), 41, 100)
    assert whole is not None and first is not None and second is not None
    assert second.first_prev == first.last_hash and second.last_hash == whole.last_hash
    assert ranges.check_range(str(db), 101, 200) is None  # nothing there


def test_a_blob_anywhere_makes_the_range_not_intact(db: Path) -> None:
    """SQLite's json_array() refuses a BLOB; the check says "not intact", never raises."""
    _write(db, [Event("syscall", input_summary=f"call {n}") for n in range(9)])
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute("UPDATE audit_log SET caller = CAST(caller AS BLOB) WHERE seq = 5")
    part = ranges.check_range(str(db), 1, 10)
    assert part is not None and not part.intact
