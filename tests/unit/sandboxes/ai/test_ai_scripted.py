"""The scripted adapter (turn selection, streaming shape) and the adapter factory."""

from __future__ import annotations

import json

import httpx
import pytest

from fluffy.ipc.ai_types import (
    Done,
    Message,
    ProviderConfig,
    ProviderError,
    ScriptedCall,
    ScriptedTurn,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolResult,
)
from fluffy.sandboxes.ai.adapters import make_adapter
from fluffy.sandboxes.ai.anthropic import AnthropicAdapter
from fluffy.sandboxes.ai.openai import OpenAIAdapter
from fluffy.sandboxes.ai.scripted import ScriptedAdapter, text_chunks, turn_index

pytestmark = pytest.mark.unit

TURNS = [
    ScriptedTurn(
        say="I will read the file first.", calls=[ScriptedCall("fs.read", {"path": "a.py"})]
    ),
    ScriptedTurn(
        say="",
        calls=[
            ScriptedCall("fs.write", {"path": "b.py", "content": "x = 1\n"}),
            ScriptedCall("test.run"),
        ],
    ),
    ScriptedTurn(say="All green."),
]
CONFIG = ProviderConfig(name="scripted", turns=TURNS)


def conversation(assistant_turns: int) -> list[Message]:
    messages = [Message("system", "sys"), Message("user", "go")]
    for n in range(assistant_turns):
        messages.append(Message("assistant", "", tool_calls=[ToolCall(f"call_{n}_0", "fs.read")]))
        messages.append(Message("tool", "result", tool_call_id=f"call_{n}_0"))
    return messages


def test_turn_index_counts_assistant_messages_after_the_last_user_message() -> None:
    assert turn_index([]) == 0
    assert turn_index(conversation(0)) == 0
    assert turn_index(conversation(2)) == 2
    assert turn_index([*conversation(2), Message("user", "again")]) == 0
    assert turn_index([Message("assistant", "a"), Message("assistant", "b")]) == 2


def test_each_turn_is_played_in_order_then_done() -> None:
    adapter = ScriptedAdapter(CONFIG)
    first = adapter.chat(conversation(0), [])
    assert first.text == "I will read the file first."
    assert first.tool_calls == [ToolCall("call_0_0", "fs.read", {"path": "a.py"})]
    assert first.stop_reason == "tool_calls"
    second = adapter.chat(conversation(1), [])
    assert [(c.id, c.name) for c in second.tool_calls] == [
        ("call_1_0", "fs.write"),
        ("call_1_1", "test.run"),
    ]
    third = adapter.chat(conversation(2), [])
    assert (third.text, third.tool_calls, third.stop_reason) == ("All green.", [], "stop")
    beyond = adapter.chat(conversation(7), [])
    assert (beyond.text, beyond.tool_calls, beyond.stop_reason) == ("Done.", [], "stop")
    assert ScriptedAdapter(ProviderConfig()).chat(conversation(0), []).text == "Done."


def test_stream_shape() -> None:
    events: list[StreamEvent] = list(ScriptedAdapter(CONFIG).chat_stream(conversation(0), []))
    texts = [e.content for e in events if isinstance(e, TextDelta)]
    assert len(texts) > 1 and "".join(texts) == "I will read the file first."
    calls = [e for e in events if not isinstance(e, TextDelta | Done)]
    assert calls == [
        ToolCallStart(call_id="call_0_0", tool_name="fs.read"),
        ToolCallDelta(call_id="call_0_0", arguments_delta='{"path":"a.py"}'),
        ToolCallEnd(call_id="call_0_0"),
    ]
    final = events[-1]
    assert isinstance(final, Done) and final.response is not None
    assert final.response.tool_calls == [ToolCall("call_0_0", "fs.read", {"path": "a.py"})]
    assert final.response.usage.output_tokens > 0


def test_stream_of_a_turn_with_two_calls_and_no_text() -> None:
    events = list(ScriptedAdapter(CONFIG).chat_stream(conversation(1), []))
    assert not any(isinstance(e, TextDelta) for e in events)
    deltas = {
        e.call_id: json.loads(e.arguments_delta) for e in events if isinstance(e, ToolCallDelta)
    }
    assert deltas == {"call_1_0": {"path": "b.py", "content": "x = 1\n"}, "call_1_1": {}}


@pytest.mark.parametrize("text", ["", "one", "a b c d e f g", "  spaced\n lines  here\t"])
def test_text_chunks_rebuild_the_text(text: str) -> None:
    assert "".join(text_chunks(text)) == text


def test_formatting_helpers() -> None:
    adapter = ScriptedAdapter(CONFIG)
    call = ToolCall("call_0_0", "fs.read")
    assert adapter.format_tool_result(call, ToolResult("call_0_0", True, "data")) == {
        "role": "tool",
        "tool_call_id": "call_0_0",
        "name": "fs.read",
        "content": "data",
    }


def test_make_adapter_by_name() -> None:
    with httpx.Client() as client:
        assert isinstance(make_adapter(CONFIG, None), ScriptedAdapter)
        assert isinstance(
            make_adapter(ProviderConfig(name="openai", model="m"), client), OpenAIAdapter
        )
        assert isinstance(
            make_adapter(ProviderConfig(name="anthropic", model="m"), client), AnthropicAdapter
        )
    bogus = ProviderConfig(name="gemini", model="m")  # type: ignore[arg-type]
    with pytest.raises(ProviderError) as info:
        make_adapter(bogus, None)
    assert "gemini" in info.value.what
    assert "openai" in info.value.why


def test_no_repr_shows_the_key() -> None:
    key = "sk-never-shown-abc123"
    with httpx.Client() as client:
        for name in ("openai", "anthropic"):
            config = ProviderConfig(name=name, model="m", api_key=key)
            adapter = make_adapter(config, client)
            assert key not in repr(adapter)
            assert key not in repr(vars(adapter).get("_endpoint"))


def test_the_kernels_own_notes_do_not_restart_the_script() -> None:
    from fluffy.ipc.ai_types import Message
    from fluffy.sandboxes.ai.scripted import turn_index

    history = [
        Message(role="user", content="Add error handling"),
        Message(role="assistant", content="one"),
        Message(role="assistant", content="two"),
        Message(role="user", content="[fluffy] The user approved the merge."),
    ]
    assert turn_index(history) == 2  # the script goes on with its third turn
    assert turn_index([*history, Message(role="user", content="next task")]) == 0
