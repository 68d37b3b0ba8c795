"""Results of the tool and review syscalls: calls, their outcomes, the review of a
session's changes."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from fluffy.ipc.results import Part, Result
from fluffy.ipc.results.admin import BreakerStatus, KernelScheduler
from fluffy.ipc.results.workflow import Mode, State

#: where a tool runs (kernel/tools/core/registry.py's ``Route``): in the kernel (``fast``,
#: ``kernel``), in its plugin's sandbox, or on a registered MCP server
ToolRoute = Literal["fast", "plugin", "kernel", "mcp"]
#: what a tool does (kernel/tools/core/registry.py's ``Kind``)
ToolKind = Literal["read", "write", "execute", "commit", "workflow", "external"]
#: the workflow's events (kernel/workflow/states.py's ``EVENTS``)
FlowEvent = Literal[
    "user_message",
    "plan_complete",
    "tests_red",
    "code_changed",
    "tests_passed",
    "tests_failed",
    "merge_approved",
    "merge_rejected",
    "add_tests",
    "tests_written",
    "commit_complete",
    "cancel",
]

# -- tool.list ---------------------------------------------------------------------------


class ListedTool(Part):
    """One tool the kernel can route: its name, description, input schema, kind and route."""

    name: str
    description: str
    #: the tool's JSON schema (open-ended: each tool's, from the kernel or its manifest)
    input_schema: dict[str, Any]
    kind: ToolKind
    route: ToolRoute


class ToolList(Result):
    """Every tool, by name, and those the session may call now (tool.list)."""

    tools: list[ListedTool]
    #: the names the session's state and mode allow (None: no session was named)
    available: list[str] | None


# -- tool.call, tool.batch ---------------------------------------------------------------


class ToolCallError(Part):
    """Why a tool call was refused or failed: its code, what / why / fix, whether to retry."""

    code: str
    what: str
    why: str
    fix: str
    retryable: bool
    #: where the error arose, when the raiser said so
    context: str = ""
    #: the next five: a tool the workflow does not allow now (``tool.unavailable``, the
    #: design's ToolUnavailableError); None for every other error
    error: Literal["tool_unavailable"] | None = None
    tool_name: str | None = None
    current_state: State | None = None
    reason: str | None = None
    available_tools: list[str] | None = None


class CallSession(Part):
    """The session a call ran in, as the call left it."""

    session_id: str
    mode: Mode
    state: State


class SandboxTimings(Part):
    """How long a plugin call's sandbox took, in milliseconds."""

    #: sandbox made and started
    create_ms: float
    #: the plugin host asked for work
    ready_ms: float
    #: job handed to the host -> result back
    exchange_ms: float
    total_ms: float
    #: the tool's own run time, as the plugin host measured it
    tool_ms: float
    #: 1.0: the sandbox was made ahead of the call (the warm pool); 0.0: made for it
    warm: float


class ToolOutcome(Result):
    """A tool call's answer (tool.call; tool.batch answers a list): the output or the error."""

    ok: bool
    tool: str
    #: the kernel's id of the call (it names the call's audit entries)
    call_id: str
    #: where it ran (None: refused before it was routed)
    route: ToolRoute | None
    duration_ms: float
    #: times the call was retried (a read: at most once)
    retries: int
    #: None: there is no such session
    session: CallSession | None
    #: the tool's own result (open-ended: each tool, built-in, plugin or MCP, has its
    #: own), sanitised; a string when it was cut to the output budget (None: not ok)
    output: dict[str, Any] | str | None = None
    #: why the call was refused or failed (None: ok)
    error: ToolCallError | None = None
    #: a plugin call's sandbox (None: the call ran in no sandbox)
    timings: SandboxTimings | None = None
    #: the caller's own ``call_id``, given back (None: none was given)
    client_call_id: str | None = None


# -- tool.status -------------------------------------------------------------------------


class ToolStatus(Result):
    """The tool path's health: circuit breakers, the fast path, the scheduler (tool.status)."""

    #: plugin name -> its breaker (keyed by the plugins called so far)
    breakers: dict[str, BreakerStatus]
    #: whether the kernel runs read tools itself (policy ``tools.fast_path``)
    fast_path: bool
    #: the scheduler's figures, as kernel.ping shows them (None: no scheduler)
    scheduler: KernelScheduler | None


# -- review.* ----------------------------------------------------------------------------


class FlowStep(Part):
    """One workflow step a decision tried: the event, from where, to where, or why not."""

    event: FlowEvent
    from_state: State = msgspec.field(name="from")
    #: None: the step was not taken (``not_taken`` says why)
    to_state: State | None = msgspec.field(name="to", default=None)
    not_taken: str = ""
    #: what the step noted on the way (a coverage drop, a baseline file problem)
    notes: list[str] = []


class Review(Result):
    """The session's staged changes, and why a person reviews them (review.show)."""

    state: State
    #: names exactly these changes: review.approve takes it back
    plan_id: str
    #: the staged paths
    files: list[str]
    #: changed lines of the diff
    diff_lines: int
    #: paths matching the policy's sensitive globs
    sensitive: list[str]
    #: test-support files the session changed (conftest.py, plugins, runner settings), each
    #: with why
    support: list[str]
    #: why the merge is not automatic (empty: it could be)
    reasons: list[str]
    #: the unified diff of every staged change
    diff: str


class ReviewApproved(Result):
    """An approved review's merge: the files written, the workflow's next step (review.approve)."""

    merged: list[str]
    #: a file the person changed meanwhile, with why (a git merge; a files merge lands
    #: whole or fails)
    conflicts: list[str]
    refused: list[str]
    #: the merge operation's id (None: nothing was staged)
    operation: str | None
    #: ``reviewing``: conflicts or refusals kept the session there; else the step's
    state: State
    #: files merged three-way with the person's changes made since they were staged
    three_way: list[str] = []
    #: what to do about the conflicts (empty: none)
    fix: str = ""
    #: the step to committing (empty: the merge was incomplete)
    workflow: list[FlowStep] = []
    #: the tech-debt budget's notices (a coverage drop merged with its notice)
    budget: list[str] = []


class ReviewRejected(Result):
    """The staged changes discarded, and the workflow's step back (review.reject)."""

    discarded: Literal[True]
    workflow: list[FlowStep]
    #: code_writing (strict) or idle (explore); None: the workflow refused the step
    state: State | None


class ReviewTestsFirst(Result):
    """The change kept, the session gone to write tests for it first (review.add_tests)."""

    workflow: list[FlowStep]
    state: Literal["retroactive_testing"]
    kept: Literal[True]
