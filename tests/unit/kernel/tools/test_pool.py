"""The warm pool's rules (kernel.tools.sandbox.pool), fake maker; real engines: integration."""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from fluffy.errors import EngineOperationFailed
from fluffy.kernel.containers.lifecycle import Sandbox
from fluffy.kernel.memory_guard import MemoryGuard
from fluffy.kernel.tools.sandbox.pool import SandboxPool
from fluffy.kernel.tools.sandbox.poolslots import (
    IDLE_SANDBOX_MIB,
    PoolLimits,
    Recipe,
    Slot,
    folder_identity,
    host_memory_free,
)


def sync(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run the async test on its own loop (no async plugin), within 20 s."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(asyncio.wait_for(fn(*args, **kwargs), 20))

    return run


class _Job:
    def __init__(self) -> None:
        self.waiting = asyncio.Event()
        self.lost = False


class Maker:
    """Makes slots instantly; images can be 'rebuilt' by changing their id."""

    def __init__(self) -> None:
        self.images: dict[str, str] = {}
        self.opened: list[Slot] = []
        self.closed: list[Slot] = []
        self.fail: Exception | None = None
        self.delay = 0.0
        self.image_delay = 0.0
        self.begun: list[Recipe] = []  # slots whose making has started
        self._ids = itertools.count()

    async def open_slot(self, recipe: Recipe) -> Slot:
        self.begun.append(recipe)
        await asyncio.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        n = next(self._ids)
        sandbox = Sandbox(f"sb{n}", recipe.template, f"fluffy-{n}", Path("/nonexistent"))
        ref = recipe.image or "fluffy/code-executor:0123456789ab"
        slot = Slot(recipe, f"tool:x:{n}", _Job(), sandbox, ref, self.images.setdefault(ref, "id1"))
        slot.job.waiting.set()
        self.opened.append(slot)
        return slot

    async def close_slot(self, slot: Slot) -> None:
        self.closed.append(slot)

    async def image_id(self, ref: str) -> str:
        await asyncio.sleep(self.image_delay)
        return self.images[ref]


def recipe(tmp_path: Path, template: str = "code-executor", **changes: object) -> Recipe:
    project = tmp_path / "project"
    staged = tmp_path / "staged"
    project.mkdir(exist_ok=True)
    staged.mkdir(exist_ok=True)
    fields: dict[str, object] = {
        "plugin": "fs-tool",
        "module": "fluffy.plugins.fs_tool",
        "template": template,
        "project": project,
        "staged_dir": staged,
        "image": None,
        "max_duration": "365s",
        "environment": (("HOME", "/tmp"),),
        "identity": folder_identity(project, staged),
        **changes,
    }
    return Recipe(**fields)  # type: ignore[arg-type]


def pool(maker: Maker, **limits: object) -> SandboxPool:
    settings = PoolLimits(**limits)  # type: ignore[arg-type]
    return SandboxPool(maker, settings, host_free=lambda: 0.5)


async def settle(subject: SandboxPool, idle: int, timeout: float = 5.0) -> None:
    """Wait until ``subject`` holds ``idle`` sandboxes (the filler runs in the background)."""
    async with asyncio.timeout(timeout):
        while subject.size != idle:
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # nothing more is on its way
    assert subject.size == idle


async def warm(tmp_path: Path) -> tuple[Maker, Recipe, SandboxPool]:
    """A pool holding one idle sandbox of the default recipe (writes were expected)."""
    maker, r = Maker(), recipe(tmp_path)
    subject = pool(maker)
    subject.expect(r)
    await settle(subject, 1)
    return maker, r, subject


@sync
async def test_a_pooled_sandbox_is_handed_out_once_and_never_again(tmp_path: Path) -> None:
    maker, r = Maker(), recipe(tmp_path)
    subject = pool(maker)
    assert await subject.take(r) is None  # the first call makes its own; demand is noted
    await settle(subject, 2)  # one warm, plus one for the call that found none
    handed = [await subject.take(r) for _ in range(2)]
    assert all(s is not None for s in handed)
    assert len({id(s) for s in handed}) == 2
    await settle(subject, 2)  # the two calls in a row: the next run finds two
    later = [await subject.take(r) for _ in range(2)]
    assert all(s is not None for s in later)
    assert not {id(s) for s in later} & {id(s) for s in handed}  # refilled with new ones
    assert not maker.closed  # the runner destroys what it took, after the call
    await subject.close()
    taken = {id(s) for s in [*handed, *later]}
    assert {id(s) for s in maker.closed} == {id(s) for s in maker.opened} - taken


@sync
async def test_a_call_arriving_while_its_sandbox_is_made_waits_for_that_one(
    tmp_path: Path,
) -> None:
    maker, r = Maker(), recipe(tmp_path)
    maker.delay = 0.3
    subject = pool(maker)
    subject.expect(r)  # writes are about to begin
    await asyncio.sleep(0.1)  # ... and the first comes before its sandbox is ready
    started = asyncio.get_running_loop().time()
    taken = await subject.take(r)
    waited = asyncio.get_running_loop().time() - started
    assert taken is maker.opened[0]  # not a second, cold one
    assert 0.1 < waited < 0.3  # the rest of its making, not a whole one
    await subject.close()


@sync
async def test_no_sandbox_is_handed_out_after_the_policy_is_reloaded(tmp_path: Path) -> None:
    maker, r, subject = await warm(tmp_path)
    before = list(maker.opened)
    subject.invalidate("the policy was reloaded")
    taken = await subject.take(r)
    assert taken is None or taken not in before
    await asyncio.sleep(0.05)
    assert before[0] in maker.closed  # destroyed, not kept
    await subject.close()


@sync
async def test_a_sandbox_of_a_rebuilt_image_is_not_confirmed(tmp_path: Path) -> None:
    """The image check runs beside the call (ADR-095): a taken sandbox of a rebuilt
    image is not confirmed, and the pool's other idle ones of that image are dropped."""
    maker, r = Maker(), recipe(tmp_path, image="fluffy/env-demo:0123456789abcdef")
    subject = pool(maker)
    subject.expect(r, 2)
    await settle(subject, 2)
    stale, idle = maker.opened[0], maker.opened[1]
    maker.images["fluffy/env-demo:0123456789abcdef"] = "id2"  # `fluffy env build` moved the tag
    taken = await subject.take(r)
    assert taken is not None and taken.image_id != "id2"
    assert not await subject.confirm(taken)
    await asyncio.sleep(0.05)
    assert {stale, idle} - {taken} <= set(maker.closed)  # the idle one: dropped
    async with asyncio.timeout(5):  # refilled from the new image
        while not any(s.image_id == "id2" for s in subject.idle.get(r, [])):
            await asyncio.sleep(0.01)
    fresh = await subject.take(r)
    assert fresh is not None and fresh.image_id == "id2" and await subject.confirm(fresh)
    await subject.close()


@sync
async def test_a_sandbox_whose_folder_was_replaced_is_not_handed_out(tmp_path: Path) -> None:
    _, r, subject = await warm(tmp_path)
    assert r.staged_dir is not None
    # discarded and made again: the mount shows the old folder. The old one is moved
    # aside, not removed, so the file system cannot hand its inode to the new one.
    r.staged_dir.rename(tmp_path / "discarded")
    r.staged_dir.mkdir()
    assert await subject.take(r) is None
    await subject.close()


@sync
async def test_a_folder_discarded_drops_only_the_sandboxes_that_mount_it(tmp_path: Path) -> None:
    maker = Maker()
    a = recipe(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    b = recipe(tmp_path, staged_dir=other, identity=folder_identity(tmp_path / "project", other))
    subject = pool(maker)
    subject.expect(a)
    subject.expect(b)
    await settle(subject, 2)
    subject.invalidate("session ended", folder=other)
    assert subject.size == 1 and b not in subject.idle and a in subject.idle
    await subject.close()


@sync
async def test_a_sandbox_whose_host_hung_up_is_not_handed_out(tmp_path: Path) -> None:
    maker, r, subject = await warm(tmp_path)
    maker.opened[0].job.lost = True  # its container died while idle
    assert await subject.take(r) is None
    await subject.close()


@sync
async def test_the_pool_empties_under_memory_pressure_and_refills_after(tmp_path: Path) -> None:
    free = [0.5]
    maker, r = Maker(), recipe(tmp_path)
    subject = SandboxPool(maker, PoolLimits(), host_free=lambda: free[0])
    subject.expect(r)
    await settle(subject, 1)
    free[0] = 0.05  # the machine is short of memory
    await settle(subject, 0)
    assert maker.opened[0] in maker.closed
    assert await subject.take(r) is None  # and makes none while it lasts
    await asyncio.sleep(0.1)
    assert subject.size == 0 and len(maker.opened) == 1
    free[0] = 0.5
    await settle(subject, 2)
    await subject.close()


@sync
async def test_the_kernel_memory_guard_drains_the_pool(tmp_path: Path) -> None:
    """A real MemoryGuard over cgroup files: at 80 % its shedders run, the pool drains."""
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text("1000\n")
    (cgroup / "memory.current").write_text("100\n")
    guard = MemoryGuard(root=cgroup)
    maker, r = Maker(), recipe(tmp_path)
    subject = SandboxPool(
        maker,
        PoolLimits(),
        kernel_pressure=lambda: not guard.accepting_work,
        host_free=lambda: 0.5,
    )
    guard.shedders.append(subject.drain)
    guard.check()
    subject.expect(r)
    await settle(subject, 1)
    (cgroup / "memory.current").write_text("850\n")
    assert guard.check() == "shed"
    assert subject.size == 0
    assert await subject.take(r) is None  # a call wakes the filler: it makes nothing
    await asyncio.sleep(0.2)
    assert subject.size == 0 and len(maker.opened) == 1  # nothing is made while it sheds
    (cgroup / "memory.current").write_text("100\n")
    assert guard.check() == "ok"
    await settle(subject, 2)  # and refills (the call above counts as a miss)
    await subject.close()


@sync
async def test_demand_sets_the_size_and_idleness_empties_it(tmp_path: Path) -> None:
    now = [1000.0]
    maker, r = Maker(), recipe(tmp_path)
    limits = PoolLimits(max_idle=4, idle_after_s=120)
    subject = SandboxPool(maker, limits, host_free=lambda: 0.5, clock=lambda: now[0])
    assert subject.target(r, now[0]) == 0  # never asked for: nothing kept
    subject.expect(r)
    assert subject.target(r, now[0]) == 1
    for _ in range(5):  # calls that found the pool empty
        await subject.take(r)
        now[0] += 5  # (not in a row)
    assert subject.target(r, now[0]) == 4  # 1 + 5 misses, capped by max_idle
    now[0] += 61
    assert subject.target(r, now[0]) == 1  # the misses are a minute old
    now[0] += 120
    assert subject.target(r, now[0]) == 0  # not asked for in idle_after: drained
    await subject.close()


def test_a_run_of_calls_in_a_row_sets_the_size_without_misses(tmp_path: Path) -> None:
    """A turn's calls in a row (each sooner after the last than a sandbox takes to make)
    size the pool for the next such turn, even when the pool had them all warm (so none
    missed)."""
    now = [1000.0]
    r = recipe(tmp_path)
    subject = SandboxPool(Maker(), PoolLimits(), host_free=lambda: 0.5, clock=lambda: now[0])
    demand = subject._demand(r, now[0])
    demand.calls.extend([1000.0, 1000.2, 1000.4, 1000.6, 1000.8, 1001.0, 1030.0])
    assert subject.make_s == 0.25  # (nothing made yet: the default)
    assert demand.longest_run(subject.make_s) == 6  # the last one came after a pause
    assert subject.target(r, now[0]) == 6
    now[0] += 61
    assert subject.target(r, now[0]) == 1  # a minute later the run is forgotten


@sync
async def test_the_recipe_asked_for_last_takes_the_room_of_the_others(tmp_path: Path) -> None:
    maker = Maker()
    subject = pool(maker, max_idle=3)
    old, new = recipe(tmp_path, plugin="git-tool"), recipe(tmp_path)
    subject.expect(old, 3)
    await settle(subject, 3)
    subject.expect(new, 2)  # writes begin: two of the three places go to them
    async with asyncio.timeout(5):
        while len(subject.idle.get(new, ())) < 2:
            await asyncio.sleep(0.01)
    assert len(subject.idle.get(old, ())) == 1 and subject.size == 3
    await subject.close()


@sync
async def test_the_memory_budget_caps_the_pool(tmp_path: Path) -> None:
    maker, r = Maker(), recipe(tmp_path)
    subject = pool(maker, memory_budget_mib=3 * IDLE_SANDBOX_MIB + 1)
    assert subject.limits.capacity == 3
    subject.expect(r, 6)  # a batch of six writes announced
    await settle(subject, 3)
    await subject.close()


@sync
async def test_an_announced_batch_is_made_ahead_two_at_a_time(tmp_path: Path) -> None:
    maker, r = Maker(), recipe(tmp_path)
    maker.delay = 0.2
    subject = pool(maker, makers=2)
    subject.expect(r, 4)
    await asyncio.sleep(0.1)
    assert len(maker.begun) == 2 and subject.size == 0  # two at once, none ready yet
    await settle(subject, 4)
    assert len(maker.opened) == 4
    await subject.close()


@sync
async def test_all_recipes_together_stay_within_max_idle(tmp_path: Path) -> None:
    maker = Maker()
    subject = pool(maker, max_idle=2)
    for template in ("code-executor", "integration-test", "ai-provider"):
        subject.expect(recipe(tmp_path, template=template))
    await settle(subject, 2)
    await subject.close()


@sync
async def test_a_disabled_pool_makes_nothing(tmp_path: Path) -> None:
    maker, r = Maker(), recipe(tmp_path)
    subject = pool(maker, enabled=False)
    subject.expect(r)
    assert await subject.take(r) is None
    await asyncio.sleep(0.1)
    assert not maker.opened
    await subject.close()


@sync
async def test_a_recipe_that_cannot_be_made_backs_off(tmp_path: Path) -> None:
    maker, r = Maker(), recipe(tmp_path)
    maker.fail = EngineOperationFailed("the engine refused to create the container")
    subject = pool(maker)
    subject.expect(r)
    await asyncio.sleep(0.3)
    assert subject.stats["failed"] == 1  # tried once, then waits before trying again
    await subject.close()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("MemTotal: 1000 kB\nMemFree: 10 kB\nMemAvailable: 250 kB\n", 0.25),
        ("MemTotal: 1000 kB\n", None),
        ("garbage", None),
    ],
)
def test_host_memory_is_read_from_meminfo(tmp_path: Path, text: str, expected: float) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(text)
    assert host_memory_free(meminfo) == expected


