"""A one-shot task says in one line whether its change landed, and exits by it (issue 32)."""

from __future__ import annotations

from typing import Any

import pytest

from fluffy.cli.events import Ended, Shown
from fluffy.cli.outcome import Tally, outcome
from unit.cli_fakes import shown


class _Seen:
    def __init__(self) -> None:
        self.events: list[Shown] = []

    def render(self, event: Shown) -> None:
        self.events.append(event)


def _tally(*events: dict[str, Any]) -> Tally:
    tally = Tally(_Seen())
    given = [shown(event) for event in events]  # as the CLI reads them
    for event in given:
        tally.render(event)
    assert tally.inner.events == given  # every event still reaches the renderer
    return tally


def _end(event: dict[str, Any]) -> Ended:
    """Where following the turn stopped, with ``event``'s status."""
    return Ended(status=event["status"], next=0)


WRITE = {"type": "tool_result", "tool_name": "fs.write", "ok": True}
REFUSED = {"type": "tool_result", "tool_name": "fs.write", "ok": False}
MERGED = {"type": "merged", "paths": ["calc.py"]}
COMMIT = {"type": "commit", "sha": "4b1b1a057113aaaa", "message": "Add"}
PART = {**COMMIT, "left_out": ["calc.py"], "notes": ["calc.py was left out"]}
NONE = {"type": "commit", "sha": None, "message": "Add", "left_out": ["calc.py"]}
DONE = {"type": "turn_end", "status": "done"}


@pytest.mark.parametrize(
    ("events", "end", "state", "landed", "says"),
    [
        ((WRITE, MERGED, COMMIT), DONE, "idle", True, "Landed: committed 4b1b1a057113"),
        ((WRITE, MERGED, PART), DONE, "idle", True, "committed 4b1b1a057113; calc.py merged into "
         "your working tree but not committed"),
        ((WRITE, MERGED, NONE), DONE, "idle", True, "Landed: calc.py merged into your working "
         "tree but not committed (the notes above say why"),
        ((), DONE, "planning", True, "No change was made"),  # a question, answered
        ((REFUSED,), DONE, "test_writing", True, "No change was made"),
        ((WRITE,), DONE, "code_writing", False, "the tests did not pass"),
        ((WRITE,), {"status": "waiting_review"}, "reviewing", False, "waits for a review"),
        ((WRITE, MERGED), DONE, "committing", False, "merged but not committed"),
        ((WRITE, MERGED, COMMIT, WRITE), DONE, "code_writing", False, "an earlier change"),
        ((WRITE,), {"status": "failed"}, "code_writing", False, "the turn failed"),
        ((WRITE, MERGED, COMMIT), {"status": "cancelled"}, "idle", False, "cancelled after"),
    ],
)  # fmt: skip
def test_the_line_and_the_exit_say_what_landed(
    events: tuple[dict[str, Any], ...], end: dict[str, Any], state: str, landed: bool, says: str
) -> None:
    result = outcome(_end(end), state, _tally(*events))
    assert result.landed is landed and says in result.line, result.line
    summary = result.event()
    assert summary["type"] == "summary" and summary["landed"] is landed
    assert summary["text"] == result.line and summary["state"] == state


def test_the_json_summary_names_the_files_left_to_the_person() -> None:
    done = _end(DONE)
    assert outcome(done, "idle", _tally(WRITE, MERGED, PART)).event()["left_out"] == ["calc.py"]
    assert outcome(done, "idle", _tally(WRITE, MERGED, COMMIT)).event()["left_out"] == []
