"""The session loop: a user's message becomes model requests and tool calls, in the kernel.

A turn (``session.message``) runs in the background:

1. idle -> planning (the user's message); the message joins the conversation;
2. each round: the context (system prompt with the workflow state line, tool summaries,
   pins, summary of older turns, the recent window) goes to the ai-provider sandbox;
   its streamed text reaches the CLI as ``text_delta`` events;
3. the model's tool calls go through the tool router (policy, TDD availability, sandbox,
   sanitiser, audit) — in parallel where their paths allow; each is shown as
   ``tool_executing`` / ``tool_result`` with its end-to-end time;
4. real test results drive the guards (the router's test.run); in reviewing the turn
   either auto-merges, or waits for the user's ``review.approve`` / ``review.reject``
   (or approves at once when the user said ``--yes``); committing -> idle by git.commit;
5. a response without tool calls ends the turn.

Repeated refusals (policy denials and tools unavailable in the state, 5 by default)
quarantine the session: the turn ends, only read-only tools are offered and accepted
until the user lifts it; both are recorded in the audit log (a run-level quarantine).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from fluffy.errors import (
    ContextTooLong,
    FluffyError,
    PolicyError,
    Quarantined,
    TurnRunning,
    WorkflowError,
)
from fluffy.ipc.ai_types import (
    AIResponse,
    Message,
    ProviderConfig,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolDefinition,
    kernel_note,
)
from fluffy.kernel.ai.events import EventStream
from fluffy.kernel.ai.instructions import Instructions
from fluffy.kernel.ai.memory import Memory
from fluffy.kernel.ai.narrate import describe_call, summarize_result
from fluffy.kernel.ai.provider import ProviderRunner, ProviderSession
from fluffy.kernel.ai.retry import Retry, RetryPolicy, with_retries
from fluffy.kernel.ai.summary import summary_request
from fluffy.kernel.ai.usage import Tally
from fluffy.kernel.tools.routedcall import TURN_PRIORITY
from fluffy.kernel.tools.router import ToolRouter
from fluffy.kernel.tools.scheduling import run_ordered

log = logging.getLogger("fluffy.kernel.ai")

QUARANTINE_AFTER = 5
#: A finished turn's events stay whole this long, then only the newest are kept.
STREAM_KEEP_S = 600.0
#: An ai-provider sandbox older than this gets no new request (its template ends it at
#: 120 s): a fresh one takes over, so a request never runs into the limit.
RENEW_AFTER_S = 60.0
MAX_ROUNDS = 50
DENIAL_CODES = frozenset({"tool.unavailable", "policy.invalid", "ai.quarantined"})
#: A tool result in the conversation is at most this long (the router already truncated
#: it to its token budget; this bounds the JSON wrapping).
RESULT_CHARS = 40_000

Audit = Callable[..., Awaitable[None]]
#: Reads (and audits) the project's instructions: (session id or None, caller) -> them.
InstructionSource = Callable[[str | None, str], Awaitable[Instructions]]


@dataclass
class Turn:
    turn_id: str
    session_id: str
    text: str
    provider: ProviderConfig
    auto_approve: bool
    max_rounds: int
    task: asyncio.Task[None] | None = None
    status: str = "running"
    review: asyncio.Future[dict[str, Any]] | None = None
    final_text: str = ""
    provider_session: ProviderSession | None = None
    ended: bool = False
    started: float = field(default_factory=time.monotonic)
    #: the id of the tool call waiting for the user's yes (one at a time: review_lock)
    tool_review: str | None = None
    tool_shown: dict[str, Any] | None = None  # what the user is asked about it
    review_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    usage: Tally = field(default_factory=Tally)  # the providers' reported token counts
    #: the project's instructions, read once at the start of the turn
    instructions: Instructions | None = None


class SessionLoop:
    def __init__(
        self,
        router: ToolRouter,
        runner: ProviderRunner,
        memory: Memory,
        *,
        audit: Audit | None = None,
        durable: Callable[[], Awaitable[None]] | None = None,
        quarantine_after: int = QUARANTINE_AFTER,
        instructions: InstructionSource | None = None,
    ) -> None:
        self.router = router
        self.instructions = instructions
        self.runner = runner
        self.memory = memory
        self.audit = audit
        #: commits the buffered audit entries: awaited before every model request, so
        #: what the model is told (its tool results) is never lost from the log by a crash
        self.durable = durable
        self.quarantine_after = quarantine_after
        self.streams: dict[str, EventStream] = {}
        self.turns: dict[str, Turn] = {}
        self.denials: dict[str, int] = {}
        #: per round, what the ai-provider sandbox waited for the kernel (benchmarks)
        self.round_gaps: deque[float] = deque(maxlen=10_000)
        router.reviewer = self.review_call
        #: the wait between a request's attempts (tests: a fake clock)
        self.sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    # -- the CLI's side ---------------------------------------------------------------
    def stream(self, session_id: str) -> EventStream:
        return self.streams.setdefault(session_id, EventStream())

    def running(self, session_id: str) -> Turn | None:
        """The session's turn until it has ended (reserved before its task exists)."""
        turn = self.turns.get(session_id)
        return turn if turn is not None and not turn.ended else None

    async def start(
        self,
        session_id: str,
        text: str,
        provider: ProviderConfig,
        *,
        auto_approve: bool = False,
        max_rounds: int = MAX_ROUNDS,
    ) -> Turn:
        session = await self.router.workflow.get(session_id)
        busy = self.running(session_id)
        if busy is not None:
            raise TurnRunning(
                f"session {session_id} is still working on a task",
                why=f"turn {busy.turn_id} is {busy.status}",
            )
        if session.data.get("quarantined"):
            raise Quarantined(f"session {session_id} is quarantined")
        turn = Turn(uuid.uuid4().hex[:12], session_id, text, provider, auto_approve, max_rounds)
        self.turns[session_id] = turn  # reserved before any await: one turn per session
        try:
            await self._emit(
                turn, {"type": "turn_start", "turn_id": turn.turn_id, "text": turn.text}
            )
            if session.state == "idle":  # before answering: the caller sees planning
                await self.router.workflow.fire(session_id, "user_message")
                await self._steps(turn, "idle", {})
        except BaseException as exc:
            turn.status = "failed"
            what = exc.what if isinstance(exc, FluffyError) else type(exc).__name__
            await self._end(turn, {"what": what, "why": "", "fix": "", "code": "ai.start"})
            raise
        turn.task = asyncio.create_task(self._run(turn), name=f"turn-{turn.turn_id}")
        return turn

    async def cancel(self, session_id: str) -> bool:
        turn = self.running(session_id)
        if turn is None or turn.task is None or turn.task.done():
            return False
        turn.status = "cancelled"
        turn.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await turn.task
        if not turn.ended:  # cancelled before it ever ran
            await self._end(turn, None)
        return True

    async def resolve_review(
        self, session_id: str, decision: str, result: Any, reason: str = ""
    ) -> None:
        """The user approved or rejected (through review.*): a waiting turn goes on."""
        turn = self.turns.get(session_id)
        if turn is not None and turn.review is not None and not turn.review.done():
            turn.review.set_result({"decision": decision, "result": result, "reason": reason})

    async def review_call(self, session_id: str, shown: dict[str, Any]) -> dict[str, Any]:
        """A tool call policy holds for review (an MCP tool): the turn asks the user and
        waits; ``decide_call`` answers.  Calls of one response are asked one at a time."""
        turn = self.running(session_id)
        if turn is None:
            raise PolicyError(
                f"{shown.get('tool')} needs the user's review",
                why="only a running task can ask the user",
                fix="Allow it with a policy rule, or call it from a task.",
            )
        async with turn.review_lock:
            if turn.review is not None and not turn.review.done():
                raise PolicyError(
                    f"{shown.get('tool')} needs the user's review, and the session already "
                    "waits for another decision",
                    fix="Decide on what the session shows first, then call it again.",
                )
            turn.review = asyncio.get_running_loop().create_future()
            turn.status = "waiting_review"
            turn.tool_review = str(shown.get("review_id"))
            turn.tool_shown = dict(shown)
            await self._emit(turn, {"type": "tool_review", "kernel_decides": False, **shown})
            try:
                return await self._wait_for_user(turn)
            finally:
                turn.tool_review = turn.tool_shown = None

    def pending_call(self, session_id: str) -> dict[str, Any] | None:
        """The tool call that waits for the user's answer in this session, if any."""
        turn = self.running(session_id)
        return dict(turn.tool_shown) if turn is not None and turn.tool_shown else None

    async def decide_call(
        self, session_id: str, review_id: str, decision: str, reason: str = ""
    ) -> None:
        turn = self.running(session_id)
        if turn is None or turn.tool_review is None or turn.tool_review != review_id:
            raise PolicyError(
                f"no tool call {review_id} waits for a decision in session {session_id}",
                why="it was decided already, or its task ended",
                fix="Decide on the call the session shows now.",
            )
        await self.resolve_review(session_id, decision, None, reason)

    async def lift_quarantine(self, session_id: str) -> None:
        await self.router.workflow.annotate(session_id, "quarantine_lifted", quarantined=None)
        self.denials[session_id] = 0
        await self._audit(session_id, "quarantine lifted by the user", {"by": "user"})
        await self.stream(session_id).emit(
            {"type": "notice", "level": "info", "what": "quarantine lifted", "why": "", "fix": ""}
        )

    async def close(self) -> None:
        for turn in list(self.turns.values()):
            if turn.task is not None and not turn.task.done():
                turn.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await turn.task

    # -- a turn -----------------------------------------------------------------------
    async def _emit(self, turn: Turn, event: dict[str, Any]) -> None:
        await self.stream(turn.session_id).emit(event)

    async def _steps(self, turn: Turn, before: str, answer: dict[str, Any]) -> None:
        """Every state the call passed through (a test run may pass several), in order."""
        output = answer.get("output") if answer.get("ok") else None
        steps: list[Any] = []
        if isinstance(output, dict):
            steps += list(output.get("workflow") or [])
            review = output.get("review")
            if isinstance(review, dict):
                steps += list(review.get("workflow") or [])
        session = await self.router.workflow.get(turn.session_id)
        current = before
        for step in steps:
            if not isinstance(step, dict):
                continue
            # a merge's budget notices come with the merge (_budget_notices)
            notes = step.get("notes") if step.get("event") != "merge_approved" else None
            for note in notes or []:
                await self._emit(
                    turn,
                    {"type": "notice", "level": "warn", "what": str(note), "why": "", "fix": ""},
                )
            if step.get("to") and step.get("from") == current:
                await self._emit(
                    turn,
                    {"type": "state", "from": current, "to": step["to"], "mode": session.mode},
                )
                current = str(step["to"])
        if session.state != current:
            await self._emit(
                turn, {"type": "state", "from": current, "to": session.state, "mode": session.mode}
            )

    async def _run(self, turn: Turn) -> None:
        sid = turn.session_id
        error: dict[str, Any] | None = None
        try:
            await self.memory.append(sid, [Message(role="user", content=turn.text)])
            if self.instructions is not None:  # once per turn: edits count from the next task
                turn.instructions = await self.instructions(sid, "kernel")
            await self._rounds(turn)
        except asyncio.CancelledError:
            turn.status = "cancelled"
        except FluffyError as exc:
            turn.status = "failed"
            error = {"what": exc.what, "why": exc.why, "fix": exc.fix, "code": exc.code}
        except Exception as exc:  # a bug: still an end the CLI can show
            log.exception("turn %s failed", turn.turn_id)
            turn.status = "failed"
            error = {
                "what": f"the session loop failed: {type(exc).__name__}",
                "why": str(exc)[:500],
                "fix": "Retry; if it persists, report it with the kernel's log.",
                "code": "ai.loop_failed",
            }
        finally:
            if turn.provider_session is not None:
                self.round_gaps.extend(turn.provider_session.gaps)
                await asyncio.shield(turn.provider_session.close())
                turn.provider_session = None
        await self._end(turn, error)

    async def _end(self, turn: Turn, error: dict[str, Any] | None) -> None:
        turn.ended = True
        # the API key stays in memory only while a turn needs it
        turn.provider = msgspec.structs.replace(turn.provider, api_key="")
        stream = self.stream(turn.session_id)
        asyncio.get_running_loop().call_later(STREAM_KEEP_S, stream.trim)
        if turn.status == "running":
            turn.status = "done"
        await self._emit(
            turn,
            {
                "type": "turn_end",
                "turn_id": turn.turn_id,
                "status": turn.status,
                "text": turn.final_text,
                "error": error,
                "usage": turn.usage.to_dict(),
            },
        )

    async def _provider(self, turn: Turn) -> ProviderSession:
        current = turn.provider_session
        if current is not None and not current.closed:
            exited = current.exited
            young = time.monotonic() - current.started_at < RENEW_AFTER_S
            if young and (exited is None or not exited.done()):
                return current
            # near its time limit (the template's 120 s), or gone: a fresh one
            self.round_gaps.extend(current.gaps)
            await current.close()
        turn.provider_session = await self.runner.open(
            turn.session_id, f"{turn.turn_id}-{uuid.uuid4().hex[:4]}"
        )
        return turn.provider_session

    async def _summarise(self, turn: Turn, old: list[Message], previous: str) -> str:
        """The design's summary fallback: a small, tool-less request to the same model."""

        async def ignore(event: StreamEvent) -> None:
            return None

        provider = await self._provider(turn)
        response = await provider.request(turn.provider, summary_request(old, previous), [], ignore)
        await self._account(turn, response)
        return response.text

    async def _tools(self, session_id: str, quarantined: bool) -> list[ToolDefinition]:
        available = set(await self.router.available(session_id))
        specs = [
            s
            for s in self.router.tools()
            if s.name in available and (not quarantined or s.kind == "read")
        ]
        return [
            ToolDefinition(s.name, s.description, dict(s.input_schema))
            for s in sorted(specs, key=lambda s: s.name)
        ]

    async def _rounds(self, turn: Turn) -> None:
        for _ in range(turn.max_rounds):
            calls = await self._ask(turn)
            if not calls:
                return
            stop = await self._calls(turn, calls)
            if stop:
                return
        turn.status = "failed"
        raise WorkflowError(
            f"the task did not finish within {turn.max_rounds} model rounds",
            why="the model kept calling tools",
            fix="Give a narrower task, or raise max_rounds (fluffy config set max_rounds N).",
        )

    async def _ask(self, turn: Turn, only: frozenset[str] | None = None) -> list[ToolCall]:
        """One model request (the tools of the state, or just ``only``); its tool calls."""
        sid = turn.session_id
        session = await self.router.workflow.get(sid)
        quarantined = bool(session.data.get("quarantined"))
        tools = await self._tools(sid, quarantined)
        if only is not None:
            tools = [t for t in tools if t.name in only]
        text: list[str] = []
        response = await self._request(turn, session.state, session.mode, tools, text)
        turn.final_text = response.text or "".join(text)
        calls = list(response.tool_calls)
        await self.memory.append(
            sid, [Message(role="assistant", content=turn.final_text, tool_calls=calls)]
        )
        return calls

    async def _request(
        self,
        turn: Turn,
        state: str,
        mode: str,
        tools: list[ToolDefinition],
        text: list[str],
    ) -> AIResponse:
        """One model request, its text streamed to the user (and into ``text``).

        Retried within the provider's retry policy; a prompt the provider refuses as too
        long is compacted (the older half of the window summarised) and sent once more.
        """
        sid = turn.session_id

        async def context(compact: bool) -> list[Message]:
            return await self.memory.context(
                sid,
                state=state,
                mode=mode,
                tools=tools,
                window_tokens=turn.provider.context_window,
                instructions=turn.instructions,
                # a script cannot summarise (it would replay its turns): extractive then
                summarise=None
                if turn.provider.name == "scripted"
                else lambda old, prev: self._summarise(turn, old, prev),
                compact=compact,
            )

        sent = await context(False)

        async def on_event(event: StreamEvent) -> None:
            if isinstance(event, TextDelta):
                text.append(event.content)
                await self._emit(turn, {"type": "text_delta", "content": event.content})

        async def attempt() -> AIResponse:
            text.clear()
            provider = await self._provider(turn)  # a fresh sandbox if this one is old
            return await provider.request(turn.provider, sent, tools, on_event)

        async def announce(retry: Retry) -> None:
            # a stream cut after some text: the next attempt's answer replaces it
            await self._emit(turn, retry.event(restart=bool(text)))

        if self.durable is not None:
            await self.durable()
        policy = RetryPolicy(turn.provider.max_retries, turn.provider.retry_max_wait_s)
        try:
            response = await with_retries(attempt, policy, announce, sleep=self.sleep)
        except ContextTooLong as exc:
            await self._emit(
                turn,
                {
                    "type": "notice",
                    "level": "warn",
                    "what": "the conversation is too long for the model: compacting it "
                    "and retrying once",
                    "why": exc.why,
                    "fix": "",
                },
            )
            sent = await context(True)
            try:
                response = await with_retries(attempt, policy, announce, sleep=self.sleep)
            except ContextTooLong as again:
                raise ContextTooLong(
                    "the conversation is too long for the model, even after compacting it",
                    why=again.why,
                    fix="Start a new session (`fluffy`), drop pins (/unpin), or ask for less "
                    "at once; check that context_window matches the model's "
                    "(`fluffy config set context_window N`).",
                ) from None
        await self._account(turn, response, sent, tools)
        return response

    async def _account(
        self,
        turn: Turn,
        response: AIResponse,
        sent: list[Message] | None = None,
        tools: list[ToolDefinition] | None = None,
    ) -> None:
        """Book a response's usage (and with what was sent: calibrate the estimate)."""
        model = response.model or turn.provider.model or turn.provider.name
        turn.usage.add_usage(model, response.usage)
        await self.memory.record_usage(
            turn.session_id, turn.turn_id, model, response.usage, sent, tools or []
        )

    async def _calls(self, turn: Turn, calls: list[ToolCall]) -> bool:
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
            await self._emit(
                turn,
                {
                    "type": "tool_result",
                    "call_id": calls[i].id,
                    "tool_name": tools[i],
                    "ok": False,
                    "summary": error.what,
                    "duration_ms": 0.0,
                    "error": _short_error(answers[i].get("error")),
                },
            )
            return answers[i]

        try:
            done = await run_ordered(
                self.router.steps, planned, tools, changes, one, refuse, priority=TURN_PRIORITY
            )
            for i, answer in enumerate(done):
                answers[i] = answer
        finally:
            # every call gets its result, even a cancelled turn's: providers refuse a
            # conversation with a tool call left unanswered
            for i, answer in enumerate(answers):
                if not answer:
                    answers[i] = {"ok": False, "error": {"code": "ai.cancelled",
                                  "what": "the call was cancelled before it finished"}}  # fmt: skip
            results_messages = [
                Message(
                    role="tool",
                    content=_tool_content(answer),
                    tool_call_id=call.id,
                    name=call.name,
                )
                for call, answer in zip(calls, answers, strict=True)
            ]
            await asyncio.shield(self.memory.append(sid, results_messages))
        session = await self.router.workflow.get(sid)
        if session.data.get("quarantined"):
            turn.status = "quarantined"
            return True
        for call, answer in zip(calls, answers, strict=True):
            await self._after(turn, call, answer)
        return False

    async def _one(self, turn: Turn, call: ToolCall) -> dict[str, Any]:
        sid = turn.session_id
        before = (await self.router.workflow.get(sid)).state
        await self._emit(
            turn,
            {
                "type": "tool_executing",
                "call_id": call.id,
                "tool_name": call.name,
                "description": describe_call(call.name, call.arguments),
            },
        )
        started = time.perf_counter()
        answer = await self._execute(turn, call)
        duration = (time.perf_counter() - started) * 1000
        error = answer.get("error") if not answer.get("ok") else None
        await self._emit(
            turn,
            {
                "type": "tool_result",
                "call_id": call.id,
                "tool_name": call.name,
                "ok": bool(answer.get("ok")),
                "summary": summarize_result(call.name, call.arguments, answer),
                "duration_ms": round(duration, 2),
                "error": _short_error(error) if error else None,
            },
        )
        await self._steps(turn, str(before), answer)
        if error and _is_denial(error):
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
        session = await self.router.workflow.get(sid)
        if session.data.get("quarantined"):
            spec = None
            try:
                spec = self.router.registry.get(call.name)
            except FluffyError:
                spec = None
            if spec is None or spec.kind != "read":
                exc = Quarantined(f"{call.name} refused: the session is quarantined (read-only)")
                return {"ok": False, "error": exc.to_dict(), "tool": call.name}
        return await self.router.call(
            sid, call.name, call.arguments, call_id=call.id, priority=TURN_PRIORITY
        )

    async def _denied(self, turn: Turn) -> None:
        sid = turn.session_id
        count = self.denials.get(sid, 0) + 1
        self.denials[sid] = count
        session = await self.router.workflow.get(sid)
        if count < self.quarantine_after or session.data.get("quarantined"):
            return
        reason = f"{count} tool calls were refused in this session"
        await self.router.workflow.annotate(sid, "quarantined", quarantined=reason)
        await self._audit(sid, f"session quarantined: {reason}", {"denials": str(count)})
        await self._emit(turn, {"type": "quarantine", "denials": count, "reason": reason})

    async def _after(self, turn: Turn, call: ToolCall, answer: dict[str, Any]) -> None:
        """Reviews and commits that a call brought about."""
        if not answer.get("ok"):
            return
        output = answer.get("output")
        if not isinstance(output, dict):
            return
        if call.name == "git.commit":
            message = call.arguments.get("message") if isinstance(call.arguments, dict) else ""
            await self._emit(
                turn, {"type": "commit", "sha": output.get("commit"), "message": message}
            )
        review = output.get("review")
        if call.name == "test.run" and isinstance(review, dict):
            await self._review(turn, review)
        if call.name == "workflow.request_exemption" and output.get("held_for_review"):
            await self._exemption(turn, output)

    async def _wait_for_user(self, turn: Turn) -> dict[str, Any]:
        """Park the turn until the user decides (``resolve_review``); no idle sandbox."""
        assert turn.review is not None
        if turn.provider_session is not None:  # the wait may be long
            self.round_gaps.extend(turn.provider_session.gaps)
            await turn.provider_session.close()
            turn.provider_session = None
        decision = await turn.review
        turn.review = None
        turn.status = "running"
        return decision

    async def _exemption(self, turn: Turn, output: dict[str, Any]) -> None:
        """The AI asked for a TDD exemption: only the user grants it (never --yes)."""
        sid = turn.session_id
        asked = dict(output.get("exemption") or {})
        held = await self.router.workflow.get(sid)
        before = held.state
        pending = held.data.get("exemption_pending") or {}
        if pending.get("request_id") != asked.get("request_id"):  # decided meanwhile
            note = (
                f"The exemption request {asked.get('request_id')} no longer waits (the user "
                f"decided on it). Workflow state: {held.state}."
            )
            await self.memory.append(sid, [Message(role="user", content=kernel_note(note))])
            return
        turn.review = asyncio.get_running_loop().create_future()
        turn.status = "waiting_review"
        # the user decides on the request shown here, by its id (workflow.decide_exemption)
        shown = {k: pending[k] for k in ("request_id", "category", "paths", "reason")}
        await self._emit(turn, {"type": "exemption", "kernel_decides": False, **shown})
        decision = await self._wait_for_user(turn)
        session = await self.router.workflow.get(sid)
        if session.state != before:  # granted: the explore flow starts
            await self._emit(
                turn, {"type": "state", "from": before, "to": session.state, "mode": session.mode}
            )
        if decision["decision"] == "grant":
            note = (
                f"The user granted the {asked.get('category')} exemption for "
                f"{', '.join(asked.get('paths') or [])}. Workflow state: {session.state}. "
                "Change only those files, then run test.run."
            )
        else:
            reason = str(decision.get("reason") or "").strip()
            said = f' They said: "{reason}".' if reason else ""
            note = (
                f"The user refused the exemption.{said} Workflow state: {session.state}. "
                "Follow the TDD flow: a failing test first."
            )
        await self.memory.append(sid, [Message(role="user", content=kernel_note(note))])

    async def _review(self, turn: Turn, review: dict[str, Any]) -> None:
        sid = turn.session_id
        if review.get("auto_merged"):
            await self._budget_notices(turn, review)
            merged = list(review.get("merged") or [])
            await self._emit(
                turn,
                {
                    "type": "merged",
                    "files": len(merged),
                    "paths": merged,
                    "auto": True,
                    "reason": "tests pass, no sensitive files, "
                    f"{review.get('diff_lines', '?')} lines changed",
                },
            )
            return
        shown = await self._show(sid)
        session = await self.router.workflow.get(sid)
        # --yes stands for the user on size and sensitive files; a policy require_review
        # rule asks for a person, so that review waits like any other
        auto = turn.auto_approve and not session.data.get("review_required")
        if not auto and shown["can_add_tests"]:
            shown["tests_requested"] = await self._review_round(turn)
        if not auto:  # ready before anyone is told: an approval can come at once
            turn.review = asyncio.get_running_loop().create_future()
            turn.status = "waiting_review"
        await self._emit(turn, {"type": "review", "auto": False, "kernel_decides": auto, **shown})
        if auto:
            # shielded: a cancelled turn must not leave a merge half-recorded
            outcome = await asyncio.shield(
                self.router.flow.approve(sid, by="user (--yes)", plan_id=shown["plan_id"])
            )
            decision: dict[str, Any] = {"decision": "approve", "result": outcome}
        else:
            decision = await self._wait_for_user(turn)
        result = decision.get("result") or {}
        if decision["decision"] == "approve":
            await self._budget_notices(turn, result)
            await self._emit(
                turn,
                {
                    "type": "merged",
                    "files": len(result.get("merged") or []),
                    "paths": list(result.get("merged") or []),
                    "auto": False,
                    "reason": "approved by the user",
                },
            )
            note = (
                "The user approved the merge; the changes are in the project. "
                f"Workflow state: {result.get('state', 'committing')}. Commit with git.commit."
            )
        elif decision["decision"] == "add_tests":
            session = await self.router.workflow.get(sid)
            await self._emit(
                turn,
                {"type": "state", "from": "reviewing", "to": session.state, "mode": session.mode},
            )
            note = (
                "The user wants tests for this change before the merge; the staged change "
                f"stays as it is. Workflow state: {result.get('state', 'retroactive_testing')}. "
                "Write tests that cover the change (test files only), then run test.run: "
                "the change comes back for review with its tests."
            )
        else:
            reason = str(decision.get("reason") or "").strip()
            said = f' They said: "{reason}".' if reason else " Ask the user what to change."
            note = (
                "The user rejected the merge; the staged changes were discarded. "
                f"Workflow state: {result.get('state')}.{said}"
            )
        await self.memory.append(sid, [Message(role="user", content=kernel_note(note))])

    async def _review_round(self, turn: Turn) -> str | None:
        """Before a person decides on an explore change, the model may ask for tests
        first (workflow.add_tests, one round); the person sees the request and decides."""
        sid = turn.session_id
        if "workflow.add_tests" not in self.router.registry.specs:
            return None
        ask = (
            "The change waits for the user's review. If it should get tests before it is "
            "merged, call workflow.add_tests with the reason (the user decides); otherwise "
            "say so in one sentence, without tools."
        )
        await self.memory.append(sid, [Message(role="user", content=kernel_note(ask))])
        calls = await self._ask(turn, only=frozenset({"workflow.add_tests"}))
        if calls:
            await self._calls(turn, calls)
        session = await self.router.workflow.get(sid)
        requested = session.data.get("tests_requested")
        return str(requested) if requested else None

    async def _budget_notices(self, turn: Turn, merge: dict[str, Any]) -> None:
        """A merge's tech-debt notices (coverage below min_delta or past the warning)."""
        for message in merge.get("budget") or []:
            await self._emit(
                turn,
                {"type": "notice", "level": "warn", "what": str(message), "why": "", "fix": ""},
            )

    async def _show(self, session_id: str) -> dict[str, Any]:
        stage = self.router.workspaces.get(session_id)
        plan = await asyncio.to_thread(self.router.merger.plan, stage, tests_pass=True)
        session = await self.router.workflow.get(session_id)
        exempted = bool(session.data.get("exemption"))
        return {
            "plan_id": plan.plan_id,
            "files": [c.path for c in plan.changes],
            "lines": plan.diff_lines,
            "diff": plan.diff[:20_000],
            "reasons": list(plan.reasons) + list(session.data.get("review_required", [])),
            # explore changes may get tests first (review.add_tests, /add-tests)
            "can_add_tests": session.mode != "strict" and not exempted,
        }

    async def _audit(self, session_id: str, summary: str, metadata: dict[str, str]) -> None:
        if self.audit is not None:
            await self.audit(session_id, summary, metadata)


def _is_denial(error: dict[str, Any]) -> bool:
    """Refusals that count toward quarantine: policy, state, and paths out of bounds."""
    code = str(error.get("code"))
    if code in DENIAL_CODES:
        return True
    text = f"{error.get('what', '')} {error.get('why', '')}"
    return code == "tool.input_invalid" and ("outside the project" in text or ".." in text)


def _short_error(error: Any) -> dict[str, Any]:
    if not isinstance(error, dict):
        return {"what": str(error), "why": "", "fix": ""}
    # "error" is the design's ToolUnavailableError tag ("tool_unavailable") where there is one
    return {k: error.get(k, "") for k in ("code", "error", "what", "why", "fix")}


def _tool_content(answer: dict[str, Any]) -> str:
    body = {k: answer[k] for k in ("ok", "output", "error", "session") if answer.get(k)}
    text = json.dumps(body, ensure_ascii=False, default=str)
    if len(text) > RESULT_CHARS:
        text = text[: RESULT_CHARS // 2] + " ...[cut]... " + text[-RESULT_CHARS // 2 :]
    return text
