"""A model response's tool calls, run for a turn of the session loop.

The calls of one response are submitted together through the tool router -- in parallel
where their paths allow, each after the earlier calls it conflicts with -- at the turn's
priority.  Each is shown to the user as ``tool_executing`` / ``tool_result``; every call
gets its result in the conversation, even a cancelled turn's.  Refusals that count
(policy, state, paths out of bounds) add up to the session's quarantine.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

import msgspec

from fluffy.errors import CallCancelled, FluffyError, Quarantined
from fluffy.ipc.ai_types import Message, ToolCall
from fluffy.ipc.results.events import (
    CallFailure,
    Committed,
    SessionQuarantined,
    ToolFinished,
    ToolStarted,
)
from fluffy.kernel.ai.bounds import OMITTED, TOO_LARGE, needs_summary, summarised
from fluffy.kernel.ai.narrate import describe_call, summarize_result
from fluffy.kernel.ai.turn import Turn
from fluffy.kernel.tools.core.routedcall import TURN_PRIORITY

if TYPE_CHECKING:
    from fluffy.kernel.ai.host import TurnHost
    from fluffy.kernel.tools.routing.router import ToolRouter
    from fluffy.kernel.workflow.machine import Workflow

DENIAL_CODES = frozenset({"tool.unavailable", "policy.denied", "policy.invalid", "ai.quarantined"})
#: A tool result in the conversation is at most this long (the router already truncated
#: it to its token budget; this bounds the JSON wrapping).
RESULT_CHARS = 40_000


class TurnCalls:
    """Runs a turn's tool calls through ``router``, for ``loop`` (its events, the
    conversation and the session's refusal count: kernel/ai/host.py)."""

    def __init__(self, loop: TurnHost, router: ToolRouter, workflow: Workflow) -> None:
        self.loop = loop
        self.router = router
        self.workflow = workflow

    async def run(self, turn: Turn, calls: list[ToolCall]) -> bool:
        """Run one response's calls; True when the turn must stop (quarantine)."""
        sid = turn.session_id
        tools = [call.name for call in calls]
        planned, changes = self.router.plan(tools, [call.arguments for call in calls])
        answers: list[dict[str, Any]] = [{} for _ in calls]

        async def one(i: int) -> dict[str, Any]:
            answers[i] = await self._one(turn, calls[i])
            return answers[i]

        async def refuse(i: int, error: FluffyError) -> dict[str, Any]:
            answers[i] = await self.router.refused(sid, tools[i], calls[i].arguments, error)
            await self.loop.emit(
                turn,
                ToolFinished(
                    call_id=calls[i].id,
                    tool_name=tools[i],
                    ok=False,
                    summary=error.what,
                    duration_ms=0.0,
                    error=short_error(answers[i].get("error")),
                ),
            )
            return answers[i]

        try:
            done = await self.router.ordered(
                planned, tools, changes, one, refuse, priority=TURN_PRIORITY
            )
            for i, answer in enumerate(done):
                answers[i] = answer
        finally:
            # every call gets its result, even a cancelled turn's: providers refuse a
            # conversation with a tool call left unanswered
            for i, answer in enumerate(answers):
                if not answer:
                    cancelled = CallCancelled("the call was cancelled before it finished")
                    answers[i] = {"ok": False, "error": cancelled.to_dict()}
            # a refused call's large arguments (or any call's huge ones) are not sent back
            # with every later request: a summary stands in for them (ADR-054)
            kept = {
                call.id: summarised(call, _why_not_kept(answer))
                for call, answer in zip(calls, answers, strict=True)
                if needs_summary(call, refused=not answer.get("ok"))
            }
            results_messages = [
                Message(
                    role="tool",
                    content=tool_content(answer, kept.get(call.id)),
                    tool_call_id=call.id,
                    name=call.name,
                )
                for call, answer in zip(calls, answers, strict=True)
            ]
            if kept:
                await asyncio.shield(self.loop.memory.store.replace_calls(sid, kept))
            await asyncio.shield(self.loop.memory.append(sid, results_messages))
        session = await self.workflow.get(sid)
        if session.data.quarantined:
            turn.status = "quarantined"
            return True
        for call, answer in zip(calls, answers, strict=True):
            await self._after(turn, call, answer)
        return False

    async def _one(self, turn: Turn, call: ToolCall) -> dict[str, Any]:
        sid = turn.session_id
        before = (await self.workflow.get(sid)).state
        description = describe_call(call.name, call.arguments)
        await self.loop.emit(
            turn, ToolStarted(call_id=call.id, tool_name=call.name, description=description)
        )
        started = time.perf_counter()
        answer = await self._execute(turn, call)
        duration = (time.perf_counter() - started) * 1000
        error = answer.get("error") if not answer.get("ok") else None
        await self.loop.emit(
            turn,
            ToolFinished(
                call_id=call.id,
                tool_name=call.name,
                ok=bool(answer.get("ok")),
                summary=summarize_result(call.name, call.arguments, answer),
                duration_ms=round(duration, 2),
                error=short_error(error) if error else None,
            ),
        )
        await self.loop.emit_steps(turn, before, answer)
        if error and is_denial(error):
            await self._denied(turn)
        return answer

    async def _execute(self, turn: Turn, call: ToolCall) -> dict[str, Any]:
        sid = turn.session_id
        if call.invalid_arguments is not None:
            error = {
                "code": "tool.input_invalid",
                "what": f"{call.name}: the arguments are not a JSON object",
                "why": call.invalid_arguments[:200],
                "fix": "Call the tool again with a JSON object of its parameters.",
            }
            return {"ok": False, "error": error, "tool": call.name}
        session = await self.workflow.get(sid)
        if session.data.quarantined:
            spec = self.router.spec(call.name)
            if spec is None or spec.kind != "read":
                exc = Quarantined(f"{call.name} refused: the session is quarantined (read-only)")
                return {"ok": False, "error": exc.to_dict(), "tool": call.name}
        return await self.router.call(
            sid, call.name, call.arguments, call_id=call.id, priority=TURN_PRIORITY
        )

    async def _denied(self, turn: Turn) -> None:
        sid = turn.session_id
        count = self.loop.denials.get(sid, 0) + 1
        self.loop.denials[sid] = count
        session = await self.workflow.get(sid)
        if count < self.loop.quarantine_after or session.data.quarantined:
            return
        reason = f"{count} tool calls were refused in this session"
        await self.workflow.annotate(sid, "quarantined", quarantined=reason)
        await self.loop.note_audit(sid, f"session quarantined: {reason}", {"denials": str(count)})
        await self.loop.emit(turn, SessionQuarantined(denials=count, reason=reason))

    async def _after(self, turn: Turn, call: ToolCall, answer: dict[str, Any]) -> None:
        """Reviews and commits that a call brought about."""
        if not answer.get("ok"):
            return
        output = answer.get("output")
        if not isinstance(output, dict):
            return
        if call.name == "git.commit":
            message = str(call.arguments.get("message", ""))  # required by its schema
            # the person's lines kept out of it, and why (sent only when there are some)
            event = Committed(
                sha=output.get("commit"),
                message=message,
                left_out=output.get("left_out") or msgspec.UNSET,
                notes=output.get("notes") or msgspec.UNSET,
            )
            await self.loop.emit(turn, event)
        review = output.get("review")
        if call.name == "test.run" and isinstance(review, dict):
            await self.loop.decisions.review(turn, review)
        if call.name == "workflow.request_exemption" and output.get("held_for_review"):
            await self.loop.decisions.exemption(turn, output)


