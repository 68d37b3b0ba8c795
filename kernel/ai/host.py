"""What a turn's helpers need of the session loop: a narrow, typed view of it.

:class:`~fluffy.kernel.ai.toolcalls.TurnCalls` and
:class:`~fluffy.kernel.ai.reviews.TurnReviews` get the tool router (and its parts) as
their own inputs; of the loop they see only this: the turn's events, its audit notes,
the conversation, the session's refusal count and one more model request.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from fluffy.ipc.ai_types import ToolCall
from fluffy.ipc.results.events import SessionEvent
from fluffy.ipc.results.workflow import State
from fluffy.kernel.ai.memory import Memory
from fluffy.kernel.ai.turn import Turn

if TYPE_CHECKING:
    from fluffy.kernel.ai.reviews import TurnReviews
    from fluffy.kernel.ai.toolcalls import TurnCalls


class TurnHost(Protocol):
    memory: Memory
    #: refusals that count towards the quarantine, per session
    denials: dict[str, int]
    quarantine_after: int
    #: per round, what the ai-provider sandbox waited for the kernel (benchmarks)
    round_gaps: deque[float]
    tool_calls: TurnCalls
    decisions: TurnReviews

    async def emit(self, turn: Turn, event: SessionEvent) -> None: ...

    async def emit_steps(self, turn: Turn, before: State, answer: dict[str, Any]) -> None: ...

    async def note_audit(self, session_id: str, summary: str, metadata: dict[str, str]) -> None: ...

    async def ask(self, turn: Turn, only: frozenset[str] | None = None) -> list[ToolCall]: ...
