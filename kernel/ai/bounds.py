"""How much of the model's own output the conversation keeps (issue 31, ADR-054).

Everything in the conversation is sent back to the model with every request, through the
ai-provider sandbox's frames (4 MiB at most).  A model that once asked for a call with a
3 MB argument -- refused, so nothing came of it -- made every later request too large:
the provider sandbox failed for the rest of the session.  So a call's arguments are kept
verbatim only up to :data:`ARGUMENTS_KEPT` characters, a refused call's only up to
:data:`REFUSED_KEPT`; beyond that the conversation holds a summary in their place (the
tool, the size, why, and a short prefix), and the call's result tells the model so.  The
audit log keeps its own record of the call, as before; the call itself ran with what the
model sent.
"""

from __future__ import annotations

import json
from typing import Any, Final

import msgspec

from fluffy.ipc.ai_types import Message, ToolCall

#: A call's arguments (compact JSON, or the text the model sent) kept verbatim up to this.
ARGUMENTS_KEPT: Final = 64_000
#: A refused call's arguments: the model gets a summary beyond this.
REFUSED_KEPT: Final = 2_000
#: How much of omitted arguments the summary shows.
PREFIX_CHARS: Final = 200
#: An assistant message's text kept up to this (its middle is cut beyond).
TEXT_KEPT: Final = 100_000
#: The key of a summary standing in for a call's arguments.
OMITTED: Final = "_omitted_by_fluffy"
TOO_LARGE: Final = "too large to keep in the conversation"


def arguments_text(call: ToolCall) -> str:
    """The call's arguments as the model sent them (or their compact JSON)."""
    if call.invalid_arguments is not None:
        return call.invalid_arguments
    return json.dumps(call.arguments, separators=(",", ":"), ensure_ascii=False, default=str)


def omitted(call: ToolCall, why: str) -> dict[str, Any]:
    """The summary of a call's arguments: tool, size in bytes, why, a short prefix."""
    text = arguments_text(call)
    return {
        "tool": call.name,
        "bytes": len(text.encode("utf-8", "surrogatepass")),
        "why": why,
        "prefix": text[:PREFIX_CHARS],
    }


def summarised(call: ToolCall, why: str) -> ToolCall:
    """``call`` with a summary in place of its arguments."""
    return ToolCall(id=call.id, name=call.name, arguments={OMITTED: omitted(call, why)})


def is_summarised(call: ToolCall) -> bool:
    return set(call.arguments) == {OMITTED}


def bounded(message: Message) -> Message:
    """``message`` as the conversation keeps it: long text cut in the middle, calls whose
    arguments pass :data:`ARGUMENTS_KEPT` summarised."""
    calls = [
        summarised(call, TOO_LARGE) if len(arguments_text(call)) > ARGUMENTS_KEPT else call
        for call in message.tool_calls
    ]
    content = message.content
    if len(content) > TEXT_KEPT:
        half = TEXT_KEPT // 2
        cut = len(content) - 2 * half
        content = f"{content[:half]}\n...[{cut} characters not kept]...\n{content[-half:]}"
    if content is message.content and calls == list(message.tool_calls):
        return message
    return msgspec.structs.replace(message, content=content, tool_calls=calls)


def needs_summary(call: ToolCall, refused: bool) -> bool:
    """Whether the conversation keeps a summary instead of the call's arguments."""
    size = len(arguments_text(call))
    return size > ARGUMENTS_KEPT or (refused and size > REFUSED_KEPT)
