"""Token usage: what the providers reported, per turn and per session (ADR-044).

Every model request's :class:`~fluffy.ipc.ai_types.Usage` is added to the
``ai_usage`` table of the state database (same file and connection as the conversation):
one row per (session, turn, model) with the request count, how many of those requests
reported usage at all, and input / output / cached-input tokens.  ``/usage`` and
``fluffy session list`` read the sums; prices (the CLI's settings) turn them into cost.

:class:`Calibration` keeps, per session, how far the provider's real input count was
above the kernel's estimate (4 characters a token) for the last requests; the context
window's estimates are multiplied by it, never by less than 1, so the estimate's safety
margin only ever grows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Final

import aiosqlite
import msgspec

from fluffy.ipc.ai_types import Message, ToolDefinition, Usage
from fluffy.kernel.ai.token_estimate import estimate_tokens, json_tokens, messages_tokens
from fluffy.kernel.audit.entry import now_ms

USAGE_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS ai_usage (
    session_id TEXT NOT NULL, turn_id TEXT NOT NULL, model TEXT NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0, reported INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0,
    started_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,
    PRIMARY KEY (session_id, turn_id, model)
);
"""
_COUNTS: Final = ("requests", "reported", "input_tokens", "output_tokens", "cached_tokens")
#: The calibration never multiplies the estimate by more than this (a wild report).
MAX_SCALE: Final = 4.0
#: Weight of the newest request in the running ratio.
SMOOTHING: Final = 0.5


class Tally(msgspec.Struct):
    """Sums over some requests; ``models`` the same sums per model (for prices)."""

    requests: int = 0
    reported: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    models: dict[str, dict[str, int]] = msgspec.field(default_factory=dict)

    def add(self, model: str, counts: dict[str, int]) -> None:
        mine = self.models.setdefault(model, dict.fromkeys(_COUNTS, 0))
        for name in _COUNTS:
            setattr(self, name, getattr(self, name) + counts[name])
            mine[name] += counts[name]

    def add_usage(self, model: str, usage: Usage) -> None:
        self.add(model, counts_of(usage))

    def to_dict(self) -> dict[str, Any]:
        return {
            **{name: getattr(self, name) for name in _COUNTS},
            "models": {model: dict(counts) for model, counts in self.models.items()},
        }


def counts_of(usage: Usage) -> dict[str, int]:
    return {
        "requests": 1,
        "reported": int(usage.reported),
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cached_tokens": usage.cached_tokens,
    }


UPSERT_SQL: Final = (
    "INSERT INTO ai_usage (session_id, turn_id, model, requests, reported, "
    "input_tokens, output_tokens, cached_tokens, started_at, updated_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT(session_id, turn_id, model) DO UPDATE SET "
    "requests = requests + excluded.requests, "
    "reported = reported + excluded.reported, "
    "input_tokens = input_tokens + excluded.input_tokens, "
    "output_tokens = output_tokens + excluded.output_tokens, "
    "cached_tokens = cached_tokens + excluded.cached_tokens, "
    "updated_at = excluded.updated_at"
)


class Booked(msgspec.Struct, frozen=True):
    """A model response's usage, booked to its turn with the message that answers it
    (``sent``/``tools``: what was sent, to calibrate the estimate against)."""

    turn_id: str
    model: str
    usage: Usage
    sent: Sequence[Message] | None = None
    tools: Sequence[ToolDefinition] = ()


def upsert(session_id: str, turn_id: str, model: str, usage: Usage) -> tuple[str, tuple[Any, ...]]:
    """The statement that adds ``usage`` to its turn's row (part of any transaction)."""
    counts = counts_of(usage)
    now = now_ms()
    return UPSERT_SQL, (session_id, turn_id, model, *(counts[n] for n in _COUNTS), now, now)


class UsageLedger:
    """The ``ai_usage`` table (the conversation store's connection)."""

    def __init__(self, db: aiosqlite.Connection) -> None:
        self.db = db

    async def record(self, session_id: str, turn_id: str, model: str, usage: Usage) -> None:
        try:
            await self.db.execute(*upsert(session_id, turn_id, model, usage))
            await self.db.commit()
        except BaseException:
            await self.db.rollback()
            raise

    async def _rows(self, session_ids: Sequence[str]) -> list[Any]:
        return list(
            await self.db.execute_fetchall(
                "SELECT session_id, turn_id, model, requests, reported, input_tokens, "
                "output_tokens, cached_tokens, started_at FROM ai_usage "
                "WHERE session_id IN (SELECT value FROM json_each(?))",
                (json.dumps(list(session_ids)),),
            )
        )

    @staticmethod
    def _add(tally: Tally, row: tuple[Any, ...]) -> None:
        tally.add(str(row[2]), dict(zip(_COUNTS, (int(v) for v in row[3:8]), strict=True)))

    async def session(self, session_id: str) -> tuple[Tally, Tally]:
        """``(latest turn, whole session)`` of one session."""
        rows = await self._rows([session_id])
        whole, latest = Tally(), Tally()
        last = max(rows, key=lambda r: int(r[8]))[1] if rows else None
        for row in rows:
            self._add(whole, row)
            if row[1] == last:
                self._add(latest, row)
        return latest, whole

    async def sessions(self, session_ids: Iterable[str]) -> dict[str, Tally]:
        ids = list(session_ids)
        if not ids:
            return {}
        rows = await self._rows(ids)
        out = {sid: Tally() for sid in ids}
        for row in rows:
            self._add(out[str(row[0])], row)
        return out


def tools_tokens(tools: Sequence[ToolDefinition]) -> int:
    """What the tool definitions cost on the wire (name, description, schema)."""
    return sum(
        estimate_tokens(t.name) + estimate_tokens(t.description) + json_tokens(t.parameters)
        for t in tools
    )


class Calibration:
    """Per session: the provider's real input tokens over the kernel's estimate."""

    def __init__(self) -> None:
        self._ratios: dict[str, float] = {}

    def observe(
        self,
        session_id: str,
        sent: Sequence[Message],
        tools: Sequence[ToolDefinition],
        usage: Usage,
    ) -> None:
        if not usage.reported or usage.input_tokens <= 0:
            return
        estimate = messages_tokens(sent) + tools_tokens(tools)
        if estimate <= 0:
            return
        ratio = usage.input_tokens / estimate
        previous = self._ratios.get(session_id)
        self._ratios[session_id] = (
            ratio if previous is None else SMOOTHING * ratio + (1 - SMOOTHING) * previous
        )

    def ratio(self, session_id: str) -> float | None:
        """The observed real/estimated ratio (None: nothing reported yet)."""
        return self._ratios.get(session_id)

    def scale(self, session_id: str) -> float:
        """What the estimates are multiplied by: the ratio, within [1, MAX_SCALE]."""
        ratio = self._ratios.get(session_id)
        return 1.0 if ratio is None else min(max(ratio, 1.0), MAX_SCALE)
