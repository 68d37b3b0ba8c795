"""Per-plugin circuit breakers: 5 failures open for 30 s, then one trial call."""

from __future__ import annotations

import asyncio

import pytest

from fluffy.errors import (
    CircuitOpen,
    ConfigError,
    ToolFailed,
    ToolInputInvalid,
    ToolTimeout,
    ToolTransient,
)
from fluffy.kernel.tools.routing.breaker import BreakerBoard, CircuitBreaker, counts_as_failure


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


def fail(breaker: CircuitBreaker, times: int, error: str = "sandbox died") -> None:
    for _ in range(times):
        breaker.failure(breaker.before(), error)


def test_four_failures_keep_it_closed_five_open_it(clock: Clock) -> None:
    breaker = CircuitBreaker("fs-tool", clock=clock)
    fail(breaker, 4)
    assert breaker.state == "closed"
    breaker.before()
    fail(breaker, 1)
    assert breaker.state == "open"
    with pytest.raises(CircuitOpen):
        breaker.before()


def test_a_success_resets_the_count(clock: Clock) -> None:
    breaker = CircuitBreaker("fs-tool", clock=clock)
    fail(breaker, 4)
    breaker.success(breaker.before())
    fail(breaker, 4)
    assert breaker.state == "closed"
    assert breaker.status().consecutive_failures == 4


def test_the_refusal_says_when_it_closes_and_the_last_error(clock: Clock) -> None:
    breaker = CircuitBreaker("git-tool", clock=clock)
    fail(breaker, 4, "first")
    breaker.failure(breaker.before(), ToolTimeout("git.diff timed out after 300 s"))
    clock.advance(12)
    with pytest.raises(CircuitOpen) as caught:
        breaker.before()
    error = caught.value
    assert "git-tool" in error.what and "18.0 s" in error.what
    assert "tool.timeout: git.diff timed out after 300 s" in error.why
    assert error.retryable and error.to_dict()["code"] == "tool.circuit_open"


def test_last_errors_are_redacted_and_bounded(clock: Clock) -> None:
    breaker = CircuitBreaker("x", threshold=1, clock=clock)
    secret = "ghp_" + "s" * 30
    breaker.failure(breaker.before(), RuntimeError(f"bad token {secret} " + "y" * 1000))
    last = breaker.status().last_error
    assert last is not None and secret not in last and "[REDACTED:github_token]" in last
    assert len(last) <= 300


def test_after_the_cooldown_exactly_one_trial_goes_through(clock: Clock) -> None:
    breaker = CircuitBreaker("fs-tool", clock=clock)
    fail(breaker, 5)
    clock.advance(29.9)
    with pytest.raises(CircuitOpen):
        breaker.before()
    clock.advance(0.1)
    assert breaker.state == "half_open"
    trial = breaker.before()
    assert trial.trial
    with pytest.raises(CircuitOpen, match="trial call is running"):
        breaker.before()
    breaker.success(trial)
    assert breaker.state == "closed"
    assert breaker.status().consecutive_failures == 0
    assert not breaker.before().trial


def test_a_failed_trial_opens_it_for_another_cooldown(clock: Clock) -> None:
    breaker = CircuitBreaker("fs-tool", clock=clock)
    fail(breaker, 5)
    clock.advance(30)
    breaker.failure(breaker.before(), "still broken")
    assert breaker.state == "open"
    clock.advance(29)
    with pytest.raises(CircuitOpen) as caught:
        breaker.before()
    assert "still broken" in caught.value.why and "1.0 s" in caught.value.what
    clock.advance(1)
    assert breaker.before().trial


def test_a_released_trial_lets_the_next_caller_try(clock: Clock) -> None:
    breaker = CircuitBreaker("fs-tool", clock=clock)
    fail(breaker, 5)
    clock.advance(30)
    breaker.release(breaker.before())
    assert breaker.state == "half_open"
    assert breaker.before().trial


def test_late_results_of_calls_admitted_before_opening_change_nothing(clock: Clock) -> None:
    breaker = CircuitBreaker("fs-tool", clock=clock)
    slow = [breaker.before() for _ in range(3)]
    fail(breaker, 5)
    assert breaker.state == "open"
    breaker.success(slow[0])  # must not close an open circuit
    assert breaker.state == "open"
    clock.advance(30)
    trial = breaker.before()
    breaker.failure(slow[1], "late")  # must not re-open or count against the trial
    assert breaker.status().trial_in_flight
    breaker.success(trial)
    breaker.failure(slow[2], "late")  # belongs to the previous epoch
    assert breaker.status().consecutive_failures == 0


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigError):
        CircuitBreaker("x", threshold=0)


