"""Per-plugin circuit breakers (design: Circuit Breaker, after KarnEvil9's Layer 8).

``threshold`` (5) consecutive failures open a plugin's circuit for ``cooldown_s`` (30 s):
calls are refused with :class:`~fluffy.errors.CircuitOpen`, which says when it closes
and what the last error was.  Then the circuit is *half-open*: exactly one trial call is
let through (others are refused while it runs); its success closes the circuit, its
failure opens it for another ``cooldown_s``.

Each admitted call holds a :class:`Ticket` and must report it exactly once: ``success``,
``failure`` or ``release`` (neither -- a cancelled call, or an error that is the
caller's, not the plugin's).  Tickets remember the circuit's epoch, so a call admitted
before the circuit opened cannot close it (or re-open it) by finishing late.
:meth:`BreakerBoard.guard` does the bookkeeping as an ``async with``.  Every method runs
without awaiting and under a lock: safe from asyncio tasks and threads alike.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Final, Literal

import msgspec
from msgspec.structs import asdict

from fluffy.errors import CircuitOpen, ConfigError, FluffyError
from fluffy.kernel.redaction import redact

Clock = Callable[[], float]
BreakerState = Literal["closed", "open", "half_open"]
THRESHOLD: Final = 5
COOLDOWN_S: Final = 30.0
MAX_ERROR_CHARS: Final = 300


def counts_as_failure(exc: BaseException) -> bool:
    """Default rule: unexpected exceptions and retryable fluffy errors are the plugin's
    failures; a deliberate, non-retryable :class:`FluffyError` (bad input, the tool's own
    error) is an answer, and cancellation is nobody's failure."""
    if not isinstance(exc, Exception):
        return False  # CancelledError, KeyboardInterrupt, SystemExit
    if isinstance(exc, FluffyError):
        return exc.retryable
    return True


def describe(error: BaseException | str) -> str:
    """One line about an error, secrets redacted, at most :data:`MAX_ERROR_CHARS`."""
    if isinstance(error, FluffyError):
        text = f"{error.code}: {error.what}"
    elif isinstance(error, BaseException):
        text = f"{type(error).__name__}: {error}"
    else:
        text = error
    text = redact(" ".join(text.split()))
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


class Ticket(msgspec.Struct, frozen=True):
    """One admitted call: which breaker, in which epoch, and whether it is the trial."""

    name: str
    epoch: int
    trial: bool


