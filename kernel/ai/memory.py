"""What the model is sent each round: the conversation store and the context rules joined.

``context`` loads the session's history, fits the sliding window (design: summary when
the pending messages pass 70 % of their budget), summarises what fell out of it — by the
model when the loop gives a summariser (a lightweight request in the ai-provider
sandbox), else extractively — and builds the system prompt: role, workflow state line
with the writable paths, tool summaries, pinned context and the summary.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiosqlite
import msgspec

from fluffy.errors import CallCancelled, FluffyError, SessionNotFound
from fluffy.ipc.ai_types import Message, ToolDefinition, Usage
from fluffy.kernel.ai.context import ContextWindow, TokenBudget, build_messages, pins_tokens
from fluffy.kernel.ai.conversation import ConversationStore
from fluffy.kernel.ai.instructions import Instructions
from fluffy.kernel.ai.prompt import base_prompt
from fluffy.kernel.ai.summary import fallback_summary
from fluffy.kernel.ai.token_estimate import estimate_tokens
from fluffy.kernel.ai.usage import Booked, Calibration, Tally, UsageLedger, upsert
from fluffy.kernel.audit.store import db_path
from fluffy.kernel.tools.routing.availability import WRITES
from fluffy.kernel.workflow.machine import Workflow
from fluffy.kernel.workflow.store import WorkflowStore

log = logging.getLogger("fluffy.kernel.ai")

Summariser = Callable[[list[Message], str], Awaitable[str]]


UNANSWERED = msgspec.json.encode(
    {"ok": False, "error": CallCancelled("no result: the call was interrupted").to_dict()}
).decode()


def answered(history: list[Message]) -> list[Message]:
    """``history`` with a result for every tool call (a kernel killed in mid-call leaves
    calls unanswered, and providers refuse such a conversation)."""
    out: list[Message] = []
    i = 0
    while i < len(history):
        message = history[i]
        out.append(message)
        i += 1
        if message.role != "assistant" or not message.tool_calls:
            continue
        seen: set[str] = set()
        while i < len(history) and history[i].role == "tool":
            seen.add(history[i].tool_call_id)
            out.append(history[i])
            i += 1
        out += [
            Message(role="tool", content=UNANSWERED, tool_call_id=call.id, name=call.name)
            for call in message.tool_calls
            if call.id not in seen
        ]
    return out


class Answered:
    """:func:`answered` over a session's history, each message walked once: a running
    session's history only grows, as the same Message values (``ConversationStore.load``),
    so the result before its last tool-call message is kept and only what follows is
    walked each round.  Any other change to the history makes new values: walked anew."""

    def __init__(self, sessions: int = 8) -> None:
        self.sessions = sessions
        self._kept: dict[str, tuple[int, Message, list[Message]]] = {}

    def __call__(self, session_id: str, history: list[Message]) -> list[Message]:
        start, prefix = 0, []
        kept = self._kept.pop(session_id, None)
        if kept is not None and kept[0] <= len(history) and history[kept[0] - 1] is kept[1]:
            start, prefix = kept[0], kept[2]
        cut = len(history)  # at the last tool-call message: its results may still come
        while cut > start and not (
            history[cut - 1].role == "assistant" and history[cut - 1].tool_calls
        ):
            cut -= 1
        cut = max(start, cut - 1)
        head = prefix + answered(history[start:cut]) if cut > start else prefix
        if cut:
            self._kept[session_id] = (cut, history[cut - 1], head)
            while len(self._kept) > self.sessions:
                self._kept.pop(next(iter(self._kept)))
        return head + answered(history[cut:])


class Memory:
    def __init__(
        self,
        store: ConversationStore,
        *,
        context_window: int = 128_000,
        test_globs: Sequence[str] = ("tests/**",),
    ) -> None:
        self.store = store
        self.budget = TokenBudget(total=context_window)
        self.test_globs = tuple(test_globs)
        self.usage = UsageLedger(store.db)
        self.calibration = Calibration()
        self.answered = Answered()

    def writable(self, state: str) -> list[str] | None:
        rule = WRITES.get(state, "none")
        if rule == "tests":
            return list(self.test_globs)
        if rule == "sources":
            return ["anything but " + ", ".join(self.test_globs)]
        if rule == "anywhere":
            return ["**"]
        return None

    async def append(
        self, session_id: str, messages: Sequence[Message], *, booked: Booked | None = None
    ) -> None:
        """Store ``messages``; ``booked``: the response they carry, its usage booked in
        the same transaction (and the estimate calibrated against it)."""
        if booked is None:
            await self.store.append(session_id, messages)
            return
        usage = upsert(session_id, booked.turn_id, booked.model, booked.usage)
        await self.store.append(session_id, messages, also=[usage])
        if booked.sent is not None:
            self.calibration.observe(session_id, booked.sent, booked.tools, booked.usage)

    async def context(
        self,
        session_id: str,
        *,
        state: str,
        mode: str,
        tools: Sequence[ToolDefinition],
        summarise: Summariser | None = None,
        window_tokens: int = 0,
        compact: bool = False,
        instructions: Instructions | None = None,
    ) -> list[Message]:
        """The request's messages; ``compact``: the provider refused the last prompt as
        too long, so the older half of the window is summarised now (ADR-044)."""
        history = self.answered(session_id, await self.store.load(session_id))
        # the project's instructions are paid for out of the window's spare tokens
        spare = self.budget.total - self.budget.minimum_total()
        section = instructions.section(max_tokens=spare) if instructions is not None else ""
        budget = dataclasses.replace(
            self.budget, prompt=self.budget.prompt + estimate_tokens(section)
        )
        meta = await self.store.meta(session_id)
        pins = [p.text for p in meta.pins] if meta else []
        summary = meta.summary if meta else ""
        start = meta.summarised_upto if meta else 0
        window = ContextWindow.fit(
            history,
            budget,
            start=start,
            pins_tokens=pins_tokens(pins),
            scale=self.calibration.scale(session_id),
            compact=compact,
        )
        if window.needs_summary:
            summary = await self._summarise(window.old, summary, summarise)
            await self.store.set_summary(session_id, summary, window.upto)
        system = base_prompt(state, mode, self.writable(state), tools)
        system = "\n\n".join(part for part in (system, section) if part)
        return build_messages(system, summary, pins, window)

    async def record_usage(self, session_id: str, turn_id: str, model: str, usage: Usage) -> None:
        """Book the usage of a request whose answer no message keeps (a summary)."""
        await self.usage.record(session_id, turn_id, model, usage)

    async def usage_report(self, session_id: str) -> dict[str, Any]:
        """``/usage``: the latest turn, the whole session, and the estimate's calibration."""
        turn, session = await self.usage.session(session_id)
        ratio = self.calibration.ratio(session_id)
        return {
            "turn": turn.to_dict(),
            "session": session.to_dict(),
            "calibration": None if ratio is None else round(ratio, 3),
            "scale": round(self.calibration.scale(session_id), 3),
        }

    async def _summarise(
        self, old: list[Message], previous: str, summarise: Summariser | None
    ) -> str:
        if summarise is not None:
            try:
                text = (await summarise(old, previous)).strip()
                if text:
                    return text
            except FluffyError as exc:  # the model could not: the extractive one
                log.warning("AI summary failed, using the extractive one: %s", exc.what)
        return fallback_summary(old, previous)

    async def pin(self, session_id: str, text: str) -> list[str]:
        if await self.store.meta(session_id) is None:  # pinned before the first task
            await self.store.append(session_id, [])
        await self.store.add_pin(session_id, text)
        return [p.text for p in await self.store.pins(session_id)]

    async def pins(self, session_id: str) -> list[str]:
        if await self.store.meta(session_id) is None:
            return []
        return [p.text for p in await self.store.pins(session_id)]

    async def unpin(self, session_id: str, index: int) -> list[str]:
        pins = await self.store.pins(session_id)
        if not 0 <= index < len(pins):
            raise SessionNotFound(
                f"no pin number {index}",
                why=f"the session has {len(pins)} pin(s)",
                fix="/pins lists them with their numbers.",
            )
        await self.store.remove_pin(session_id, pins[index].id)
        return [p.text for p in await self.store.pins(session_id)]

    async def sessions(self, workflow: Workflow, limit: int) -> list[dict[str, Any]]:
        """Sessions newest first, with the conversation's title and turn count."""
        return await listed_sessions(workflow.store, self.store, self.usage, limit)


