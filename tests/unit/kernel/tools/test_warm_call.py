"""A pooled sandbox's call runs while the pool confirms its image (ADR-095): the
answer is used only once the image is confirmed; otherwise the call is stopped (or its
finished outcome released), its sandbox destroyed in the background, and its job no
longer answers to the call's id (the call runs again elsewhere)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fluffy.kernel.tools.sandbox.pluginjob import Job
from fluffy.kernel.tools.sandbox.plugins import PluginRunner

CALL = SimpleNamespace(call_id="c1")


class Pool:
    def __init__(self, current: bool, delay: float | None) -> None:
        self.current, self.delay = current, delay  # delay None: answers without waiting
        self.asked = asyncio.Event()
        self.call_started: asyncio.Event | None = None  # the check waits for the call

    async def confirm(self, slot: object) -> bool:
        self.asked.set()
        if self.call_started is not None:  # a check that ran first would wait forever
            await asyncio.wait_for(self.call_started.wait(), 5)
        if self.delay is not None:
            await asyncio.sleep(self.delay)
        return self.current


class Calls:
    """Stands in for the runner's ``_call`` (a sandbox's exchange), ``release`` and
    ``_teardown``; ``answer``: the sandbox replies (its job's future is done) at once."""

    def __init__(self, duration: float, *, answer: bool = False) -> None:
        self.duration, self.answer = duration, answer
        self.started = asyncio.Event()
        self.stopped = False
        self.released: list[object] = []
        self.torn_down: list[str] = []

    async def call(self, slot: Any, call: object, started: float, *, warm: bool) -> Any:
        self.started.set()
        slot.job.call_id = CALL.call_id
        if self.answer:
            slot.job.future.set_result({"ok": True})
        try:
            await asyncio.sleep(self.duration)
        except asyncio.CancelledError:
            self.stopped = True  # the real one tears its sandbox down here
            raise
        return ("outcome", slot.binding)

    async def release(self, outcome: object) -> None:
        self.released.append(outcome)

    async def teardown(self, binding: str | None, sandbox: object) -> None:
        self.torn_down.append(str(binding))


def setup(tmp_path: Path, pool: Pool, calls: Calls) -> tuple[PluginRunner, Any]:
    runner = PluginRunner(lambda: None, tmp_path, environment=dict)  # type: ignore[arg-type,return-value]
    runner.pool = pool  # type: ignore[assignment]
    runner._call = calls.call  # type: ignore[method-assign]
    runner.release = calls.release  # type: ignore[method-assign]
    runner._teardown = calls.teardown  # type: ignore[method-assign]
    job = Job("", "fs.write", {}, "strict", plugin="fs-tool")
    runner.jobs["tool:fs-tool:s1"] = job
    return runner, SimpleNamespace(job=job, binding="tool:fs-tool:s1", sandbox=None)


async def until(check: Any) -> None:
    async with asyncio.timeout(5):
        while not check():
            await asyncio.sleep(0.01)


def test_a_confirmed_sandbox_answers_and_its_call_did_not_wait_for_the_check(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        pool, calls = Pool(True, 0.0), Calls(0.05)
        pool.call_started = calls.started
        runner, slot = setup(tmp_path, pool, calls)
        assert await runner._warm_call(slot, CALL, 0.0) == ("outcome", slot.binding)  # type: ignore[arg-type]
        assert not calls.released and not calls.stopped and not calls.torn_down
        assert runner._job_by_call("c1") is slot.job

    asyncio.run(main())


def test_a_stale_sandbox_is_stopped_mid_call_and_no_longer_answers_to_the_call(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        pool, calls = Pool(False, 0.01), Calls(30.0)
        runner, slot = setup(tmp_path, pool, calls)
        assert await runner._warm_call(slot, CALL, 0.0) is None  # type: ignore[arg-type]
        await until(lambda: calls.stopped)
        assert not calls.released
        assert runner._job_by_call("c1") is None  # the rerun's job is the one found
        assert slot.job.call_id == "c1 (stale)"

    asyncio.run(main())


def test_a_stale_sandbox_that_already_answered_is_released_not_stopped(tmp_path: Path) -> None:
    async def main() -> None:
        pool, calls = Pool(False, 0.05), Calls(0.1, answer=True)
        runner, slot = setup(tmp_path, pool, calls)
        assert await runner._warm_call(slot, CALL, 0.0) is None  # type: ignore[arg-type]
        await until(lambda: calls.released)
        assert calls.released == [("outcome", slot.binding)] and not calls.stopped

    asyncio.run(main())


def test_a_call_stopped_before_it_began_is_torn_down(tmp_path: Path) -> None:
    async def main() -> None:
        pool, calls = Pool(False, None), Calls(30.0)
        runner, slot = setup(tmp_path, pool, calls)
        assert await runner._warm_call(slot, CALL, 0.0) is None  # type: ignore[arg-type]
        await until(lambda: calls.torn_down)
        assert not calls.started.is_set()
        assert calls.torn_down == [slot.binding]

    asyncio.run(main())


def test_a_caller_gone_during_the_check_stops_the_call(tmp_path: Path) -> None:
    async def main() -> None:
        pool, calls = Pool(True, 30.0), Calls(30.0)
        runner, slot = setup(tmp_path, pool, calls)
        task = asyncio.ensure_future(runner._warm_call(slot, CALL, 0.0))  # type: ignore[arg-type]
        await pool.asked.wait()
        await calls.started.wait()
        task.cancel()  # the client hung up
        with pytest.raises(asyncio.CancelledError):
            await task
        await until(lambda: calls.stopped)
        assert not calls.released

    asyncio.run(main())
