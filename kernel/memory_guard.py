"""Kernel memory defence (design: Error Recovery, Kernel OOM).

The kernel reads its container's real memory limit and usage from the cgroup (v2
``memory.max``/``memory.current``, or v1 ``memory.limit_in_bytes``/``memory.usage_in_bytes``)
every two seconds.  At 80 % it stops taking new work (methods that start work are
refused with a retryable error) and sheds caches; at 90 % it also destroys
non-critical sandboxes through the registered evictors.  Below 80 % it takes work again.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import msgspec

log = logging.getLogger("fluffy.kernel.memory")  # the name logs have always carried

Level = Literal["ok", "shed", "evict", "unknown"]
SHED_AT, EVICT_AT = 0.80, 0.90
UNLIMITED = 1 << 60
CGROUP = Path("/sys/fs/cgroup")


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return UNLIMITED
    try:
        return int(text)
    except ValueError:
        return None


def read_memory(root: Path = CGROUP) -> tuple[int | None, int | None]:
    """(usage, limit) in bytes from the cgroup; limit None when unlimited or unknown."""
    for usage_name, limit_name in (
        ("memory.current", "memory.max"),
        ("memory/memory.usage_in_bytes", "memory/memory.limit_in_bytes"),
    ):
        usage, limit = _read_int(root / usage_name), _read_int(root / limit_name)
        if usage is not None and limit is not None:
            return usage, (None if limit >= UNLIMITED // 2 else limit)
    return None, None


def level_of(usage: int | None, limit: int | None) -> Level:
    if usage is None or limit is None or limit <= 0:
        return "unknown"
    ratio = usage / limit
    return "evict" if ratio >= EVICT_AT else "shed" if ratio >= SHED_AT else "ok"


class MemoryGuard(msgspec.Struct):
    root: Path = CGROUP
    interval_s: float = 2.0
    evictors: list[Callable[[], object]] = msgspec.field(default_factory=list)
    shedders: list[Callable[[], object]] = msgspec.field(default_factory=list)
    level: Level = "unknown"
    usage: int | None = None
    limit: int | None = None

    @property
    def accepting_work(self) -> bool:
        return self.level not in ("shed", "evict")

    def check(self) -> Level:
        self.usage, self.limit = read_memory(self.root)
        new = level_of(self.usage, self.limit)
        if new in ("shed", "evict") and self.level not in ("shed", "evict"):
            log.warning(
                "memory at %s of %s bytes: refusing new work, shedding caches",
                self.usage,
                self.limit,
            )
            gc.collect()
            for shed in self.shedders:
                shed()
        if new == "evict" and self.level != "evict":
            log.warning("memory above 90%%: destroying non-critical sandboxes")
            for evict in self.evictors:
                evict()
        self.level = new
        return new

    @property
    def ratio(self) -> float:
        """Fraction of the memory limit in use (0.0 when unknown)."""
        if not self.usage or not self.limit:
            return 0.0
        return self.usage / self.limit

    def as_dict(self) -> dict[str, object]:
        return {"level": self.level, "usage": self.usage, "limit": self.limit}

    async def watch(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                self.check()
            await asyncio.sleep(self.interval_s)
