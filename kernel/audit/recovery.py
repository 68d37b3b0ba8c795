"""Start-up checks and recovery of the database (design: Error Recovery, SQLite Corruption).

:func:`check_database` runs before the audit log opens.  ``PRAGMA integrity_check``
first; a corrupt file is moved aside (never deleted: it stays for forensics) and
replaced by, in order, (1) what ``sqlite3 .recover`` salvages, if that verifies, (2) the
newest of the last five backups that verifies, (3) a new empty database.  A healthy
file whose chain does not verify (tampering, truncation, a restored copy) is left as
it is.  Either way the kernel comes up, and the returned events (``audit_chain_break``)
say what happened; the kernel records them right after ``kernel_start``.

Backups (:func:`take_backup`) are taken with SQLite's online backup API at each
session end and at shutdown; the last five are kept.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import shutil
import sqlite3
import subprocess
from pathlib import Path
from typing import Literal

import msgspec

from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.findings import Report
from fluffy.kernel.audit.storage import archives
from fluffy.kernel.audit.store import BACKUP_DIR, connect_ro, db_path, migrate_layout
from fluffy.kernel.audit.verify import Found, at_start, verify

KEEP_BACKUPS = 5
Outcome = Literal["ok", "tampered", "recovered", "restored_backup", "new_database"]


class StartupCheck(msgspec.Struct):
    outcome: Outcome
    detail: str
    report: Report | None = None
    events: list[Event] = msgspec.field(default_factory=list)
    #: a healthy file's chain left for later: the head its files claimed now, before the
    #: kernel's first entry rewrites ``audit.head`` and the database's own head
    found: Found | None = None
    deferred: bool = False


def integrity_ok(path: Path) -> tuple[bool, str]:
    try:
        conn = connect_ro(path)
        try:
            rows = conn.execute("PRAGMA integrity_check").fetchall()
            conn.execute("SELECT COUNT(*) FROM audit_log").fetchone()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return False, str(exc)
    messages = [str(row[0]) for row in rows]
    return messages == ["ok"], "; ".join(messages[:5])


def _stamp() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")


def _files(path: Path) -> list[Path]:
    return [path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")]


def _move_aside(path: Path) -> Path:
    folder = path.parent / "corrupt" / _stamp()
    folder.mkdir(parents=True, mode=0o700)
    for file in _files(path):
        if file.exists():
            file.rename(folder / file.name)
    return folder / path.name


def _salvage(corrupt: Path, target: Path) -> str | None:
    """``sqlite3 corrupt .recover | sqlite3 target``; None when it cannot be done.

    ``.recover`` needs the ``sqlite_dbpage`` table, which many distributions' CLI lacks
    (it then fails with "SQL logic error"); ``.dump`` is the fallback (it reads the
    tables' b-trees, so it saves e.g. a database whose index pages are corrupt).
    """
    cli = shutil.which("sqlite3")
    if cli is None:
        return None
    for command in (".recover", ".dump"):
        for file in _files(target):
            file.unlink(missing_ok=True)
        try:
            dump = subprocess.run(
                [cli, str(corrupt), command], capture_output=True, timeout=300, check=False
            )
            if dump.returncode != 0 or not dump.stdout:
                continue
            load = subprocess.run(
                [cli, str(target)], input=dump.stdout, capture_output=True, timeout=300, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        if load.returncode == 0 and target.exists():
            return f"salvaged with sqlite3 {command}"
    return None


def backups(state_dir: Path) -> list[Path]:
    folder = state_dir / BACKUP_DIR
    return sorted(folder.glob("fluffy-*.db"), reverse=True) if folder.is_dir() else []


def take_backup(state_dir: Path, keep: int = KEEP_BACKUPS) -> Path | None:
    """Copy the live database with the online backup API; keep the newest ``keep``."""
    source_path = db_path(state_dir)
    if not source_path.exists():
        return None
    folder = state_dir / BACKUP_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    target = folder / f"fluffy-{_stamp()}.db"
    source = connect_ro(source_path)
    try:
        dest = sqlite3.connect(target)
        try:
            source.backup(dest)
        finally:
            dest.close()
    finally:
        source.close()
    for old in backups(state_dir)[keep:]:
        old.unlink(missing_ok=True)
    return target


def _chain_break(outcome: str, detail: str, report: Report | None) -> Event:
    metadata = {"outcome": outcome, "detail": detail[:400]}
    if report is not None and report.problem is not None:
        problem = report.problem
        metadata.update(
            kind=problem.kind, first_broken_id=str(problem.seq), problem=problem.detail[:400]
        )
    return Event("audit_chain_break", input_summary=detail, metadata=metadata)


def convert_layout(state_dir: Path) -> int:
    """Archives and backups of the earlier layout converted; how many.

    One that cannot be converted stays as it is: verify then names it (the active
    database: :func:`_usable`).
    """
    converted = 0
    for path in [*(a.path for a in archives(state_dir)), *backups(state_dir)]:
        with contextlib.suppress(sqlite3.Error):
            converted += migrate_layout(path) is not None
    return converted


def _usable(path: Path, converted: list[Path]) -> tuple[bool, str]:
    """Healthy (``PRAGMA integrity_check``), and in this layout, converting it if need be.

    The check comes first, so a corrupt file is moved aside as it was found.  A file
    that cannot be converted is not usable either: it is then treated like a corrupt one
    (moved aside, salvaged or replaced), and the kernel still comes up.
    """
    healthy, why = integrity_ok(path)
    if not healthy:
        return False, why
    try:
        if migrate_layout(path) is not None:
            converted.append(path)
    except sqlite3.Error as exc:
        return False, f"cannot convert it from the earlier audit layout: {exc}"
    return True, ""


def check_database(state_dir: Path, *, chain: bool = True) -> StartupCheck:
    """Make ``state_dir``'s database usable; say what was found and done.

    ``chain=False``: a healthy database's chain is not verified here (the kernel's start
    verifies it once it serves, :func:`chain_check`: the time grows with the log, ~0.7 s
    at 100,000 entries); a corrupt one's replacement still is."""
    converted: list[Path] = []
    archived = convert_layout(state_dir)
    check = _check(state_dir, converted, chain)
    if archived or converted:
        count = archived + len(converted)
        check.detail += f" ({count} file(s) converted from the earlier audit layout)"
    return check


