"""The merge: staged changes (or a git.commit's output) into the project, crash-safe.

:meth:`Merger.plan` judges whether the staged changes may merge automatically (tests
pass, every path inside the project's source and test folders or named by the policy's
``merge.auto_merge_paths`` and no dotfile, no sensitive path, no binary file, fewer than
``max_auto_lines`` changed diff lines) and says why not.  A change outside that allow-list
waits for a person even under ``--yes`` (:attr:`MergePlan.outside`, ADR-054).
:meth:`Merger.merge` then runs a :class:`MergeOperation`:

1. the staged contents are copied into the op's folder and the op is persisted;
2. the staging area is cleared (the op is self-contained from here on);
3. one step per file, each idempotent: the project file's sha256 is compared with the
   staged one (equal: already applied, e.g. by a run killed after its rename) and with
   the base recorded at staging (different: a *conflict*, reported and skipped, other
   files still merge -- no automatic rollback); otherwise the file is replaced
   atomically (temp in the same folder, fsync, rename, fsync of the folder) or unlinked.

Every step is recorded durably before the next starts.  :meth:`resume_pending` (kernel
start-up) completes every in-progress operation, skipping recorded steps.  An OSError
leaves the operation in progress (retried at the next start); a lost source or another
unexpected fluffy error ends it as ``failed``.  The caller decides *whether* to merge
(auto, or after the user's approval); this module does not ask.

``on_step(op, phase)`` is called at ``prepared``, ``before:<step>``, ``applied:<step>``
(effect done, not yet recorded), ``recorded:<step>`` and ``completed`` (tests use it to
crash at chosen points).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import msgspec

from fluffy.errors import FluffyError, MergeConflict, MergeError, MergeRefused
from fluffy.kernel.confined_files import (
    DEFAULT_SENSITIVE,
    FileChanged,
    ProtectedPaths,
    file_sha256,
    read_existing,
    remove_file,
    remove_stale,
    safe_relpath,
    write_atomic,
)
from fluffy.kernel.globs import GlobSet
from fluffy.kernel.merge.gitmerge import apply_git_step, prepare_git
from fluffy.kernel.merge.oplog import MergeOperation, MergeStep, OperationLog, StepResult
from fluffy.kernel.merge.patch import count_diff_lines
from fluffy.kernel.merge.preflight import file_steps
from fluffy.kernel.merge.staging import (
    MAX_VIEW_BYTES,
    StagedChange,
    Staging,
    sha256,
)
from fluffy.kernel.merge.support import SupportChange, support_changes
from fluffy.merge3 import is_binary

#: Why a change outside the allow-list waits (the review names each such file).
OUTSIDE = "outside the source and test folders: a tool on your machine may read it as configuration"
DOTFILE = "a dotfile or dot-folder: a tool on your machine may read it as configuration"
MAX_AUTO_LINES = 500

Hook = Callable[[MergeOperation, str], None]


class MergeIssue(msgspec.Struct, frozen=True):
    path: str
    reason: str


class MergePlan(msgspec.Struct):
    staging: Staging
    changes: list[StagedChange]
    diff: str
    diff_lines: int
    sensitive: list[str]
    binary: list[str]
    #: test-support code the session changed (conftest.py, plugins, runner settings):
    #: a green run may rest on it, so a person reviews it (kernel/merge/support.py)
    support: list[SupportChange]
    tests_pass: bool
    auto: bool
    reasons: list[str]  # why it may not merge automatically (empty when auto)
    #: paths outside the allow-list: a person reviews them, ``--yes`` does not stand in
    outside: list[str] = msgspec.field(default_factory=list)

    @property
    def plan_id(self) -> str:
        """Names exactly these changes: an approval is for what the user was shown."""
        digest = hashlib.sha256(b"fluffy-merge-plan-v1\0")
        for change in sorted(self.changes, key=lambda c: c.path):
            for part in (change.path, change.op, change.sha256 or "", change.base_sha256 or ""):
                data = part.encode("utf-8", "surrogateescape")
                digest.update(len(data).to_bytes(8, "big") + data)
        return digest.hexdigest()[:32]


class MergeResult(msgspec.Struct):
    operation_id: str | None
    status: Literal["completed", "failed", "in_progress", "empty"]
    merged: list[str] = msgspec.field(default_factory=list)
    conflicts: list[MergeIssue] = msgspec.field(default_factory=list)
    refused: list[MergeIssue] = msgspec.field(default_factory=list)
    error: str | None = None
    #: steps left out on purpose, and why (the person's git index kept, for one)
    notes: list[str] = msgspec.field(default_factory=list)
    #: files merged three-way with the person's changes made since they were staged
    three_way: list[str] = msgspec.field(default_factory=list)


def _view_reader(staging: Staging) -> Callable[[str], bytes | None]:
    """The session's view of a path (staged, else the project's); None when absent or not
    a file that can be read safely."""

    def read(rel: str) -> bytes | None:
        try:
            return staging.read(rel)
        except (OSError, FluffyError):
            return None

    return read


def result_of(op: MergeOperation) -> MergeResult:
    out = MergeResult(op.id, op.status, error=op.error)
    for step in op.steps:
        done = op.results.get(step.id)
        if done is not None and done.outcome == "skipped" and done.reason:
            out.notes.append(done.reason)
        if done is None or done.outcome in ("skipped", "rolled_back"):
            continue
        if done.outcome in ("applied", "already"):
            out.merged.append(step.path)
        elif done.outcome == "conflict":
            out.conflicts.append(MergeIssue(step.path, done.reason))
        else:
            out.refused.append(MergeIssue(step.path, done.reason))
    return out


class Merger:
    def __init__(
        self,
        project: Path,
        state_dir: Path,
        *,
        protected: Sequence[str] = (),
        sensitive: Sequence[str] = DEFAULT_SENSITIVE,
        max_auto_lines: int = MAX_AUTO_LINES,
        auto_merge: Sequence[str] = (),
        roots: Sequence[str] = (),
        on_step: Hook | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.project = project
        self.state_dir = state_dir
        self.log = OperationLog(state_dir, clock=clock)
        self._on_step = on_step
        self._lock = threading.Lock()
        # the project's source and test folders (Layout.merge_globs); none: nothing
        # merges without review but what the policy names
        self._roots = GlobSet(tuple(roots))
        self.configure(protected, sensitive, max_auto_lines, auto_merge)

    def configure(
        self,
        protected: Sequence[str],
        sensitive: Sequence[str],
        max_auto_lines: int,
        auto_merge: Sequence[str] = (),
    ) -> None:
        """New rules from a policy update (the same merger, the same lock)."""
        self._guard = ProtectedPaths(protected)
        # validated where the policy was read (tool_settings); compiled when first used
        self._sensitive = GlobSet(tuple(sensitive), lazy=True)
        self._named = GlobSet(tuple(auto_merge), lazy=True)
        self.max_auto_lines = max_auto_lines

    def outside(self, path: str) -> str | None:
        """Why ``path`` is outside the allow-list (None: inside).  The policy's
        ``auto_merge_paths`` come first; otherwise a dot-named part anywhere is outside,
        and the rest must lie in the project's source and test folders."""
        if self._named.match(path):
            return None
        if any(part.startswith(".") for part in path.split("/")):
            return DOTFILE
        return None if self._roots.match(path) else OUTSIDE

    # -- planning --------------------------------------------------------------------

    def plan(self, staging: Staging, *, tests_pass: bool) -> MergePlan:
        changes = staging.changes()
        diff = staging.diff()
        lines = count_diff_lines(diff)
        sensitive = [c.path for c in changes if self._sensitive.match(c.path)]
        outside = {c.path: why for c in changes if (why := self.outside(c.path)) is not None}
        binary: list[str] = []
        unreadable: list[str] = []
        for change in changes:
            try:
                old = read_existing(self.project, change.path, MAX_VIEW_BYTES)
            except (OSError, MergeRefused):
                unreadable.append(change.path)
                old = None
            if is_binary(old) or is_binary(staging.read(change.path)):
                binary.append(change.path)
        support = support_changes([c.path for c in changes], _view_reader(staging))
        reasons: list[str] = []
        if not changes:
            reasons.append("nothing is staged")
        if not tests_pass:
            reasons.append("the tests did not pass")
        if sensitive:
            reasons.append(f"sensitive paths change: {', '.join(sensitive)}")
        reasons.extend(f"{path}: {why}" for path, why in outside.items())
        if binary:
            reasons.append(f"binary files change: {', '.join(binary)}")
        if unreadable:
            reasons.append(f"the project's file cannot be read safely: {', '.join(unreadable)}")
        if support:
            reasons.append(
                "test-support code changed, so the green run may rest on it: "
                + "; ".join(str(s) for s in support)
            )
        if lines >= self.max_auto_lines:
            reasons.append(
                f"the diff has {lines} changed lines; auto-merge needs fewer than "
                f"{self.max_auto_lines}"
            )
        return MergePlan(
            staging,
            changes,
            diff,
            lines,
            sensitive,
            binary,
            support,
            tests_pass,
            not reasons,
            reasons,
            list(outside),
        )

    # -- merging ---------------------------------------------------------------------

    def merge(self, target: MergePlan | Staging) -> MergeResult:
        """Merge everything staged (the plan's staging area must be unchanged): all of it
        or nothing.  A file the person changed since it was staged is merged three-way
        when the changes do not overlap; otherwise :class:`MergeOverlap` is raised before
        anything is written.  A file changed while the merge writes rolls it back."""
        staging = target.staging if isinstance(target, MergePlan) else target
        with self._lock:
            changes = staging.changes()
            if isinstance(target, MergePlan) and changes != target.changes:
                raise MergeConflict(
                    "the staged changes differ from the reviewed plan",
                    why="something was staged or discarded after the plan was made",
                    fix="Plan (and review) the merge again.",
                )
            if not changes:
                return MergeResult(None, "empty")
            steps, sources, merged3 = file_steps(self.project, self._guard, staging, changes)
            op = self.log.create("files", steps, sources, staging_root=staging.root)
            self._hook(op, "prepared")
            result = self._run(op)
            if result.status == "completed":
                staging.clear()  # only now: a rolled-back merge leaves it as it was
                op.staging_cleared = True
                self.log.save(op)
            result.three_way = sorted(merged3)
            return result

    def merge_git(self, call_dir: Path, result: dict[str, object]) -> MergeResult:
        """Merge a git.commit sandbox's objects, ref and index into ``<project>/.git``."""
        with self._lock:
            try:
                steps, sources = prepare_git(self.project, call_dir, result)
            except OSError as exc:
                raise MergeRefused(
                    f"cannot read the git.commit output in {call_dir}: {exc.strerror or exc}"
                ) from exc
            op = self.log.create("git", steps, sources)
            self._hook(op, "prepared")
            return self._run(op)

    def resume_pending(self) -> list[MergeResult]:
        """Complete every in-progress operation (kernel start-up), oldest first."""
        results: list[MergeResult] = []
        with self._lock:
            for op in self.log.pending():
                try:
                    result = self._run(op)
                except MergeError as exc:
                    out = result_of(op)
                    out.error = exc.what
                    results.append(out)
                    continue
                results.append(result)
            for op in self.log.operations():  # killed between completing and clearing
                if op.status == "completed" and op.kind == "files" and not op.staging_cleared:
                    self._clear_staging(op)  # (rolled back: the session keeps its changes)
                    op.staging_cleared = True
                    self.log.save(op)
            self.log.collect_garbage()
        return results

    def _clear_staging(self, op: MergeOperation) -> None:
        """A merge killed before it cleared its staging area: clear it now."""
        if op.kind != "files" or op.staging_root is None or not Path(op.staging_root).is_dir():
            return
        staging = Staging(Path(op.staging_root), self.project)
        staged = {(c.path, c.op, c.sha256, c.base_sha256) for c in staging.changes()}
        ours = {(s.path, s.action, s.new_sha256, s.base_sha256) for s in op.steps}
        missing = {change[0] for change in ours - staged}  # a machine crash dropped them
        if staged <= ours and missing <= set(staging.lost) and (staged or missing):
            staging.clear()

    # -- running steps ---------------------------------------------------------------

    def _hook(self, op: MergeOperation, phase: str) -> None:
        if self._on_step is not None:
            self._on_step(op, phase)

    def _run(self, op: MergeOperation) -> MergeResult:
        if op.rolling_back:  # a kill during a roll-back: finish undoing
            return self._roll_back(op, op.error or "")
        for step in op.steps:
            if op.step_done(step.id):
                continue
            self._hook(op, f"before:{step.id}")
            try:
                outcome = self._apply(op, step)
            except (MergeRefused, MergeConflict) as exc:
                outcome = StepResult(
                    "refused" if isinstance(exc, MergeRefused) else "conflict", exc.why or exc.what
                )
            except FluffyError as exc:
                self.log.finish(op, "failed", exc.what)
                return result_of(op)
            except OSError as exc:
                raise MergeError(
                    f"merge {op.id} stopped at {step.path!r}: {exc.strerror or exc}",
                    why="the project could not be written; merged files are kept",
                    fix="Fix the cause (disk space, permissions); the merge resumes when "
                    "the kernel starts again.",
                ) from exc
            self._hook(op, f"applied:{step.id}")
            self.log.record(op, step.id, outcome)
            self._hook(op, f"recorded:{step.id}")
            if op.kind == "files" and outcome.outcome in ("conflict", "refused"):
                return self._roll_back(op, f"{step.path}: {outcome.reason}")
        self.log.finish(op, "completed")
        self._hook(op, "completed")
        return result_of(op)

    def _roll_back(self, op: MergeOperation, why: str) -> MergeResult:
        """Undo every applied step of a files merge that cannot land whole (newest
        first; a file changed again since is left as it is)."""
        op.rolling_back, op.error = True, why
        self.log.save(op)
        for step in reversed(op.steps):
            done = op.results.get(step.id)
            if done is None or done.outcome != "applied":
                continue
            path = safe_relpath(step.path)
            if file_sha256(self.project, path, MAX_VIEW_BYTES) == step.new_sha256:
                if step.before is None:
                    remove_file(self.project, path)
                else:
                    with contextlib.suppress(FileChanged):  # saved meanwhile: theirs stays
                        write_atomic(self.project, path, self.log.source(op, step.before),
                                     unchanged=(step.new_sha256, MAX_VIEW_BYTES))  # fmt: skip
            self.log.undo(op, step.id, "undone: " + why)
            self._hook(op, f"undone:{step.id}")
        self.log.finish(op, "failed", f"rolled back, nothing merged: {why}")
        return result_of(op)

    def _apply(self, op: MergeOperation, step: MergeStep) -> StepResult:
        if step.action in ("git_objects", "git_ref", "git_index"):
            return apply_git_step(
                self.project,
                op,
                step,
                source=lambda name: self.log.source(op, name),
                names=lambda folder: self.log.source_names(op, folder),
            )
        path = safe_relpath(step.path)
        self._guard.check(path)
        temp = f".{path.rsplit('/', 1)[-1]}.fluffy-merge-{op.id[:16]}-{step.id}.tmp"
        remove_stale(self.project, path, temp)
        current = file_sha256(self.project, path, MAX_VIEW_BYTES)
        if current == step.new_sha256:
            return StepResult("already")
        if current != step.base_sha256:
            return StepResult(
                "conflict",
                f"the project's file changed since it was staged (expected "
                f"{_short(step.base_sha256)}, found {_short(current)})",
            )
        if step.action == "delete":
            remove_file(self.project, path)
            return StepResult("applied")
        assert step.source is not None
        data = self.log.source(op, step.source)
        if sha256(data) != step.new_sha256:
            raise MergeError(
                f"merge {op.id}: the copy of {path!r} is corrupt",
                why="the bytes kept for this step no longer match the SHA-256 recorded when the "
                "merge was planned",
                fix="Nothing was written for that file; reject the review and redo the change "
                "(`fluffy audit verify` checks the rest).",
            )
        try:
            write_atomic(
                self.project, path, data, temp_name=temp, unchanged=(current, MAX_VIEW_BYTES)
            )
        except FileChanged as changed:  # saved while the new bytes were being synced
            return StepResult(
                "conflict",
                f"the project's file changed while it was being written (expected "
                f"{_short(current)}, found {_short(changed.found)})",
            )
        return StepResult("applied")


def _short(digest: str | None) -> str:
    return "no file" if digest is None else f"sha256 {digest[:12]}"
