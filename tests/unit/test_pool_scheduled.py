"""The warm pool under the scheduler (ADR-043): its sandboxes hold yielding leases that
count against the limits, it fills only free slots, and it gives slots back the moment
user work needs them -- without ever holding that work back."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fluffy.kernel.policy.tool_settings import SchedulerSettings
from fluffy.kernel.tools.pool import POOL_PRIORITY, SandboxPool
from fluffy.kernel.tools.poolslots import PoolLimits
from fluffy.kernel.tools.routedcall import CALL_PRIORITY, TURN_PRIORITY
from fluffy.kernel.tools.scheduling import SchedulerBridge
from tests.unit.test_pool import Maker, recipe, settle, sync


async def _scheduled(**limits: object) -> tuple[Maker, SandboxPool, SchedulerBridge]:
    bridge = SchedulerBridge(SchedulerSettings(**limits), None, lambda: True)  # type: ignore[arg-type]
    await bridge.start()
    maker = Maker()
    settings = PoolLimits(per_template=dict(bridge.scheduler.limits.per_template))
    subject = SandboxPool(maker, settings, host_free=lambda: 0.5)
    subject.slots = bridge
    bridge.on_start.append(subject.nudge)
    return maker, subject, bridge


def test_pool_work_is_below_all_user_work() -> None:
    assert TURN_PRIORITY < CALL_PRIORITY < POOL_PRIORITY  # 1 is the highest


@sync
async def test_idle_sandboxes_hold_leases_the_scheduler_counts(tmp_path: Path) -> None:
    _maker, subject, bridge = await _scheduled()
    subject.expect(recipe(tmp_path))
    await settle(subject, 1)
    figures = bridge.figures()
    assert figures["running_by_template"] == {"code-executor": 1}
    assert figures["running_by_priority"] == {str(POOL_PRIORITY): 1}
    assert figures["yielding"] == 1
    await subject.close()
    await asyncio.sleep(0.05)
    assert bridge.figures()["running_by_template"] == {}
    await bridge.close()


@sync
async def test_a_taken_sandbox_gives_its_lease_to_the_call(tmp_path: Path) -> None:
    _maker, subject, bridge = await _scheduled()
    r = recipe(tmp_path)
    subject.expect(r)
    await settle(subject, 1)
    taken = asyncio.Event()

    async def work() -> str:
        slot = await subject.take(r)
        assert slot is not None and slot.lease is None
        taken.set()
        await asyncio.sleep(0.1)
        return "ok"

    call = asyncio.ensure_future(bridge.schedule("code-executor", "c1", work, CALL_PRIORITY))
    await taken.wait()
    await asyncio.sleep(0.05)
    running = bridge.figures()["running_by_priority"]
    assert running.get(str(CALL_PRIORITY)) == 1
    assert await call == "ok"
    await subject.close()
    await bridge.close()


@sync
async def test_the_pool_does_not_fill_a_full_template(tmp_path: Path) -> None:
    maker, subject, bridge = await _scheduled(per_template={"code-executor": 1})
    gate = asyncio.Event()

    async def work() -> str:
        await gate.wait()
        return "ok"

    call = asyncio.ensure_future(bridge.schedule("code-executor", "c1", work, CALL_PRIORITY))
    await asyncio.sleep(0.05)
    subject.expect(recipe(tmp_path))
    await asyncio.sleep(0.3)
    assert subject.size == 0 and maker.opened == []  # background waits for a free slot
    assert bridge.figures()["queued_by_priority"] == {}  # ...outside the queue
    gate.set()
    await call
    await settle(subject, 1)  # and fills once the slot is free
    await subject.close()
    await bridge.close()


@sync
async def test_user_work_starts_at_once_and_the_pool_yields_its_slot(tmp_path: Path) -> None:
    """code-executor limit 1, held by an idle pool sandbox of another recipe: a call
    starts without waiting, and the idle sandbox is dropped so the limit holds again."""
    maker, subject, bridge = await _scheduled(per_template={"code-executor": 1})
    other = recipe(tmp_path, plugin="git-tool")
    subject.expect(other)
    await settle(subject, 1)
    started = asyncio.Event()
    gate = asyncio.Event()

    async def work() -> str:
        started.set()
        assert await subject.take(recipe(tmp_path)) is None  # not its recipe
        await gate.wait()
        return "ok"

    call = asyncio.ensure_future(bridge.schedule("code-executor", "c1", work, TURN_PRIORITY))
    await asyncio.wait_for(started.wait(), 2)  # never queued behind the idle sandbox
    await settle(subject, 0)
    assert subject.stats["yielded"] == 1 and len(maker.closed) == 1
    figures = bridge.figures()
    assert figures["running_by_template"] == {"code-executor": 1}
    assert figures["over_limit"] == 0
    gate.set()
    await call
    await subject.close()
    await bridge.close()


@sync
async def test_a_call_takes_its_warm_sandbox_before_the_pool_yields(tmp_path: Path) -> None:
    _maker, subject, bridge = await _scheduled(per_template={"code-executor": 1})
    r = recipe(tmp_path)
    subject.expect(r)
    await settle(subject, 1)

    async def work() -> bool:
        return await subject.take(r) is not None

    assert await bridge.schedule("code-executor", "c1", work, TURN_PRIORITY)
    assert subject.stats["yielded"] == 0 and subject.stats["taken"] == 1
    await subject.close()
    await bridge.close()
