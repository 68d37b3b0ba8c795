"""What a one-shot task landed: one honest line, and the command's exit code.

"Done." only says the model's turn ended.  A person running `fluffy "task"` (or a script
around it) needs to know whether the change is in the project: merged, and committed
where the workflow commits.  :class:`Tally` watches the events as they are rendered;
:func:`outcome` reads it with the session's final state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fluffy.cli.events import Ended, Shown
from fluffy.ipc.results.events import ChangesMerged, Committed, ToolFinished

WRITES = frozenset({"fs.write", "fs.edit", "fs.delete"})
#: Why a change did not land, by the state the session stopped in.
_WHY = {
    "planning": "the plan was not completed, so nothing was written",
    "test_writing": "no failing test was recorded yet (tests come first), so no code was written",
    "code_writing": "the tests did not pass; the change is staged, not merged",
    "validating": "no green run of the whole suite on the change as it now stands; the "
    "change is staged, not merged",
    "reviewing": "the change waits for a review; nothing was merged",
    "committing": "the change was merged but not committed",
    "retroactive_testing": "tests for the change are still missing; nothing was merged",
    "exploring": "the change is staged, not merged",
}


@dataclass
class Tally:
    """Passes each event on to ``inner`` and notes merges and commits."""

    inner: Any
    merged: list[str] = field(default_factory=list)
    commits: list[str] = field(default_factory=list)
    #: merged files a commit left out (they overlap the person's uncommitted lines)
    left_out: list[str] = field(default_factory=list)
    writes: int = 0  # writes that staged a change in this turn

    def render(self, event: Shown) -> None:
        if isinstance(event, ToolFinished) and event.ok and event.tool_name in WRITES:
            self.writes += 1
        if isinstance(event, ChangesMerged):
            self.merged += event.paths
        elif isinstance(event, Committed):
            if event.sha:
                self.commits.append(event.sha)
            self.left_out += event.left_out or []
        self.inner.render(event)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@dataclass(frozen=True)
class Outcome:
    landed: bool
    line: str
    state: str
    commit: str | None
    #: merged files the commit left to the person (in their working tree, not committed)
    left_out: tuple[str, ...] = ()

    def event(self) -> dict[str, Any]:
        return {"type": "summary", "landed": self.landed, "text": self.line,
                "state": self.state, "commit": self.commit,
                "left_out": list(self.left_out)}  # fmt: skip


def outcome(end: Ended, state: str, tally: Tally) -> Outcome:
    """Whether the task's change landed, and the line that says so."""
    status = end.status
    commit = tally.commits[-1] if tally.commits else None
    done = f"committed {commit[:12]}" if commit else ""
    if status in ("failed", "cancelled", "quarantined"):
        word = {"failed": "the turn failed", "cancelled": "the task was cancelled",
                "quarantined": "the session was quarantined"}[status]  # fmt: skip
        return Outcome(False, f"Not landed: {word}" + (f" after it {done}" if done else ""),
                       state, commit)  # fmt: skip
    kept = ""
    if tally.left_out:
        kept = (
            f"{', '.join(tally.left_out)} merged into your working tree but not committed "
            "(the notes above say why; commit them yourself)"
        )
    if state == "idle" and (commit or kept):
        line = f"Landed: {'; '.join(filter(None, (done, kept)))}."
        return Outcome(True, line, state, commit, tuple(tally.left_out))
    if not tally.writes and not tally.merged and not commit and status != "waiting_review":
        return Outcome(True, "No change was made.", state, None)
    why = _WHY.get(state, f"the session stopped in {state}")
    if status == "waiting_review":
        why = _WHY["reviewing"] if state == "reviewing" else "a call waits for your answer"
    head = f"Not landed: {why}"
    if done:
        head += f" (an earlier change was {done})"
    return Outcome(False, head + ".", state, commit)
