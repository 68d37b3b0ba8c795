"""follow(): polling a turn's events, reviews decided or left waiting, Ctrl-C cancels."""

from __future__ import annotations

from typing import Any

import pytest

from fluffy.cli.events import Asked, Ended, plain
from fluffy.cli.turns import cursor, follow
from fluffy.errors import MergeRefused
from unit.cli_fakes import EXEMPTION, REVIEW, AsSent, FakeKernel, Seen, complete, turn

pytestmark = pytest.mark.unit


def never(event: Asked) -> str | None:
    raise AssertionError("no review should be asked about")


def start(kernel: FakeKernel) -> str:
    return str(kernel.call("session.create")["session_id"])


def test_follows_pages_until_turn_end_and_returns_it() -> None:
    delta = {"type": "text_delta", "content": "hi"}
    kernel = FakeKernel([turn("x", delta)[:2], [delta, turn("x")[-1]]])
    sid = start(kernel)
    seen = Seen()
    end = follow(kernel, sid, 0, seen, on_review=never, turn_id="t1", wait_ms=5)
    assert isinstance(end, Ended) and end.status == "done" and not end.synthetic
    assert end.next == 4  # the cursor for the next turn
    assert seen.types() == ["turn_start", "text_delta", "text_delta", "turn_end"]
    polls = kernel.methods("session.events")
    assert [p["after"] for p in polls] == [0, 2]  # each poll continues where the last ended


def test_events_of_an_older_turn_are_skipped() -> None:
    kernel = FakeKernel([turn("old"), turn("new")])
    sid = start(kernel)
    kernel.call("session.events", {"session_id": sid, "after": 0, "wait_ms": 5})  # old turn
    for event in kernel.log:
        event["turn_id"] = "t0"
    seen = Seen()
    end = follow(kernel, sid, 0, seen, on_review=never, turn_id="t1", wait_ms=5)
    assert end.turn_id == "t1"
    assert [e.get("text") for e in seen.events if e["type"] == "turn_start"] == ["new"]


def test_cursor_is_where_the_stream_stands() -> None:
    kernel = FakeKernel([turn("a")])
    sid = start(kernel)
    assert cursor(kernel, sid) == 0
    follow(kernel, sid, 0, Seen(), on_review=never, wait_ms=5)
    assert cursor(kernel, sid) == 2


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_a_review_is_decided_and_the_turn_goes_on(decision: str) -> None:
    waiting = {"type": "turn_end", "turn_id": "t1", "status": "waiting_review", "text": ""}
    rest = [{"type": "merged", "files": 1, "auto": False, "reason": "approved by the user"}]
    kernel = FakeKernel([[*turn("x")[:1], REVIEW, waiting], [*rest, turn("x")[-1]]])
    sid = start(kernel)
    asked: list[dict[str, Any]] = []

    def on_review(event: Asked) -> str | None:
        asked.append(plain(event))
        return decision

    seen = Seen()
    end = follow(kernel, sid, 0, seen, on_review=on_review, turn_id="t1", wait_ms=5)
    assert [e["plan_id"] for e in asked] == ["plan-1"]
    assert kernel.methods(f"review.{decision}") == [{"session_id": sid, "plan_id": "plan-1"}]
    assert end.status == "done"  # the waiting_review end after the decision was not the end
    assert "waiting_review" not in [e.get("status") for e in seen.events]
    assert seen.types()[-2:] == ["merged", "turn_end"]


def test_no_decision_leaves_the_review_waiting() -> None:
    kernel = FakeKernel([[*turn("x")[:1], REVIEW], turn("x")[-1:]])
    sid = start(kernel)
    seen = Seen()
    end = follow(kernel, sid, 0, seen, on_review=lambda e: None, turn_id="t1", wait_ms=5)
    assert end.status == "waiting_review" and end.plan_id == "plan-1"
    assert end.synthetic and end.next == 2
    assert not kernel.methods("review.approve") and not kernel.methods("review.reject")
    assert kernel.blocked  # the kernel still waits
    # later (/approve at the prompt): approve, then follow the rest from where we stopped
    kernel.call("review.approve", {"session_id": sid, "plan_id": "plan-1"})
    after = follow(kernel, sid, end.next, Seen(), on_review=never, review_decided=True, wait_ms=5)
    assert after.status == "done"


