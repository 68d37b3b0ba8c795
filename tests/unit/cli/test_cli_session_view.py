"""The session's events rendered as the design's interactive output (and as JSON lines)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from rich.console import Console

from fluffy.cli.diffview import split_diff
from fluffy.cli.events import Ended, Problem, Refusal, Shown
from fluffy.cli.session_view import (
    JsonRenderer,
    SessionRenderer,
    duration,
    error_fields,
    status_line,
)
from fluffy.errors import FluffyError, ModeDenied
from fluffy.ipc.client import raise_error
from fluffy.ipc.protocol import error_body
from unit.cli_fakes import complete, shown

pytestmark = pytest.mark.unit

TASK = "Add error handling to parseConfig"
REFUSAL = {
    "what": "Cannot modify source code",
    "why": "Workflow state is 'test_writing' - tests must be written first",
    "fix": "Write tests for the target functionality first",
}
EVENTS: list[dict[str, Any]] = [
    {"seq": 1, "type": "turn_start", "turn_id": "t1", "text": TASK},
    {"seq": 2, "type": "state", "from": "idle", "to": "planning", "mode": "strict"},
    {"seq": 3, "type": "tool_executing", "call_id": "c1", "tool_name": "fs.read",
     "description": "Reading /src/utils.py"},
    {"seq": 4, "type": "tool_result", "call_id": "c1", "tool_name": "fs.read", "ok": True,
     "summary": "Read 85 lines", "duration_ms": 3, "error": None},
    {"seq": 5, "type": "text_delta", "content": "I'll write tests "},
    {"seq": 6, "type": "text_delta", "content": "for the error handling first."},
    {"seq": 7, "type": "tool_executing", "call_id": "c2", "tool_name": "test.run",
     "description": "Running tests/test_utils.py"},
    {"seq": 8, "type": "tool_executing", "call_id": "c3", "tool_name": "fs.write",
     "description": "Writing src/utils.py"},
    {"seq": 9, "type": "tool_result", "call_id": "c3", "tool_name": "fs.write", "ok": False,
     "summary": "Cannot modify source code", "duration_ms": 12, "error": REFUSAL},
    {"seq": 10, "type": "tool_result", "call_id": "c2", "tool_name": "test.run", "ok": True,
     "summary": "1 failed (expected: parseConfig raises)", "duration_ms": 1234, "error": None},
    {"seq": 11, "type": "merged", "files": 2, "paths": ["src/utils.py", "tests/test_utils.py"],
     "auto": True,
     "reason": "tests pass, no sensitive files, 54 lines changed"},
    {"seq": 12, "type": "commit", "sha": "0123456789abcdef", "message": TASK},
    {"seq": 13, "type": "turn_end", "turn_id": "t1", "status": "done",
     "text": "Added error handling to parseConfig with tests.", "error": None},
]  # fmt: skip


def render(events: list[dict[str, Any] | Shown], **kwargs: Any) -> str:
    """The events (a dict: as the CLI reads it off the wire) as the person sees them."""
    console = Console(record=True, width=100, file=io.StringIO())
    renderer = SessionRenderer(console, **kwargs)
    for event in events:
        renderer.render(shown(event) if isinstance(event, dict) else event)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines())


def test_a_turn_reads_like_the_design() -> None:
    text = render(EVENTS)
    expected = f"""You: {TASK}

  state: idle -> planning (strict mode)
  Reading /src/utils.py... (3ms)
  Read 85 lines

AI: I'll write tests for the error handling first.

  Writing src/utils.py... (12ms)
  ERROR: Cannot modify source code
  Reason: Workflow state is 'test_writing' - tests must be written first
  Fix: Write tests for the target functionality first

  Running tests/test_utils.py... (1.2s)
  1 failed (expected: parseConfig raises)

  Merging changes...
  Auto-approved: tests pass, no sensitive files, 54 lines changed

  Committing: "{TASK}" 0123456789ab

