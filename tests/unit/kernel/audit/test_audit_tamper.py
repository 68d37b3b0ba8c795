"""Tamper matrix over a real audit database built through :class:`AuditLog`.

One database (``kernel_start`` + 299 mixed security/operational events, every optional
field set on every third entry, metadata on many) is built once per module; each test
works on a copy and changes it with plain ``sqlite3``, the way someone with write access
to the file would.  The table stores each entry as its canonical JSON (``entry``) with
copies of seq, timestamp and event_type (``kernel/audit/store.py``); "changing a field"
rewrites the entry with that field changed (and the copy, for a copied field), as a
reader of the log would see it.  Every case checks that :func:`verify` fails, with the problem kind
the module documents and ``problem.seq`` naming the right entry.  "Right" is stated per
case; in short it is the entry a reader must look at: the changed one, the first missing
one, the one that was never part of the chain, the first of two swapped ones, the first
entry the database lost, or the entry the checkpoint witnessed that now differs.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import shutil
import sqlite3
import tempfile
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fluffy.kernel.audit import ranges
from fluffy.kernel.audit.entry import (
    COLUMNS,
    DECISIONS,
    DOMAIN,
    Event,
    _encode,
    entry_hash,
    genesis_hash,
)
from fluffy.kernel.audit.findings import Report
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.audit.store import (
    HEAD_NAME,
    INSERT_SQL,
    MARK_HEAD_SQL,
    SELECT_ROWS,
    STORED,
    Head,
    db_path,
    head_path,
    migrate_layout,
    read_head,
    unpack,
)
from fluffy.kernel.audit.verify import verify
from tests.audit_support import change_entry, entry_fields, rewrite_in_earlier_layout

DAY_MS = 86_400_000
NOON = 20_000 * DAY_MS + DAY_MS // 2  # 2024-10-04 12:00 UTC: far from midnight (no rotation)
SANDBOX = "5f3c" * 16  # a container id: 64 hex digits
SYNC_TYPES = ("policy_update", "state_transition", "capability_issued", "session_mode_change")
OP_TYPES = ("syscall", "tool_execute", "tool_result", "sandbox_created")
ALL_COLUMNS = (*COLUMNS, "hash")  # every field of an entry, and its hash
COPIED = ("seq", "timestamp", "event_type")  # fields the table also holds in a column


class Clock:
    """Milliseconds that advance by 3 on every reading (deterministic timestamps)."""

    def __init__(self, start: int = NOON) -> None:
        self.now = start

    def __call__(self) -> int:
        self.now += 3
        return self.now


def _event(i: int, tag: str = "") -> Event:
    event_type = SYNC_TYPES[(i // 10) % len(SYNC_TYPES)] if i % 10 == 0 else OP_TYPES[i % 4]
    if i % 3 == 0:  # every optional column set
        return Event(
            event_type,
            caller=f"plugin:p{i % 4}@cli",
            session_mode="strict",
            state_machine_state="red",
            session_id=f"sess-{i % 5}",
            syscall_type="fs.read",
            tool_name="code_executor",
            policy_decision=DECISIONS[i % len(DECISIONS)],
            policy_rule_name=f"rule.{i % 7}",
            capability_id=f"cap-{i}",
            deny_reason=f"reason {i}",
            input_summary=f'{tag}input {i} {{"path": "/work/f{i}.py"}}',
            output_summary=f"output {i}",
            duration_ms=i + 1.25,
            sandbox_id=SANDBOX,
            metadata={"z": str(i), "a": "first", "request_id": f"req-{i}"},
        )
    return Event(
        event_type,
        input_summary=f"{tag}op {i}",
        metadata={} if i % 2 else {"k": str(i)},
    )


async def _record(log: AuditLog, count: int, tag: str = "", first: int = 1) -> None:
    for i in range(first, first + count):
        event = _event(i, tag)
        if event.sync:
            await log.record(event)
        else:
            log.record_nowait(event)
            if i % 25 == 0:
                await asyncio.sleep(0)


async def _build(state: Path, count: int, clock: Clock) -> Head:
    log = await AuditLog.open(state, clock=clock)
    await log.record(Event("kernel_start", input_summary="kernel started"))
    await _record(log, count - 1)
    head = log.head
    await log.close()
    return head


async def _extend(state: Path, count: int, clock: Clock, tag: str) -> Head:
    log = await AuditLog.open(state, clock=clock)
    await _record(log, count, tag, first=10_000)
    head = log.head
    await log.close()
    return head


@dataclass(frozen=True)
class Template:
    path: Path
    head: Head
    n: int
    target: int  # a middle entry with every column set


@dataclass
class Case:
    state: Path
    head: Head
    n: int
    target: int

    def db(self) -> sqlite3.Connection:
        return sqlite3.connect(db_path(self.state), isolation_level=None)

    def stored(self, seq: int) -> tuple[Any, ...]:
        with closing(self.db()) as conn:
            row = conn.execute(SELECT_ROWS + " WHERE seq = ?", (seq,)).fetchone()
        assert row is not None, seq
        return tuple(row)

    def row(self, seq: int) -> list[Any]:
        """The entry's fields and hash, as the verifier reads them."""
        with closing(self.db()) as conn:
            return entry_fields(conn, seq)


