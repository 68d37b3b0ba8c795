"""Token estimates for prompts and messages (design: Context Management).

fluffy never ships a provider's tokenizer: like the output sanitiser, it estimates one
token per 4 characters (:func:`fluffy.kernel.tools.sanitizer.estimate_tokens`), which
over-counts code and English slightly -- the safe side for a budget.  Structured parts
(tool-call arguments, schemas) are counted on their compact JSON encoding, and every
message pays a small framing overhead for its role and separators.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import msgspec

from fluffy.ipc.ai_types import Message
from fluffy.kernel.tools.sanitizer import estimate_tokens as _chars_to_tokens

#: Role, separators and the provider's per-message framing.
MESSAGE_OVERHEAD: Final = 4
#: Per tool call: its id and name framing.
CALL_OVERHEAD: Final = 4


def estimate_tokens(text: str) -> int:
    """Tokens of ``text`` (one per 4 characters, rounded up)."""
    return _chars_to_tokens(len(text))


_encode = msgspec.json.Encoder(enc_hook=repr).encode


def json_tokens(value: Any) -> int:
    """Tokens of ``value``'s compact JSON encoding (schemas, tool-call arguments; the
    context counts every message's at every round, so msgspec's encoder, not json's)."""
    return estimate_tokens(_encode(value).decode())


def message_tokens(message: Message) -> int:
    """Tokens one message costs in a request: content, tool calls and framing."""
    total = MESSAGE_OVERHEAD + estimate_tokens(message.content)
    for call in message.tool_calls:
        total += CALL_OVERHEAD + estimate_tokens(call.id) + estimate_tokens(call.name)
        if call.invalid_arguments is not None:  # sent back as the model wrote them
            total += estimate_tokens(call.invalid_arguments)
        else:
            total += json_tokens(call.arguments)
    if message.role == "tool":
        total += estimate_tokens(message.tool_call_id) + estimate_tokens(message.name)
    return total


def messages_tokens(messages: Iterable[Message]) -> int:
    return sum(message_tokens(message) for message in messages)
