"""What one model request carries (design: Context Management, ConversationContext).

A request is: one system message (role text, workflow line, tool summaries, pinned
context, summary of earlier conversation -- :mod:`fluffy.kernel.ai.prompt`), then the
newest messages that fit the budget (the sliding window).  The window is counted in
*rounds*: an assistant message that calls tools travels with all of its results, and a
window never starts with a tool result whose call it dropped (providers reject both).

When the messages not yet summarised take more than 70 % of their budget, the window
shrinks to half of it and the older messages are handed back to be summarised
(:mod:`fluffy.kernel.ai.summary`): by the model in a lightweight request, or
extractively when that is not possible.  Pins are never summarised; they are paid for
out of the recent-messages budget.  Tool results older than the last few rounds are
shortened (head and tail) before they are sent again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

from fluffy.errors import ConfigError
from fluffy.ipc.ai_types import Message, kernel_note
from fluffy.kernel.ai.kept import KeptByIdentity
from fluffy.kernel.ai.prompt import (
    base_prompt,
    context_cost,
    one_line,
    system_prompt,
    tool_summaries,
    with_context,
    workflow_line,
)
from fluffy.kernel.ai.summary import fallback_summary, summary_request, transcript
from fluffy.kernel.ai.token_estimate import estimate_tokens, message_tokens, messages_tokens
from fluffy.kernel.tools.reading.sanitizer import cut

__all__ = [
    "ContextWindow",
    "TokenBudget",
    "base_prompt",
    "build_messages",
    "context_cost",
    "fallback_summary",
    "one_line",
    "rounds",
    "shorten_old_results",
    "summary_request",
    "system_prompt",
    "tool_summaries",
    "transcript",
    "with_context",
    "workflow_line",
]

SUMMARY_TRIGGER: Final = 0.7  # summarise when pending messages exceed 70 % of the budget
KEEP_AFTER_SUMMARY: Final = 0.5  # ... and keep the newest half of the budget verbatim
MIN_RECENT: Final = 2000  # a budget that leaves less for messages is refused
FULL_ROUNDS: Final = 3  # tool results of the last rounds are sent in full
OLD_RESULT_CHARS: Final = 2000  # older results: head and tail, about 500 tokens
CONTINUE: Final = kernel_note(
    "The earlier conversation is summarised in the system prompt. Continue."
)


@dataclass(frozen=True)
class TokenBudget:
    """The design's TokenBudget: what each part of a request may take (tokens).

    ``recent_messages`` is what remains of ``total`` after the response reserve, the
    summary, the tool summaries, the role and workflow text (``prompt``) and the pins.
    """

    total: int
    reserved: int = 4000
    summary: int = 2000
    tools: int = 3000
    prompt: int = 500
    pins: int = 2000

    def __post_init__(self) -> None:
        parts = {
            "reserved": self.reserved,
            "summary": self.summary,
            "tools": self.tools,
            "prompt": self.prompt,
            "pins": self.pins,
        }
        for name, value in {"total": self.total, **parts}.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(
                    f"token budget {name} must be a whole number >= 0, not {value!r}",
                    fix="Set context_window to the model's context window in tokens.",
                    why="the context is split into token budgets, each a count of tokens",
                )
        if self.recent_messages < MIN_RECENT:
            fixed = " + ".join(f"{name} {value}" for name, value in parts.items())
            raise ConfigError(
                f"a context window of {self.total} tokens is too small",
                why=(
                    f"{fixed} leave {self.recent_messages} tokens for the conversation; "
                    f"fluffy needs at least {MIN_RECENT}"
                ),
                fix=(
                    f"Set context_window to at least {self.minimum_total()} "
                    "(`fluffy config set context_window N`), or use a model with a larger one."
                ),
            )

    def fixed(self) -> int:
        return self.reserved + self.summary + self.tools + self.prompt + self.pins

    def minimum_total(self) -> int:
        return self.fixed() + MIN_RECENT

    @property
    def system_prompt(self) -> int:
        """The design's system_prompt part: tool summaries + role and workflow text."""
        return self.tools + self.prompt

    @property
    def recent_messages(self) -> int:
        """The sliding window's budget when the pins take their whole allowance."""
        return self.total - self.fixed()

    def recent_for(self, pins_tokens: int) -> int:
        """The window's budget given the pins' actual size (never more than allowed)."""
        return self.recent_messages + self.pins - min(max(pins_tokens, 0), self.pins)


def rounds(messages: Sequence[Message]) -> list[list[Message]]:
    """``messages`` grouped so that no group must be split: an assistant message with
    tool calls together with the results of those calls that follow it; any other
    message alone.  A tool result whose call is not right before it is a group of its
    own (an orphan)."""
    groups: list[list[Message]] = []
    calls: frozenset[str] = frozenset()  # the ids of the calls the last group opened
    for message in messages:
        if message.role == "tool" and message.tool_call_id in calls:
            groups[-1].append(message)
            continue
        groups.append([message])
        opens = message.role == "assistant" and message.tool_calls
        calls = frozenset(c.id for c in message.tool_calls) if opens else frozenset()
    return groups


