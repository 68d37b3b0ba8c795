"""The scripted provider: replays ``config.turns`` with no network (demos, tests, benchmarks).

The turn to play is derived from the conversation itself (the number of assistant
messages since the user's last message; the kernel's own notes do not count), so the
adapter keeps no state and a replayed or resumed session plays the same turn again.
Past the end of the script the model says "Done." and calls nothing, which ends the
task.  It streams like a real provider: the text in a few word chunks, each call as
start / arguments / end.  The usage it reports is simulated (characters / 3.3, as a
tokenizer averages on code).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import msgspec

from fluffy.ipc.ai_types import (
    KERNEL_NOTE,
    AIResponse,
    Done,
    Message,
    ProviderConfig,
    ScriptedTurn,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolDefinition,
    ToolResult,
    Usage,
)

FINAL_TURN = ScriptedTurn(say="Done.")
#: Words per streamed text chunk.
WORDS_PER_CHUNK = 3
_WORDS = re.compile(r"\S+\s*|\s+")


def turn_index(messages: list[Message]) -> int:
    """Assistant messages after the last user message (all of them if there is none)."""
    count = 0
    for message in reversed(messages):
        if message.role == "user" and not message.content.startswith(KERNEL_NOTE):
            break
        if message.role == "assistant":
            count += 1
    return count


def text_chunks(text: str) -> list[str]:
    """``text`` in chunks of a few words; joined they give ``text`` back exactly."""
    words = _WORDS.findall(text)
    return ["".join(words[i : i + WORDS_PER_CHUNK]) for i in range(0, len(words), WORDS_PER_CHUNK)]


#: Characters per token of the simulated usage: what a BPE tokenizer averages on code
#: (fewer than the kernel's estimate of 4, so a demo shows the budget's calibration).
CHARS_PER_TOKEN = 3.3


def _tokens(text: str) -> int:
    """Simulated usage: the tokens a real model would report for ``text``."""
    return int(len(text) / CHARS_PER_TOKEN + 0.999)


def _prompt_tokens(messages: list[Message], tools: list[ToolDefinition]) -> int:
    parts = [m.content for m in messages]
    parts += [msgspec.json.encode(c.arguments).decode() for m in messages for c in m.tool_calls]
    parts += [msgspec.json.encode(t).decode() for t in tools]
    return sum(_tokens(p) for p in parts) + 4 * len(messages)


class ScriptedAdapter:
    name = "scripted"

    def __init__(self, config: ProviderConfig, client: Any = None) -> None:
        self.config = config

    def __repr__(self) -> str:
        return f"ScriptedAdapter(turns={len(self.config.turns)})"

    def turn(self, messages: list[Message]) -> tuple[int, ScriptedTurn]:
        index = turn_index(messages)
        turns = self.config.turns
        return index, turns[index] if index < len(turns) else FINAL_TURN

    def format_tools(self, tools: list[ToolDefinition]) -> list[dict[str, Any]]:
        return [msgspec.to_builtins(t) for t in tools]

    def chat(self, messages: list[Message], tools: list[ToolDefinition]) -> AIResponse:
        index, turn = self.turn(messages)
        calls = [
            ToolCall(id=f"call_{index}_{k}", name=c.tool, arguments=dict(c.args))
            for k, c in enumerate(turn.calls)
        ]
        spoken = turn.say + "".join(msgspec.json.encode(c.args).decode() for c in turn.calls)
        return AIResponse(
            text=turn.say,
            tool_calls=calls,
            stop_reason="tool_calls" if calls else "stop",
            usage=Usage(
                input_tokens=_prompt_tokens(messages, tools),
                output_tokens=_tokens(spoken),
                reported=True,  # simulated (CHARS_PER_TOKEN), so the demo shows usage
            ),
            model=self.config.model or "scripted",
        )

    def chat_stream(
        self, messages: list[Message], tools: list[ToolDefinition]
    ) -> Iterator[StreamEvent]:
        response = self.chat(messages, tools)
        for chunk in text_chunks(response.text):
            yield TextDelta(content=chunk)
        for call in response.tool_calls:
            yield ToolCallStart(call_id=call.id, tool_name=call.name)
            yield ToolCallDelta(
                call_id=call.id, arguments_delta=msgspec.json.encode(call.arguments).decode()
            )
            yield ToolCallEnd(call_id=call.id)
        yield Done(response=response)

    def parse_tool_calls(self, response: AIResponse) -> list[ToolCall]:
        return list(response.tool_calls)

    def format_tool_result(self, call: ToolCall, result: ToolResult) -> dict[str, Any]:
        return {
            "role": "tool",
            "tool_call_id": call.id,
            "name": call.name,
            "content": result.content,
        }
