"""The sandbox lifecycle (design: Container Manager, Lifecycle State Machine).

::

    CREATING --success--> RUNNING --normal--> STOPPING --> CLEANUP --> DESTROYED
        |                    |
        | failure            | abnormal: timeout / OOM / crash
        v                    v
      FAILED ------------> CLEANUP --> DESTROYED
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from pathlib import Path

from fluffy.errors import SandboxStateError


class SandboxState(enum.StrEnum):
    CREATING = "creating"
    RUNNING = "running"
    STOPPING = "stopping"
    FAILED = "failed"
    CLEANUP = "cleanup"
    DESTROYED = "destroyed"


class FailureReason(enum.StrEnum):
    CREATE_FAILED = "create_failed"
    START_FAILED = "start_failed"
    TIMEOUT = "timeout"
    OOM = "oom"
    CRASH = "crash"


TRANSITIONS: dict[SandboxState, frozenset[SandboxState]] = {
    SandboxState.CREATING: frozenset({SandboxState.RUNNING, SandboxState.FAILED}),
    SandboxState.RUNNING: frozenset({SandboxState.STOPPING, SandboxState.FAILED}),
    SandboxState.STOPPING: frozenset({SandboxState.CLEANUP}),
    SandboxState.FAILED: frozenset({SandboxState.CLEANUP}),
    SandboxState.CLEANUP: frozenset({SandboxState.DESTROYED}),
    SandboxState.DESTROYED: frozenset(),
}


@dataclass
class Sandbox:
    """One sandbox as the manager tracks it."""

    sandbox_id: str
    template: str
    name: str
    output_dir: Path
    state: SandboxState = SandboxState.CREATING
    container_id: str | None = None
    failure: FailureReason | None = None
    exit_code: int | None = None
    history: list[tuple[SandboxState, float]] = field(default_factory=list)
    cleanup_errors: list[str] = field(default_factory=list)
    #: the tool call it serves (set when the call is handed to it; "" for other kinds)
    call_id: str = ""

    def __post_init__(self) -> None:
        self.history.append((self.state, time.monotonic()))

    def move(self, to: SandboxState) -> None:
        if to not in TRANSITIONS[self.state]:
            raise SandboxStateError(
                f"sandbox {self.sandbox_id}: cannot go from {self.state} to {to}"
            )
        self.state = to
        self.history.append((to, time.monotonic()))

    def fail(self, reason: FailureReason) -> None:
        self.failure = reason
        self.move(SandboxState.FAILED)
