"""The coverage baseline file (design: Tech Debt Budget, ``baseline_file``).

The kernel writes ``<project>/.fluffy/coverage-baseline.json`` after each strict-mode
commit, atomically (a new file in the same folder, fsynced, then renamed over the old
one), and the budget reads it back.  ``.fluffy/`` is a protected path: no AI tool writes
it and no merge may touch it, so the file changes only through this module or by the
user's own hand.  The kernel's state database keeps a copy of what it last wrote; when
the file differs from that copy the budget still uses the file (the user may reset it)
and says so.

The file is read only when it is a regular file, opened without following a link and
without blocking on a FIFO.  A missing or unreadable file is never fatal: it means "no
baseline", with a note saying what was wrong and how to get a baseline again (ADR-042).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

from fluffy.errors import CoverageFormatError
from fluffy.kernel.confined_files import write_atomic
from fluffy.kernel.workflow.coverage import MAX_REPORT_BYTES, CoverageReport

VERSION = 1
FIX = "a strict-mode commit with a coverage run writes it again"
_NONE = f"the budget runs without a baseline until {FIX}"


def _report(raw: str | None) -> CoverageReport | None:
    if not raw:
        return None
    try:
        return CoverageReport.from_dict(json.loads(raw))
    except (ValueError, CoverageFormatError):
        return None


class _NotRegular(Exception):
    """The baseline path is there but is no regular file (its kind is the message)."""


_KINDS = {
    stat.S_IFDIR: "is a folder",
    stat.S_IFIFO: "is a named pipe (FIFO)",
    stat.S_IFSOCK: "is a socket",
    stat.S_IFCHR: "is a character device",
    stat.S_IFBLK: "is a block device",
}


def _read_regular(path: Path) -> bytes:
    """Up to ``MAX_REPORT_BYTES + 1`` bytes of the regular file at ``path``.

    The file is opened without following a link (ELOOP) and without blocking on a FIFO
    nobody writes, then checked to be a regular file before anything is read.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
    flags |= getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _NotRegular(_KINDS.get(stat.S_IFMT(mode), "is not a regular file"))
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_REPORT_BYTES:
            chunk = os.read(fd, MAX_REPORT_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_baseline(
    project: Path, rel: str, cached: str | None = None
) -> tuple[CoverageReport | None, list[str]]:
    """The baseline in ``project/rel`` (None: no baseline) and notes on what was wrong.

    ``cached``: the copy the kernel last wrote (its state database), to tell a file that
    was removed or changed since from one that never existed.
    """
    path = project / rel
    before = _report(cached)
    try:
        data = _read_regular(path)
    except FileNotFoundError:
        if before is None:
            return None, []
        return None, [
            f"the coverage baseline file {rel} is missing (fluffy wrote one at "
            f"{before.percent:.2f}%); the budget runs without a baseline until {FIX}"
        ]
    except _NotRegular as exc:
        return None, [
            f"the coverage baseline file {rel} {exc}, which fluffy does not read; "
            f"remove it, then {FIX}"
        ]
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None, [
                f"the coverage baseline file {rel} is a symbolic link, which fluffy does not "
                f"follow; remove it, then {FIX}"
            ]
        return None, [f"cannot read the coverage baseline file {rel} ({exc.strerror}); {_NONE}"]
    try:
        if len(data) > MAX_REPORT_BYTES:
            raise ValueError(f"it is over {MAX_REPORT_BYTES // 2**20} MiB")
        doc = json.loads(data.decode("utf-8"))
        if not isinstance(doc, dict):
            raise ValueError("it is not a JSON object")
        report = CoverageReport.from_dict(doc)
    except (ValueError, UnicodeDecodeError, RecursionError, CoverageFormatError) as exc:
        detail = exc.what if isinstance(exc, CoverageFormatError) else str(exc)
        return None, [f"the coverage baseline file {rel} is corrupt ({detail[:200]}); {_NONE}"]
    notes = []
    if before is not None and before != report:
        notes.append(
            f"the coverage baseline file {rel} says {report.percent:.2f}%, not the "
            f"{before.percent:.2f}% fluffy last wrote; the file is used"
        )
    return report, notes


def baseline_document(report: CoverageReport, session_id: str) -> dict[str, Any]:
    return {
        "version": VERSION,
        "written_by": "fluffy kernel, after a strict-mode commit",
        "session_id": session_id,
        "written_at": int(time.time() * 1000),
        "percent": round(report.percent, 4),
        **report.to_dict(),
    }


def write_baseline(project: Path, rel: str, report: CoverageReport, session_id: str) -> None:
    """Write the baseline atomically and durably, never through a link, as the folder's
    owner (OSError or MergeRefused when it cannot be written)."""
    path = project / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    keep_out_of_git(path)
    text = json.dumps(baseline_document(report, session_id), indent=2, sort_keys=True) + "\n"
    write_atomic(project, rel, text.encode(), mode=0o644)


IGNORE_NOTE = (
    "# Written by fluffy: its coverage baseline is its own state, not the project's.\n"
    "# Delete this file (or write your own .gitignore here) to commit the baseline.\n"
)


def keep_out_of_git(path: Path) -> None:
    """A baseline written after each commit would leave the worktree changed after every
    one (and slip into the next commit): unless the folder has a ``.gitignore`` already
    (the user's choice stands), fluffy writes one that ignores the baseline and itself,
    so ``git status`` stays as the commit left it."""
    ignore = path.parent / ".gitignore"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(ignore, flags, 0o644)
    except FileExistsError:
        return
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(f"{IGNORE_NOTE}/{path.name}\n/.gitignore\n")