class BreakerStatus(msgspec.Struct, frozen=True):
    name: str
    state: BreakerState
    consecutive_failures: int
    #: Seconds until an open circuit lets a trial call through (None unless open).
    retry_in_s: float | None
    trial_in_flight: bool
    last_error: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class CircuitBreaker:
    def __init__(
        self,
        name: str,
        *,
        threshold: int = THRESHOLD,
        cooldown_s: float = COOLDOWN_S,
        clock: Clock = time.monotonic,
    ) -> None:
        if threshold < 1 or cooldown_s < 0:
            raise ConfigError(
                f"circuit breaker for {name}: threshold {threshold} / cooldown {cooldown_s} s",
                why="the threshold must be at least 1 and the cooldown not negative",
            )
        self.name = name
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._open = False
        self._until = 0.0
        self._failures = 0
        self._epoch = 0
        self._trial = False
        self._last_error: str | None = None

    def _state(self, now: float) -> BreakerState:
        if not self._open:
            return "closed"
        return "open" if now < self._until else "half_open"

    @property
    def state(self) -> BreakerState:
        with self._lock:
            return self._state(self._clock())

    def before(self) -> Ticket:
        """Admit a call or raise :class:`CircuitOpen`."""
        with self._lock:
            now = self._clock()
            state = self._state(now)
            if state == "closed":
                return Ticket(self.name, self._epoch, trial=False)
            if state == "half_open" and not self._trial:
                self._trial = True
                return Ticket(self.name, self._epoch, trial=True)
            raise self._refusal(now, state)

    def _refusal(self, now: float, state: BreakerState) -> CircuitOpen:
        last = f"; last error: {self._last_error}" if self._last_error else ""
        if state == "open":
            wait = max(self._until - now, 0.0)
            what = f"plugin {self.name}'s circuit is open; it closes for a trial in {wait:.1f} s"
            fix = f"Retry in {wait:.0f} s or later; meanwhile look at the plugin's last error."
        else:
            what = f"plugin {self.name}'s circuit is half-open and its one trial call is running"
            fix = "Retry when the trial call has finished."
        why = f"{self.name} failed {self.threshold} times in a row{last}"
        return CircuitOpen(what, why=why, fix=fix)

    def success(self, ticket: Ticket) -> None:
        with self._lock:
            if ticket.epoch != self._epoch:
                return  # admitted before the circuit last changed: proves nothing now
            if ticket.trial:
                self._open = False
                self._trial = False
                self._epoch += 1
            if not self._open:
                self._failures = 0

    def failure(self, ticket: Ticket, error: BaseException | str) -> None:
        with self._lock:
            if ticket.epoch != self._epoch:
                return
            self._last_error = describe(error)
            if ticket.trial:
                self._trip()
            elif not self._open:
                self._failures += 1
                if self._failures >= self.threshold:
                    self._trip()

    def release(self, ticket: Ticket) -> None:
        """The call ended without telling anything about the plugin's health."""
        with self._lock:
            if ticket.trial and ticket.epoch == self._epoch:
                self._trial = False  # the next caller becomes the trial

    def _trip(self) -> None:
        self._open = True
        self._trial = False
        self._until = self._clock() + self.cooldown_s
        self._epoch += 1

    def status(self) -> BreakerStatus:
        with self._lock:
            now = self._clock()
            state = self._state(now)
            return BreakerStatus(
                name=self.name,
                state=state,
                consecutive_failures=self._failures,
                retry_in_s=round(self._until - now, 3) if state == "open" else None,
                trial_in_flight=self._trial,
                last_error=self._last_error,
            )


class BreakerBoard:
    """One :class:`CircuitBreaker` per plugin name, created on first use."""

    def __init__(
        self,
        *,
        threshold: int = THRESHOLD,
        cooldown_s: float = COOLDOWN_S,
        clock: Clock = time.monotonic,
        is_failure: Callable[[BaseException], bool] = counts_as_failure,
    ) -> None:
        self._threshold = threshold
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._is_failure = is_failure
        self._lock = threading.Lock()
        self._breakers: dict[str, CircuitBreaker] = {}

    def breaker(self, name: str) -> CircuitBreaker:
        with self._lock:
            found = self._breakers.get(name)
            if found is None:
                found = CircuitBreaker(
                    name, threshold=self._threshold, cooldown_s=self._cooldown_s, clock=self._clock
                )
                self._breakers[name] = found
            return found

    def before(self, name: str) -> Ticket:
        return self.breaker(name).before()

    def success(self, ticket: Ticket) -> None:
        self.breaker(ticket.name).success(ticket)

    def failure(self, ticket: Ticket, error: BaseException | str) -> None:
        self.breaker(ticket.name).failure(ticket, error)

    def release(self, ticket: Ticket) -> None:
        self.breaker(ticket.name).release(ticket)

    @asynccontextmanager
    async def guard(self, name: str) -> AsyncIterator[Ticket]:
        """``async with board.guard("fs-tool"):`` -- admits (or raises CircuitOpen) and
        reports the outcome: normal exit is a success, an exception is judged by
        ``is_failure`` (others, and cancellation, release the ticket)."""
        ticket = self.before(name)
        try:
            yield ticket
        except asyncio.CancelledError:
            self.release(ticket)
            raise
        except BaseException as exc:
            if self._is_failure(exc):
                self.failure(ticket, exc)
            else:
                self.release(ticket)
            raise
        else:
            self.success(ticket)

    def snapshot(self) -> dict[str, BreakerStatus]:
        """Every breaker's status, by plugin name (for ``fluffy status``)."""
        with self._lock:
            breakers = sorted(self._breakers.items())
        return {name: breaker.status() for name, breaker in breakers}
