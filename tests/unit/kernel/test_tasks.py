"""to_the_end: work that must end once started, whoever awaited it."""

from __future__ import annotations

import asyncio

import pytest

from fluffy.kernel.tasks import to_the_end


def test_a_cancelled_caller_waits_for_the_work_even_when_cancelled_again() -> None:
    async def main() -> None:
        started, release = asyncio.Event(), asyncio.Event()
        finished: list[str] = []

        async def work() -> str:
            started.set()
            await release.wait()
            finished.append("done")
            return "done"

        caller = asyncio.ensure_future(to_the_end(work()))
        await started.wait()
        caller.cancel()
        await asyncio.sleep(0)
        caller.cancel()  # a second cancel reaches the caller, never the work
        await asyncio.sleep(0)
        assert not caller.done()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert finished == ["done"]

    asyncio.run(main())


def test_the_result_and_the_error_are_the_works() -> None:
    async def fails() -> None:
        raise LookupError("the work's")

    async def main() -> None:
        assert await to_the_end(asyncio.sleep(0, "value")) == "value"
        with pytest.raises(LookupError, match="the work's"):
            await to_the_end(fails())

    asyncio.run(main())
