"""Retries of a model request: exponential backoff with jitter, bounded (ADR-044).

The ai-provider sandbox makes one attempt per request and says what went wrong
(:class:`~fluffy.errors.ProviderBusy`: its kind and the wait the provider asked for in
``Retry-After`` / ``retry-after-ms``).  The waiting happens here, in the kernel, as an
``asyncio.sleep``: a cancelled turn stops waiting at once, and every wait is announced
to the user first (a ``retry`` event: "rate limited, retrying in 4 s").

Bounds, both from the provider settings (``max_retries``, ``retry_max_wait_s``):

* at most ``max_retries`` retries (``max_retries + 1`` attempts);
* at most ``max_wait_s`` seconds of waiting in all.  A wait the provider asks for that
  does not fit in what is left fails at once, saying when to retry, rather than
  sleeping past the budget.

Without a ``Retry-After`` the wait is the openai SDK's: 0.5 s doubling up to 8 s, less
up to 25 % jitter.  Only :class:`ProviderBusy` is retried: a 400/401/403/404/422, a
malformed answer or a prompt too long for the model fail on the first attempt.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import msgspec

from fluffy.errors import ProviderBusy, ProviderFailed
from fluffy.ipc.results.events import RetryScheduled

T = TypeVar("T")

BASE_S: Final = 0.5
CAP_S: Final = 8.0
JITTER: Final = 0.25

#: What the user reads for each kind of failure ("rate limited, retrying in 4 s").
SAID: Final = {
    "rate_limit": "rate limited",
    "overloaded": "the provider is overloaded",
    "server": "the provider failed to answer",
    "network": "the connection to the provider dropped",
}


class RetryPolicy(msgspec.Struct, frozen=True):
    max_retries: int = 4
    max_wait_s: float = 60.0
    base_s: float = BASE_S
    cap_s: float = CAP_S

    @property
    def attempts(self) -> int:
        return self.max_retries + 1

    def backoff(self, retry: int, jitter: float) -> float:
        """The wait before retry number ``retry`` (1, 2, ...); ``jitter`` in [0, 1)."""
        return min(self.cap_s, self.base_s * 2.0 ** (retry - 1)) * (1 - JITTER * jitter)


class Retry(msgspec.Struct, frozen=True):
    """One announced wait: attempt ``attempt`` of ``attempts`` failed with ``error``."""

    attempt: int
    attempts: int
    wait_s: float
    error: ProviderBusy

    @property
    def text(self) -> str:
        said = SAID.get(self.error.kind, "the provider request failed")
        shown = f"{self.wait_s:.0f}" if self.wait_s >= 1 else f"{self.wait_s:.1f}"
        return f"{said}, retrying in {shown} s (attempt {self.attempt + 1} of {self.attempts})"

    def event(self, *, restart: bool) -> RetryScheduled:
        """The ``retry`` event the CLI shows; ``restart``: text already shown is void."""
        return RetryScheduled(
            text=self.text,
            kind=self.error.kind,
            attempt=self.attempt,
            attempts=self.attempts,
            wait_s=round(self.wait_s, 2),
            what=self.error.what,
            why=self.error.why,
            restart=restart,
        )


def _gave_up(error: ProviderBusy, attempts: int, waited: float) -> ProviderFailed:
    return ProviderFailed(
        f"{error.what} (gave up after {attempts} attempt(s))",
        why=f"{error.why}; {waited:.0f} s spent waiting between attempts".lstrip("; "),
        fix=f"{error.fix} fluffy retries up to max_retries times within retry_max_wait_s "
        "seconds (`fluffy config set max_retries N`).".lstrip(),
    )


def _asks_too_long(error: ProviderBusy, asked: float, left: float) -> ProviderFailed:
    when = time.strftime("%H:%M:%S", time.localtime(time.time() + asked))
    return ProviderFailed(
        f"{error.what}: the provider asks to wait {asked:.0f} s before a retry",
        why=f"{error.why}; that is more than the {left:.0f} s fluffy may still wait "
        "(retry_max_wait_s)".lstrip("; "),
        fix=f"Retry after {when}, or raise retry_max_wait_s "
        "(`fluffy config set retry_max_wait_s N`).",
    )


async def with_retries(
    attempt: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    announce: Callable[[Retry], Awaitable[None]],
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    jitter: Callable[[], float] = random.random,
) -> T:
    """``attempt()``'s result, retried on :class:`ProviderBusy` within ``policy``."""
    waited = 0.0
    number = 1
    while True:
        try:
            return await attempt()
        except ProviderBusy as error:
            if number >= policy.attempts:
                raise _gave_up(error, number, waited) from None
            left = policy.max_wait_s - waited
            asked = error.retry_after_s
            if asked is not None and asked > left:
                raise _asks_too_long(error, asked, left) from None
            wait = asked if asked is not None and asked > 0 else policy.backoff(number, jitter())
            wait = min(wait, left)
            if wait <= 0 and left <= 0:
                raise _gave_up(error, number, waited) from None
            await announce(Retry(number, policy.attempts, wait, error))
            await sleep(wait)
            waited += wait
            number += 1