Done. Added error handling to parseConfig with tests.
"""
    assert text.strip() == expected.strip()


def test_streamed_final_text_is_not_repeated_after_done() -> None:
    final = "All done here."
    events = [
        EVENTS[0],
        {"type": "text_delta", "content": "All done "},
        {"type": "text_delta", "content": "here."},
        {"type": "turn_end", "status": "done", "text": final, "error": None},
    ]
    lines = render(events).splitlines()
    assert "AI: All done here." in lines
    assert "Done." in lines and f"Done. {final}" not in lines


def test_markup_in_model_text_is_printed_literally() -> None:
    text = render([{"type": "text_delta", "content": "[bold]x[/bold] and [red]"}])
    assert "AI: [bold]x[/bold] and [red]" in text


def test_review_shows_each_file_with_a_truncated_diff() -> None:
    body = "\n".join(f"+line {n}" for n in range(30))
    diff = (
        "--- a/src/a.py\n+++ b/src/a.py\n@@ -1 +1,30 @@\n-old\n" + body + "\n"
        "--- /dev/null\n+++ b/tests/test_a.py\n@@ -0,0 +1 @@\n+def test_a(): pass\n"
    )
    review = {
        "type": "review", "plan_id": "p1", "files": ["src/a.py", "tests/test_a.py"],
        "diff": diff, "lines": 32, "reasons": ["src/a.py is a sensitive path"], "auto": False,
    }  # fmt: skip
    text = render([review], diff_lines=10)
    assert "Review needed: 2 file(s), 32 line(s) changed" in text
    assert "- src/a.py is a sensitive path" in text
    assert "src/a.py +30 -1" in text and "tests/test_a.py +1 -0" in text
    assert "+line 5" in text and "+line 6" not in text  # 10 lines of that file's diff
    assert "24 more diff line(s) not shown" in text
    assert "+def test_a(): pass" in text


def test_auto_review_lists_files_without_diffs() -> None:
    review = {
        "type": "review", "plan_id": "p1", "lines": 3, "reasons": [], "auto": True,
        "files": ["a.py"], "diff": "--- a/a.py\n+++ b/a.py\n@@ -1 +1,2 @@\n-x\n+y\n+z",
    }  # fmt: skip
    text = render([review])
    assert "Review (auto-approved): 1 file(s)" in text and "a.py +2 -1" in text
    assert "+y" not in text


def test_split_diff_finds_files_and_counts() -> None:
    diff = "--- a/x.py\n+++ b/x.py\n@@\n-a\n+b\nBinary files a/i.png and b/i.png differ\n"
    parts = split_diff(diff)
    assert [(p.path, p.added, p.removed) for p in parts] == [
        ("x.py", 1, 1),
        ("Binary files a/i.png and b/i.png differ", 0, 0),
    ]


@pytest.mark.parametrize(
    ("status", "words"),
    [
        ("failed", "Failed."),
        ("cancelled", "Cancelled."),
        ("quarantined", "Stopped: the session is quarantined."),
        ("waiting_review", "Waiting for your review: /approve or /reject"),
    ],
)
def test_turn_ends_say_how_it_ended(status: str, words: str) -> None:
    error = {"what": "the provider failed", "why": "HTTP 500", "fix": "Retry."}
    text = render([{"type": "turn_end", "status": status, "text": "", "error": error}])
    assert words in text
    assert "ERROR: the provider failed" in text and "Reason: HTTP 500" in text


def test_an_explore_review_offers_add_tests() -> None:
    from unit.cli_fakes import REVIEW

    offered = render([{**REVIEW, "can_add_tests": True}])
    assert "/add-tests asks for tests before the merge" in offered
    assert "/add-tests" not in render([REVIEW])
    # the end the CLI makes up when it leaves the review waiting (fluffy/cli/turns.py)
    end = Ended(status="waiting_review", next=2, plan_id="plan-1")
    offered = Ended(status="waiting_review", next=2, plan_id="plan-1", can_add_tests=True)
    assert "(or /add-tests)" in render([offered])
    assert "/add-tests" not in render([end])


def test_quarantine_and_notices() -> None:
    text = render(
        [
            {"type": "quarantine", "denials": 3, "reason": "three denied writes"},
            {"type": "notice", "level": "warn", "what": "budget low", "why": "-2.1", "fix": ""},
            Refusal(what="w", why="y", fix="f", code="review.refused"),  # the CLI's own
        ]
    )
    assert "QUARANTINED: the session is read-only (3 denials): three denied writes" in text
    assert "/unquarantine" in text
    assert "WARN: budget low (-2.1)" in text
    assert "ERROR: w\nReason: y\nFix: f" in text


def test_an_event_of_a_kind_this_cli_does_not_know_is_not_shown_but_printed_as_json() -> None:
    # a newer kernel's: the person reads nothing about it, a script gets it as it came
    future = {"seq": 2, "type": "future_thing", "x": 1}
    text = render([{"type": "notice", "level": "info", "what": "before"}, future])
    assert text.strip() == "before"
    lines: list[str] = []
    JsonRenderer(lines.append).render(shown(future))
    assert [json.loads(line) for line in lines] == [future]


def test_durations_and_status_line() -> None:
    assert [duration(v) for v in (3, 999, 1000, 1234, None)] == [
        "3ms",
        "999ms",
        "1.0s",
        "1.2s",
        "?",
    ]
    assert status_line("strict", "idle") == "[strict] [idle] > "


def test_json_renderer_prints_one_object_per_line() -> None:
    lines: list[str] = []
    renderer = JsonRenderer(lines.append)
    for event in EVENTS:
        renderer.render(shown(event))
    assert [json.loads(line) for line in lines] == [complete(event) for event in EVENTS]


def test_errors_from_the_socket_are_unpacked_into_what_why_fix() -> None:
    sent = ModeDenied("mode explore refused", why="no rule allowed it", fix="Edit policy.yaml.")
    with pytest.raises(FluffyError) as received:
        raise_error(error_body(sent))  # what the client raises for the kernel's answer
    assert error_fields(received.value) == Problem(
        what="mode explore refused",
        why="no rule allowed it",
        fix="Edit policy.yaml.",
        code="workflow.mode_denied",
    )
    local = ModeDenied("a (local) error (kept whole)")
    assert error_fields(local).what == "a (local) error (kept whole)"


def test_an_error_whose_why_holds_parentheses_is_shown_as_the_kernel_split_it() -> None:
    """A merge refusal's why is two diffs (code: ``function slug (type) {``), and its
    class needs more than what/why/fix to be rebuilt: the parts are kept as they came."""
    from fluffy.errors import MergeOverlap

    why = "your change:\n+function slug (type) {\n+}\nthe session's change:\n+x"
    sent = MergeOverlap("nothing was merged: a.js overlaps", paths=["a.js"], why=why)
    with pytest.raises(FluffyError) as received:
        raise_error(error_body(sent))
    shown = error_fields(received.value)
    assert (shown.what, shown.why) == ("nothing was merged: a.js overlaps", why)
    assert shown.code == sent.code


def test_the_ais_exemption_request_is_shown_with_its_id() -> None:
    from unit.cli_fakes import EXEMPTION

    out = render([{"seq": 1, **EXEMPTION}])
    assert "The AI asks for a TDD exemption: documentation for README.md" in out
    assert "reason: a typo" in out
    assert "request: ex-0123456789abcdef" in out  # what /approve decides on


def test_a_retry_says_why_and_how_long_it_waits() -> None:
    text = render(
        [
            {"type": "text_delta", "content": "Half an ans"},
            {"type": "retry", "text": "rate limited, retrying in 4 s (attempt 2 of 5)",
             "why": "api.openai.com answered 429", "restart": True},
            {"type": "retry", "text": "the provider is overloaded, retrying in 1 s "
             "(attempt 3 of 5)", "why": "", "restart": False},
        ]
    )  # fmt: skip
    lines = text.splitlines()
    assert lines[0] == "AI: Half an ans"
    assert (
        "  rate limited, retrying in 4 s (attempt 2 of 5) -- the answer above was cut off "
        "and starts again" in lines
    )
    assert "  api.openai.com answered 429" in lines
    assert "  the provider is overloaded, retrying in 1 s (attempt 3 of 5)" in lines


def test_what_a_commit_left_to_the_person_is_said() -> None:
    note = "src/a.py was left out of the commit: the session's change there overlaps [b]"
    text = render([{"type": "commit", "sha": None, "message": "m", "notes": [note]}])
    assert f"Note: {note}" in " ".join(text.split())  # markup-like text stays literal
    assert "Committing" not in text  # there is no commit
