"""Scheduling on the live path (ADR-043): the priority each kind of work gets, and the
order a batch's dependent calls are run in, on a real kernel stack (database, audit,
policy, router; the scripted model in a child process)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from fluffy.errors import ToolFailed
from fluffy.kernel.ai.assemble import AiLayer
from fluffy.kernel.scheduler import PRIORITY_HIGH, PRIORITY_NORMAL
from fluffy.kernel.tools.assemble import ToolPath
from tests.unit.test_ai_loop import _events, _script
from tests.unit.test_ai_loop import run as run_ai
from tests.unit.test_tool_router import Harness, run

pytestmark = pytest.mark.unit


class Recorder:
    """Stands for the scheduler: records (template, priority) and fails the call (no
    engine here: what matters is what the router asked for)."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []

    async def __call__(
        self, template: str, key: str, work: Callable[[], Awaitable[Any]], priority: int
    ) -> Any:
        self.asked.append((template, priority))
        raise ToolFailed("no sandbox in this test")


def _recording(tools: ToolPath) -> Recorder:
    recorder = Recorder()
    tools.router.schedule = recorder
    tools.router.runner = object()  # type: ignore[assignment]  # past the engine check
    return recorder


def test_a_clients_tool_call_runs_at_normal_priority(tmp_path: Path) -> None:
    async def body(tools: ToolPath, sid: str) -> list[tuple[str, int]]:
        recorder = _recording(tools)
        answer = await tools.router.call(sid, "git.status", {})
        assert not answer["ok"]
        return recorder.asked

    assert run(Harness(tmp_path), body) == [("code-executor", PRIORITY_NORMAL)]


def test_a_model_turns_calls_run_at_high_priority(tmp_path: Path) -> None:
    provider = _script(("Checking the tree.", [("git.status", {})]), ("Done.", []))

    async def body(tools: ToolPath, ai: AiLayer, sid: str) -> list[tuple[str, int]]:
        recorder = _recording(tools)
        await ai.loop.start(sid, "Look around", provider)
        await _events(ai, sid)
        return recorder.asked

    assert run_ai(Harness(tmp_path), body) == [("code-executor", PRIORITY_HIGH)]