def chain_check(state_dir: Path, found: Found | None = None) -> StartupCheck:
    """Verify a healthy database's chain: "ok", or "tampered" with its break to record
    (the file is left as it is: it is the evidence).  ``found``: see :func:`at_start`."""
    report = verify(state_dir, found=found)
    if report.ok:
        return StartupCheck("ok", f"{report.entries} entries verified", report)
    problem = report.problem
    assert problem is not None
    detail = f"audit chain broken: {problem.kind} at entry {problem.seq}: {problem.detail}"
    return StartupCheck("tampered", detail, report, [_chain_break("tampered", detail, report)])


def chain_unverified(exc: BaseException) -> StartupCheck:
    """A chain check that raised (a damaged archive, an I/O error): recorded as a break."""
    detail = f"the audit chain could not be verified: {type(exc).__name__}: {exc}"[:400]
    return StartupCheck("tampered", detail, None, [_chain_break("tampered", detail, None)])


def _check(state_dir: Path, converted: list[Path], chain: bool) -> StartupCheck:
    path = db_path(state_dir)
    if path.exists():
        healthy, why = _usable(path, converted)
        if healthy:
            doubt, found = (False, None) if chain else at_start(state_dir)
            if not chain and not doubt:  # (a doubted end is verified before it moves)
                return StartupCheck(
                    "ok",
                    "integrity checked; the chain is verified next",
                    found=found,
                    deferred=True,
                )
            return chain_check(state_dir)
        corrupt = _move_aside(path)
        detail = f"database corrupt ({why}); moved to {corrupt.parent}"
        how = _salvage(corrupt, path)
        if (
            how is not None
            and _usable(path, converted)[0]
            and (report := verify(state_dir, checkpoint=False)).ok
        ):
            detail += f"; {how}: {report.entries} entries"
            return StartupCheck(
                "recovered", detail, report, [_chain_break("recovered", detail, report)]
            )
        for file in _files(path):
            file.unlink(missing_ok=True)
        for backup in backups(state_dir):
            shutil.copyfile(backup, path)
            if _usable(path, converted)[0] and (report := verify(state_dir, checkpoint=False)).ok:
                detail += f"; restored backup {backup.name} ({report.entries} entries)"
                return StartupCheck(
                    "restored_backup",
                    detail,
                    report,
                    [_chain_break("restored_backup", detail, report)],
                )
            path.unlink(missing_ok=True)
        detail += "; no salvage or backup verified: started a new database"
        return StartupCheck(
            "new_database", detail, None, [_chain_break("new_database", detail, None)]
        )
    report = verify(state_dir)
    if report.checkpoint is not None:
        detail = "the audit database is missing although a checkpoint says entries were recorded"
        return StartupCheck(
            "new_database", detail, report, [_chain_break("new_database", detail, report)]
        )
    with contextlib.suppress(OSError):
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    return StartupCheck("ok", "new database", report)
