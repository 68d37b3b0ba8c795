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
  environment rebuild moved the tag): the current image id is read from the engine at
  each take (~1 ms) and compared with the one the container was made from;
* one whose host hung up (its container died while idle).

Third-party plugins are not pooled: their code would run, unwatched by the scheduler,
for as long as it idles, and watch the session's staged folder change between calls.

Sizing: a recipe is kept warm while it is in demand: one sandbox, plus one for each
call in the last minute that found the pool empty, at most the template's scheduler
limit; all recipes together at most ``scheduler.pool.max_idle`` (and the global limit).
A recipe not asked for within ``scheduler.pool.idle_after`` is drained.  Under memory
pressure (the kernel's guard past "shed", or the host's available memory below
``scheduler.pool.min_free_memory``) the pool empties and makes nothing.  One sandbox is
made at a time, in the background.  Pool sandboxes carry the same labels as every
other, so a crashed kernel's are removed by the next one at start-up.

Under the scheduler (ADR-043): each sandbox the pool makes holds a *yielding* lease of
its template at the lowest priority from the moment its making starts until it is taken
or dropped, so the limits count it.  The pool starts making one only while a slot is
free and nothing waits in the queue; a user-facing call is never held back by an idle
sandbox (yielding slots do not count against it), and as soon as such a call has started
the pool drops idle sandboxes until they fit in what the running work leaves
(:meth:`Slots.room`) -- the call itself takes its warm sandbox first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fluffy.errors import FluffyError
from fluffy.kernel.scheduler.task import PRIORITY_IDLE
from fluffy.kernel.tools.poolslots import (
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

#: How far back demand is counted.
WINDOW_S = 60.0
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


@dataclass
class _Demand:
    misses: deque[float] = field(default_factory=deque)
    last: float = 0.0
    failed_until: float = 0.0
    failures: int = 0


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
        self.demand: dict[Recipe, _Demand] = {}
        self.making: Recipe | None = None
        self._arrival: asyncio.Future[None] | None = None  # the one being made is done
        self._making_stale = False
        self.stats = {
            "made": 0,
            "taken": 0,
            "missed": 0,
            "stale": 0,
            "drained": 0,
            "failed": 0,
            "yielded": 0,  # dropped to give their slot to user work
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
        demand = self._demand(recipe, now)
        found = None
        if self.limits.enabled:
            found = await self._pick(recipe)
            if found is None and self.making == recipe and self._arrival is not None:
                # its sandbox is being made: waiting for it beats making another
                await asyncio.shield(self._arrival)
                found = await self._pick(recipe)
        if found is None:
            demand.misses.append(now)
            self.stats["missed"] += 1
        else:
            self.stats["taken"] += 1
            self._unlease(found)  # the call's own task holds its slot now
        self._start()
        self._wake.set()
        return found

    def expect(self, recipe: Recipe) -> None:
        """``recipe`` will be asked for soon (e.g. writes begin): keep one warm."""
        if recipe.third_party:
            return
        self._demand(recipe, self.clock())
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
            making = self.making
            if making is not None and folder in (making.project, making.staged_dir):
                self._making_stale = True  # the one being made is dropped when it arrives
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
            "recipes": len(self.idle),
            "under_pressure": self.under_pressure(),
            **self.stats,
        }

    async def close(self) -> None:
        """Stop filling and destroy every idle sandbox.  One being made is waited for
        (then destroyed): cancelled midway, the engine would finish making it unseen."""
        self._closed = True
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(self._task), CLOSE_WAIT_S)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self.drain()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    # -- choosing ------------------------------------------------------------------------
    async def _pick(self, recipe: Recipe) -> Slot | None:
        slots = self.idle.get(recipe)
        while slots:
            slots.sort(key=lambda s: (not s.ready, s.made_at))  # a waiting host first
            slot = slots.pop(0)
            if not slots:
                self.idle.pop(recipe, None)
            try:
                fresh = await self._fresh(slot)
            except BaseException:  # the caller went away (or the check broke): not kept
                self._discard(slot)
                raise
            if fresh and self._current(slot):  # again: a reload may have come meanwhile
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

    async def _fresh(self, slot: Slot) -> bool:
        if not self._current(slot, folders=False):
            return False
        try:
            current = await self.maker.image_id(slot.image_ref)
        except FluffyError:
            return False
        if current != slot.image_id:
            log.info("pool: image %s was rebuilt; its idle sandboxes are dropped", slot.image_ref)
            ref = slot.image_ref
            for recipe in [r for r, s in self.idle.items() if s and s[0].image_ref == ref]:
                self.stats["stale"] += len(self.idle[recipe])
                for stale in self.idle.pop(recipe):
                    self._discard(stale)
            return False
        return True

    # -- sizing --------------------------------------------------------------------------
    def _demand(self, recipe: Recipe, now: float) -> _Demand:
        demand = self.demand.setdefault(recipe, _Demand())
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
        misses = demand.misses
        while misses and now - misses[0] > WINDOW_S:
            misses.popleft()
        cap = self.limits.per_template.get(recipe.template, self.limits.global_max)
        return max(0, min(1 + len(demand.misses), cap, self.limits.max_idle))

    def _plan(self, now: float) -> Recipe | None:
        """The recipe to make a sandbox for next (most recently asked first), or None."""
        budget = min(self.limits.max_idle, self.limits.global_max) - self.size
        if budget <= 0:
            return None
        free: dict[str, int] = {}  # asked once per template: the scheduler's figures
        for recipe, demand in sorted(self.demand.items(), key=lambda kv: -kv[1].last):
            if now < demand.failed_until:
                continue
            if self.slots is not None:
                if recipe.template not in free:
                    free[recipe.template] = self.slots.free(recipe.template)
                if free[recipe.template] <= 0:
                    continue  # no slot free, or work waits for one: background waits
            if len(self.idle.get(recipe, ())) < self.target(recipe, now):
                return recipe
        return None

    def _trim(self, now: float) -> None:
        """Drop idle sandboxes past their recipe's target (oldest first), dead or stale."""
        for recipe in list(self.idle):
            slots = self.idle[recipe]
            keep = [s for s in slots if s.generation == self.generation and not s.job.lost]
            for slot in (s for s in slots if s not in keep):
                self.stats["stale"] += 1
                self._discard(slot)
            keep.sort(key=lambda s: s.made_at, reverse=True)
            excess = keep[self.target(recipe, now) :]
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
        self._fit()

    def _fit(self) -> None:
        """Drop idle sandboxes (oldest first) until they fit in the scheduler's room."""
        if self.slots is None:
            return
        by_template: dict[str, list[Slot]] = {}
        for slots in self.idle.values():
            for slot in slots:
                by_template.setdefault(slot.recipe.template, []).append(slot)
        for template, slots in by_template.items():
            room = self.slots.room(template)
            if self.making is not None and self.making.template == template:
                room -= 1
            slots.sort(key=lambda s: s.made_at)
            for slot in slots[: max(0, len(slots) - max(0, room))]:
                self.idle[slot.recipe].remove(slot)
                if not self.idle[slot.recipe]:
                    del self.idle[slot.recipe]
                self.stats["yielded"] += 1
                self._discard(slot)

    def nudge(self) -> None:
        """User work started: check at once that the idle sandboxes still fit."""
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
        if self.under_pressure():
            if self.size:
                dropped = self.drain()
                log.warning("pool: memory is short; %d idle sandbox(es) destroyed", dropped)
            return
        self._trim(now)
        recipe = self._plan(now)
        if recipe is not None:
            await self._make(recipe)
            self._wake.set()  # more may be needed

    async def _make(self, recipe: Recipe) -> None:
        lease: Lease | None = None
        if self.slots is not None:
            # before it counts as being made: a call must never wait on a sandbox that
            # itself waits for a slot
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
        generation = self.generation
        self.making = recipe
        self._making_stale = False
        arrival = self._arrival = asyncio.get_running_loop().create_future()
        try:
            slot = await self.maker.open_slot(recipe)
        except BaseException as exc:
            if lease is not None:
                lease.release()
            if not isinstance(exc, Exception):
                raise
            # FluffyError, OSError, or the engine SDK's own
            self.stats["failed"] += 1
            demand = self.demand.setdefault(recipe, _Demand())
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
        finally:
            self.making = None
            self._arrival = None
            self._arrived(arrival)
        slot.generation = generation
        slot.lease = lease
        if lease is not None:
            lease.on_lost = lambda: self._lost(slot)
        if recipe in self.demand:
            self.demand[recipe].failures = 0
        stale = self._making_stale or generation != self.generation
        if self._closed or stale or self.under_pressure():
            self._discard(slot)
            return
        self.stats["made"] += 1
        self.idle.setdefault(recipe, []).append(slot)

    @staticmethod
    def _arrived(arrival: asyncio.Future[None]) -> None:
        """Wake the callers waiting for the sandbox being made (after it is idle)."""

        def wake() -> None:
            if not arrival.done():
                arrival.set_result(None)

        asyncio.get_running_loop().call_soon(wake)

    def _unlease(self, slot: Slot) -> None:
        lease, slot.lease = slot.lease, None
        if lease is not None:
            lease.on_lost = None
            lease.release()

    def _lost(self, slot: Slot) -> None:
        """The scheduler ended the slot's lease (it closed): the sandbox goes too."""
        slot.lease = None
        slots = self.idle.get(slot.recipe)
        if slots is not None and slot in slots:
            slots.remove(slot)
            if not slots:
                del self.idle[slot.recipe]
            self._discard(slot)

    def _discard(self, slot: Slot) -> None:
        self._unlease(slot)
        task = asyncio.ensure_future(self._close(slot))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close(self, slot: Slot) -> None:
        with contextlib.suppress(FluffyError, OSError):
            await self.maker.close_slot(slot)
