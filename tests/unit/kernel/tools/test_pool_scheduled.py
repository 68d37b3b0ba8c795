"""The warm pool under the scheduler (ADR-043, ADR-065): making a sandbox holds a
yielding lease that counts against the limits, the pool makes only in free slots and
never holds user work back; a made, idle sandbox holds no slot at all."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fluffy.kernel.policy.tool_settings import SchedulerSettings
from fluffy.kernel.tools.core.routedcall import CALL_PRIORITY, TURN_PRIORITY
from fluffy.kernel.tools.routing.scheduling import SchedulerBridge
from fluffy.kernel.tools.sandbox.pool import POOL_PRIORITY, SandboxPool
from fluffy.kernel.tools.sandbox.poolslots import PoolLimits
from tests.unit.kernel.tools.test_pool import Maker, recipe, settle, sync


async def _scheduled(**limits: object) -> tuple[Maker, SandboxPool, SchedulerBridge]:
    bridge = SchedulerBridge(SchedulerSettings(**limits), None, lambda: True)  # type: ignore[arg-type]
    await bridge.start()
    maker = Maker()
    subject = SandboxPool(maker, PoolLimits(), host_free=lambda: 0.5)
    subject.slots = bridge
    bridge.on_finish.append(subject.nudge)
    return maker, subject, bridge


def test_pool_work_is_below_all_user_work() -> None:
    assert TURN_PRIORITY < CALL_PRIORITY < POOL_PRIORITY  # 1 is the highest


@sync
async def test_making_holds_a_counted_lease_and_an_idle_sandbox_none(tmp_path: Path) -> None:
    maker, subject, bridge = await _scheduled()
    maker.delay = 0.3
    subject.expect(recipe(tmp_path))
    await asyncio.sleep(0.1)  # being made
    figures = bridge.figures()
    assert figures["running_by_template"] == {"code-executor": 1}
    assert figures["running_by_priority"] == {str(POOL_PRIORITY): 1}
    assert figures["yielding"] == 1
    await settle(subject, 1)  # made: idle, running nothing
    assert bridge.figures()["running_by_template"] == {}
    await subject.close()
    await bridge.close()


@sync
async def test_a_taken_sandbox_runs_under_its_calls_slot(tmp_path: Path) -> None:
    _maker, subject, bridge = await _scheduled()
    r = recipe(tmp_path)
    subject.expect(r)
    await settle(subject, 1)
    taken = asyncio.Event()

    async def work() -> str:
        slot = await subject.take(r)
        assert slot is not None
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
async def test_user_work_starts_at_once_while_the_pool_makes_one(tmp_path: Path) -> None:
    """code-executor limit 1, held by a sandbox the pool is making: a call starts without
    waiting for it (its lease yields)."""
    maker, subject, bridge = await _scheduled(per_template={"code-executor": 1})
    maker.delay = 0.5
    subject.expect(recipe(tmp_path, plugin="git-tool"))
    await asyncio.sleep(0.1)
    assert bridge.figures()["yielding"] == 1
    started = asyncio.Event()

    async def work() -> str:
        started.set()
        return "ok"

    call = asyncio.ensure_future(bridge.schedule("code-executor", "c1", work, TURN_PRIORITY))
    await asyncio.wait_for(started.wait(), 0.3)  # not queued behind the making
    assert await call == "ok"
    await settle(subject, 1)
    await subject.close()
    await bridge.close()


@sync
async def test_idle_sandboxes_stay_while_user_work_runs(tmp_path: Path) -> None:
    """code-executor limit 1: an idle sandbox of another recipe is not dropped when a
    call takes the slot (it holds none), and is there for its own call after."""
    maker, subject, bridge = await _scheduled(per_template={"code-executor": 1})
    other = recipe(tmp_path, plugin="git-tool")
    subject.expect(other)
    await settle(subject, 1)

    async def work() -> bool:
        return await subject.take(recipe(tmp_path)) is None  # not its recipe

    assert await bridge.schedule("code-executor", "c1", work, TURN_PRIORITY)
    assert subject.size >= 1 and not maker.closed
    assert bridge.figures()["over_limit"] == 0

    async def own() -> bool:
        return await subject.take(other) is not None

    assert await bridge.schedule("code-executor", "c2", own, TURN_PRIORITY)
    await subject.close()
    await bridge.close()


@sync
async def test_calls_never_wait_for_sandboxes_that_wait_for_their_slots(tmp_path: Path) -> None:
    """A batch announced two writes, then its two calls took both code-executor slots
    before the pool's makes got theirs: each call makes its own sandbox instead of
    waiting for one that waits for its slot (which would hold until a task timed out)."""
    _maker, subject, bridge = await _scheduled(per_template={"code-executor": 2})
    r = recipe(tmp_path)
    subject.expect(r, 2)
    await asyncio.sleep(0)  # the pool plans its makes; the calls come in the same turn

    async def work() -> bool:
        return await subject.take(r) is not None

    calls = [bridge.schedule("code-executor", f"c{i}", work, TURN_PRIORITY) for i in range(2)]
    done = await asyncio.wait_for(asyncio.gather(*calls), 5)  # never a hang
    assert len(done) == 2
    await subject.close()
    await bridge.close()
