"""The kernel's retry policy (ADR-044): bounds, Retry-After, cancellation, and the chain
sandbox attempt -> kernel error -> wait -> next attempt against fake servers on loopback."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import msgspec
import pytest

from fluffy.errors import ContextTooLong, ProviderBusy, ProviderFailed
from fluffy.ipc.ai_types import AIResponse, TextDelta
from fluffy.kernel.ai.provider import failure
from fluffy.kernel.ai.retry import Retry, RetryPolicy, with_retries
from fluffy.sandboxes.ai_host import run_request
from tests.fakes import Fail, FakeAnthropicServer, FakeOpenAIServer, Reply, Reset

pytestmark = pytest.mark.unit


class Clock:
    """A fake sleep: records the waits, returns at once."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)


def _failing(errors: list[Exception], result: str = "ok") -> tuple[Any, list[int]]:
    calls = [0]

    async def attempt() -> str:
        calls[0] += 1
        if errors:
            raise errors.pop(0)
        return result

    return attempt, calls


def _busy(kind: str = "rate_limit", after: float | None = None) -> ProviderBusy:
    return ProviderBusy("the provider is rate limiting requests", kind=kind, retry_after_s=after)


def _run(attempt: Any, policy: RetryPolicy, clock: Clock) -> tuple[Any, list[Retry]]:
    said: list[Retry] = []

    async def announce(retry: Retry) -> None:
        said.append(retry)

    async def main() -> Any:
        return await with_retries(attempt, policy, announce, sleep=clock.sleep, jitter=lambda: 0)

    return asyncio.run(main()), said


# -- the policy ----------------------------------------------------------------------------
def test_the_wait_the_provider_asks_for_is_honoured_and_announced() -> None:
    clock = Clock()
    attempt, calls = _failing([_busy(after=4.0)])
    result, said = _run(attempt, RetryPolicy(), clock)
    assert (result, calls[0], clock.waits) == ("ok", 2, [4.0])
    assert said[0].text == "rate limited, retrying in 4 s (attempt 2 of 5)"
    event = msgspec.to_builtins(said[0].event(restart=False))  # as the wire carries it
    assert event["type"] == "retry" and event["wait_s"] == 4.0 and event["kind"] == "rate_limit"


def test_without_retry_after_the_backoff_doubles_and_the_count_is_bounded() -> None:
    clock = Clock()
    attempt, calls = _failing([_busy("overloaded") for _ in range(10)])
    with pytest.raises(ProviderFailed) as caught:
        _run(attempt, RetryPolicy(max_retries=4, max_wait_s=60), clock)
    assert calls[0] == 5  # 1 + max_retries
    assert clock.waits == [0.5, 1.0, 2.0, 4.0]
    assert "gave up after 5 attempt(s)" in caught.value.what
    assert "max_retries" in caught.value.fix


def test_backoff_is_capped_and_jittered_down_only() -> None:
    policy = RetryPolicy()
    assert policy.backoff(10, 0) == 8.0
    assert 0.375 <= policy.backoff(1, 0.999) <= 0.5


def test_the_total_wait_is_bounded() -> None:
    clock = Clock()
    attempt, _ = _failing([_busy("server") for _ in range(10)])
    with pytest.raises(ProviderFailed):
        _run(attempt, RetryPolicy(max_retries=10, max_wait_s=3.0), clock)
    assert sum(clock.waits) == pytest.approx(3.0)
    assert clock.waits == [0.5, 1.0, 1.5]  # the last wait is what was left


def test_a_retry_after_beyond_the_budget_fails_at_once_saying_when() -> None:
    clock = Clock()
    attempt, calls = _failing([_busy(after=3600.0)])
    with pytest.raises(ProviderFailed) as caught:
        _run(attempt, RetryPolicy(max_wait_s=60), clock)
    assert (calls[0], clock.waits) == (1, [])
    assert "asks to wait 3600 s" in caught.value.what
    assert caught.value.fix.startswith("Retry after ")
    assert "retry_max_wait_s" in caught.value.fix


@pytest.mark.parametrize(
    "error",
    [ProviderFailed("the provider refused the API key"), ContextTooLong("too long")],
)
def test_what_a_retry_cannot_fix_fails_on_the_first_attempt(error: Exception) -> None:
    clock = Clock()
    attempt, calls = _failing([error])
    with pytest.raises(type(error)):
        _run(attempt, RetryPolicy(), clock)
    assert (calls[0], clock.waits) == (1, [])


def test_no_retries_configured_means_one_attempt() -> None:
    clock = Clock()
    attempt, calls = _failing([_busy()])
    with pytest.raises(ProviderFailed):
        _run(attempt, RetryPolicy(max_retries=0), clock)
    assert calls[0] == 1


