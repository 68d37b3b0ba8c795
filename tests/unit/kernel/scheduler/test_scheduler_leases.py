"""Leases: the slots long-lived sandboxes hold through the SchedulerBridge (ADR-043)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fluffy.errors import SchedulerError
from fluffy.kernel.policy.tool_settings import SchedulerSettings
from fluffy.kernel.scheduler import Task, TaskHandle
from fluffy.kernel.tools.routing.scheduling import SchedulerBridge, _Preemptor
from tests.unit.kernel.scheduler.test_scheduler import async_test


async def _noop(handle: TaskHandle) -> None:
    return None


def _bridge(**limits: Any) -> SchedulerBridge:
    settings = SchedulerSettings(**limits)
    return SchedulerBridge(settings, None, lambda: True)


@async_test
async def test_a_lease_waits_for_its_slot_and_holds_it_until_released() -> None:
    bridge = _bridge(global_max=4, per_template={"ai-provider": 1})
    await bridge.start()
    first = await bridge.lease("ai-provider", "turn-1", priority=2, kind="ai_generate")
    second = asyncio.ensure_future(
        bridge.lease("ai-provider", "turn-2", priority=2, kind="ai_generate")
    )
    await asyncio.sleep(0.05)
    assert not second.done()  # the template's one slot is held
    assert bridge.figures()["running_by_template"] == {"ai-provider": 1}
    assert bridge.figures()["queued_by_priority"] == {"2": 1}
    first.release()
    lease = await asyncio.wait_for(second, 5)
    assert bridge.scheduler.get("turn-2").state == "running"
    lease.release()
    await asyncio.sleep(0.05)
    assert bridge.figures()["running_by_template"] == {}
    await bridge.close()


@async_test
async def test_a_lease_cancelled_while_queued_leaves_nothing_behind() -> None:
    bridge = _bridge(per_template={"ai-provider": 1})
    await bridge.start()
    held = await bridge.lease("ai-provider", "a", priority=2, kind="ai_generate")
    waiting = asyncio.ensure_future(
        bridge.lease("ai-provider", "b", priority=2, kind="ai_generate")
    )
    await asyncio.sleep(0.05)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await asyncio.sleep(0.05)
    assert bridge.figures()["by_state"]["queued"] == 0
    held.release()
    await bridge.close()


@async_test
async def test_a_lease_lost_to_the_scheduler_says_so() -> None:
    bridge = _bridge()
    await bridge.start()
    lease = await bridge.lease("code-executor", "idle", priority=5, kind="pool_fill", yields=True)
    lost: list[str] = []
    lease.on_lost = lambda: lost.append("lost")
    await bridge.close()
    assert lost == ["lost"]


@async_test
async def test_free_counts_yielding_leases() -> None:
    bridge = _bridge(global_max=4, per_template={"code-executor": 2})
    await bridge.start()
    pool = await bridge.lease("code-executor", "p", priority=5, kind="pool_fill", yields=True)
    assert bridge.free("code-executor") == 1  # the pool's own slot is taken
    call = asyncio.Event()

    async def work() -> str:
        await call.wait()
        return "ok"

    running = asyncio.ensure_future(bridge.schedule("code-executor", "c1", work, priority=3))
    await asyncio.sleep(0.05)
    assert bridge.free("code-executor") == 0
    call.set()
    assert await running == "ok"
    pool.release()
    await bridge.close()


@async_test
async def test_a_lease_is_never_paused() -> None:
    preemptor = _Preemptor(runner=None)  # type: ignore[arg-type]
    with pytest.raises(SchedulerError, match="lease"):
        await preemptor.pause(Task("x", "ai_generate", "ai-provider", _noop))


@async_test
async def test_a_call_that_ends_tells_the_pool_its_slot_is_free() -> None:
    """The warm pool refills when a call gives its slot back, not at its next tick: with
    a model's next call half a second away, a tick later is too late (the benchmark's
    warm share fell from 1.0 to 0.05 without it)."""
    bridge = _bridge()
    await bridge.start()
    seen: list[dict[str, int]] = []
    bridge.on_finish.append(lambda: seen.append(dict(bridge.figures()["running_by_template"])))

    async def work() -> str:
        return "done"

    assert await bridge.schedule("code-executor", "call-1", work) == "done"

    async def broken() -> None:
        raise RuntimeError("the call failed")

    with pytest.raises(RuntimeError):
        await bridge.schedule("code-executor", "call-2", broken)
    assert seen == [{}, {}]  # after each call, failed or not, its slot already free
    await bridge.close()
