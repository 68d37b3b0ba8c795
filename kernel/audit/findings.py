"""What verifying the audit chain found: the report, and the first problem located.

A :class:`Problem` is one of these kinds:

``modified``     an entry's content no longer matches its hash (or was re-hashed)
``deleted``      entries are missing from the middle (a sequence gap or renumbering)
``inserted``     an entry that was never chained sits between two entries
``reordered``    an entry sits at the wrong place in the chain
``truncated``    the newest entries were deleted
``rolled_back``  an older copy of the database was restored
``replaced``     the database is not the chain the checkpoint witnessed
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from fluffy.kernel.audit.store import Head

Kind = Literal[
    "modified", "deleted", "inserted", "reordered", "truncated", "rolled_back", "replaced"
]


class Problem(msgspec.Struct, frozen=True):
    kind: Kind
    seq: int | None
    file: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "id": self.seq, "file": self.file, "detail": self.detail}


class Report(msgspec.Struct):
    ok: bool = True
    entries: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    head: Head | None = None
    checkpoint: Head | None = None
    witness: Head | None = None
    files: list[str] = msgspec.field(default_factory=list)
    problem: Problem | None = None
    breaks: list[dict[str, Any]] = msgspec.field(default_factory=list)
    warnings: list[str] = msgspec.field(default_factory=list)
    #: entries after the witnessed head (first, last): the witness has not seen them
    unwitnessed: tuple[int, int] | None = None
    seconds: float = 0.0

    def fail(self, problem: Problem) -> None:
        if self.problem is None:
            self.problem = problem
        self.ok = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "entries": self.entries,
            "first_id": self.first_seq,
            "last_id": self.last_seq,
            "head": self.head.to_dict() if self.head else None,
            "checkpoint": self.checkpoint.to_dict() if self.checkpoint else None,
            "witness": self.witness.to_dict() if self.witness else None,
            "files": self.files,
            "problem": self.problem.to_dict() if self.problem else None,
            "recorded_breaks": self.breaks,
            "warnings": self.warnings,
            "unwitnessed": None
            if self.unwitnessed is None
            else {
                "first_id": self.unwitnessed[0],
                "last_id": self.unwitnessed[1],
                "count": self.unwitnessed[1] - self.unwitnessed[0] + 1,
            },
            "seconds": round(self.seconds, 3),
        }