def test_cancelling_during_a_backoff_wait_stops_at_once() -> None:
    async def main() -> float:
        attempt, _ = _failing([_busy(after=30.0)])
        announced = asyncio.Event()

        async def announce(retry: Retry) -> None:
            announced.set()

        task = asyncio.create_task(with_retries(attempt, RetryPolicy(), announce))
        await asyncio.wait_for(announced.wait(), 5)
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - started

    assert asyncio.run(main()) < 0.5


# -- the sandbox's errors as the kernel's -------------------------------------------------
def test_the_sandboxs_error_becomes_the_kernels() -> None:
    busy = failure({"what": "w", "retryable": True, "kind": "rate_limit", "retry_after_s": 2})
    assert isinstance(busy, ProviderBusy) and busy.retry_after_s == 2.0
    assert busy.kind == "rate_limit"
    assert isinstance(failure({"what": "w", "kind": "context_length"}), ContextTooLong)
    plain = failure({"what": "w", "retryable": False, "kind": "auth"})
    assert type(plain) is ProviderFailed
    odd = failure({"what": "w", "retryable": True, "retry_after_s": "soon"})
    assert isinstance(odd, ProviderBusy) and odd.retry_after_s is None


# -- the whole chain against fake servers ---------------------------------------------------
def _attempts(server: Any, wire: str, emitted: list[str]) -> Any:
    job = {
        "job_id": "j",
        "provider": {"name": wire, "model": "m", "base_url": server.base_url},
        "messages": [{"role": "user", "content": "hi"}],
    }

    def emit(event: Any) -> None:
        if isinstance(event, TextDelta):
            emitted.append(event.content)

    async def attempt() -> AIResponse:
        emitted.clear()
        reply = await asyncio.to_thread(
            run_request, job, "", emit, client_for=lambda c, p: httpx.Client()
        )
        if not reply["ok"]:
            raise failure(reply["error"])
        return AIResponse(text=str(reply["response"]["text"]))

    return attempt


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_rate_limits_overload_5xx_and_resets_are_retried_until_an_answer(wire: str) -> None:
    replies = [
        Fail(429, "slow down", {"retry-after-ms": "20"}),
        Fail(429, "slow down", {"retry-after": "0.03"}),
        Fail(529 if wire == "anthropic" else 503, "busy"),
        Reset(),
        Reply("at last"),
    ]
    server = FakeOpenAIServer(replies) if wire == "openai" else FakeAnthropicServer(replies)
    emitted: list[str] = []
    said: list[Retry] = []
    slept: list[float] = []

    async def announce(retry: Retry) -> None:
        said.append(retry)

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await asyncio.sleep(seconds)

    async def main() -> AIResponse:
        policy = RetryPolicy(max_retries=4, base_s=0.01)
        return await with_retries(_attempts(server, wire, emitted), policy, announce, sleep=sleep)

    with server:
        response = asyncio.run(main())
    assert response.text == "at last"
    assert len(server.requests) == 5
    kinds = [r.error.kind for r in said]
    assert kinds == ["rate_limit", "rate_limit", "overloaded" if wire == "anthropic" else "server",
                     "network"]  # fmt: skip
    assert slept[:2] == [0.02, 0.03]  # retry-after-ms, then Retry-After in seconds
    assert said[0].text.startswith("rate limited, retrying in 0.0 s")


def test_a_stream_cut_after_text_is_retried_and_the_answer_restarts() -> None:
    emitted: list[str] = []
    restarts: list[bool] = []

    async def announce(retry: Retry) -> None:
        restarts.append(bool(emitted))

    async def main() -> AIResponse:
        policy = RetryPolicy(base_s=0.01)
        return await with_retries(_attempts(server, "openai", emitted), policy, announce)

    with FakeOpenAIServer([Reply("cut off mid-way", drop_after=5), Reply("whole")]) as server:
        response = asyncio.run(main())
    assert response.text == "whole"
    assert restarts == [True]  # text had been shown: the user is told it starts again
    assert "".join(emitted) == "whole"


def test_a_context_length_error_is_not_retried() -> None:
    from tests.fakes.llm_wire import OPENAI_TOO_LONG

    async def announce(retry: Retry) -> None:
        raise AssertionError("no retry expected")

    with FakeOpenAIServer([OPENAI_TOO_LONG]) as server, pytest.raises(ContextTooLong):
        asyncio.run(with_retries(_attempts(server, "openai", []), RetryPolicy(), announce))
    assert len(server.requests) == 1
