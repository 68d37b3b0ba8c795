"""Results of the session syscalls the AI layer serves: messages, events, pins, usage,
budget, decisions.
"""

from __future__ import annotations

from typing import Literal

from fluffy.ipc.results import Part, Result
from fluffy.ipc.results.events import HeldCall, SessionEvent
from fluffy.ipc.results.usage import UsageTally
from fluffy.ipc.results.workflow import Mode, Session, State

#: the person's answer on a tool call held for review (tool.decide's ``decision``)
CallDecision = Literal["allow", "allow_session", "deny"]

# -- session.message, session.cancel -----------------------------------------------------


class MessageAccepted(Session):
    """A turn started (session.message): its id, then the session; session.events follows it."""

    turn_id: str


class CancelledSession(Session):
    """The session after session.cancel (idle), and whether a running turn was stopped."""

    turn_cancelled: bool


# -- session.events ----------------------------------------------------------------------


class SessionEvents(Result):
    """One long-poll of a session's event stream (session.events)."""

    #: the events after the cursor, oldest first, each tagged by its ``type``
    #: (fluffy/ipc/results/events.py)
    events: list[SessionEvent]
    #: the cursor to ask ``after`` next: the last event's ``seq`` (the one asked when
    #: none came; the stream's position when ``after`` was negative)
    next: int
    #: whether a turn runs in the session now
    running: bool
    mode: Mode
    state: State
    quarantined: bool


# -- session.usage, session.list ---------------------------------------------------------


class SessionUsage(Result):
    """The token usage of a session's latest turn and of the whole session (session.usage)."""

    session_id: str
    turn: UsageTally
    session: UsageTally
    #: the real/estimated input-token ratio of the last requests (null: none reported)
    calibration: float | None
    #: what the context window's estimates are multiplied by (1.0 to 4.0)
    scale: float


class SessionSummary(Part):
    """One session as session.list shows it, with its conversation's title and turns."""

    session_id: str
    mode: Mode
    state: State
    title: str
    turns: int
    #: milliseconds since the epoch
    created_at: int
    #: milliseconds since the epoch (the session's or its conversation's, the later)
    updated_at: int
    quarantined: bool
    usage: UsageTally


class SessionList(Result):
    """The newest sessions, newest first (session.list)."""

    sessions: list[SessionSummary]


# -- session.pin, .unpin, .pins ----------------------------------------------------------


class Pins(Result):
    """The texts pinned to a session's context, in order (their numbers for unpin)."""

    pins: list[str]


# -- session.budget ----------------------------------------------------------------------


class Budget(Result):
    """A session's coverage budget (session.budget): coverage % and deltas in points."""

    session_id: str
    mode: Mode
    #: the baseline's coverage % (null: no baseline)
    baseline: float | None
    #: the session's latest test run's coverage % (null: no coverage recorded)
    current: float | None
    #: current - baseline (null when either is)
    delta: float | None
    #: whether the budget's lockout is on (explore commits refused)
    locked: bool
    warn_at: float
    lock_at: float
    min_delta: float
    baseline_file: str
    #: what is wrong with the baseline file (missing, corrupt, changed)
    notes: list[str]


# -- session.instructions ----------------------------------------------------------------


class InstructionFile(Part):
    """One instruction file looked at: its size, the bytes of it used, or why skipped."""

    path: str
    size: int
    #: bytes of the file that reach the prompt
    used: int
    #: of the bytes read ("" when skipped)
    sha256: str
    truncated: bool
    #: why it was not read ("" when it was)
    skipped: str


class Instructions(Result):
    """The project's instruction files as the next turn gets them (no text)."""

    files: list[InstructionFile]
    #: the bytes all files together may use (0: the kernel reads no instructions)
    limit: int
    truncated: bool
    digest: str


# -- tool.pending, tool.decide -----------------------------------------------------------


class PendingCall(Result):
    """The tool call that waits for the person's answer in a session (tool.pending)."""

    session_id: str
    #: null: none waits
    pending: HeldCall | None


class CallDecided(Result):
    """The person's answer on a held tool call, handed to the waiting turn (tool.decide)."""

    session_id: str
    review_id: str
    decision: CallDecision
