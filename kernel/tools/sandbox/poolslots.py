"""What the warm pool deals in: recipes and slots, its limits, and the sides it talks to.

A :class:`Recipe` is everything a plugin sandbox is made of (equal recipes make equal
sandboxes, down to the mounted folders' device and inode); a :class:`Slot` is one
created, started sandbox of a recipe, waiting for exactly one call.  The pool reads the
scheduler through :class:`Slots` and has slots made and destroyed by a :class:`Maker`
(the plugin runner).  See :mod:`fluffy.kernel.tools.sandbox.pool` (ADR-038).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import msgspec

from fluffy.kernel.containers.lifecycle import Sandbox


class Recipe(msgspec.Struct, frozen=True):
    """Everything a plugin sandbox is made of: equal recipes make equal sandboxes."""

    plugin: str
    module: str
    template: str
    project: Path
    staged_dir: Path | None
    image: str | None
    max_duration: str
    environment: tuple[tuple[str, str], ...]
    #: a third-party plugin's (never pooled: see the module docstring)
    third_party: bool = False
    #: (device, inode) of the mounted folders, in the order project, staged
    identity: tuple[tuple[int, int], ...] = ()


def folder_identity(*folders: Path | None) -> tuple[tuple[int, int], ...]:
    """(device, inode) of each folder (0, 0 for None or a missing one)."""
    out = []
    for folder in folders:
        try:
            info = folder.stat() if folder is not None else None
        except OSError:
            info = None
        out.append((info.st_dev, info.st_ino) if info is not None else (0, 0))
    return tuple(out)


class Lease(Protocol):
    on_lost: Callable[[], None] | None

    def release(self) -> None: ...


class Slots(Protocol):
    """The scheduler's side (:class:`fluffy.kernel.tools.routing.scheduling.SchedulerBridge`)."""

    def free(self, template: str) -> int:
        """Slots free now with nothing queued: may the pool take one?"""

    async def lease(
        self, template: str, key: str, *, priority: int, kind: Any, yields: bool = False
    ) -> Any: ...


class Waiter(Protocol):
    """What the pool reads of a slot's job: has its host asked for work, or hung up."""

    waiting: asyncio.Event
    lost: bool


class Slot(msgspec.Struct, eq=False):
    """A created, started sandbox of one recipe, waiting for exactly one call."""

    recipe: Recipe
    binding: str
    job: Waiter
    sandbox: Sandbox
    image_ref: str = ""
    image_id: str = ""
    generation: int = 0
    made_at: float = msgspec.field(default_factory=time.monotonic)

    @property
    def ready(self) -> bool:
        return self.job.waiting.is_set() and not self.job.lost


class Maker(Protocol):
    """The runner's side: makes and destroys slots, reads an image's current id."""

    async def open_slot(self, recipe: Recipe) -> Slot: ...

    async def close_slot(self, slot: Slot) -> None: ...

    async def image_id(self, ref: str) -> str: ...


#: What one idle plugin sandbox holds, for the memory budget (its host waiting: ~14 MiB,
#: ``pool_idle_memory_mib_per_sandbox`` in python -m benchmarks.tools).
IDLE_SANDBOX_MIB = 16.0


class PoolLimits(msgspec.Struct):
    enabled: bool = True
    max_idle: int = 10
    idle_after_s: float = 120.0
    min_free_memory: float = 0.15
    #: what idle sandboxes may hold together (MiB), at IDLE_SANDBOX_MIB each
    memory_budget_mib: float = 160.0
    #: sandboxes made at once (each also needs a free slot of its template)
    makers: int = 2

    @property
    def capacity(self) -> int:
        """Idle sandboxes the pool may hold: max_idle, within the memory budget."""
        return max(0, min(self.max_idle, int(self.memory_budget_mib // IDLE_SANDBOX_MIB)))


def host_memory_free(meminfo: Path = Path("/proc/meminfo")) -> float | None:
    """MemAvailable / MemTotal of the machine (the sandboxes' memory is the host's)."""
    values: dict[str, int] = {}
    try:
        for line in meminfo.read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in ("MemTotal", "MemAvailable"):
                values[name] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        return None
    total, free = values.get("MemTotal"), values.get("MemAvailable")
    return free / total if total and free is not None else None
