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
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from fluffy.errors import (
    ContextTooLong,
    FluffyError,
    LoopFailed,
    PolicyDenied,
    PolicyError,
    Quarantined,
    TurnNotStarted,
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
)
from fluffy.ipc.results.events import (
    Notice,
    SessionEvent,
    StateChanged,
    TextStreamed,
    TurnEnded,
    TurnFailure,
    TurnStarted,
)
from fluffy.ipc.results.usage import UsageTally
from fluffy.ipc.results.workflow import State
from fluffy.kernel.ai.bounds import bounded
from fluffy.kernel.ai.events import EventStream
from fluffy.kernel.ai.instructions import Instructions
from fluffy.kernel.ai.memory import Memory
from fluffy.kernel.ai.provider import ProviderRunner, ProviderSession
from fluffy.kernel.ai.retry import Retry, RetryPolicy, with_retries
from fluffy.kernel.ai.reviews import TurnReviews, held_call
from fluffy.kernel.ai.summary import summary_request
from fluffy.kernel.ai.toolcalls import TurnCalls
from fluffy.kernel.ai.turn import Turn
from fluffy.kernel.ai.usage import Booked
from fluffy.kernel.tools.changes.flow import Flow
from fluffy.kernel.tools.routing.router import ToolRouter

log = logging.getLogger("fluffy.kernel.ai")

QUARANTINE_AFTER = 5
#: A finished turn's events stay whole this long, then only the newest are kept.
STREAM_KEEP_S = 600.0
#: An ai-provider sandbox older than this gets no new request (its template ends it at
#: 120 s): a fresh one takes over, so a request never runs into the limit.
RENEW_AFTER_S = 60.0
MAX_ROUNDS = 50

Audit = Callable[..., Awaitable[None]]
#: Reads (and audits) the project's instructions: (session id or None, caller) -> them.
InstructionSource = Callable[[str | None, str], Awaitable[Instructions]]