def is_denial(error: dict[str, Any]) -> bool:
    """Refusals that count toward quarantine: policy, state, and paths out of bounds."""
    code = str(error.get("code"))
    if code in DENIAL_CODES:
        return True
    text = f"{error.get('what', '')} {error.get('why', '')}"
    return code == "tool.input_invalid" and ("outside the project" in text or ".." in text)


def short_error(error: Any) -> CallFailure:
    if not isinstance(error, dict):
        return CallFailure(what=str(error), why="", fix="")
    # "error" is the design's ToolUnavailableError tag ("tool_unavailable") where there is one
    return CallFailure(
        code=error.get("code", ""),
        error=error.get("error", ""),
        what=error.get("what", ""),
        why=error.get("why", ""),
        fix=error.get("fix", ""),
    )


def _why_not_kept(answer: dict[str, Any]) -> str:
    if answer.get("ok"):
        return TOO_LARGE
    error = answer.get("error")
    what = error.get("what") if isinstance(error, dict) else error
    return f"the call was refused: {str(what or 'no reason given')[:300]}"


def tool_content(answer: dict[str, Any], summary: ToolCall | None = None) -> str:
    """The call's result as the model reads it; ``summary``: its arguments are no longer
    in the conversation (the summary stands in for them), and the model is told so."""
    body: dict[str, Any] = {}
    if summary is not None:
        body["arguments_not_kept"] = {
            **summary.arguments[OMITTED],
            "note": "these arguments are not in the conversation any more: a summary "
            "stands in for them; do not send them again as they were",
        }
    body.update({k: answer[k] for k in ("ok", "output", "error", "session") if answer.get(k)})
    text = json.dumps(body, ensure_ascii=False, default=str)
    if len(text) > RESULT_CHARS:
        text = text[: RESULT_CHARS // 2] + " ...[cut]... " + text[-RESULT_CHARS // 2 :]
    return text