def _insert(conn: sqlite3.Connection, row: list[Any]) -> None:
    """Store an entry given as its fields and hash (the way the log stores it)."""
    conn.execute(INSERT_SQL, (row[0], row[1], row[3], _encode(row[:-1]), row[-1]))


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    path = tmp_path_factory.mktemp("audit-template")
    head: Head = asyncio.run(_build(path, 300, Clock()))
    conn = sqlite3.connect(db_path(path))
    try:
        rows = map(unpack, conn.execute(SELECT_ROWS + " WHERE seq >= 150 ORDER BY seq"))
        target = next(row[0] for row in rows if None not in row)
    finally:
        conn.close()
    assert target is not None and 150 <= target < 160
    return Template(path, head, head.seq, int(target))


def _copy(template: Template, target: Path) -> Case:
    target.mkdir(parents=True, exist_ok=True)
    for name in (db_path(template.path).name, HEAD_NAME):
        shutil.copyfile(template.path / name, target / name)
    return Case(target, template.head, template.n, template.target)


def parallel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every verify() take its parallel fast path (``ranges``): the whole file in
    ranges of 64 entries over a pool of processes (two CPUs' worth, even on one), not the
    sequential scan alone."""
    monkeypatch.setattr(ranges, "PARALLEL_MIN_ROWS", 1)
    monkeypatch.setattr(ranges, "CHUNK_ROWS", 64)
    monkeypatch.setattr(ranges, "workers", lambda: 2)


@pytest.fixture(params=["scan", "parallel"])
def verifier(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every case runs twice: through the sequential scan, and through the parallel fast
    check that large logs take, which must never call a changed file intact."""
    if request.param != "scan":
        parallel(monkeypatch)
    return str(request.param)


@pytest.fixture()
def case(template: Template, tmp_path: Path, verifier: str) -> Case:
    return _copy(template, tmp_path / "state")


def _broken(state: Path, kind: str, seq: int | None, **options: Any) -> Report:
    report = verify(state, **options)
    assert not report.ok, "the change went unnoticed"
    assert report.problem is not None
    assert (report.problem.kind, report.problem.seq) == (kind, seq), report.problem
    return report


def _one_byte(value: Any) -> Any:
    """The value with one byte changed (text: one ASCII character; numbers: the value)."""
    if isinstance(value, str):
        middle = len(value) // 2
        return value[:middle] + chr(ord(value[middle]) ^ 1) + value[middle + 1 :]
    if isinstance(value, float):
        return value + 1.0
    assert isinstance(value, int)
    return value + 1


def _update(case: Case, seq: int, /, **values: Any) -> None:
    with closing(case.db()) as conn:
        change_entry(conn, seq, **values)


def _set(case: Case, seq: int, column: str, value: Any) -> None:
    """One stored column, as it is (``entry``: its bytes)."""
    with closing(case.db()) as conn:
        changed = conn.execute(
            f"UPDATE audit_log SET {column} = ? WHERE seq = ?", (value, seq)
        ).rowcount
    assert changed == 1


def _renumber(conn: sqlite3.Connection, after: int, delta: int) -> None:
    """Shift the seq of every entry after ``after`` by ``delta`` (two steps: seq is unique)."""
    conn.execute("UPDATE audit_log SET seq = -seq WHERE seq > ?", (after,))
    conn.execute("UPDATE audit_log SET seq = ? - seq WHERE seq < 0", (delta,))


def _forged(case: Case, like: int, seq: int, prev_hash: str) -> list[Any]:
    """An entry with a correctly computed self-hash (what an attacker can always write)."""
    row = case.row(like)[:-1]
    row[0], row[2] = seq, prev_hash
    row[COLUMNS.index("input_summary")] = "forged entry"
    return [*row, entry_hash(tuple(row))]


# -- an intact log ---------------------------------------------------------------------


def test_an_intact_log_verifies_with_the_writers_head(
    case: Case, verifier: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[Any] = []
    real = ranges.parallel_intact

    def spy(*args: Any) -> Any:
        checked.append(real(*args))
        return checked[-1]

    monkeypatch.setattr(ranges, "parallel_intact", spy)
    report = verify(case.state)
    if verifier != "scan":  # the fast path found it intact, and that was the answer
        assert [(r.first_seq, r.last_seq, r.count) for r in checked] == [(1, case.n, case.n)]
    else:
        assert checked == []
    assert report.ok, report.problem
    assert report.head == case.head
    assert report.checkpoint == case.head
    assert report.entries == case.n == report.last_seq
    assert report.first_seq == 1
    assert report.warnings == []


def test_the_template_has_every_column_set_on_the_target(case: Case) -> None:
    row = case.row(case.target)
    assert all(value is not None for value in row)
    assert msgspec.json.decode(row[COLUMNS.index("metadata")]) == {
        "a": "first",
        "request_id": f"req-{case.target - 1}",
        "z": str(case.target - 1),
    }


# -- every column, one at a time --------------------------------------------------------


@pytest.mark.parametrize("column", ALL_COLUMNS)
def test_changing_any_column_of_a_middle_entry_is_modified_at_that_entry(
    case: Case, column: str
) -> None:
    """Right entry: the changed one.  A changed seq moves the entry out of its place (to a
    free number after the end); it is still the entry ``target`` that was modified."""
    value = case.row(case.target)[ALL_COLUMNS.index(column)]
    new = case.n + 1000 if column == "seq" else _one_byte(value)
    assert new != value
    _update(case, case.target, **{column: new})
    _broken(case.state, "modified", case.target)


@pytest.mark.parametrize("new_seq", [0, -1])
def test_moving_an_entry_before_the_genesis_is_modified_at_that_entry(
    case: Case, new_seq: int
) -> None:
    _update(case, case.target, seq=new_seq)
    _broken(case.state, "modified", case.target)


@pytest.mark.parametrize("column", STORED[1:])
def test_a_type_only_change_is_modified_at_that_entry(case: Case, column: str) -> None:
    """Same bytes, another SQLite type: a BLOB for the copies and the hash, TEXT for the
    entry.  (A number in text form cannot be stored in ``timestamp``: its affinity
    converts it back; the encoding's side of it is in test_canonical_encoding_is_injective.)
    """
    other = "TEXT" if column == "entry" else "BLOB"
    with closing(case.db()) as conn:
        conn.execute(
            f"UPDATE audit_log SET {column} = CAST({column} AS {other}) WHERE seq = ?",
            (case.target,),
        )
        (kind,) = conn.execute(
            f"SELECT typeof({column}) FROM audit_log WHERE seq = ?",
            (case.target,),
        ).fetchone()
    assert kind == other.lower()
    _broken(case.state, "modified", case.target)


@pytest.mark.parametrize("column", ["timestamp", "event_type"])
def test_a_copy_that_no_longer_matches_its_entry_is_modified(case: Case, column: str) -> None:
    """Only the table's copy changed (the one its index and filters use); the entry and
    its hash are intact."""
    value = case.stored(case.target)[STORED.index(column)]
    _set(case, case.target, column, value + 1 if column == "timestamp" else "tool_result")
    _broken(case.state, "modified", case.target)


def test_an_event_type_copy_reaching_past_its_quote_is_modified(case: Case) -> None:
    """A copy such as ``tool_execute",null,null,"kernel`` still spells a prefix of the
    unchanged entry; the fast check must not take it for the entry's event type (it
    would hide an entry from ``--type`` and a recorded chain break from verify)."""
    _, _, event_type, entry, _ = case.stored(case.target)
    start = entry.index(b'"' + event_type.encode() + b'"') + 1
    end = entry.index(b'",', start + len(event_type) + 2)  # the end of a later string
    longer = entry[start:end].decode()
    assert longer.startswith(event_type + '",') and entry.startswith(
        b'"%b",' % longer.encode(), start - 1
    )
    _set(case, case.target, "event_type", longer)
    _broken(case.state, "modified", case.target)


@pytest.mark.parametrize("column", ["input_summary", "metadata", "prev_hash", "hash"])
def test_a_one_byte_change_anywhere_in_a_value_is_modified(case: Case, column: str) -> None:
    value = case.row(case.target)[ALL_COLUMNS.index(column)]
    for position in (0, len(value) - 1):
        changed = value[:position] + chr(ord(value[position]) ^ 0x20) + value[position + 1 :]
        _update(case, case.target, **{column: changed})
        _broken(case.state, "modified", case.target)
        _update(case, case.target, **{column: value})
        assert verify(case.state).ok


@pytest.mark.parametrize("fast", [False, True], ids=["scan", "parallel"])
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_every_single_byte_change_of_a_stored_value_is_detected(
    template: Template, fast: bool, data: st.DataObject
) -> None:
    """Hypothesis over entry, stored column and byte position: one byte of the column's
    stored value (numbers: of their decimal text, stored back through the column's
    affinity; the entry: one of its bytes) becomes another letter or digit.  Always
    ``modified`` at that entry."""
    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as patch:
        if fast:
            parallel(patch)
        case = _copy(template, Path(folder))
        seq = data.draw(st.integers(1, case.n), label="seq")
        stored = case.stored(seq)
        column = data.draw(st.sampled_from(STORED), label="column")
        value = stored[STORED.index(column)]
        raw = value if isinstance(value, bytes) else str(value).encode()
        assert raw.isascii()
        position = data.draw(st.integers(0, len(raw) - 1), label="position")
        alphabet = b"0123456789" if column in ("seq", "timestamp") else b"0123456789abcdefXYZ"
        byte = data.draw(st.sampled_from([c for c in alphabet if c != raw[position]]))
        changed = raw[:position] + bytes([byte]) + raw[position + 1 :]
        if column == "seq":  # seq is the primary key: the new number must be free
            with closing(case.db()) as conn:
                taken = conn.execute("SELECT 1 FROM audit_log WHERE seq = ?", (int(changed),))
                assume(taken.fetchone() is None)
        _set(case, seq, column, changed if column == "entry" else changed.decode())
        if column != "seq":  # the column's affinity did not turn it back into the old value
            assert case.stored(seq) != stored
        _broken(case.state, "modified", seq)


# -- deleting, inserting, reordering ----------------------------------------------------


def test_deleting_a_middle_entry_is_deleted_at_it(case: Case) -> None:
    """Right entry: the first missing one."""
    with closing(case.db()) as conn:
        conn.execute("DELETE FROM audit_log WHERE seq = ?", (case.target,))
    _broken(case.state, "deleted", case.target)


@pytest.mark.parametrize("count", [1, 2])
def test_deleting_and_renumbering_the_rest_is_deleted_at_the_gap(case: Case, count: int) -> None:
    """Right entry: the first missing one (the place the renumbered entries now fill)."""
    last = case.target + count - 1
    with closing(case.db()) as conn:
        conn.execute("DELETE FROM audit_log WHERE seq BETWEEN ? AND ?", (case.target, last))
        _renumber(conn, last, -count)
    _broken(case.state, "deleted", case.target)


def test_inserting_with_renumbering_is_inserted_at_the_new_entry(case: Case) -> None:
    """The new entry goes between ``target`` and its successor, chained to ``target`` and
    with a correct self-hash; the following entries are renumbered.  Right entry: the
    inserted one (``target + 1``)."""
    prev = case.row(case.target)[-1]
    with closing(case.db()) as conn:
        _renumber(conn, case.target, 1)
        _insert(conn, _forged(case, case.target + 5, case.target + 1, prev))
    _broken(case.state, "inserted", case.target + 1)


def test_inserting_without_renumbering_is_inserted_at_the_new_entry(case: Case) -> None:
    """With no free number in the middle, the new entry takes the next free one (after the
    end) and claims to follow ``target``.  Right entry: the inserted one (``n + 1``)."""
    prev = case.row(case.target)[-1]
    with closing(case.db()) as conn:
        _insert(conn, _forged(case, case.target, case.n + 1, prev))
    _broken(case.state, "inserted", case.n + 1)


def test_appending_an_unchained_entry_is_inserted_at_it(case: Case) -> None:
    """An appended entry naming a hash nobody holds: the checkpoint witnessed entry n, so
    entry n is genuine and the new one is the intruder.  Right entry: ``n + 1``."""
    with closing(case.db()) as conn:
        _insert(conn, _forged(case, case.target, case.n + 1, "ab" * 32))
    _broken(case.state, "inserted", case.n + 1)


def test_appending_a_correctly_chained_entry_is_only_a_warning(case: Case) -> None:
    """The limit of a keyless chain: an entry chained to the real head with a correct hash,
    the head's mark moved onto it as the log does, is indistinguishable from the last batch
    a crash kept from the checkpoint.  verify says so (and an outside witness of the head is
    what settles it)."""
    with closing(case.db()) as conn:
        _insert(conn, _forged(case, case.target, case.n + 1, case.head.hash))
        conn.execute(MARK_HEAD_SQL, (case.n, case.n + 1))
    report = verify(case.state)
    assert report.ok
    assert any(
        f"{case.n + 1}..{case.n + 1} are newer than the checkpoint" in w for w in report.warnings
    )


@pytest.mark.parametrize("appended", [1, 3])
def test_entries_appended_after_the_marked_head_are_inserted(case: Case, appended: int) -> None:
    """Chained to the real head with correct hashes, but the head's mark left where the log
    put it (ADR-099): the log did not append them, whatever the checkpoint says."""
    prev = case.head.hash
    with closing(case.db()) as conn:
        for seq in range(case.n + 1, case.n + 1 + appended):
            row = _forged(case, case.target, seq, prev)
            _insert(conn, row)
            prev = row[-1]
    problem = _broken(case.state, "inserted", case.n + 1).problem
    assert problem is not None
    assert f"follow entry {case.n}, the newest the log marked" in problem.detail


def _swap(case: Case, a: int, b: int) -> None:
    """Exchange the contents (everything but seq) of entries a and b."""
    rows = {seq: case.stored(seq) for seq in (a, b)}
    with closing(case.db()) as conn:
        for here, there in ((a, b), (b, a)):
            conn.execute(
                "UPDATE audit_log SET timestamp = ?, event_type = ?, entry = ?, hash = ? "
                "WHERE seq = ?",
                (*rows[there][1:], here),
            )


@pytest.mark.parametrize("distance", [1, 2, 40])
def test_swapping_two_entries_is_reordered_at_the_first(case: Case, distance: int) -> None:
    """Right entry: the first of the two (it holds the other's content)."""
    _swap(case, case.target, case.target + distance)
    _broken(case.state, "reordered", case.target)


def test_rehashing_a_modified_entry_is_modified_at_it(case: Case) -> None:
    """Content changed and its own hash recomputed: the successor still names the old hash.
    Right entry: the changed one."""
    row = case.row(case.target)[:-1]
    row[COLUMNS.index("policy_decision")] = "allowed"
    row[COLUMNS.index("deny_reason")] = None
    assert row != case.row(case.target)[:-1]
    _update(
        case,
        case.target,
        policy_decision="allowed",
        deny_reason=None,
        hash=entry_hash(tuple(row)),
    )
    _broken(case.state, "modified", case.target)


def test_rehashing_the_whole_rest_of_the_chain_is_caught_by_the_checkpoint(case: Case) -> None:
    """Changed at ``target`` and every later entry re-chained: internally consistent, so only
    the checkpoint can tell; it names the entry it witnessed, which now differs (the
    verifier cannot tell this from an older copy with other entries written after it)."""
    prev = None
    for seq in range(case.target, case.n + 1):
        row = case.row(seq)[:-1]
        if prev is not None:
            row[2] = prev
        else:
            row[COLUMNS.index("input_summary")] = "rewritten history"
        prev = entry_hash(tuple(row))
        _update(
            case,
            seq,
            prev_hash=row[2],
            input_summary=row[COLUMNS.index("input_summary")],
            hash=prev,
        )
    assert verify(case.state, checkpoint=False).ok  # the chain alone cannot see it
    _broken(case.state, "rolled_back", case.n)


# -- the genesis entry ------------------------------------------------------------------


def test_modifying_the_genesis_entry_is_modified_at_1(case: Case) -> None:
    _update(case, 1, input_summary="kernel started (edited)")
    _broken(case.state, "modified", 1)


def test_a_rehashed_genesis_entry_with_a_false_prev_hash_is_modified_at_1(case: Case) -> None:
    row = case.row(1)[:-1]
    row[1] -= 60_000  # backdated, prev_hash no longer SHA-256("genesis:" + timestamp)
    assert row[2] != genesis_hash(row[1])
    _update(case, 1, timestamp=row[1], hash=entry_hash(tuple(row)))
    report = _broken(case.state, "modified", 1)
    assert report.problem is not None and "genesis" in report.problem.detail


def test_deleting_the_genesis_entry_is_deleted_at_1(case: Case) -> None:
    with closing(case.db()) as conn:
        conn.execute("DELETE FROM audit_log WHERE seq = 1")
    _broken(case.state, "deleted", 1)


# -- the end of the chain ---------------------------------------------------------------


@pytest.mark.parametrize("copy", ["kept", "deleted"])
@pytest.mark.parametrize("k", [1, 5])
def test_deleting_the_newest_entries_is_truncated(case: Case, k: int, copy: str) -> None:
    """Right entry: the first one the database lost (``n - k + 1``).  Found both by the
    database's own head (the newest row's mark, ADR-099; audit_meta's copy, deleted too
    or not) and, without it, by the checkpoint."""
    with closing(case.db()) as conn:
        conn.execute("DELETE FROM audit_log WHERE seq > ?", (case.n - k,))
        if copy == "deleted":
            conn.execute("DELETE FROM audit_meta WHERE key IN ('head_seq', 'head_hash')")
    _broken(case.state, "truncated", case.n - k + 1)
    report = _broken(case.state, "truncated", case.n - k + 1, checkpoint=False)
    assert report.problem is not None
    said = "is not the newest the log marked" if copy == "deleted" else "own head says"
    assert said in report.problem.detail


def test_deleting_every_entry_is_truncated_by_the_copy_of_the_head(case: Case) -> None:
    """No row is left to carry the mark: audit_meta's copy of the head (moved at the log's
    close) is the file's own evidence."""
    with closing(case.db()) as conn:
        conn.execute("DELETE FROM audit_log")
    report = _broken(case.state, "truncated", 1, checkpoint=False)
    assert report.problem is not None
    assert f"entries 1..{case.n} were deleted" in report.problem.detail


def test_restoring_an_older_copy_is_rolled_back(case: Case, tmp_path: Path) -> None:
    """The file copied after closing the log, more written, the old copy put back.  Right
    entry: the first one the old copy lacks."""
    old = tmp_path / "old.db"
    shutil.copyfile(db_path(case.state), old)
    head = asyncio.run(_extend(case.state, 30, Clock(NOON + 60_000), "later "))
    assert head.seq == case.n + 30 and verify(case.state).ok
    shutil.copyfile(old, db_path(case.state))
    _broken(case.state, "rolled_back", case.n + 1)
    assert verify(case.state, checkpoint=False).ok  # the old copy on its own is intact


@pytest.mark.parametrize(
    ("written", "forked"), [(30, 50), (30, 10)], ids=["fork-longer", "fork-shorter"]
)
def test_an_older_copy_with_other_entries_after_it_is_rolled_back(
    case: Case, tmp_path: Path, written: int, forked: int
) -> None:
    """The old copy grew a different history elsewhere, then replaced the database.  Right
    entry: a longer fork differs at the entry the checkpoint witnessed; a shorter one
    lacks the first entry after its end."""
    fork = tmp_path / "fork"
    fork.mkdir()
    shutil.copyfile(db_path(case.state), db_path(fork))
    asyncio.run(_extend(case.state, written, Clock(NOON + 60_000), "real "))
    asyncio.run(_extend(fork, forked, Clock(NOON + 60_000), "fake "))
    shutil.copyfile(db_path(fork), db_path(case.state))
    if forked > written:
        _broken(case.state, "rolled_back", case.n + written)
    else:
        _broken(case.state, "rolled_back", case.n + forked + 1)


def test_replacing_the_database_by_another_chain_is_replaced(case: Case, tmp_path: Path) -> None:
    """Right entry: none (the whole file is another chain)."""
    other = tmp_path / "other"
    asyncio.run(_build(other, case.n + 20, Clock()))
    shutil.copyfile(db_path(other), db_path(case.state))
    report = _broken(case.state, "replaced", None)
    assert report.checkpoint is not None and report.checkpoint.chain_id == case.head.chain_id
    assert verify(case.state, checkpoint=False).ok


def test_a_witness_held_outside_catches_a_rollback_the_checkpoint_missed(
    case: Case, tmp_path: Path
) -> None:
    """Roll back the database and the checkpoint together: only an outside witness sees it."""
    saved = {name: (case.state / name).read_bytes() for name in ("fluffy.db", HEAD_NAME)}
    witness = asyncio.run(_extend(case.state, 5, Clock(NOON + 60_000), "later "))
    for name, data in saved.items():
        (case.state / name).write_bytes(data)
    assert verify(case.state).ok
    assert read_head(head_path(case.state)) == case.head
    _broken(case.state, "rolled_back", case.n + 1, witness=witness)


def _cut_back(state: Path, head: Head) -> None:
    """Delete every entry after ``head`` and point the database's head and the checkpoint
    at it: what someone with write access to the state folder does to hide a tail."""
    with closing(sqlite3.connect(db_path(state), isolation_level=None)) as conn:
        conn.execute("DELETE FROM audit_log WHERE seq > ?", (head.seq,))
        conn.execute(
            "INSERT OR REPLACE INTO audit_meta VALUES ('head_seq', ?), ('head_hash', ?)",
            (str(head.seq), head.hash),
        )
    head_path(state).write_text(json.dumps(head.to_dict()))


def test_a_log_cut_back_to_an_earlier_witnessed_head_fails_against_the_final_witness(
    case: Case,
) -> None:
    """The bootstrap witnesses the final head at stop (ADR-054): a log cut back to the
    head it had witnessed a moment earlier verifies alone, never against the witness."""
    final = asyncio.run(_extend(case.state, 3, Clock(NOON + 60_000), "last "))
    _cut_back(case.state, case.head)
    assert verify(case.state).ok  # on its own the shorter chain is consistent
    report = _broken(case.state, "rolled_back", case.n + 1, witness=final)
    assert report.unwitnessed is None


def test_entries_after_the_witnessed_head_are_reported_as_unwitnessed(case: Case) -> None:
    asyncio.run(_extend(case.state, 4, Clock(NOON + 60_000), "after "))
    report = verify(case.state, witness=case.head)
    assert report.ok  # a warning: a running kernel's newest entries are not witnessed yet
    assert report.unwitnessed == (case.n + 1, case.n + 4)
    shown = report.to_dict()["unwitnessed"]
    assert shown == {"first_id": case.n + 1, "last_id": case.n + 4, "count": 4}
    at_head = verify(case.state, witness=read_head(head_path(case.state)))
    assert at_head.ok and at_head.unwitnessed is None
    assert at_head.to_dict()["unwitnessed"] is None


# -- the canonical encoding -------------------------------------------------------------


def _row(**values: Any) -> tuple[Any, ...]:
    row = dict.fromkeys(COLUMNS)
    row.update(seq=7, timestamp=NOON, prev_hash="0" * 64, event_type="syscall")
    row.update(values)
    return tuple(row[column] for column in COLUMNS)


@pytest.mark.parametrize(
    "variants",
    [
        [{"output_summary": None}, {"output_summary": ""}, {"output_summary": "null"}],
        [{"duration_ms": 1}, {"duration_ms": 1.0}, {"duration_ms": "1"}, {"duration_ms": None}],
        [{"timestamp": 5}, {"timestamp": "5"}, {"timestamp": 5.0}],
        [{"tool_name": "ab", "caller": "c"}, {"tool_name": "a", "caller": "bc"}],
        [{"tool_name": 'a","b'}, {"tool_name": "a", "caller": "b"}],
        [{"deny_reason": "\u00e9"}, {"deny_reason": "e\u0301"}, {"deny_reason": "\\u00e9"}],
        [{"metadata": '{"a":"1"}'}, {"metadata": '{"a": "1"}'}, {"metadata": None}],
    ],
    ids=[
        "none-empty-null",
        "int-float-text",
        "timestamp-types",
        "boundary",
        "quote",
        "unicode",
        "json",
    ],
)
def test_canonical_encoding_is_injective(variants: list[dict[str, Any]]) -> None:
    hashes = {entry_hash(_row(**variant)) for variant in variants}
    assert len(hashes) == len(variants)


def test_metadata_is_stored_canonically_whatever_the_key_order(tmp_path: Path) -> None:
    first = Event("syscall", metadata={"b": "2", "a": "1", "c": "3"})
    second = Event("syscall", metadata={"c": "3", "a": "1", "b": "2"})
    assert first.row(2, NOON, "x") == second.row(2, NOON, "x")

    async def record() -> None:
        log = await AuditLog.open(tmp_path, clock=Clock())
        await log.record(Event("kernel_start"))
        log.record_nowait(first)
        log.record_nowait(second)
        await log.close()

    asyncio.run(record())
    with closing(sqlite3.connect(db_path(tmp_path))) as conn:
        rows = map(unpack, conn.execute(SELECT_ROWS + " WHERE seq > 1"))
        stored = [row[COLUMNS.index("metadata")] for row in rows]
    assert stored == ['{"a":"1","b":"2","c":"3"}'] * 2
    assert verify(tmp_path).ok


# -- numbers, and entries appended past the checkpoint -----------------------------------


@pytest.mark.parametrize("column", ["timestamp", "duration_ms"])
def test_a_number_changed_in_its_last_digit_is_detected(case: Case, column: str) -> None:
    """1 ulp away (SQLite would print both with the same 15 digits)."""
    index = ALL_COLUMNS.index(column)
    seq = next(s for s in range(case.target, case.n) if case.row(s)[index] is not None)
    value = case.row(seq)[index]
    near = math.nextafter(float(value), math.inf)
    assert near != value and f"{near:.15g}" == f"{float(value):.15g}"
    _update(case, seq, **{column: near})
    _broken(case.state, "modified", seq)


def _append(case: Case, entry: bytes, event_type: str = "syscall") -> int:
    """Append ``entry`` (bytes) after the head with its own hash, and move the head's mark
    onto it: what anyone can do."""
    seq = case.n + 1
    digest = hashlib.sha256(DOMAIN)
    digest.update(entry)
    with closing(case.db()) as conn:
        conn.execute(
            INSERT_SQL, (seq, case.row(case.target)[1], event_type, entry, digest.hexdigest())
        )
        conn.execute(MARK_HEAD_SQL, (seq - 1, seq))
    return seq


def _appendable(case: Case, **values: Any) -> list[Any]:
    """The fields of an entry that follows the head (forged from the target)."""
    fields = _forged(case, case.target, case.n + 1, case.head.hash)[:-1]
    fields[COLUMNS.index("event_type")] = "syscall"
    for name, value in values.items():
        fields[COLUMNS.index(name)] = value
    return fields


def test_an_appended_entry_the_log_could_have_written_is_only_a_warning(case: Case) -> None:
    """What every case below changes one thing of (else the forgery itself were found)."""
    _append(case, _encode(_appendable(case)))
    report = verify(case.state)
    assert report.ok, report.problem
    assert report.warnings


@pytest.mark.parametrize(
    "values",
    [
        {"tool_name": 1.5},  # a number where the log writes text
        {"duration_ms": 2},  # an integer where the log writes a float (2.0)
        {"metadata": {"a": "1"}},  # an object where the log writes its JSON text
        {"caller": None},  # null where the log always writes text
    ],
    ids=["number-for-text", "int-for-float", "object-for-text", "null-for-required"],
)
def test_an_appended_self_hashed_entry_of_a_wrong_type_is_modified(
    case: Case, values: dict[str, Any]
) -> None:
    """Past the checkpoint, whoever appends also computes the hash: each passes every hash
    and link, and only the decoding (also after the parallel check, which vouches only
    for the chain the checkpoint witnessed) refuses it."""
    seq = _append(case, _encode(_appendable(case, **values)))
    _broken(case.state, "modified", seq)


@pytest.mark.parametrize(
    "spelling",
    [
        lambda fields: _encode(fields).replace(b",", b", ", 1),  # not canonical JSON
        lambda fields: _encode([*fields, "extra"]),  # a field too many
        lambda fields: _encode(fields).replace(b"[", b'{"a":', 1)[:-1] + b"}",  # no array
        lambda fields: _encode(fields)[:-1],  # not JSON at all
        lambda fields: _encode(fields)[:-3] + b'\xff"]',  # not UTF-8
    ],
    ids=["whitespace", "extra-field", "object", "truncated", "bad-utf8"],
)
def test_an_appended_self_hashed_entry_in_another_spelling_is_modified(
    case: Case, spelling: Any
) -> None:
    """The bytes are hashed as stored, but the scan rebuilds them from the fields they
    decode to: another spelling of an entry is not an entry the log writes."""
    seq = _append(case, spelling(_appendable(case)))
    _broken(case.state, "modified", seq)


# -- a table rebuilt so that seq is no longer its row id -------------------------------


@pytest.mark.parametrize("change", ["none", "null", "real", "twice"])
def test_a_table_whose_seq_is_not_the_row_id_is_modified(case: Case, change: str) -> None:
    """Rebuilt without ``INTEGER PRIMARY KEY``, a table can hold entries without a number
    (which ``seq BETWEEN`` never sees), with a fractional one, or two with the same one.
    The log never creates such a table: refused as it is, whatever it holds."""
    with closing(case.db()) as conn:
        conn.executescript(
            "ALTER TABLE audit_log RENAME TO old; "
            "CREATE TABLE audit_log AS SELECT * FROM old; DROP TABLE old;"
        )
        if change == "null":  # a forged entry no range holds
            forged = _forged(case, case.target, 0, "0" * 64)
            forged[0] = None
            _insert(conn, forged)
        elif change == "real":
            conn.execute("UPDATE audit_log SET seq = seq + 0.75 WHERE seq = ?", (case.target,))
        elif change == "twice":
            _insert(conn, _forged(case, case.target, case.target, "0" * 64))
    report = _broken(case.state, "modified", None)
    assert report.problem is not None and "seq is no longer its row id" in report.problem.detail


def test_a_view_in_place_of_the_table_is_modified(case: Case) -> None:
    """A view can show what the table cannot hold: here a fractional seq."""
    with closing(case.db()) as conn:
        conn.executescript(
            "ALTER TABLE audit_log RENAME TO real_log; "
            "CREATE VIEW audit_log AS SELECT CASE WHEN seq = 100 THEN 100.25 ELSE seq END "
            "AS seq, timestamp, event_type, entry, hash FROM real_log;"
        )
    _broken(case.state, "modified", None)


@pytest.mark.parametrize(
    "damage",
    [
        "UPDATE audit_log SET entry = CAST(? AS BLOB) WHERE seq = 100",  # nested 100,000 deep
        "UPDATE audit_log SET event_type = CAST(x'c328' AS TEXT) WHERE seq = 100",  # not UTF-8
        "UPDATE audit_meta SET value = 'x' WHERE key = 'head_seq'",
        "DROP TABLE audit_log",
    ],
    ids=["deep-json", "bad-utf8-copy", "garbled-head", "no-table"],
)
def test_damage_anywhere_gives_a_report_not_a_traceback(case: Case, damage: str) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    with closing(case.db()) as conn:
        conn.execute(damage, (deep,) if "?" in damage else ())
    report = verify(case.state)
    assert not report.ok and report.problem is not None, report
    assert report.problem.kind in ("modified", "truncated"), report.problem


@pytest.mark.parametrize("metadata", ["x", "[1]", '{"last_seq": "abc"}', "5", None])
@pytest.mark.parametrize("event_type", ["audit_chain_break", "audit_archive_deleted"])
def test_a_special_entry_with_metadata_the_log_never_writes_is_reported_not_raised(
    case: Case, event_type: str, metadata: str | None
) -> None:
    """Appended after the head with its own hash: hash-valid, canonical, attacker-made."""
    fields = _appendable(case, event_type=event_type, metadata=metadata)
    _append(case, _encode(fields), event_type)
    report = verify(case.state)
    assert report.ok, report.problem  # shown as it is, never obeyed
    if event_type == "audit_chain_break":
        shown = json.loads(metadata) if metadata and metadata.startswith("{") else {}
        if metadata and not shown:
            shown = {"metadata": metadata}
        assert report.breaks == [{**shown, "id": case.n + 1}]


def test_archives_without_the_active_database_are_truncated(case: Case, tmp_path: Path) -> None:
    """The checkpoint says entries were written; only older files are left."""
    archive_dir = case.state / "audit-archive"
    archive_dir.mkdir()
    db_path(case.state).rename(archive_dir / f"audit-20241004-{1:012d}-{case.n:012d}.db")
    fake_head = Head(case.head.chain_id, case.n + 100, "ab" * 32)
    (case.state / HEAD_NAME).write_text(json.dumps(fake_head.to_dict()).ljust(512))
    _broken(case.state, "truncated", case.n + 1)


def test_a_far_off_seq_is_found_at_once(case: Case) -> None:
    """One entry moved to seq 40,000,000,000: the span is no reason to cut the file into a
    million ranges."""
    with closing(case.db()) as conn:
        conn.execute("UPDATE audit_log SET seq = 40000000000 WHERE seq = ?", (case.n,))
    started = time.perf_counter()
    report = verify(case.state)
    assert time.perf_counter() - started < 10
    assert not report.ok and report.problem is not None
    assert report.problem.seq in (case.n, 40_000_000_000), report.problem


def test_a_negative_zero_duration_verifies(tmp_path: Path) -> None:
    async def record() -> None:
        log = await AuditLog.open(tmp_path, clock=Clock())
        await log.record(Event("kernel_start"))
        log.record_nowait(Event("syscall", duration_ms=-0.0))
        await log.close()

    asyncio.run(record())
    assert verify(tmp_path).ok


# -- a file of the earlier layout (one column per field) ----------------------------------


def _earlier_layout(case: Case) -> None:
    with closing(case.db()) as conn:
        rewrite_in_earlier_layout(conn)


def test_a_file_of_the_earlier_layout_is_named_then_converted_and_still_verifies(
    case: Case,
) -> None:
    _earlier_layout(case)
    report = _broken(case.state, "modified", None)
    assert report.problem is not None and "earlier fluffy" in report.problem.detail
    assert migrate_layout(db_path(case.state)) == case.n
    assert migrate_layout(db_path(case.state)) is None  # once
    report = verify(case.state)
    assert report.ok, report.problem
    assert report.entries == case.n and report.head == case.head


@pytest.mark.parametrize(
    ("column", "value"),
    [("duration_ms", float("inf")), ("sandbox_id", b"\x01\x02"), ("tool_name", 1.5)],
)
def test_a_value_changed_before_the_conversion_is_still_found(
    case: Case, column: str, value: Any
) -> None:
    """Values the canonical JSON cannot hold faithfully (an infinity is written null, a
    BLOB base64) do not become, once converted, values whose hash matches."""
    seq = next(s for s in range(case.target, case.n) if case.row(s)[16] is None)
    _earlier_layout(case)
    with closing(case.db()) as conn:
        conn.execute(f"UPDATE audit_log SET {column} = ? WHERE seq = ?", (value, seq))
    migrate_layout(db_path(case.state))
    _broken(case.state, "modified", seq)