def test_a_refused_approval_leaves_it_waiting_and_shows_why() -> None:
    kernel = FakeKernel([[*turn("x")[:1], REVIEW], turn("x")[-1:]])
    kernel.approve_error = MergeRefused("src/app.py is protected")
    sid = start(kernel)
    seen = Seen()
    end = follow(kernel, sid, 0, seen, on_review=lambda e: "approve", turn_id="t1", wait_ms=5)
    assert end.status == "waiting_review"
    assert end.error is not None and end.error.what == "src/app.py is protected"
    notice = [e for e in seen.events if e["type"] == "notice"]
    assert notice and notice[0]["level"] == "error" and notice[0]["fix"]


def test_with_kernel_decides_reviews_are_shown_not_asked() -> None:
    # --yes: the turn was started with auto_approve; the kernel approves (policy permitting)
    kernel = FakeKernel([turn("x", {**REVIEW, "kernel_decides": True})])
    sid = start(kernel)
    seen = Seen()
    end = follow(kernel, sid, 0, seen, on_review=never, wait_ms=5)
    assert end.status == "done" and "review" in seen.types()
    assert not kernel.methods("review.approve")


def test_ctrl_c_cancels_the_turn_in_the_kernel() -> None:
    kernel = FakeKernel([turn("x")[:1], turn("x")[-1:]])
    kernel.interrupt_on_poll = 2
    sid = start(kernel)
    seen = Seen()
    end = follow(kernel, sid, 0, seen, on_review=never, turn_id="t1", wait_ms=5)
    assert kernel.methods("session.cancel") == [{"session_id": sid}]
    assert end.status == "cancelled" and end.next == 1 and end.error is None
    assert seen.types() == ["turn_start", "turn_end"]


def test_nothing_running_and_nothing_new_ends_the_follow() -> None:
    kernel = FakeKernel([])
    sid = start(kernel)
    end = follow(kernel, sid, 7, Seen(), on_review=never, wait_ms=5)
    assert end.status == "idle" and end.next == 7


@pytest.mark.parametrize(("answer", "grant"), [("approve", True), ("reject", False)])
def test_an_exemption_the_ai_asks_for_is_the_users_to_decide(answer: str, grant: bool) -> None:
    kernel = FakeKernel([[*turn("x")[:1], EXEMPTION], turn("x")[-1:]])
    sid = start(kernel)
    asked: list[dict[str, Any]] = []

    def on_review(event: Asked) -> str | None:
        asked.append(plain(event))
        return answer

    # the kernel never decides an exemption for you (kernel_decides is false, --yes or not)
    end = follow(kernel, sid, 0, Seen(), on_review=on_review, turn_id="t1", wait_ms=5)
    assert [e["type"] for e in asked] == ["exemption"]
    decided = {"session_id": sid, "grant": grant, "request_id": EXEMPTION["request_id"]}
    assert kernel.methods("workflow.decide_exemption") == [decided]  # the request shown
    assert not kernel.methods("review.approve") and end.status == "done"


def test_an_exemption_left_undecided_waits() -> None:
    kernel = FakeKernel([[*turn("x")[:1], EXEMPTION], turn("x")[-1:]])
    sid = start(kernel)
    end = follow(kernel, sid, 0, Seen(), on_review=lambda e: None, turn_id="t1", wait_ms=5)
    assert end.status == "waiting_review" and end.exemption is True
    assert end.request_id == EXEMPTION["request_id"]
    assert kernel.blocked and not kernel.methods("workflow.decide_exemption")


def test_what_a_newer_kernel_sends_is_read_as_far_as_this_cli_knows_it() -> None:
    # a kind this CLI does not know (one that even looks like a question), and known
    # kinds with fields it does not know, at the top and nested
    future = AsSent(type="future_question", kernel_decides=False, plan_id="p9")
    newer = AsSent(type="text_delta", content="hi", tone="warm")
    end = complete(turn("x")[-1])
    end["usage"]["reasoning_tokens"] = 7
    kernel = FakeKernel([[*turn("x")[:1], future, newer, AsSent({**end, "cost": 0.1})]])
    sid = start(kernel)
    seen = Seen()
    ended = follow(kernel, sid, 0, seen, on_review=never, turn_id="t1", wait_ms=5)
    assert ended.status == "done" and not ended.synthetic and ended.next == 4
    assert seen.types() == ["turn_start", "(unknown)", "text_delta", "turn_end"]
    assert seen.events[1]["raw"] == {"seq": 2, **future}  # passed on as it came
    assert seen.events[2] == {"type": "text_delta", "seq": 3, "content": "hi"}
    assert "cost" not in seen.events[3] and "reasoning_tokens" not in seen.events[3]["usage"]
    assert not kernel.methods("review.approve") and not kernel.methods("review.reject")