@sync
async def test_a_sandbox_made_while_its_folder_is_discarded_is_dropped(tmp_path: Path) -> None:
    maker = Maker()
    a = recipe(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    b = recipe(tmp_path, staged_dir=other, identity=folder_identity(tmp_path / "project", other))
    subject = pool(maker)
    subject.expect(a)
    await settle(subject, 1)
    maker.delay = 0.3
    subject.expect(b)
    async with asyncio.timeout(5):
        while b not in maker.begun:
            await asyncio.sleep(0.01)  # b's sandbox is being made ...
    subject.invalidate("session ended", folder=other)  # ... when its folder goes
    async with asyncio.timeout(5):
        while len(maker.opened) < 2 or maker.opened[1] not in maker.closed:
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # nothing more is on its way
    assert b not in subject.idle and maker.opened[1] in maker.closed
    assert a in subject.idle  # the others stay
    await subject.close()


@sync
async def test_an_unanswered_image_check_is_not_a_confirmation(tmp_path: Path) -> None:
    maker, r, subject = await warm(tmp_path)
    taken = await subject.take(r)
    assert taken is not None

    async def unanswered(ref: str) -> str:
        raise EngineOperationFailed("the engine refused to inspect the image")

    maker.image_id = unanswered  # type: ignore[method-assign]
    stale = subject.stats["stale"]
    assert not await subject.confirm(taken)
    assert subject.stats["stale"] == stale + 1
    await subject.close()


@sync
async def test_a_reload_during_the_image_check_is_not_missed(tmp_path: Path) -> None:
    maker, r, subject = await warm(tmp_path)
    maker.image_delay = 0.2
    taken = await subject.take(r)
    assert taken is not None
    checking = asyncio.ensure_future(subject.confirm(taken))
    await asyncio.sleep(0.05)  # the check waits for the engine's answer ...
    subject.invalidate("the policy was reloaded")  # ... when the policy changes
    assert not await checking
    await subject.close()


@sync
async def test_an_unexpected_error_neither_stops_the_pool_nor_its_shutdown(
    tmp_path: Path,
) -> None:
    maker, r = Maker(), recipe(tmp_path)
    maker.fail = ValueError("a bug in the engine library")
    subject = pool(maker)
    subject.expect(r)
    await asyncio.sleep(0.2)
    assert subject.stats["failed"] == 1
    assert subject._task is not None and not subject._task.done()  # still filling
    await subject.close()  # and closes cleanly


@sync
async def test_a_third_party_plugin_is_never_pooled(tmp_path: Path) -> None:
    maker, r = Maker(), recipe(tmp_path, plugin="hello-tool", third_party=True)
    subject = pool(maker)
    subject.expect(r)
    assert await subject.take(r) is None
    await asyncio.sleep(0.2)
    assert not maker.opened and not subject.demand
    await subject.close()


@sync
async def test_closing_waits_for_the_sandbox_being_made_and_destroys_it(tmp_path: Path) -> None:
    maker, r = Maker(), recipe(tmp_path)
    maker.delay = 0.3
    subject = pool(maker)
    subject.expect(r)
    await asyncio.sleep(0.1)  # being made when the kernel stops
    await subject.close()
    assert len(maker.opened) == 1 and maker.opened[0] in maker.closed  # none left behind
