"""Work that must end once started, whoever awaited it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def to_the_end(work: Awaitable[T]) -> T:
    """``work``'s result.  A caller cancelled meanwhile (the client hung up) still waits
    for ``work`` to finish -- a further cancel changes nothing -- so nothing it holds
    (a session's lock, a half-applied update) is left midway; then the caller is
    cancelled, and what ``work`` raised is moot."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        while not task.done():
            try:
                await asyncio.wait([task])
            except asyncio.CancelledError:  # asked again: the answer is the same
                continue
        if not task.cancelled():
            task.exception()  # retrieved: not logged as never retrieved
        raise
