"""Results of the workflow's syscalls: the session view and its history."""

from __future__ import annotations

from typing import Literal

import msgspec

from fluffy.ipc.results import Part, Result

#: the TDD states (kernel/workflow/states.py's transition tables use these)
State = Literal[
    "idle",
    "planning",
    "test_writing",
    "code_writing",
    "validating",
    "reviewing",
    "committing",
    "exploring",
    "retroactive_testing",
]
#: the session modes
Mode = Literal["strict", "explore", "debug"]


class Exemption(Part):
    """A granted TDD exemption: the category, the paths it covers, why, its rule's condition."""

    category: str
    paths: list[str]
    reason: str
    condition: str = ""


class PendingExemption(Part):
    """An exemption the AI asked for, held until the person decides on ``request_id``."""

    request_id: str
    category: str
    paths: list[str]
    reason: str


class Session(Result):
    """A session as the workflow answers it (session.create, .get, .set_mode, ...)."""

    session_id: str
    mode: Mode
    state: State
    exemption: Exemption | None
    exemption_pending: PendingExemption | None
    unverified: bool
    #: milliseconds since the epoch
    updated_at: int


class Transition(Result):
    """One chained transition of a session (session.history), oldest first."""

    seq: int
    #: milliseconds since the epoch
    timestamp: int
    event: str
    from_state: State = msgspec.field(name="from")
    to_state: State = msgspec.field(name="to")
    mode: Mode
