"""A warm pool of single-use plugin sandboxes (ADR-038).

A plugin call used to wait for its sandbox to be created and started, and for the
plugin host's interpreter to come up (~140-190 ms of a ~190 ms ``fs.write``).  The pool
does that work before the call: for each *recipe* (plugin, template, image, project
view, staged folder, environment) it keeps a few sandboxes created,
started and connected, each blocked in ``tool.next`` on its own socket.  A call takes
one, hands it its job, and the sandbox is destroyed after the call as before: one
sandbox, one call (ADR-019); nothing carries over, only the wait leaves the model's
critical path.

What is never handed out:

* a sandbox made for another recipe: equal recipes are equal sandboxes (the mounts'
  folders are compared by device and inode too, so a folder replaced under the same
  path does not match);
* one made before :meth:`SandboxPool.invalidate`: a policy reload (a generation number),
  a session's staging folder discarded (its sandboxes dropped);
* one whose image reference now names another image (``fluffy images build`` or an
  environment rebuild moved the tag): the current image id is read from the engine
  while the taken sandbox's call runs (:meth:`SandboxPool.confirm`, ADR-095) and
  compared with the one the container was made from; the call's answer waits for it;
* one whose host hung up (its container died while idle).

Third-party plugins are not pooled: their code would run, unwatched by the scheduler,
for as long as it idles, and watch the session's staged folder change between calls.

Sizing, from the session's recent calls and a memory budget (ADR-065): a recipe is kept
warm while it is in demand, with as many sandboxes as its longest run of calls in the
last minute (calls that came faster than sandboxes are made: a model's turn asking for
several in a row), or one more than the calls that found the pool empty, or what a batch
announced (:meth:`SandboxPool.expect`); all recipes together at most
``scheduler.pool.max_idle`` and what ``scheduler.pool.memory_budget`` holds at
``IDLE_SANDBOX_MIB`` each, shared out to the recipes asked for most recently first.  A recipe
not asked for within ``scheduler.pool.idle_after`` is drained.  Under memory pressure
(the kernel's guard past "shed", or the host's available memory below
``scheduler.pool.min_free_memory``) the pool empties and makes nothing.  Up to
``scheduler.pool.makers`` sandboxes are made at once, in the background.  Pool sandboxes
carry the same labels as every other, so a crashed kernel's are removed by the next one
at start-up.

Under the scheduler (ADR-043, ADR-065): *making* a sandbox is work (the engine's create
and start, the host's start-up), so each one being made holds a *yielding* lease of its
template at the lowest priority: the pool starts one only while a slot is free and
nothing waits in the queue, and a user-facing call never waits behind it.  A made,
idle sandbox runs nothing (its host is blocked in ``tool.next``): it holds no slot and
counts against the memory budget only; the call that takes it runs under its own slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from fluffy.errors import FluffyError
from fluffy.kernel.scheduler.task import PRIORITY_IDLE
from fluffy.kernel.tools.sandbox.pooldemand import MAKE_S, WINDOW_S, Demand
from fluffy.kernel.tools.sandbox.poolslots import (
    Lease,
    Maker,
    PoolLimits,
    Recipe,
    Slot,
    Slots,
    folder_identity,
    host_memory_free,
)

#: The pool's API; Recipe, Slot and folder_identity live in poolslots (the plugin
#: runner imports them from here).
__all__ = ["POOL_PRIORITY", "Recipe", "SandboxPool", "Slot", "folder_identity"]

log = logging.getLogger("fluffy.kernel.pool")

#: After a call takes a sandbox, the pool makes none for this long: more calls of the
#: same turn may follow, and making one (the engine's work, a host starting) would slow
#: them down on a small machine; it refills in the model's time to think.
QUIET_S = 0.2
#: A call waits at most this long (or three recent makes) for a sandbox being made.
WAIT_S = 1.0
#: How often idle sandboxes are checked (age, pressure) when nothing else wakes the pool.
TICK_S = 1.0
#: A recipe whose sandbox could not be made is not tried again for this long (doubled
#: after each further failure, up to BACKOFF_MAX_S).
BACKOFF_S = 5.0
BACKOFF_MAX_S = 120.0
#: How long closing waits for a sandbox being made.
CLOSE_WAIT_S = 60.0
#: The scheduler priority of the pool's sandboxes: background, below all user work.
POOL_PRIORITY = PRIORITY_IDLE


class _Make(msgspec.Struct):
    """A sandbox being made: its recipe, whether it holds its scheduler slot yet, and
    whether it is dropped when it arrives (its folder was discarded meanwhile)."""

    recipe: Recipe
    leased: bool = False
    stale: bool = False


class SandboxPool:
    """Warm single-use sandboxes per recipe (see the module docstring)."""

    def __init__(
        self,
        maker: Maker,
        limits: PoolLimits,
        *,
        kernel_pressure: Callable[[], bool] = lambda: False,
        host_free: Callable[[], float | None] = host_memory_free,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.maker = maker
        self.limits = limits
        self.kernel_pressure = kernel_pressure
        self.host_free = host_free
        self.clock = clock
        self.generation = 0
        self.idle: dict[Recipe, list[Slot]] = {}
        self.demand: dict[Recipe, Demand] = {}
        #: the sandboxes being made, by their arrival (done once idle, or failed)
        self.making: dict[asyncio.Future[None], _Make] = {}
        #: how long making a sandbox took lately (a moving average)
        self.make_s = MAKE_S
        self.last_take = float("-inf")  # (time.monotonic(): the quiet period after it)
        #: whether memory was short when the filler last looked (what kernel.ping shows)
        self.pressured = False
        self._makes: set[asyncio.Task[None]] = set()
        self.stats = {
            "made": 0,
            "taken": 0,
            "missed": 0,
            "stale": 0,
            "drained": 0,
            "failed": 0,
        }
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False
        #: the scheduler (None: the pool answers to no limits but its own)
        self.slots: Slots | None = None

    # -- the caller's side ---------------------------------------------------------------
    async def take(self, recipe: Recipe) -> Slot | None:
        """A warm sandbox of ``recipe`` (its host waiting, if one is), or None: make one."""
        if recipe.third_party:
            return None  # a third-party plugin's code never idles ahead of its call
        now = self.clock()
        self.last_take = time.monotonic()
        demand = self._demand(recipe, now)
        demand.calls.append(now)
        found = self._pick(recipe) if self.limits.enabled else None
        if found is None:
            demand.misses.append(now)  # a call the pool was not ready for: it counts
            # for the size.  Its sandbox may be being made: waiting for it beats making
            # another -- only for one that holds its slot (one still waiting for a slot
            # may wait for this very call's), and at most WAIT_S or three recent makes
            arrivals = [f for f, m in self.making.items() if m.recipe == recipe and m.leased]
            if arrivals:
                await asyncio.wait(
                    [asyncio.shield(f) for f in arrivals],
                    timeout=max(WAIT_S, 3 * self.make_s),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                found = self._pick(recipe)
        if found is None:
            self.stats["missed"] += 1
        else:
            self.stats["taken"] += 1
        self._start()
        self._wake.set()
        return found

    def expect(self, recipe: Recipe, count: int = 1) -> None:
        """``recipe`` will be asked for soon, ``count`` times (writes begin; a batch of
        calls): keep that many warm."""
        if recipe.third_party:
            return
        now = self.clock()
        demand = self._demand(recipe, now)
        demand.expected, demand.expected_at = max(1, count), now
        self._start()
        self._wake.set()

    def invalidate(self, why: str, folder: Path | None = None) -> None:
        """Nothing made so far is handed out any more (``folder``: only what mounts it)."""
        if folder is None:
            self.generation += 1
            victims = [s for slots in self.idle.values() for s in slots]
            self.idle.clear()
        else:
            victims = []
            for recipe in list(self.idle):
                if folder in (recipe.project, recipe.staged_dir):
                    victims.extend(self.idle.pop(recipe))
            for making in self.making.values():
                if folder in (making.recipe.project, making.recipe.staged_dir):
                    making.stale = True  # dropped when it arrives
        if victims:
            log.info("pool: %d idle sandbox(es) dropped: %s", len(victims), why)
        self.stats["stale"] += len(victims)
        for slot in victims:
            self._discard(slot)
        self._wake.set()

    def drain(self) -> int:
        """Destroy every idle sandbox (memory pressure); the pool refills when it eases."""
        victims = [s for slots in self.idle.values() for s in slots]
        self.idle.clear()
        self.stats["drained"] += len(victims)
        for slot in victims:
            self._discard(slot)
        return len(victims)

    @property
    def size(self) -> int:
        return sum(len(slots) for slots in self.idle.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "enabled": self.limits.enabled,
            "idle": self.size,
            "making": len(self.making),
            "capacity": self.limits.capacity,
            "recipes": len(self.idle),
            "under_pressure": self.pressured,
            **self.stats,
        }

    async def close(self) -> None:
        """Stop filling and destroy every idle sandbox.  Those being made are waited for
        (then destroyed): cancelled midway, the engine would finish making them unseen."""
        self._closed = True
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(self._task), CLOSE_WAIT_S)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._makes:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.gather(*self._makes, return_exceptions=True), CLOSE_WAIT_S
                )
        self.drain()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    # -- choosing ------------------------------------------------------------------------
    def _pick(self, recipe: Recipe) -> Slot | None:
        """An idle sandbox of ``recipe`` that is current (generation, folders, host); its
        image is for :meth:`confirm`, asked while the call already runs (ADR-095)."""
        slots = self.idle.get(recipe)
        while slots:
            slots.sort(key=lambda s: (not s.ready, s.made_at))  # a waiting host first
            slot = slots.pop(0)
            if not slots:
                self.idle.pop(recipe, None)
            if self._current(slot):
                return slot
            self.stats["stale"] += 1
            self._discard(slot)
            slots = self.idle.get(recipe)
        return None

    def _current(self, slot: Slot, *, folders: bool = True) -> bool:
        """Made in this generation, on the folders it was made for, its host still there.

        ``folders=False``: the caller's recipe, just taken from the folders, matched it."""
        if slot.generation != self.generation or slot.job.lost:
            return False
        recipe = slot.recipe
        return not folders or folder_identity(recipe.project, recipe.staged_dir) == recipe.identity

    async def confirm(self, slot: Slot) -> bool:
        """Whether the image ``slot`` was made from is still the one its tag names (and
        no reload came meanwhile): a rebuilt image's idle sandboxes are dropped; the
        caller stops the taken one, and nothing it did is used."""
        current: str | None = None
        try:
            current = await self.maker.image_id(slot.image_ref)
        except FluffyError as exc:
            log.warning("pool: image %s could not be confirmed: %s", slot.image_ref, exc)
        if current is not None and current != slot.image_id:
            log.info("pool: image %s was rebuilt; its idle sandboxes are dropped", slot.image_ref)
            ref = slot.image_ref
            for recipe in [r for r, s in self.idle.items() if s and s[0].image_ref == ref]:
                self.stats["stale"] += len(self.idle[recipe])
                for stale in self.idle.pop(recipe):
                    self._discard(stale)
        if current == slot.image_id and self._current(slot, folders=False):
            return True
        self.stats["stale"] += 1  # rebuilt, not answered, or a reload came meanwhile
        return False

    # -- sizing --------------------------------------------------------------------------
    def _demand(self, recipe: Recipe, now: float) -> Demand:
        demand = self.demand.setdefault(recipe, Demand())
        demand.last = now
        return demand

    def under_pressure(self) -> bool:
        if self.kernel_pressure():
            return True
        free = self.host_free()
        return free is not None and free < self.limits.min_free_memory

    def target(self, recipe: Recipe, now: float) -> int:
        """How many idle sandboxes ``recipe`` should have now."""
        demand = self.demand.get(recipe)
        if demand is None or not self.limits.enabled:
            return 0
        if now - demand.last > self.limits.idle_after_s:
            return 0
        return max(0, min(demand.wanted(now, self.make_s), self.limits.capacity))

    def allotment(self, now: float) -> dict[Recipe, int]:
        """How many idle sandboxes each recipe may have now: its target, the capacity
        shared out in the order the recipes were last asked for (the newest first)."""
        left, out = self.limits.capacity, {}
        for recipe, _ in sorted(self.demand.items(), key=lambda kv: -kv[1].last):
            out[recipe] = min(self.target(recipe, now), left)
            left -= out[recipe]
        return out

    def _plan(self, now: float) -> Recipe | None:
        """The recipe to make a sandbox for next (most recently asked first), or None."""
        if self.size + len(self.making) >= self.limits.capacity:
            return None
        if len(self.making) >= self.limits.makers:
            return None
        allotted = self.allotment(now)
        free: dict[str, int] = {}  # asked once per template: the scheduler's figures
        for recipe, demand in sorted(self.demand.items(), key=lambda kv: -kv[1].last):
            if now < demand.failed_until:
                continue
            if self.slots is not None:
                if recipe.template not in free:
                    # (a make just started does not hold its slot yet: count it)
                    kind = recipe.template
                    leasing = sum(
                        1
                        for m in self.making.values()
                        if m.recipe.template == kind and not m.leased
                    )
                    free[kind] = self.slots.free(kind) - leasing
                if free[recipe.template] <= 0:
                    continue  # no slot free, or work waits for one: background waits
            made = len(self.idle.get(recipe, ()))
            made += sum(1 for m in self.making.values() if m.recipe == recipe)
            if made < allotted.get(recipe, 0):
                return recipe
        return None

    def _trim(self, now: float) -> None:
        """Drop idle sandboxes past their recipe's allotment (oldest first), dead or
        stale: a recipe asked for now takes the room of one not asked for a while."""
        allotted = self.allotment(now)
        for recipe in list(self.idle):
            slots = self.idle[recipe]
            keep = [s for s in slots if s.generation == self.generation and not s.job.lost]
            for slot in (s for s in slots if s not in keep):
                self.stats["stale"] += 1
                self._discard(slot)
            keep.sort(key=lambda s: s.made_at, reverse=True)
            excess = keep[allotted.get(recipe, 0) :]
            for slot in excess:
                self.stats["drained"] += 1
                self._discard(slot)
            kept = keep[: len(keep) - len(excess)]
            if kept:
                self.idle[recipe] = kept
            else:
                del self.idle[recipe]
        for recipe in [r for r, d in self.demand.items() if now - d.last > WINDOW_S * 10]:
            if recipe not in self.idle:
                del self.demand[recipe]

    def nudge(self) -> None:
        """A scheduler slot changed hands: look at once whether one can be made."""
        if self._task is not None:
            self._wake.set()

    # -- the background filler -----------------------------------------------------------
    def _start(self) -> None:
        if self._task is None and not self._closed and self.limits.enabled:
            self._task = asyncio.create_task(self._fill(), name="sandbox-pool")

    async def _fill(self) -> None:
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), TICK_S)
            self._wake.clear()
            try:
                await self._step()
            except Exception:  # never leave the pool dead: say so, wait, go on
                log.exception("pool: unexpected error; trying again in %.0f s", BACKOFF_S)
                await asyncio.sleep(BACKOFF_S)

    async def _step(self) -> None:
        now = self.clock()
        self.pressured = self.under_pressure()
        if self.pressured:
            if self.size:
                dropped = self.drain()
                log.warning("pool: memory is short; %d idle sandbox(es) destroyed", dropped)
            return
        self._trim(now)
        quiet = self.last_take + QUIET_S - time.monotonic()
        if quiet > 0:  # calls are coming: make nothing until they pause
            asyncio.get_running_loop().call_later(quiet, self._wake.set)
            return
        while (recipe := self._plan(now)) is not None:
            arrival = asyncio.get_running_loop().create_future()
            self.making[arrival] = _Make(recipe)
            task = asyncio.create_task(self._make(recipe, arrival), name="sandbox-pool-make")
            self._makes.add(task)
            task.add_done_callback(self._makes.discard)

    async def _make(self, recipe: Recipe, arrival: asyncio.Future[None]) -> None:
        lease: Lease | None = None
        try:
            if self.slots is not None:
                # while it is made, it holds a yielding slot: making is work under the
                # limits (an idle sandbox runs nothing and holds none)
                try:
                    lease = await self.slots.lease(
                        recipe.template,
                        f"pool-{uuid.uuid4().hex[:12]}",
                        priority=POOL_PRIORITY,
                        kind="pool_fill",
                        yields=True,
                    )
                except FluffyError as exc:
                    log.info("pool: no slot for a %s sandbox: %s", recipe.template, exc.what)
                    return
            self.making[arrival].leased = True
            generation = self.generation
            began = time.monotonic()
            try:
                slot = await self.maker.open_slot(recipe)
            except Exception as exc:  # FluffyError, OSError, or the engine SDK's own
                self.stats["failed"] += 1
                demand = self.demand.setdefault(recipe, Demand())
                wait = min(BACKOFF_S * 2**demand.failures, BACKOFF_MAX_S)
                demand.failures += 1
                demand.failed_until = self.clock() + wait
                log.warning(
                    "pool: cannot make a %s sandbox (next try in %.0f s): %s",
                    recipe.template,
                    wait,
                    exc,
                )
                return
            slot.generation = generation
            self.make_s = 0.8 * self.make_s + 0.2 * (time.monotonic() - began)
            if recipe in self.demand:
                self.demand[recipe].failures = 0
            stale = self.making[arrival].stale or generation != self.generation
            if self._closed or stale or self.under_pressure():
                self._discard(slot)
                return
            self.stats["made"] += 1
            self.idle.setdefault(recipe, []).append(slot)
        finally:
            if lease is not None:
                lease.release()
            self.making.pop(arrival, None)
            self._arrived(arrival)
            self._wake.set()  # more may be needed

    @staticmethod
    def _arrived(arrival: asyncio.Future[None]) -> None:
        """Wake the callers waiting for the sandbox being made (after it is idle)."""

        def wake() -> None:
            if not arrival.done():
                arrival.set_result(None)

        asyncio.get_running_loop().call_soon(wake)

    def _discard(self, slot: Slot) -> None:
        task = asyncio.ensure_future(self._close(slot))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close(self, slot: Slot) -> None:
        with contextlib.suppress(FluffyError, OSError):
            await self.maker.close_slot(slot)
