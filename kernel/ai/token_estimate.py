"""Token estimates for prompts and messages (design: Context Management).

fluffy never ships a provider's tokenizer: like the output sanitiser, it estimates one
token per 4 characters (:func:`fluffy.kernel.tools.reading.sanitizer.estimate_tokens`), which
over-counts code and English slightly -- the safe side for a budget.  Structured parts
(tool-call arguments, schemas) are counted on their compact JSON encoding, and every
message pays a small framing overhead for its role and separators.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import msgspec

from fluffy.ipc.ai_types import Message
from fluffy.kernel.ai.kept import KeptByIdentity
from fluffy.kernel.tools.reading.sanitizer import CHARS_PER_TOKEN

#: Role, separators and the provider's per-message framing.
MESSAGE_OVERHEAD: Final = 4
#: Per tool call: its id and name framing.
CALL_OVERHEAD: Final = 4


def estimate_tokens(text: str) -> int:
    """Tokens of ``text`` (one per 4 characters, rounded up)."""
    return -(-len(text) // CHARS_PER_TOKEN)


_encode = msgspec.json.Encoder(enc_hook=repr).encode


def json_tokens(value: Any) -> int:
    """Tokens of ``value``'s compact JSON encoding (schemas, tool-call arguments; the
    context counts every message's at every round, so msgspec's encoder, not json's)."""
    raw = _encode(value)
    return -(-(len(raw) if raw.isascii() else len(raw.decode())) // CHARS_PER_TOKEN)


#: The tool calls' cost of the messages counted lately (:mod:`kernel.ai.kept`): encoding
#: their calls' arguments was most of counting the window.  Bounded by CALL_COSTS_KEPT
#: messages and CALL_COSTS_TOKENS tokens of their calls (~4 bytes each).
CALL_COSTS_KEPT: Final = 20_000
CALL_COSTS_TOKENS: Final = 2_000_000
CALL_COSTS: KeptByIdentity[int] = KeptByIdentity(CALL_COSTS_KEPT, CALL_COSTS_TOKENS)


def _calls_tokens(message: Message) -> int:
    hit = CALL_COSTS.get(message)
    if hit is not None:
        return hit
    per = CHARS_PER_TOKEN
    total = 0
    for call in message.tool_calls:
        total += CALL_OVERHEAD - (-len(call.id) // per) - (-len(call.name) // per)
        if call.invalid_arguments is not None:  # sent back as the model wrote them
            total -= -len(call.invalid_arguments) // per
        else:
            total += json_tokens(call.arguments)
    return CALL_COSTS.put(message, total, total)


def message_tokens(message: Message) -> int:
    """Tokens one message costs in a request: content, tool calls and framing.

    (The context counts every message of the window at every round: the per-4-character
    estimate is spelled out here rather than called per part.)"""
    per = CHARS_PER_TOKEN
    total = MESSAGE_OVERHEAD - (-len(message.content) // per)
    if message.tool_calls:
        total += _calls_tokens(message)
    if message.role == "tool":
        total -= (-len(message.tool_call_id) // per) + (-len(message.name) // per)
    return total


def messages_tokens(messages: Iterable[Message]) -> int:
    return sum(message_tokens(message) for message in messages)
