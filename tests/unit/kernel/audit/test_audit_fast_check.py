"""The parallel fast check of large audit files (``kernel/audit/ranges.py``).

It hashes the stored bytes of each entry and checks the table's copies of seq,
timestamp and event_type and the link with one prefix comparison: on an intact file it
must reach exactly the hashes the log wrote, for any text a caller can put in an entry
(else every large log would fall back to the slow scan), and agree with the scan, which
decodes every entry.  What it must refuse on a changed file is in
``test_audit_tamper.py``, which runs its whole matrix through this path too.
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
from fluffy.kernel.audit.entry import Event, entry_hash, genesis_hash, stored
from fluffy.kernel.audit.store import AUDIT_SCHEMA, INSERT_SQL, SELECT_ROWS, unpack

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
    """A chain as the log writes it (Event.row, entry.stored), after a kernel_start."""
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.executescript(AUDIT_SCHEMA)
        conn.execute("DELETE FROM audit_log")
        timestamp = 1_790_000_000_000
        prev = genesis_hash(timestamp + 1)  # the kernel_start's own timestamp
        rows = []
        for seq, event in enumerate([Event("kernel_start"), *chained], start=1):
            row = stored(event.row(seq, timestamp + seq, prev))
            prev = row[-1]
            rows.append(row)
        conn.executemany(INSERT_SQL, rows)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("fast-check") / "fluffy.db"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chained=st.lists(events(), min_size=1, max_size=8))
def test_the_fast_check_and_the_scan_find_any_honest_chain_intact_alike(
    db: Path, chained: list[Event]
) -> None:
    _write(db, chained)
    count = len(chained) + 1
    with closing(ranges.connect_ro(db)) as conn:
        fast = ranges._walk(conn, 1, count)
        rows = [unpack(row) for row in conn.execute(SELECT_ROWS + " ORDER BY seq")]
    assert fast is not None and fast.intact, chained
    assert (fast.first_seq, fast.last_seq, fast.count) == (1, count, count)
    assert fast.last_hash == rows[-1][-1]
    assert fast.first_prev == rows[0][2] == genesis_hash(rows[0][1])
    assert all(entry_hash(row[:-1]) == row[-1] for row in rows)  # what the scan checks
    assert [row[2] for row in rows[1:]] == [row[-1] for row in rows[:-1]]


def test_a_range_ends_where_the_chain_does_and_parts_link(db: Path) -> None:
    _write(db, [Event("syscall", input_summary=f"call {n}") for n in range(99)])
    whole = ranges.check_range(str(db), 1, 100)
    first, second = ranges.check_range(str(db), 1, 40), ranges.check_range(str(db), 41, 100)
    assert whole is not None and first is not None and second is not None
    assert second.first_prev == first.last_hash and second.last_hash == whole.last_hash
    assert ranges.check_range(str(db), 101, 200) is None  # nothing there


@pytest.mark.parametrize(
    "change",
    [
        "entry = CAST(entry AS TEXT)",  # the same bytes, another type
        "timestamp = timestamp + 0.5",  # a REAL (a whole one would be stored as INTEGER)
        "timestamp = 't' || timestamp",  # text (numeric text would be stored as INTEGER)
        "timestamp = timestamp + 1",
        "event_type = CAST(event_type AS BLOB)",
        "event_type = 'tool_result'",
        "seq = seq + 100",
    ],
)
def test_a_copy_that_differs_or_a_type_the_log_never_writes_is_not_intact(
    db: Path, change: str
) -> None:
    """The check says "not intact", never raises (the scan then says what and where)."""
    _write(db, [Event("syscall", input_summary=f"call {n}") for n in range(9)])
    with closing(ranges.connect_ro(db)) as conn:
        assert ranges.check_range(str(db), 1, 10) == ranges._walk(conn, 1, 10)
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute(f"UPDATE audit_log SET {change} WHERE seq = 5")
    part = ranges.check_range(str(db), 1, 200)
    assert part is not None and not part.intact
