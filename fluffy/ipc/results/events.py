"""The events of a session's stream (session.events), one tagged struct per kind.

The session loop (kernel/ai/) emits them as a turn runs; the stream stamps each with
``seq``, its number in the session's stream (from 1), and ``session.events`` carries
them oldest first, each a JSON object whose ``type`` names its kind.  A field that only
some paths send is ``UNSET`` on the others and then left out of the object (drawn
"required: no").
"""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import UNSET, UnsetType

from fluffy.ipc.results import Part
from fluffy.ipc.results.usage import UsageTally
from fluffy.ipc.results.workflow import Mode, State

#: a turn's status (kernel/ai/turn.py): ``turn_end`` carries done, failed, cancelled or
#: quarantined
TurnStatus = Literal["running", "waiting_review", "done", "failed", "cancelled", "quarantined"]

# Each event's ``seq`` is its number in the session's stream, set by the stream as it
# emits the event (kernel/ai/events.py): 0 only until then, so never sent.


class TurnStarted(Part, kw_only=True, tag="turn_start", tag_field="type"):
    """A turn began with the person's task (session.message)."""

    seq: int = 0
    turn_id: str
    text: str


class TextStreamed(Part, kw_only=True, tag="text_delta", tag_field="type"):
    """The next piece of the model's answer, as it streams in."""

    seq: int = 0
    content: str


class ToolStarted(Part, kw_only=True, tag="tool_executing", tag_field="type"):
    """A tool call the model asked for started."""

    seq: int = 0
    call_id: str
    tool_name: str
    #: what the call does, in words ("Reading src/app.py")
    description: str


class CallFailure(Part, kw_only=True):
    """Why a tool call failed or was refused, as the person is shown it."""

    #: left out when the tool's answer carried no error object, only a text
    code: str | UnsetType = UNSET
    #: "tool_unavailable" for a tool the workflow does not allow now, else ""; left out
    #: with ``code``
    error: str | UnsetType = UNSET
    what: str
    why: str
    fix: str


class ToolFinished(Part, kw_only=True, tag="tool_result", tag_field="type"):
    """A tool call ended (refused calls too, at once), with its end-to-end time."""

    seq: int = 0
    call_id: str
    tool_name: str
    ok: bool
    #: the answer in one line ("Read 85 lines")
    summary: str
    #: end to end (0 for a call refused before it ran)
    duration_ms: float
    #: null when the call succeeded
    error: CallFailure | None


class StateChanged(Part, kw_only=True, tag="state", tag_field="type"):
    """The session's TDD state moved (one event per step)."""

    seq: int = 0
    from_: State = msgspec.field(name="from")
    to: State
    mode: Mode


class ReviewShown(Part, kw_only=True, tag="review", tag_field="type"):
    """A change that reached reviewing: the person decides (review.*), or the kernel
    approves it for them (``kernel_decides``: the turn's --yes, where policy lets it)."""

    seq: int = 0
    #: always false (a change merged by itself is a ``merged`` event)
    auto: bool
    kernel_decides: bool
    #: what review.approve / .reject / .add_tests name
    plan_id: str
    files: list[str]
    lines: int
    #: the whole unified diff (at most 20,000 characters)
    diff: str
    #: why it does not merge by itself
    reasons: list[str]
    #: test-support code the change touches (a person reviews it)
    support: list[str]
    #: --yes does not stand in for a person (test-support code, files outside the
    #: source and test folders)
    needs_person: bool
    #: an explore change: the person may ask for tests first (review.add_tests)
    can_add_tests: bool
    #: why the model asks for tests first (null: it does not); sent only when
    #: ``can_add_tests`` and the person decides
    tests_requested: str | UnsetType | None = UNSET


class ExemptionAsked(Part, kw_only=True, tag="exemption", tag_field="type"):
    """The model asks for a TDD exemption; only the person grants it
    (workflow.decide_exemption, naming ``request_id``)."""

    seq: int = 0
    #: always false: never decided for the person
    kernel_decides: bool
    request_id: str
    category: str
    paths: list[str]
    reason: str


class HeldCall(Part):
    """A tool call held for the person's review, as they are shown it (tool.pending)."""

    #: what tool.decide names it by
    review_id: str
    tool: str
    #: the call's arguments as indented JSON text, in full
    arguments: str
    #: why policy holds it
    reason: str
    description: str
    #: the policy rule that would stop the asking
    allow_with: str
    #: the command line (container.run only)
    command: str | UnsetType = UNSET


class ToolCallHeld(HeldCall, kw_only=True, tag="tool_review", tag_field="type"):
    """A tool call policy holds for the person: it runs only after their yes (tool.decide);
    the fields of tool.pending's call."""

    seq: int = 0
    #: always false: never decided for the person
    kernel_decides: bool


class ChangesMerged(Part, kw_only=True, tag="merged", tag_field="type"):
    """A change was merged into the project: by itself (``auto``) or approved."""

    seq: int = 0
    #: how many files (``paths``)
    files: int
    paths: list[str]
    auto: bool
    reason: str


class Committed(Part, kw_only=True, tag="commit", tag_field="type"):
    """git.commit ran: the commit made (``sha``), or none when nothing was left to commit."""

    seq: int = 0
    #: null: no commit was made
    sha: str | None
    message: str
    #: merged files kept out of the commit (they overlap the person's uncommitted
    #: lines); sent only when there are some
    left_out: list[str] | UnsetType = UNSET
    #: why, for the person; sent only when there are some
    notes: list[str] | UnsetType = UNSET


class SessionQuarantined(Part, kw_only=True, tag="quarantine", tag_field="type"):
    """Too many refused calls: the session is read-only until the person lifts it."""

    seq: int = 0
    denials: int
    reason: str


class Notice(Part, kw_only=True, tag="notice", tag_field="type"):
    """Something the person should know: a budget warning, an overlap, a compaction."""

    seq: int = 0
    level: Literal["info", "warn"]
    what: str
    why: str
    fix: str


class RetryScheduled(Part, kw_only=True, tag="retry", tag_field="type"):
    """A model request failed and is tried again after a wait (ADR-044)."""

    seq: int = 0
    #: the line the person reads ("rate limited, retrying in 4 s (attempt 2 of 5)")
    text: str
    #: rate_limit, overloaded, server or network
    kind: str
    #: the attempt that failed (from 1) of ``attempts``
    attempt: int
    attempts: int
    wait_s: float
    what: str
    why: str
    #: the answer streamed so far is void: the next attempt's replaces it
    restart: bool


class TurnFailure(Part, kw_only=True):
    """Why a turn failed: the error's code and what / why / fix."""

    what: str
    why: str
    fix: str
    code: str


class TurnEnded(Part, kw_only=True, tag="turn_end", tag_field="type"):
    """The turn ended: how, the model's last text, and the tokens it used."""

    seq: int = 0
    turn_id: str
    status: TurnStatus
    text: str
    #: null unless it failed
    error: TurnFailure | None
    usage: UsageTally


#: every kind of event, told apart by ``type``
SessionEvent = (
    TurnStarted
    | TextStreamed
    | ToolStarted
    | ToolFinished
    | StateChanged
    | ReviewShown
    | ExemptionAsked
    | ToolCallHeld
    | ChangesMerged
    | Committed
    | SessionQuarantined
    | Notice
    | RetryScheduled
    | TurnEnded
)
