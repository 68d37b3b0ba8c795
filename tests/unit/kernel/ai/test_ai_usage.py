"""The providers' token counts in the kernel: the ledger per turn and session, the
estimate's calibration, and a whole turn booking its usage (ADR-044)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from fluffy.ipc.ai_types import Message, ToolDefinition, Usage
from fluffy.kernel.ai.conversation import ConversationStore
from fluffy.kernel.ai.token_estimate import messages_tokens
from fluffy.kernel.ai.usage import MAX_SCALE, Calibration, UsageLedger, tools_tokens
from fluffy.kernel.syscalls.ai import ai_methods
from fluffy.kernel.syscalls.assemble_ai import AiLayer
from fluffy.kernel.syscalls.assemble_tools import ToolPath
from tests.unit.kernel.ai.test_ai_loop import _events, _script, run
from tests.unit.kernel.tools.test_tool_router import Harness

pytestmark = pytest.mark.unit


def used(inp: int, out: int, cached: int = 0, reported: bool = True) -> Usage:
    return Usage(input_tokens=inp, output_tokens=out, cached_tokens=cached, reported=reported)


def test_the_ledger_sums_per_turn_session_and_model(tmp_path: Path) -> None:
    async def main() -> Any:
        store = await ConversationStore.open(tmp_path)
        try:
            ledger = UsageLedger(store.db)
            await ledger.record("s1", "t1", "gpt-4o", used(100, 10, cached=40))
            await ledger.record("s1", "t1", "gpt-4o", used(200, 20))
            await asyncio.sleep(0.01)  # the next turn starts later
            await ledger.record("s1", "t2", "gpt-4o-mini", used(50, 5))
            await ledger.record("s1", "t2", "gpt-4o-mini", Usage())  # nothing reported
            await ledger.record("s2", "t3", "gpt-4o", used(7, 1))
            return await ledger.session("s1"), await ledger.sessions(["s1", "s2", "s3"])
        finally:
            await store.close()

    (turn, session), many = asyncio.run(main())
    assert (turn.requests, turn.reported, turn.input_tokens) == (2, 1, 50)
    assert set(turn.models) == {"gpt-4o-mini"}
    assert (session.requests, session.input_tokens, session.output_tokens) == (4, 350, 35)
    assert session.cached_tokens == 40
    assert session.models["gpt-4o"]["input_tokens"] == 300
    assert many["s2"].input_tokens == 7 and many["s3"].requests == 0


def test_the_calibration_follows_real_counts_and_never_shrinks_the_estimate() -> None:
    sent = [Message("system", "x" * 4000), Message("user", "y" * 400)]
    tools = [ToolDefinition("fs.read", "Read a file", {"type": "object"})]
    estimate = messages_tokens(sent) + tools_tokens(tools)
    calibration = Calibration()
    assert calibration.scale("s") == 1.0 and calibration.ratio("s") is None
    calibration.observe("s", sent, tools, used(int(estimate * 1.5), 10))
    assert calibration.ratio("s") == pytest.approx(1.5, rel=0.01)
    assert calibration.scale("s") == pytest.approx(1.5, rel=0.01)
    calibration.observe("s", sent, tools, used(int(estimate * 1.1), 10))
    assert calibration.ratio("s") == pytest.approx(1.3, rel=0.01)  # smoothed
    calibration.observe("t", sent, tools, used(int(estimate * 0.5), 10))
    assert calibration.scale("t") == 1.0  # real counts below the estimate: kept at 1
    calibration.observe("u", sent, tools, used(estimate * 50, 10))
    assert calibration.scale("u") == MAX_SCALE
    calibration.observe("v", sent, tools, Usage())  # not reported: no information
    assert calibration.ratio("v") is None


def test_a_turn_books_its_usage_and_calibrates_the_context(tmp_path: Path) -> None:
    provider = _script(
        ("Reading first.", [("fs.read", {"path": "/src/app.py"})]),
        ("That is all.", []),
    )

    async def body(tools: ToolPath, ai: AiLayer, sid: str) -> Any:
        await ai.loop.start(sid, "read the app", provider)
        events = await _events(ai, sid)
        methods = ai_methods(ai.loop)
        report = await ai.loop.memory.usage_report(sid)
        listed = await ai.loop.memory.sessions(tools.router.workflow, 5)
        return events, report, listed, methods

    events, report, listed, methods = run(Harness(tmp_path), body)
    usage = events[-1]["usage"]
    assert events[-1]["type"] == "turn_end"
    assert usage["requests"] == 2 and usage["reported"] == 2
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert set(usage["models"]) == {"scripted"}
    assert report["turn"] == usage and report["session"] == usage
    # the scripted provider counts 3.3 characters a token: more than the 4 estimated
    assert report["calibration"] > 1.0 and report["scale"] == report["calibration"]
    (row,) = [r for r in listed if r["usage"]["requests"]]
    assert row["usage"]["input_tokens"] == usage["input_tokens"]
    assert "session.usage" in methods