def shorten_old_results(
    messages: Sequence[Message], *, full_rounds: int = FULL_ROUNDS, keep: int = OLD_RESULT_CHARS
) -> list[Message]:
    """``messages`` with the tool results of all but the last ``full_rounds`` tool rounds
    cut to ``keep`` characters (head and tail, marked)."""
    groups = rounds(messages)
    tool_rounds = [i for i, g in enumerate(groups) if any(m.role == "tool" for m in g)]
    old = set(tool_rounds[: max(len(tool_rounds) - full_rounds, 0)])
    shortened: list[Message] = []
    for index, group in enumerate(groups):
        for message in group:
            if index in old and message.role == "tool" and len(message.content) > keep:
                message = _shortened(message, keep)
            shortened.append(message)
    return shortened


#: Old results as they were shortened: the same object every round, so what is kept of
#: a message by identity (its cost, its wire form: :mod:`kernel.ai.kept`) is kept of it.
#: Weighed by the result it keeps alive (characters).
_SHORT: KeptByIdentity[tuple[int, Message]] = KeptByIdentity(20_000, 8_000_000)


def _shortened(message: Message, keep: int) -> Message:
    hit = _SHORT.get(message)
    if hit is not None and hit[0] == keep:
        return hit[1]
    content = cut(message.content, keep, "middle")
    short = Message(role="tool", content=content, tool_call_id=message.tool_call_id,
                    name=message.name)  # fmt: skip
    return _SHORT.put(message, (keep, short), len(message.content))[1]


class ContextWindow(msgspec.Struct, frozen=True):
    """The sliding window over one session's history.

    ``history`` is the whole conversation; ``start`` the index of the first message the
    current summary does not cover (``summarised_upto``).  ``recent`` is what is sent;
    ``old`` is what must be summarised next (the messages older than the window), and
    ``upto`` the new ``summarised_upto`` once it is.  ``triggered``: the pending
    messages took more than 70 % of the budget, so the window shrank to make room.
    """

    recent: list[Message]
    old: list[Message] = msgspec.field(default_factory=list)
    upto: int = 0
    budget: int = 0
    pending_tokens: int = 0
    triggered: bool = False

    @classmethod
    def fit(
        cls,
        history: Sequence[Message],
        budget: TokenBudget,
        *,
        start: int = 0,
        pins_tokens: int = 0,
        trigger: float = SUMMARY_TRIGGER,
        keep: float = KEEP_AFTER_SUMMARY,
        scale: float = 1.0,
        compact: bool = False,
    ) -> ContextWindow:
        """``scale`` (>= 1) multiplies every estimate: the session's calibration against
        the provider's real counts.  ``compact``: the provider refused the prompt as too
        long, so the window keeps only ``keep`` of what it holds now (and of its budget)
        and the rest is summarised, whatever the estimate says."""
        scale = max(scale, 1.0)
        start = min(max(start, 0), len(history))
        limit = budget.recent_for(pins_tokens)
        pending = shorten_old_results(history[start:])
        costs = [message_tokens(m) for m in pending]  # each counted once
        pending_tokens = int(sum(costs) * scale)
        triggered = compact or pending_tokens > trigger * limit
        target = int(keep * limit) if triggered else limit
        if compact:
            target = min(target, int(keep * pending_tokens))
        groups = rounds(pending)
        kept, used, end = 0, 0, len(pending)
        for group in reversed(groups):
            cost = int(sum(costs[end - len(group) : end]) * scale)
            end -= len(group)
            if kept and used + cost > target:
                break
            kept, used = kept + 1, used + cost  # the newest round always goes
        first = len(groups) - kept
        while first < len(groups) - 1 and groups[first][0].role == "tool":
            first += 1  # never start with an orphan result
        if groups and groups[first][0].role == "tool":
            first += 1  # nothing but an orphan: send nothing of it
        cut_at = sum(len(g) for g in groups[:first])
        return cls(
            recent=pending[cut_at:],
            old=pending[:cut_at],
            upto=start + cut_at,
            budget=limit,
            pending_tokens=pending_tokens,
            triggered=triggered,
        )

    @property
    def needs_summary(self) -> bool:
        """Messages fell out of the window: summarise ``old`` and store ``upto``."""
        return bool(self.old)

    @property
    def tokens(self) -> int:
        return messages_tokens(self.recent)


def build_messages(
    system: str, summary: str, pins: Sequence[str], window: ContextWindow | Sequence[Message]
) -> list[Message]:
    """The request's messages: the system message (``system`` is :func:`base_prompt`'s
    text; pins and summary are added here), then the window's messages.

    A window that does not start with a user message gets a short user message first:
    providers (Anthropic) require the conversation to open with one.
    """
    recent = list(window.recent if isinstance(window, ContextWindow) else window)
    messages = [Message(role="system", content=with_context(system, pins, summary))]
    if recent and recent[0].role != "user":
        messages.append(Message(role="user", content=CONTINUE))
    return messages + recent


def pins_tokens(pins: Sequence[str]) -> int:
    """What the pinned context costs in the system prompt."""
    return estimate_tokens("\n".join(pins)) + 2 * len(pins)
