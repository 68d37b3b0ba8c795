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

from fluffy.cli.session_view import Renderer, error_fields
from fluffy.errors import FluffyError

WAIT_MS = 1000
OnReview = Callable[[dict[str, Any]], str | None]


def ended(status: str, *, turn_id: str | None = None, **extra: Any) -> dict[str, Any]:
    """A turn_end made up by the CLI (it stopped following): marked ``synthetic``."""
    return {
        "type": "turn_end",
        "turn_id": turn_id,
        "status": status,
        "text": "",
        "error": None,
        "synthetic": True,
        **extra,
    }


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
    kernel_decides: bool = False,
    wait_ms: int = WAIT_MS,
) -> dict[str, Any]:
    """Render the events after ``after`` until the turn ends; return its turn_end event.

    With ``turn_id``, events before that turn's turn_start are skipped (a stale cursor
    never replays an older turn).  A turn_end "waiting_review" right after a review this
    call (or the caller: ``review_decided``) already decided is not the end: the kernel
    goes on with the same turn.  The returned event carries ``next``: the ``after`` for
    the next call (where the stream stood).  ``kernel_decides``: the turn was started
    with ``auto_approve`` (--yes), so the kernel approves reviews itself, as far as policy
    lets it; they are shown, not asked about.
    """
    started = turn_id is None
    decided = review_decided  # the latest review that needed a person was answered
    try:
        while True:
            page = client.call(
                "session.events",
                {"session_id": session_id, "after": after, "wait_ms": wait_ms},
            )
            events: list[dict[str, Any]] = list(page.get("events") or [])
            position = int(page.get("next", after))
            for event in events:
                kind = event.get("type")
                if not started:
                    started = kind == "turn_start" and event.get("turn_id") == turn_id
                    if not started:
                        continue
                if kind == "turn_end" and event.get("status") == "waiting_review" and decided:
                    continue
                renderer.render(event)
                # the kernel says whether it decides (--yes, no policy review); else ask
                kernel_takes = event.get("kernel_decides", kernel_decides)
                asks = kind in ("review", "exemption", "tool_review")
                if asks and not event.get("auto") and not kernel_takes:
                    decided = False
                    outcome = _decide(client, session_id, event, renderer, on_review, position)
                    if outcome is not None:
                        return outcome
                    decided = True
                elif kind == "turn_end":
                    return {**event, "next": position}
            after = position
            if not events and not page.get("running", False):
                return ended("idle", turn_id=turn_id, next=after)  # nothing runs, nothing came
    except KeyboardInterrupt:
        return _cancel(client, session_id, renderer, turn_id, after)


def _decide(
    client: Any,
    session_id: str,
    review: dict[str, Any],
    renderer: Renderer,
    on_review: OnReview,
    position: int,
) -> dict[str, Any] | None:
    """Ask, and pass the answer on; a turn_end to return when the review stays open."""
    plan_id = review.get("plan_id")
    decision = on_review(review)
    if review.get("type") == "tool_review":  # a call policy holds (an MCP tool, ADR-046)
        return _decide_call(client, session_id, review, renderer, decision, position)
    if review.get("type") == "exemption":  # the AI's request: the user grants or refuses
        shown = str(review.get("request_id") or "")  # the decision names what was shown
        if decision not in ("approve", "reject"):
            end = ended("waiting_review", next=position, exemption=True, request_id=shown)
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
    if decision not in ("approve", "reject", "add_tests"):
        end = ended("waiting_review", plan_id=plan_id, next=position)
        if review.get("can_add_tests"):
            end["can_add_tests"] = True
        renderer.render(end)
        return end
    try:
        client.call(f"review.{decision}", {"session_id": session_id, "plan_id": plan_id})
    except FluffyError as exc:  # e.g. policy does not let this change be accepted
        return _refused(renderer, exc, plan_id=plan_id, next=position)
    return None


def _refused(renderer: Renderer, exc: FluffyError, **end: Any) -> dict[str, Any]:
    """The kernel refused the person's answer: say why; the review stays open."""
    renderer.render({"type": "notice", "level": "error", **_error(exc)})
    waiting = ended("waiting_review", error=_error(exc), **end)
    renderer.render(waiting)
    return waiting


#: How the person's answer on a held tool call is said to the kernel (tool.decide).
CALL_ANSWERS = {"approve": "allow", "approve_session": "allow_session", "reject": "deny"}


def _decide_call(
    client: Any,
    session_id: str,
    review: dict[str, Any],
    renderer: Renderer,
    decision: str | None,
    position: int,
) -> dict[str, Any] | None:
    shown = str(review.get("review_id") or "")
    if decision not in CALL_ANSWERS:
        # the next reader starts right after this event: what follows it on the page
        # (another call's result) is shown then, not lost
        after = int(review.get("seq") or position)
        end = ended("waiting_review", next=after, tool_review=shown, tool=review.get("tool"))
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
) -> dict[str, Any]:
    error: dict[str, Any] | None = None
    try:
        client.call("session.cancel", {"session_id": session_id})
    except (FluffyError, OSError) as exc:
        error = {"what": f"the turn could not be cancelled: {exc}", "why": "", "fix": ""}
        if isinstance(exc, FluffyError):
            error = {**_error(exc), "what": f"the turn could not be cancelled: {exc.what}"}
    end = ended("cancelled", turn_id=turn_id, next=position, error=error)
    renderer.render(end)
    return end


def _error(exc: FluffyError) -> dict[str, Any]:
    return error_fields(exc)