async def listed_sessions(
    workflow: WorkflowStore, store: ConversationStore, ledger: UsageLedger, limit: int
) -> list[dict[str, Any]]:
    """What ``session.list`` answers, from the stores (the kernel's, or read-only ones
    on a project whose kernel is not running)."""
    rows = await workflow.recent_sessions(limit)
    usage = await ledger.sessions(row.id for row in rows)
    out: list[dict[str, Any]] = []
    for row in rows:
        meta = await store.meta(row.id)
        out.append(
            {
                "session_id": row.id,
                "mode": row.mode,
                "state": row.state,
                "created_at": row.created_at,
                "updated_at": max(row.updated_at, meta.updated_at if meta else 0),
                "title": meta.title if meta else "",
                "turns": meta.turns if meta else 0,
                "quarantined": bool(row.data.quarantined),
                "usage": usage.get(row.id, Tally()).to_dict(),
            }
        )
    return out


async def sessions_at_rest(state_dir: Path, limit: int) -> list[dict[str, Any]]:
    """``session.list`` read from a stopped kernel's state database, read-only (nothing
    is migrated or written; only while no kernel runs: nothing else writes it then);
    raises sqlite3.Error when it cannot be read."""
    path = db_path(state_dir)
    if not path.is_file():
        return []
    wal = path.with_name(path.name + "-wal")
    # a kernel that stopped cleanly left no log to replay: the file is read as it is
    # (no lock, no -shm or -wal created); a crashed one's log is read read-only
    settled = not wal.exists() or wal.stat().st_size == 0
    mode = "immutable=1" if settled else "mode=ro"
    db = await aiosqlite.connect(f"{path.as_uri()}?{mode}", uri=True)
    try:
        return await listed_sessions(
            WorkflowStore(db), ConversationStore(db), UsageLedger(db), limit
        )
    finally:
        await db.close()
