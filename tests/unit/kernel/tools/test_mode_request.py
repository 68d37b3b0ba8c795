"""The model asks the person for another mode (workflow.request_mode, issue 33): only
while planning, the person sees the question and decides; a yes switches as the person's
own choice, a no leaves the mode as it was; the model itself can never switch."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from fluffy.kernel.policy.engine import Caller
from fluffy.kernel.tools.core.routedcall import TURN_PRIORITY
from tests.unit.kernel.mcp.test_mcp_router import Asker
from tests.unit.kernel.tools.test_tool_router import Harness

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]
ASK = {"mode": "debug", "reason": "to run the module and see the traceback"}


def _run(tmp_path: Path, asker: Asker | None, body: Any) -> Any:
    harness = Harness(tmp_path)

    async def main() -> Any:
        tools, _ = await harness.open()
        workflow = tools.router.workflow
        session = await workflow.new_session("strict", Caller("user", frozenset({"person"})))
        await workflow.fire(session.id, "user_message")
        tools.router.reviewer = asker
        try:
            return await body(tools.router, session.id)
        finally:
            await harness.close(tools)

    return asyncio.run(main())


def test_a_yes_switches_the_mode_and_a_no_keeps_it(tmp_path: Path) -> None:
    asker = Asker({"decision": "deny", "reason": "stay strict"}, {"decision": "allow"})

    async def body(router: Any, sid: str) -> list[Any]:
        assert "workflow.request_mode" in await router.available(sid)
        said = []
        for _ in range(2):
            said.append(
                await router.call(sid, "workflow.request_mode", ASK, priority=TURN_PRIORITY)
            )
            said.append((await router.workflow.get(sid)).mode)
        await router.call(sid, "plan.complete", {"summary": "reproduce first"})
        said.append("container.run" in await router.available(sid))
        return said

    refused, kept, switched, now, debug_tools = _run(tmp_path, asker, body)
    assert refused["error"]["code"] == "tool.refused" and "stay strict" in refused["error"]["why"]
    assert kept == "strict"
    assert switched["output"]["mode"] == "debug" and now == "debug"
    assert asker.shown[0]["tool"] == "workflow.request_mode"
    assert "from strict to debug mode" in asker.shown[0]["reason"]
    assert "to run the module" in asker.shown[0]["arguments"]
    assert debug_tools is True  # debug's tools, once the flow starts


def test_no_person_to_ask_or_a_flow_under_way_switches_nothing(tmp_path: Path) -> None:
    async def body(router: Any, sid: str) -> list[Any]:
        direct = await router.call(sid, "workflow.request_mode", ASK)  # a client, not a turn
        await router.call(sid, "plan.complete", {"summary": "tests first"})
        late = await router.call(sid, "workflow.request_mode", ASK, priority=TURN_PRIORITY)
        return [direct, late, (await router.workflow.get(sid)).mode]

    asker = Asker({"decision": "allow"})
    direct, late, mode = _run(tmp_path, asker, body)
    assert asker.shown == []  # never asked: no turn to answer, then a flow under way
    assert direct["error"]["code"] == "policy.denied", direct["error"]
    assert late["error"]["code"] == "workflow.mode_denied", late["error"]
    assert "test_writing" in late["error"]["what"]
    assert mode == "strict"
