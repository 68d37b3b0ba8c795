"""A refused huge argument does not poison the conversation (issue 31, ADR-054).

A 3 MB tool-call argument, refused, used to stay in the conversation: the next request
was a 6 MB frame and the ai-provider sandbox failed on its 4 MiB frame limit for the rest
of the session.  Here the scripted provider runs in a real ai_host child, so every
request crosses a real frame.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from fluffy.ipc.ai_types import Message, ToolCall
from fluffy.kernel.ai.bounds import (
    ARGUMENTS_KEPT,
    OMITTED,
    PREFIX_CHARS,
    TEXT_KEPT,
    TOO_LARGE,
    bounded,
    needs_summary,
)
from fluffy.kernel.syscalls.assemble_ai import AiLayer
from fluffy.kernel.syscalls.assemble_tools import ToolPath
from tests.unit.kernel.ai.test_ai_loop import _events, _script, run
from tests.unit.kernel.tools.test_tool_router import Harness

pytestmark = pytest.mark.unit

HUGE = 3_000_000  # the script that carries it goes to the provider with every request


def test_a_refused_huge_argument_is_summarised_and_the_session_goes_on(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    content = "# generated\n" + "x" * HUGE
    provider = _script(
        ("Plan.", [("plan.complete", {"summary": "a big fixture"})]),
        ("Writing it.", [("fs.write", {"path": "tests/test_big.py", "content": content})]),
        ("Too big; a smaller one.", [("fs.read", {"path": "/src/app.py"})]),
        ("Done after the refusal.", []),
    )

    async def body(tools: ToolPath, ai: AiLayer, sid: str) -> Any:
        await ai.loop.start(sid, "add a big fixture", provider)
        events = await _events(ai, sid, timeout_s=60)
        history = await ai.store.load(sid)
        sent = await ai.loop.memory.context(sid, state="test_writing", mode="strict", tools=[])
        return events, history, sent

    events, history, sent = run(harness, body)
    assert events[-1]["type"] == "turn_end" and events[-1]["status"] == "done", events[-3:]
    assert events[-1]["text"] == "Done after the refusal."  # the provider kept working
    (write,) = [e for e in events if e["type"] == "tool_result" and e["tool_name"] == "fs.write"]
    assert not write["ok"]  # refused: 3 MB is past max_file_size
    # the conversation keeps a summary in place of the arguments: name, size, why, prefix
    (asked,) = [m for m in history if any(c.name == "fs.write" for c in m.tool_calls)]
    summary = asked.tool_calls[0].arguments[OMITTED]
    assert summary["tool"] == "fs.write" and summary["bytes"] > HUGE
    assert summary["why"].startswith("the call was refused: ")
    assert summary["prefix"].startswith('{"path":"tests/test_big.py","content":"# generated')
    assert len(summary["prefix"]) == PREFIX_CHARS
    # the model is told, in the call's result
    (result,) = [m for m in history if m.role == "tool" and m.name == "fs.write"]
    told = json.loads(result.content)
    assert told["arguments_not_kept"]["bytes"] == summary["bytes"]
    assert "not in the conversation" in told["arguments_not_kept"]["note"]
    assert "ok" not in told and told["error"]["what"]  # the refusal, as before
    # what is stored and what is sent stay small
    assert len(msgspec.json.encode(history)) < 100_000
    assert len(msgspec.json.encode(sent)) < 100_000
    # the audit keeps its record of the call as it was
    audited = [
        e
        for kind in ("tool_execute", "tool_result")
        for e in harness.entries(kind)
        if e["syscall_type"] == "fs.write"
    ]
    (entry,) = audited
    assert (
        entry["policy_decision"] == "denied"
        and '"size":3000012' in entry["metadata"]["policy_requests"]
    )
    assert entry["input_summary"].startswith('{"path":"tests/test_big.py"')


def test_huge_arguments_and_text_are_bounded_before_they_are_stored() -> None:
    big = ToolCall(id="c1", name="fs.write", arguments={"content": "y" * (ARGUMENTS_KEPT + 1)})
    small = ToolCall(id="c2", name="fs.read", arguments={"path": "a.py"})
    raw = ToolCall(id="c3", name="fs.write", invalid_arguments="{" * (ARGUMENTS_KEPT + 5))
    message = Message(role="assistant", content="z" * (3 * TEXT_KEPT), tool_calls=[big, small, raw])
    kept = bounded(message)
    assert kept.tool_calls[1] == small
    for call in (kept.tool_calls[0], kept.tool_calls[2]):
        assert call.invalid_arguments is None
        assert call.arguments[OMITTED]["why"] == TOO_LARGE
    assert kept.tool_calls[2].arguments[OMITTED]["bytes"] == ARGUMENTS_KEPT + 5
    assert TEXT_KEPT < len(kept.content) < TEXT_KEPT + 100 and "not kept" in kept.content
    assert len(msgspec.json.encode(kept)) < 2 * TEXT_KEPT
    plain = Message(role="assistant", content="fine", tool_calls=[small])
    assert bounded(plain) is plain
    medium = ToolCall(id="c4", name="fs.write", arguments={"content": "m" * 5000})
    assert needs_summary(medium, refused=True) and not needs_summary(medium, refused=False)
