"""The design's states, modes and transition tables (State Machine Module), as data.

Two flows: *strict* (TDD: tests first, red, then code) and *explore* (explore and debug
modes, and granted TDD exemptions).  Each row is (from, event) -> (to, guard); a guard
names a check in :mod:`fluffy.kernel.workflow.guards` whose ``on_fail`` text is the
design's.  Any state goes to ``idle`` on ``cancel``.
"""

from __future__ import annotations

from typing import Final, Literal, TypeGuard, get_args

import msgspec

# the states and modes are declared once, where the wire names them (a session's result)
from fluffy.ipc.results.workflow import Mode as Mode
from fluffy.ipc.results.workflow import State as State

Flow = Literal["strict", "explore"]

STATES: Final[tuple[State, ...]] = get_args(State)
MODES: Final[tuple[Mode, ...]] = get_args(Mode)


def is_mode(value: object) -> TypeGuard[Mode]:
    return value in MODES


def is_state(value: object) -> TypeGuard[State]:
    return value in STATES


#: The caller tag of the person (their CLI, or their answer to the model's question): a
#: policy rule matches it (``caller_tag: [person]``).
PERSON: Final = frozenset({"person"})

EVENTS: Final = (
    "user_message",  # the user sends a message
    "plan_complete",  # the AI calls the plan.complete tool
    "tests_red",  # tests exist, ran, at least one fails (strict test_writing)
    "code_changed",  # code changes exist
    "tests_passed",  # the latest recorded run passes
    "tests_failed",  # the latest recorded run fails
    "merge_approved",  # auto-merge or the user's /approve
    "merge_rejected",  # the user's /reject
    "add_tests",  # explore reviewing: the user chooses to add tests before merge (review.add_tests)
    "tests_written",  # retroactive tests written
    "commit_complete",  # the commit finished
    "cancel",  # the user cancels or resets the session
)


class Transition(msgspec.Struct, frozen=True):
    to: State
    guard: str | None = None


STRICT: Final[dict[tuple[State, str], Transition]] = {
    ("idle", "user_message"): Transition("planning"),
    ("planning", "plan_complete"): Transition("test_writing"),
    ("test_writing", "tests_red"): Transition("code_writing", "red"),
    ("code_writing", "code_changed"): Transition("validating", "code_changed"),
    ("validating", "tests_passed"): Transition("reviewing", "green"),
    ("validating", "tests_failed"): Transition("code_writing", "failing"),
    ("reviewing", "merge_approved"): Transition("committing", "approved"),
    ("reviewing", "merge_rejected"): Transition("code_writing"),
    ("committing", "commit_complete"): Transition("idle"),
}

EXPLORE: Final[dict[tuple[State, str], Transition]] = {
    ("idle", "user_message"): Transition("planning"),
    ("planning", "plan_complete"): Transition("exploring"),
    ("exploring", "code_changed"): Transition("validating", "code_changed"),
    ("validating", "tests_passed"): Transition("reviewing", "green_or_no_tests"),
    ("validating", "tests_failed"): Transition("exploring", "failing"),
    ("reviewing", "merge_approved"): Transition("committing", "approved_within_budget"),
    ("reviewing", "add_tests"): Transition("retroactive_testing"),
    ("retroactive_testing", "tests_written"): Transition("validating", "tests_changed"),
    ("committing", "commit_complete"): Transition("idle"),
}

TABLES: Final = {"strict": STRICT, "explore": EXPLORE}

#: The design's on_fail messages (what), with why/fix added by the guards.
ON_FAIL: Final = {
    "red": "Tests must exist, have been run, and at least one must fail (TDD Red phase)",
    "green": "All tests must pass before review",
    "green_or_no_tests": "Existing tests must pass before review",
    "approved": "Merge must be approved before committing",
    "approved_within_budget": "Merge must be approved and within the tech-debt budget",
    "code_changed": "Code changes must exist before validating",
    "failing": "The latest test run must fail to go back to fixing",
    "tests_changed": "Tests must have been written before validating",
}

#: States in which writing is possible, and what (the design's TDD table; the tool path
#: uses it for ToolUnavailableError).
WRITABLE: Final[dict[State, tuple[str, ...]]] = {
    "test_writing": ("tests/**",),
    "code_writing": ("src/**",),
    "exploring": ("**",),
    "retroactive_testing": ("tests/**",),
}


def flow_of(mode: Mode, exempted: bool) -> Flow:
    return "explore" if mode != "strict" or exempted else "strict"


def next_state(flow: Flow, state: State, event: str) -> Transition | None:
    if event == "cancel":
        return Transition("idle")
    return TABLES[flow].get((state, event))
