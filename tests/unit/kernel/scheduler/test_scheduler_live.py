"""The scheduler's parts for the live path (ADR-043): yielding slots (the warm pool's),
reservations (the policy sandbox), work without a sandbox (a batch's steps), and the
figures by priority."""

from __future__ import annotations

import asyncio

import pytest

from fluffy.errors import DependencyFailed, SchedulerError
from fluffy.kernel.scheduler import NO_SANDBOX, Limits, Scheduler, Task, TaskHandle
from tests.unit.kernel.scheduler.test_scheduler import Harness, async_test


@async_test
async def test_a_yielding_slot_never_blocks_a_better_priority() -> None:
    h = Harness(Limits(global_max=4, per_template={"code-executor": 1}))
    h.add("pool", priority=5)
    h.sched._records["pool"].task.yields = True
    await h.sched.start()
    await h.settle()
    assert h.running() == {"pool"}
    h.add("user", priority=3)
    await h.settle()
    assert h.running() == {"pool", "user"}  # admitted at once, over the limit
    stats = h.sched.stats()
    assert stats.yielding == 1 and stats.over_limit == 1
    await h.finish_all()
    await h.sched.close()


@async_test
async def test_a_yielding_slot_blocks_equal_and_worse_priorities() -> None:
    h = Harness(Limits(global_max=4, per_template={"code-executor": 1}))
    h.add("pool", priority=4)
    h.sched._records["pool"].task.yields = True
    await h.sched.start()
    await h.settle()
    h.add("same", priority=4)
    h.add("worse", priority=5)
    await h.settle()
    assert h.running() == {"pool"}
    h.release("pool")
    await h.settle()
    assert h.running() == {"same"}
    await h.finish_all()
    await h.sched.close()


@async_test
async def test_yielding_work_is_never_aged_past_user_work() -> None:
    """Starvation prevention bumps a waiting task, but never yielding work: it cannot
    come to outrank a user-facing call however long it waits."""
    h = Harness(Limits(global_max=1))
    h.add("running", priority=2)
    await h.sched.start()
    await h.settle()
    bg = Task("bg", "pool_fill", "code-executor", _noop, priority=5, yields=True)
    h.sched.submit(bg)
    h.add("aged", priority=5, hold=False)
    await h.tick(100)  # past every bump (30 s each), before any deadline
    assert h.sched.get("aged").effective_priority == 2
    assert h.sched.get("bg").effective_priority == 5
    h.add("user", priority=2, hold=False)
    h.release("running")
    await h.settle()
    await h.tick(0)
    order = [t for t in h.started if t != "running"]
    assert order[:2] == ["aged", "user"]  # bg last: never bumped
    assert h.sched.get("bg").state in ("running", "completed")
    await h.finish_all()
    await h.sched.result("bg")
    await h.sched.close()


async def _noop(handle: TaskHandle) -> None:
    return None


@async_test
async def test_a_yielding_slot_is_never_a_preemption_victim() -> None:
    from tests.unit.kernel.scheduler.test_scheduler import FakePreemptor

    preemptor = FakePreemptor()
    h = Harness(Limits(global_max=1), preemptor=preemptor)
    h.add("pool", priority=5)
    h.sched._records["pool"].task.yields = True
    await h.sched.start()
    await h.settle()
    h.add("user", priority=2)
    await h.settle()
    assert preemptor.calls == []
    assert h.running() == {"pool", "user"}
    await h.finish_all()
    await h.sched.close()


@async_test
async def test_a_reservation_starts_at_once_and_counts() -> None:
    h = Harness(Limits(global_max=2, per_template={"policy-sandbox": 1, "code-executor": 2}))
    h.add("a", priority=3)
    h.add("b", priority=3)
    await h.sched.start()
    await h.settle()
    assert h.running() == {"a", "b"}
    gate = asyncio.Event()

    async def hold(handle: TaskHandle) -> str:
        await gate.wait()
        return "policy"

    h.sched.reserve(Task("policy", "validate", "policy-sandbox", hold, priority=1))
    await h.settle()
    assert h.sched.get("policy").state == "running"  # never queued, limits or not
    assert h.sched.stats().over_limit == 1
    h.release("a")
    h.add("c", priority=2)
    await h.settle()
    assert h.state("c") == "queued"  # the reservation holds a slot: 2 of 2 taken
    gate.set()
    await h.settle()
    assert h.state("c") == "running"
    await h.finish_all()
    await h.sched.close()


@async_test
async def test_a_reservation_cannot_wait_for_dependencies() -> None:
    sched = Scheduler(Limits())
    sched.submit(Task("a", "tool_call", "code-executor", _noop))
    with pytest.raises(SchedulerError, match="dependencies"):
        sched.reserve(Task("b", "validate", "policy-sandbox", _noop, dependencies=("a",)))
    await sched.close()


@async_test
async def test_work_without_a_sandbox_takes_no_slot() -> None:
    h = Harness(Limits(global_max=1))
    h.add("sandboxed", priority=3)
    h.add("step1", priority=3, template=NO_SANDBOX)
    h.add("step2", priority=3, template=NO_SANDBOX, deps=("step1",))
    await h.sched.start()
    await h.settle()
    assert h.running() == {"sandboxed", "step1"}
    assert h.state("step2") == "waiting_dependency"
    h.release("step1")
    await h.settle()
    assert h.running() == {"sandboxed", "step2"}
    assert h.sched.stats().running_by_template == {"code-executor": 1}
    await h.finish_all()
    await h.sched.close()


@async_test
async def test_a_failed_step_fails_its_dependent_with_the_reason() -> None:
    h = Harness()
    h.add("write", template=NO_SANDBOX, hold=False, error=RuntimeError("disk full"))
    h.add("test", template=NO_SANDBOX, deps=("write",))
    await h.sched.start()
    await h.settle()
    with pytest.raises(DependencyFailed) as info:
        await h.sched.result("test")
    assert info.value.what == "dependency failed: write"
    assert "disk full" in (info.value.why or "")
    assert "test" not in h.started
    await h.sched.close()


@async_test
async def test_stats_count_running_and_queued_by_priority() -> None:
    h = Harness(Limits(global_max=2))
    h.add("h", priority=2)
    h.add("n", priority=3)
    h.add("l", priority=4)
    h.add("i", priority=5)
    await h.sched.start()
    await h.settle()
    stats = h.sched.stats().as_dict()
    assert stats["running_by_priority"] == {"2": 1, "3": 1}
    assert stats["queued_by_priority"] == {"4": 1, "5": 1}
    assert stats["over_limit"] == 0
    await h.finish_all()
    await h.sched.close()
