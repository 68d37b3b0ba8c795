"""Ingest a sandbox's output (change list + files) into the session's staging area.

All or nothing: every change is validated in memory first -- the path is safe and not
protected, the output file is a regular file read without following links and under the
size cap, a patch applies exactly to the current *view* content, the result fits the
layout of the view (no file where a folder is, nor the reverse) -- and only then is
anything staged.  The project itself is never written here.

A change is ``{"path": str, "op": "patch" | "full" | "delete", "file": str}`` (``file``
relative to the call's output folder, absent for ``delete``).  Changes apply in order,
so two patches to one path in one call are applied one after the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fluffy.errors import MergeError, MergeRefused, PatchRejected
from fluffy.kernel.confined_files import ProtectedPaths, read_regular, refused, safe_relpath
from fluffy.kernel.merge.patch import apply_patch, parse_single
from fluffy.kernel.merge.staging import StagedChange, Staging

MAX_FILE_BYTES = 10 * 1024 * 1024
MAX_CHANGES = 10_000
_OPS = ("patch", "full", "delete")


def ingest(
    call_dir: Path,
    changes: Sequence[object],
    staging: Staging,
    *,
    protected: Sequence[str] = (),
    max_file_bytes: int = MAX_FILE_BYTES,
) -> list[StagedChange]:
    """Validate every change, then stage them all; returns what is now staged for them.

    ``protected`` adds globs to :data:`~fluffy.kernel.confined_files.DEFAULT_PROTECTED`.
    Raises MergeRefused / PatchRejected (nothing staged) on the first bad change.
    """
    if not isinstance(changes, list | tuple):
        raise MergeRefused("the change list is not a list", why=f"got {type(changes).__name__}")
    if len(changes) > MAX_CHANGES:
        raise MergeRefused(f"the change list has {len(changes)} entries, over {MAX_CHANGES}")
    guard = ProtectedPaths(protected)
    pending: dict[str, bytes | None] = {}
    for index, change in enumerate(changes):
        path, content = _validate(call_dir, index, change, staging, guard, pending, max_file_bytes)
        pending[path] = content
    _check_layout(staging, pending)
    staged: list[StagedChange] = []
    for path, content in pending.items():
        result = staging.stage(path, content)
        if result is not None:
            staged.append(result)
    return staged


def _validate(
    call_dir: Path,
    index: int,
    change: object,
    staging: Staging,
    guard: ProtectedPaths,
    pending: dict[str, bytes | None],
    max_file_bytes: int,
) -> tuple[str, bytes | None]:
    if not isinstance(change, dict):
        raise MergeRefused(f"change #{index} is not an object")
    unknown = set(change) - {"path", "op", "file"}
    if unknown:
        raise MergeRefused(f"change #{index} has unknown keys {sorted(map(str, unknown))}")
    op = change.get("op")
    if op not in _OPS:
        raise MergeRefused(f"change #{index} has op {op!r}", why=f"the ops are {', '.join(_OPS)}")
    path = safe_relpath(change.get("path"))  # type: ignore[arg-type]  # checked inside
    guard.check(path)
    file = change.get("file")
    if (op == "delete") != (file is None):
        raise MergeRefused(
            f"change #{index} ({op} {path!r}) {'has' if file is not None else 'lacks'} a file",
            why="patch and full changes name their output file; a delete names none",
        )
    try:
        view = staging.read(path)  # also refuses a link / fifo / folder at the target
        current = pending.get(path, view)
        if op == "delete":
            if current is None:
                raise PatchRejected(
                    f"cannot delete {path!r}: it does not exist",
                    fix="List the files again; only existing files can be deleted.",
                )
            return path, None
        data = read_regular(call_dir, str(file), max_file_bytes)
    except MergeError:
        raise
    except OSError as exc:
        raise MergeRefused(
            f"cannot read the output of change #{index} ({path!r}): {exc.strerror or exc}"
        ) from exc
    if op == "full":
        return path, data
    return path, _patched(path, data, current, max_file_bytes)


def _patched(path: str, patch: bytes, current: bytes | None, max_file_bytes: int) -> bytes | None:
    try:
        text = patch.decode("utf-8")
    except UnicodeDecodeError:
        raise PatchRejected(f"the patch for {path!r} is not UTF-8 text") from None
    try:
        old = None if current is None else current.decode("utf-8")
    except UnicodeDecodeError:
        raise PatchRejected(
            f"{path!r} is not UTF-8 text, so a patch cannot apply to it",
            fix="Write the whole file (full-file mode) instead.",
        ) from None
    result = apply_patch(parse_single(text, path), old)
    if result is None:
        return None
    data = result.encode("utf-8")
    if len(data) > max_file_bytes:
        raise refused(path, f"the patched file has {len(data)} bytes, more than {max_file_bytes}")
    return data


def _ancestors(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:depth]) for depth in range(1, len(parts))]


def _check_layout(staging: Staging, pending: dict[str, bytes | None]) -> None:
    """No staged file may sit where another staged file needs a folder, or the reverse."""
    files = staging.staged_files()
    for path, content in pending.items():
        if content is None:
            files.discard(path)
        else:
            files.add(path)
    folders = {folder for path in files for folder in _ancestors(path)}
    for path, content in pending.items():
        if content is None:
            continue
        if path in folders:
            raise refused(path, "another staged file needs a folder of this name")
        for folder in _ancestors(path):
            if folder in files:
                raise refused(path, f"{folder!r} is a staged file, so it cannot be a folder")
