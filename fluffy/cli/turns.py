"""Follow one AI turn: long-poll ``session.events`` and render until the turn ends.

The kernel runs the turn in the background (``session.message`` returns at once); the
CLI only reads the event stream, so leaving or losing the CLI never stops the kernel's
bookkeeping.  A review that waits for a person is handed to ``on_review``, which answers
"approve", "reject", "add_tests" (an explore change: tests before the merge), or None
(leave it waiting: ``fluffy`` then /approve decides later).
Ctrl-C cancels the turn in the kernel (``session.cancel``) rather than abandoning it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from fluffy.cli.events import Asked, Ended, Problem, Refusal, read
from fluffy.cli.session_view import Renderer, error_fields
from fluffy.errors import FluffyError
from fluffy.ipc.results.events import (
    ExemptionAsked,
    ReviewShown,
    ToolCallHeld,
    TurnEnded,
    TurnStarted,
)

WAIT_MS = 1000
OnReview = Callable[[Asked], str | None]


def cursor(client: Any, session_id: str) -> int:
    """Where the session's event stream stands now (so a new turn's events are all new).

    ``after: -1`` asks the kernel for the position without any event.
    """
    page = client.call("session.events", {"session_id": session_id, "after": -1, "wait_ms": 0})
    return int(page.get("next", 0))


def follow(
    client: Any,
    session_id: str,
    after: int,
    renderer: Renderer,
    *,
    on_review: OnReview,
    turn_id: str | None = None,
    review_decided: bool = False,
    wait_ms: int = WAIT_MS,
) -> Ended:
    """Render the events after ``after`` until the turn ends; return where it stopped.

    With ``turn_id``, events before that turn's turn_start are skipped (a stale cursor
    never replays an older turn).  A turn_end "waiting_review" right after a review this
    call (or the caller: ``review_decided``) already decided is not the end: the kernel
    goes on with the same turn.  The returned end carries ``next``: the ``after`` for
    the next call (where the stream stood).  A review the kernel decides itself
    (``kernel_decides``: the turn's ``auto_approve``, --yes, as far as policy lets it)
    is shown, not asked about.  An event this CLI cannot read goes to the renderer and
    is otherwise ignored (fluffy/cli/events.py).
    """
    started = turn_id is None
    decided = review_decided  # the latest review that needed a person was answered
    try:
        while True:
            page = client.call(
                "session.events",
                {"session_id": session_id, "after": after, "wait_ms": wait_ms},
            )
            events = [read(raw) for raw in page.get("events") or []]
            position = int(page.get("next", after))
            for event in events:
                if not started:
                    started = isinstance(event, TurnStarted) and event.turn_id == turn_id
                    if not started:
                        continue
                if isinstance(event, TurnEnded) and event.status == "waiting_review" and decided:
                    continue
                renderer.render(event)
                if isinstance(event, Asked) and asks(event):
                    decided = False
                    outcome = _decide(client, session_id, event, renderer, on_review, position)
                    if outcome is not None:
                        return outcome
                    decided = True
                elif isinstance(event, TurnEnded):
                    return _finished(event, position)
            after = position
            if not events and not page.get("running", False):
                # nothing runs, nothing came
                return Ended(status="idle", turn_id=turn_id, next=after)
    except KeyboardInterrupt:
        return _cancel(client, session_id, renderer, turn_id, after)


def asks(event: Asked) -> bool:
    """Whether the person is asked (the kernel decides with --yes, where policy lets it)."""
    return not event.kernel_decides and not (isinstance(event, ReviewShown) and event.auto)


def _finished(event: TurnEnded, position: int) -> Ended:
    """The kernel's turn_end, as where following stopped."""
    failure = event.error
    error = None
    if failure is not None:
        error = Problem(what=failure.what, why=failure.why, fix=failure.fix, code=failure.code)
    return Ended(
        status=event.status,
        next=position,
        turn_id=event.turn_id,
        text=event.text,
        error=error,
        synthetic=False,
    )


def _decide(
    client: Any,
    session_id: str,
    review: Asked,
    renderer: Renderer,
    on_review: OnReview,
    position: int,
) -> Ended | None:
    """Ask, and pass the answer on; the end to return when the review stays open."""
    decision = on_review(review)
    if isinstance(review, ToolCallHeld):  # a call policy holds (an MCP tool, ADR-046)
        return _decide_call(client, session_id, review, renderer, decision, position)
    if isinstance(review, ExemptionAsked):  # the AI's request: the user grants or refuses
        shown = review.request_id  # the decision names what was shown
        if decision not in ("approve", "reject"):
            end = Ended(status="waiting_review", next=position, exemption=True, request_id=shown)
            renderer.render(end)
            return end
        try:
            client.call(
                "workflow.decide_exemption",
                {"session_id": session_id, "grant": decision == "approve", "request_id": shown},
            )
        except FluffyError as exc:
            return _refused(renderer, exc, next=position)
        return None
    plan_id = review.plan_id
    if decision not in ("approve", "reject", "add_tests"):
        offered = True if review.can_add_tests else UNSET
        end = Ended(status="waiting_review", plan_id=plan_id, next=position, can_add_tests=offered)
        renderer.render(end)
        return end
    try:
        client.call(f"review.{decision}", {"session_id": session_id, "plan_id": plan_id})
    except FluffyError as exc:  # e.g. policy does not let this change be accepted
        return _refused(renderer, exc, plan_id=plan_id, next=position)
    return None


def _refused(
    renderer: Renderer, exc: FluffyError, *, next: int, plan_id: str | UnsetType = UNSET
) -> Ended:
    """The kernel refused the person's answer: say why; the review stays open."""
    error = error_fields(exc)
    renderer.render(Refusal(what=error.what, why=error.why, fix=error.fix, code=exc.code))
    waiting = Ended(status="waiting_review", error=error, next=next, plan_id=plan_id)
    renderer.render(waiting)
    return waiting


#: How the person's answer on a held tool call is said to the kernel (tool.decide).
CALL_ANSWERS = {"approve": "allow", "approve_session": "allow_session", "reject": "deny"}


def _decide_call(
    client: Any,
    session_id: str,
    review: ToolCallHeld,
    renderer: Renderer,
    decision: str | None,
    position: int,
) -> Ended | None:
    shown = review.review_id
    if decision not in CALL_ANSWERS:
        # the next reader starts right after this event: what follows it on the page
        # (another call's result) is shown then, not lost
        after = review.seq or position
        end = Ended(status="waiting_review", next=after, tool_review=shown, tool=review.tool)
        renderer.render(end)
        return end
    try:
        client.call(
            "tool.decide",
            {"session_id": session_id, "review_id": shown, "decision": CALL_ANSWERS[decision]},
        )
    except FluffyError as exc:
        return _refused(renderer, exc, next=position)
    return None


def _cancel(
    client: Any, session_id: str, renderer: Renderer, turn_id: str | None, position: int
) -> Ended:
    error: Problem | None = None
    try:
        client.call("session.cancel", {"session_id": session_id})
    except (FluffyError, OSError) as exc:
        error = Problem(what=f"the turn could not be cancelled: {exc}", why="", fix="")
        if isinstance(exc, FluffyError):
            what = f"the turn could not be cancelled: {exc.what}"
            error = msgspec.structs.replace(error_fields(exc), what=what)
    end = Ended(status="cancelled", turn_id=turn_id, next=position, error=error)
    renderer.render(end)
    return end
