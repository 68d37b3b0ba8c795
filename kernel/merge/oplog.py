"""The merge operation log (design: Output Volume Merge Failure, a mini WAL).

A merge is a :class:`MergeOperation`: a list of idempotent steps, persisted as
``<state>/merges/<id>.json`` and rewritten atomically (temp + fsync + rename + fsync of
the folder) after every step.  Before the JSON exists, every source the steps need is
copied into ``<state>/merges/<id>/`` and fsynced, so the operation is self-contained: the
staging area or the sandbox output may be gone when it is resumed.  An operation whose
JSON is missing never started (its folder is garbage); one whose status is
``in_progress`` is completed at kernel start-up, skipping its completed steps.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

import msgspec

from fluffy.errors import MergeError
from fluffy.kernel.confined_files import read_existing, relative_parts, write_atomic

Status = Literal["in_progress", "completed", "failed"]
Kind = Literal["files", "git"]
Action = Literal["write", "delete", "git_objects", "git_ref", "git_index"]
Outcome = Literal["applied", "already", "conflict", "refused", "skipped", "rolled_back"]

_MAX_SOURCE_BYTES = 1 << 40  # sources were size-checked when the operation was built


class MergeStep(msgspec.Struct, frozen=True):
    """One idempotent step: bring ``path`` from ``base_sha256`` to ``new_sha256``.

    For file steps the hashes are sha256 of content (None: absent).  For ``git_ref``
    they are the ref's old and new commit ids; for ``git_index``/``git_objects`` only
    ``new_sha256``/``source`` matter.  ``source`` names the copy under the op folder.
    """

    id: str
    action: Action
    path: str
    base_sha256: str | None = None
    new_sha256: str | None = None
    source: str | None = None
    #: a file step: the copy of the project's content before the step (None: there was
    #: no file), so a merge that cannot land whole is rolled back
    before: str | None = None


class StepResult(msgspec.Struct, frozen=True):
    outcome: Outcome
    reason: str = ""


class MergeOperation(msgspec.Struct):
    id: str
    kind: Kind
    steps: list[MergeStep]
    completed_steps: list[str] = msgspec.field(default_factory=list)
    status: Status = "in_progress"
    created_at: float = 0.0
    results: dict[str, StepResult] = msgspec.field(default_factory=dict)
    error: str | None = None
    staging_root: str | None = None  # a files merge: the staging area it came from
    #: a files merge that could not land whole: applied steps are being undone
    rolling_back: bool = False
    #: a completed files merge whose staging area was cleared (a kill between the two:
    #: the next start clears it)
    staging_cleared: bool = False

    def step_done(self, step_id: str) -> bool:
        return step_id in self.results


def merges_dir(state_dir: Path) -> Path:
    return state_dir / "merges"


class OperationLog:
    """Creates, records and lists merge operations under ``<state_dir>/merges``."""

    def __init__(self, state_dir: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.root = merges_dir(state_dir)
        self._clock = clock

    def _map(self, what: str, exc: OSError) -> MergeError:
        return MergeError(
            f"{what}: {exc.strerror or exc}",
            why="the merge log in the kernel's state folder could not be written",
            fix="Check the state folder's disk space and permissions; the merge resumes "
            "when the kernel starts again.",
        )

    def source_dir(self, op_id: str) -> Path:
        return self.root / op_id

    def create(
        self,
        kind: Kind,
        steps: list[MergeStep],
        sources: Mapping[str, bytes],
        *,
        staging_root: Path | None = None,
    ) -> MergeOperation:
        """Copy ``sources`` (name -> content) into the op folder, then persist the op."""
        op = MergeOperation(
            id=uuid.uuid4().hex,
            kind=kind,
            steps=steps,
            created_at=float(self._clock()),
            staging_root=None if staging_root is None else str(staging_root),
        )
        folder = self.source_dir(op.id)
        try:
            folder.mkdir(parents=True, mode=0o700)
            for name, data in sources.items():
                write_atomic(folder, "/".join(relative_parts(name)), data, mode=0o600)
            self._fsync(folder)
            self.save(op)
        except OSError as exc:
            shutil.rmtree(folder, ignore_errors=True)
            raise self._map(f"cannot prepare merge operation {op.id}", exc) from exc
        return op

    def _fsync(self, folder: Path) -> None:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def save(self, op: MergeOperation) -> None:
        try:
            write_atomic(self.root, f"{op.id}.json", msgspec.json.encode(op), mode=0o600)
        except OSError as exc:
            raise self._map(f"cannot record merge operation {op.id}", exc) from exc

    def record(self, op: MergeOperation, step_id: str, result: StepResult) -> None:
        """Mark ``step_id`` done with ``result``; durable before this returns."""
        if op.step_done(step_id):
            return
        op.results[step_id] = result
        op.completed_steps.append(step_id)
        self.save(op)

    def undo(self, op: MergeOperation, step_id: str, reason: str) -> None:
        """Mark an applied step as undone by a roll-back; durable before this returns."""
        op.results[step_id] = StepResult("rolled_back", reason)
        self.save(op)

    def finish(self, op: MergeOperation, status: Status, error: str | None = None) -> None:
        """Persist the final status, then drop the op's source copies."""
        op.status = status
        op.error = error
        self.save(op)
        shutil.rmtree(self.source_dir(op.id), ignore_errors=True)

    def source(self, op: MergeOperation, name: str) -> bytes:
        data = read_existing(
            self.source_dir(op.id), "/".join(relative_parts(name)), _MAX_SOURCE_BYTES
        )
        if data is None:
            raise MergeError(
                f"merge operation {op.id} lost its source {name!r}",
                why=f"{self.source_dir(op.id)} was changed outside fluffy",
                fix="Stage the change again; this operation cannot be completed.",
            )
        return data

    def source_names(self, op: MergeOperation, folder: str) -> list[str]:
        """Names of the files copied under ``folder`` of the op's sources, sorted."""
        path = self.source_dir(op.id) / folder
        if not path.is_dir():
            return []
        return sorted(child.name for child in path.iterdir() if not child.name.startswith("."))

    def load(self, op_id: str) -> MergeOperation:
        path = self.root / f"{op_id}.json"
        try:
            return msgspec.json.decode(path.read_bytes(), type=MergeOperation)
        except (OSError, msgspec.DecodeError) as exc:
            raise MergeError(
                f"cannot read merge operation {path}",
                why=str(exc),
                fix="Look at the file; if it is damaged, move it out of the merges folder and "
                "restart the kernel (the change is still staged).",
            ) from exc

    def operations(self) -> list[MergeOperation]:
        """Every recorded operation, oldest first."""
        if not self.root.is_dir():
            return []
        ops = [self.load(path.stem) for path in self.root.glob("*.json")]
        return sorted(ops, key=lambda op: (op.created_at, op.id))

    def pending(self) -> list[MergeOperation]:
        return [op for op in self.operations() if op.status == "in_progress"]

    def collect_garbage(self) -> None:
        """Remove source folders of operations that never started or already ended."""
        if not self.root.is_dir():
            return
        live = {op.id for op in self.pending()}
        for child in self.root.iterdir():
            if child.is_dir() and not child.is_symlink() and child.name not in live:
                shutil.rmtree(child, ignore_errors=True)
            elif child.name.startswith(".") and child.name.endswith(".tmp"):
                child.unlink(missing_ok=True)  # an interrupted save
        with contextlib.suppress(OSError):
            self._fsync(self.root)


def pending(state_dir: Path) -> list[MergeOperation]:
    """The in-progress merge operations under ``state_dir``, oldest first."""
    return OperationLog(state_dir).pending()
