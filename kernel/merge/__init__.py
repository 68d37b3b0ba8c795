"""Output extraction and merge: sandbox output -> staging -> the project (and .git).

The kernel never writes the project directly, except through this package:

* :func:`ingest` validates a sandbox's change list (all or nothing) into a session's
  :class:`Staging` area, which later sandboxes see as an overlay on the project;
* :class:`Merger` plans the merge (auto-merge criteria), merges staged files with an
  operation log (crash-safe, idempotent steps, conflicts reported and skipped), merges a
  git.commit's objects / ref / index into ``.git``, and resumes interrupted merges.

Modules: :mod:`.paths` (confined, no-follow file access), :mod:`.patch` (strict unified
diffs), :mod:`.staging`, :mod:`.ingest`, :mod:`.oplog` (the mini WAL), :mod:`.gitmerge`,
:mod:`.merger`.
"""

from fluffy.kernel.confined_files import (
    DEFAULT_PROTECTED,
    DEFAULT_SENSITIVE,
    ProtectedPaths,
    read_existing,
    read_regular,
    safe_relpath,
    write_atomic,
)
from fluffy.kernel.merge.ingest import MAX_FILE_BYTES, ingest
from fluffy.kernel.merge.merger import (
    MAX_AUTO_LINES,
    MergeIssue,
    MergePlan,
    Merger,
    MergeResult,
)
from fluffy.kernel.merge.oplog import MergeOperation, MergeStep, StepResult, pending
from fluffy.kernel.merge.patch import (
    FilePatch,
    Hunk,
    apply_patch,
    count_diff_lines,
    parse_patch,
    parse_single,
    unified_diff,
)
from fluffy.kernel.merge.staging import StagedChange, Staging

__all__ = [
    "DEFAULT_PROTECTED",
    "DEFAULT_SENSITIVE",
    "MAX_AUTO_LINES",
    "MAX_FILE_BYTES",
    "FilePatch",
    "Hunk",
    "MergeIssue",
    "MergeOperation",
    "MergePlan",
    "MergeResult",
    "MergeStep",
    "Merger",
    "ProtectedPaths",
    "StagedChange",
    "Staging",
    "StepResult",
    "apply_patch",
    "count_diff_lines",
    "ingest",
    "parse_patch",
    "parse_single",
    "pending",
    "read_existing",
    "read_regular",
    "safe_relpath",
    "unified_diff",
    "write_atomic",
]