class SessionLoop:
    def __init__(
        self,
        router: ToolRouter,
        flow: Flow,
        runner: ProviderRunner,
        memory: Memory,
        *,
        audit: Audit | None = None,
        durable: Callable[[], Awaitable[None]] | None = None,
        quarantine_after: int = QUARANTINE_AFTER,
        instructions: InstructionSource | None = None,
    ) -> None:
        self.router = router
        self.workflow = flow.workflow
        self.instructions = instructions
        self.runner = runner
        self.memory = memory
        self.audit = audit
        #: commits the buffered audit entries (at once when there are none) before every
        #: model request: what the model is told is never lost from the log by a crash
        self.durable = durable
        self.quarantine_after = quarantine_after
        self.streams: dict[str, EventStream] = {}
        self.turns: dict[str, Turn] = {}
        self.denials: dict[str, int] = {}
        #: per round, what the ai-provider sandbox waited for the kernel (benchmarks)
        self.round_gaps: deque[float] = deque(maxlen=10_000)
        router.review_with(self.review_call)
        #: a response's tool calls, and the user's decisions a turn waits for
        self.tool_calls = TurnCalls(self, router, flow.workflow)
        self.decisions = TurnReviews(self, flow, offers=lambda tool: router.spec(tool) is not None)
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
        session = await self.workflow.get(session_id)
        busy = self.running(session_id)
        if busy is not None:
            raise TurnRunning(
                f"session {session_id} is still working on a task",
                why=f"turn {busy.turn_id} is {busy.status}",
            )
        if session.data.quarantined:
            raise Quarantined(f"session {session_id} is quarantined")
        turn = Turn(uuid.uuid4().hex[:12], session_id, text, provider, auto_approve, max_rounds)
        self.turns[session_id] = turn  # reserved before any await: one turn per session
        try:
            await self.emit(turn, TurnStarted(turn_id=turn.turn_id, text=turn.text))
            if session.state == "idle":  # before answering: the caller sees planning
                await self.workflow.fire(session_id, "user_message")
                await self.emit_steps(turn, "idle", {})
        except BaseException as exc:
            turn.status = "failed"
            refused = (
                TurnNotStarted(exc.what, why=exc.why or None, fix=exc.fix or None)
                if isinstance(exc, FluffyError)
                else TurnNotStarted(type(exc).__name__, why=str(exc)[:500] or None)
            )
            await self._end(turn, _ended(refused))
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
            raise PolicyDenied(
                f"{shown.get('tool')} needs the user's review",
                why="only a running task can ask the user",
                fix="Allow it with a policy rule, or call it from a task.",
            )
        async with turn.review_lock:
            if turn.review is not None and not turn.review.done():
                raise PolicyDenied(
                    f"{shown.get('tool')} needs the user's review, and the session already "
                    "waits for another decision",
                    fix="Decide on what the session shows first, then call it again.",
                    why="a session holds one question for the person at a time",
                )
            turn.review = asyncio.get_running_loop().create_future()
            turn.status = "waiting_review"
            turn.tool_review = str(shown.get("review_id"))
            turn.tool_shown = dict(shown)
            await self.emit(turn, held_call(shown))
            try:
                return await self.decisions.wait_for_user(turn)
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
        await self.workflow.annotate(session_id, "quarantine_lifted", quarantined=None)
        self.denials[session_id] = 0
        await self.note_audit(session_id, "quarantine lifted by the user", {"by": "user"})
        await self.stream(session_id).emit(
            Notice(level="info", what="quarantine lifted", why="", fix="")
        )

    async def close(self) -> None:
        for turn in list(self.turns.values()):
            if turn.task is not None and not turn.task.done():
                turn.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await turn.task

    # -- a turn -----------------------------------------------------------------------
    async def emit(self, turn: Turn, event: SessionEvent) -> None:
        await self.stream(turn.session_id).emit(event)

    async def emit_steps(self, turn: Turn, before: State, answer: dict[str, Any]) -> None:
        """Every state the call passed through (a test run may pass several), in order."""
        output = answer.get("output") if answer.get("ok") else None
        steps: list[Any] = []
        if isinstance(output, dict):
            steps += list(output.get("workflow") or [])
            review = output.get("review")
            if isinstance(review, dict):
                steps += list(review.get("workflow") or [])
        session = await self.workflow.get(turn.session_id)
        current = before
        for step in steps:
            if not isinstance(step, dict):
                continue
            # a merge's budget notices come with the merge (reviews.py)
            notes = step.get("notes") if step.get("event") != "merge_approved" else None
            for note in notes or []:
                await self.emit(turn, Notice(level="warn", what=str(note), why="", fix=""))
            if step.get("to") and step.get("from") == current:
                # a step's states are the workflow's own (kernel/workflow/states.py)
                await self.emit(turn, StateChanged(from_=current, to=step["to"], mode=session.mode))
                current = step["to"]
        if session.state != current:
            await self.emit(turn, StateChanged(from_=current, to=session.state, mode=session.mode))

    async def _run(self, turn: Turn) -> None:
        sid = turn.session_id
        error: TurnFailure | None = None
        try:
            await self.memory.append(sid, [Message(role="user", content=turn.text)])
            if self.instructions is not None:  # once per turn: edits count from the next task
                turn.instructions = await self.instructions(sid, "kernel")
            await self._rounds(turn)
        except asyncio.CancelledError:
            turn.status = "cancelled"
        except FluffyError as exc:
            turn.status = "failed"
            error = _ended(exc)
        except Exception as exc:  # a bug: still an end the CLI can show
            log.exception("turn %s failed", turn.turn_id)
            turn.status = "failed"
            failed = LoopFailed(f"the session loop failed: {type(exc).__name__}")
            error = msgspec.structs.replace(_ended(failed), why=str(exc)[:500] or failed.why)
        finally:
            if turn.provider_session is not None:
                self.round_gaps.extend(turn.provider_session.gaps)
                await asyncio.shield(turn.provider_session.close())
                turn.provider_session = None
        await self._end(turn, error)

    async def _end(self, turn: Turn, error: TurnFailure | None) -> None:
        turn.ended = True
        # the API key stays in memory only while a turn needs it
        turn.provider = msgspec.structs.replace(turn.provider, api_key="")
        stream = self.stream(turn.session_id)
        asyncio.get_running_loop().call_later(STREAM_KEEP_S, stream.trim)
        if turn.status == "running":
            turn.status = "done"
        usage = msgspec.convert(turn.usage.to_dict(), UsageTally)
        await self.emit(
            turn,
            TurnEnded(
                turn_id=turn.turn_id,
                status=turn.status,
                text=turn.final_text,
                error=error,
                usage=usage,
            ),
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
            calls = await self.ask(turn)
            if not calls:
                return
            stop = await self.tool_calls.run(turn, calls)
            if stop:
                return
        turn.status = "failed"
        raise WorkflowError(
            f"the task did not finish within {turn.max_rounds} model rounds",
            why="the model kept calling tools",
            fix="Give a narrower task, or raise max_rounds (fluffy config set max_rounds N).",
        )

    async def ask(self, turn: Turn, only: frozenset[str] | None = None) -> list[ToolCall]:
        """One model request (the tools of the state, or just ``only``); its tool calls."""
        sid = turn.session_id
        session = await self.workflow.get(sid)
        quarantined = bool(session.data.quarantined)
        tools = await self._tools(sid, quarantined)
        if only is not None:
            tools = [t for t in tools if t.name in only]
        text: list[str] = []
        response, sent = await self._request(turn, session.state, session.mode, tools, text)
        turn.final_text = response.text or "".join(text)
        calls = list(response.tool_calls)
        # kept bounded: huge arguments or text would be sent back with every request
        message = bounded(Message(role="assistant", content=turn.final_text, tool_calls=calls))
        model = self._model(turn, response)
        booked = Booked(turn.turn_id, model, response.usage, sent, tools)
        await self.memory.append(sid, [message], booked=booked)  # the usage with it
        return calls  # as the model sent them: they run as asked (or are refused)

    async def _request(
        self,
        turn: Turn,
        state: str,
        mode: str,
        tools: list[ToolDefinition],
        text: list[str],
    ) -> tuple[AIResponse, list[Message]]:
        """One model request, its text streamed to the user (and into ``text``); the
        answer and what was sent (the caller books its usage).

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

        # the round's audit entries commit on the audit's thread while the context is
        # built (their sync overlaps it), then anything recorded meanwhile: see durable
        durable = self.durable or (lambda: asyncio.sleep(0))  # (no audit log: tests)
        committing = asyncio.ensure_future(durable())
        try:
            sent = await context(False)
        except BaseException:
            committing.cancel()
            raise

        async def on_event(event: StreamEvent) -> None:
            if isinstance(event, TextDelta):
                text.append(event.content)
                await self.emit(turn, TextStreamed(content=event.content))

        async def attempt() -> AIResponse:
            text.clear()
            provider = await self._provider(turn)  # a fresh sandbox if this one is old
            return await provider.request(turn.provider, sent, tools, on_event)

        async def announce(retry: Retry) -> None:
            # a stream cut after some text: the next attempt's answer replaces it
            await self.emit(turn, retry.event(restart=bool(text)))

        await committing
        await durable()
        policy = RetryPolicy(turn.provider.max_retries, turn.provider.retry_max_wait_s)
        try:
            response = await with_retries(attempt, policy, announce, sleep=self.sleep)
        except ContextTooLong as exc:
            compacting = (
                "the conversation is too long for the model: compacting it and retrying once"
            )
            await self.emit(turn, Notice(level="warn", what=compacting, why=exc.why, fix=""))
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
        return response, sent

    def _model(self, turn: Turn, response: AIResponse) -> str:
        """The model a response is booked to (the turn's tally counts it now)."""
        model = response.model or turn.provider.model or turn.provider.name
        turn.usage.add_usage(model, response.usage)
        return model

    async def _account(self, turn: Turn, response: AIResponse) -> None:
        """Book the usage of a response no message keeps (a summary request)."""
        model = self._model(turn, response)
        await self.memory.record_usage(turn.session_id, turn.turn_id, model, response.usage)

    async def note_audit(self, session_id: str, summary: str, metadata: dict[str, str]) -> None:
        if self.audit is not None:
            await self.audit(session_id, summary, metadata)


def _ended(exc: FluffyError) -> TurnFailure:
    """A failed turn's error as its ``turn_end`` event carries it."""
    return TurnFailure(what=exc.what, why=exc.why, fix=exc.fix, code=exc.code)