def test_default_failure_rule() -> None:
    assert counts_as_failure(RuntimeError("boom"))
    assert counts_as_failure(ToolTransient("sandbox lost"))
    assert counts_as_failure(ToolTimeout("slow"))
    assert not counts_as_failure(ToolInputInvalid("bad args"))
    assert not counts_as_failure(ToolFailed("file not found"))
    assert not counts_as_failure(asyncio.CancelledError())


def test_board_keeps_one_breaker_per_plugin(clock: Clock) -> None:
    board = BreakerBoard(clock=clock, threshold=2)
    for _ in range(2):
        board.failure(board.before("fs-tool"), "down")
    with pytest.raises(CircuitOpen):
        board.before("fs-tool")
    board.success(board.before("git-tool"))
    snap = board.snapshot()
    assert list(snap) == ["fs-tool", "git-tool"]
    assert snap["fs-tool"].state == "open" and snap["fs-tool"].retry_in_s == 30.0
    assert snap["git-tool"].to_dict() == {
        "name": "git-tool",
        "state": "closed",
        "consecutive_failures": 0,
        "retry_in_s": None,
        "trial_in_flight": False,
        "last_error": None,
    }


def test_guard_counts_outcomes(clock: Clock) -> None:
    asyncio.run(_guard_counts_outcomes(clock))


async def _guard_counts_outcomes(clock: Clock) -> None:
    board = BreakerBoard(clock=clock)
    for _ in range(5):
        with pytest.raises(ToolTransient):
            async with board.guard("fs-tool"):
                raise ToolTransient("sandbox died")
    with pytest.raises(CircuitOpen):
        async with board.guard("fs-tool"):
            pytest.fail("an open circuit must not run the call")
    clock.advance(30)
    async with board.guard("fs-tool") as ticket:
        assert ticket.trial
    assert board.breaker("fs-tool").state == "closed"


def test_guard_does_not_count_the_callers_errors(clock: Clock) -> None:
    asyncio.run(_guard_does_not_count_the_callers_errors(clock))


async def _guard_does_not_count_the_callers_errors(clock: Clock) -> None:
    board = BreakerBoard(clock=clock, threshold=1)
    for _ in range(3):
        with pytest.raises(ToolInputInvalid):
            async with board.guard("fs-tool"):
                raise ToolInputInvalid("path missing")
    assert board.breaker("fs-tool").state == "closed"


def test_concurrent_callers_during_the_trial_are_refused(clock: Clock) -> None:
    asyncio.run(_concurrent_callers_during_the_trial_are_refused(clock))


async def _concurrent_callers_during_the_trial_are_refused(clock: Clock) -> None:
    board = BreakerBoard(clock=clock)
    for _ in range(5):
        board.failure(board.before("p"), "down")
    clock.advance(30)
    release = asyncio.Event()
    ran: list[int] = []

    async def call(i: int) -> str:
        try:
            async with board.guard("p"):
                ran.append(i)
                await release.wait()
        except CircuitOpen:
            return "refused"
        return "ran"

    tasks = [asyncio.create_task(call(i)) for i in range(10)]
    await asyncio.sleep(0)
    release.set()
    results = await asyncio.gather(*tasks)
    assert results.count("ran") == 1 and results.count("refused") == 9
    assert len(ran) == 1
    assert board.breaker("p").state == "closed"


def test_a_cancelled_trial_frees_the_slot(clock: Clock) -> None:
    asyncio.run(_a_cancelled_trial_frees_the_slot(clock))


async def _a_cancelled_trial_frees_the_slot(clock: Clock) -> None:
    board = BreakerBoard(clock=clock)
    for _ in range(5):
        board.failure(board.before("p"), "down")
    clock.advance(30)

    async def hang() -> None:
        async with board.guard("p"):
            await asyncio.Event().wait()

    task = asyncio.create_task(hang())
    await asyncio.sleep(0)
    assert board.breaker("p").status().trial_in_flight
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert board.breaker("p").state == "half_open"
    assert board.before("p").trial
