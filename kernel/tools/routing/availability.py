"""Which tools the AI may call in each workflow state (design: TDD Integration, Tool
Unavailability Handling), as data.

The design's table, completed for every state of both flows:

============================  ==========================================================
state                         writes
============================  ==========================================================
``test_writing``              test paths only (:data:`DEFAULT_TEST_GLOBS`)
``code_writing``              anything but test paths (tests are read-only)
``exploring``                 anywhere but protected paths (``.fluffy/**``, ``.git/**``)
``retroactive_testing``       test paths only
``idle`` ``planning``         none
``validating`` ``reviewing``  none
``committing``                none; ``git.commit`` (kind ``commit``) only here
============================  ==========================================================

Reads (``fs.read``, ``fs.list``, ``fs.exists``, ``search.*``, ``git.status``,
``git.diff``, any tool of kind ``read``) are available in every state.  ``test.run`` runs
in :data:`TEST_RUN_STATES`.  Debug mode is explore mode plus the tools of kind
``execute`` (design: "Same as explore, plus container.run allowed via require_review"),
in the states where ``test.run`` is: fluffy's own ``container.run`` (one command in a
sandbox, which a person reviews unless a rule allows that command: ADR-062) and any
installed plugin's tool that is not read-only.
Workflow tools (kind ``workflow``) are the state machine's to refuse; those of
:data:`WORKFLOW_STATES` are listed only where they can act (``plan.complete`` while
planning, ``workflow.request_exemption`` before code is written, ``workflow.add_tests``
in reviewing, ``workflow.request_mode`` while planning).

Test paths are matched exactly like :mod:`fluffy.kernel.workflow.evidence` classifies
files (gitignore syntax, same default globs), so the two never disagree.  This layer is
the AI's first answer; the policy engine's rules and built-ins still decide every call.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from typing import Final, Literal, Protocol

from fluffy.errors import ToolUnavailable, WorkflowError
from fluffy.kernel.globs import Patterns
from fluffy.kernel.workflow.evidence import DEFAULT_TEST_GLOBS
from fluffy.kernel.workflow.states import MODES, STATES

Kind = Literal["read", "write", "execute", "commit", "workflow", "external"]
PROTECTED_GLOBS: Final = (".fluffy/**", ".git/**")
TEST_RUNNERS: Final = frozenset({"test.run"})
TEST_RUN_STATES: Final = frozenset(
    {"test_writing", "code_writing", "validating", "exploring", "retroactive_testing"}
)
#: Workflow tools that make sense in some states only (others: every state).
WORKFLOW_STATES: Final[Mapping[str, frozenset[str]]] = {
    "plan.complete": frozenset({"planning"}),
    # asks the user; granted only by the user's decision (where the state machine takes it)
    "workflow.request_exemption": frozenset({"planning", "test_writing"}),
    "workflow.add_tests": frozenset({"reviewing"}),
    # the mode changes only before a flow starts (Workflow.set_mode); the user decides
    "workflow.request_mode": frozenset({"planning"}),
}

WriteRule = Literal["tests", "sources", "anywhere", "none"]
WRITES: Final[Mapping[str, WriteRule]] = {
    "test_writing": "tests",
    "code_writing": "sources",
    "exploring": "anywhere",
    "retroactive_testing": "tests",
}

#: What to do next, per state (ends every refusal's reason).
NEXT_STEP: Final[Mapping[str, str]] = {
    "idle": "Send a message to start planning.",
    "planning": "Finish the plan with plan.complete; writing starts in the next state.",
    "test_writing": "Write a failing test, run it with test.run, then move to code_writing.",
    "code_writing": (
        "Make the failing tests pass by changing source files; tests stay read-only "
        "until the next cycle (cancel to start over)."
    ),
    "validating": (
        "Run the tests with test.run: a green run moves to reviewing, a failing run back to fixing."
    ),
    "reviewing": "Wait for the merge decision (/approve or /reject).",
    "committing": "Call git.commit to finish; the next change starts from idle.",
    "exploring": "Change files outside the protected paths; policy changes go through review.",
    "retroactive_testing": "Write the tests, then move to validating.",
}


class ToolInfo(Protocol):
    """What availability needs of a tool (``registry.ToolSpec`` has it)."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str: ...


def _valid(state: str, mode: str) -> None:
    if state not in STATES or mode not in MODES:
        raise WorkflowError(
            f"unknown workflow state {state!r} or mode {mode!r}",
            why=f"states are {', '.join(STATES)}; modes are {', '.join(MODES)}",
            fix="This is a bug in fluffy's tool router; please report it.",
        )


def _normal(path: str) -> str | None:
    """A project-relative posix path; '' for the whole project; None if it escapes."""
    if path in ("", "."):
        return ""
    if path.startswith("/") or "\\" in path or "\0" in path:
        return None
    norm = posixpath.normpath(path)
    if norm == ".":
        return ""
    if norm == ".." or norm.startswith("../"):
        return None
    return norm


def tool_allowed(name: str, kind: str, state: str, mode: str) -> bool:
    """Whether a tool of this kind is usable at all in ``state`` (paths aside)."""
    _valid(state, mode)
    if kind in ("read", "external"):  # external: an MCP server's tool (policy decides)
        return True
    if kind == "write":
        return state in WRITES
    if kind == "commit":
        return state == "committing"
    if kind == "execute":
        if name in TEST_RUNNERS:
            return state in TEST_RUN_STATES
        return mode == "debug" and state in TEST_RUN_STATES
    if kind == "workflow":
        return state in WORKFLOW_STATES.get(name, STATES)
    return False


def available(state: str, mode: str, all_tools: Sequence[ToolInfo]) -> list[str]:
    """The names of the tools usable in ``state`` (for the system prompt), sorted."""
    return sorted({t.name for t in all_tools if tool_allowed(t.name, t.kind, state, mode)})


class WriteScope:
    """Classifies project paths as test / source / protected (globs configurable)."""

    def __init__(
        self,
        test_globs: Sequence[str] = DEFAULT_TEST_GLOBS,
        protected_globs: Sequence[str] = PROTECTED_GLOBS,
    ) -> None:
        self.test_globs = tuple(test_globs)
        self.protected_globs = tuple(protected_globs)
        self._tests = Patterns(self.test_globs)
        self._protected = Patterns(self.protected_globs)

    def is_test(self, path: str) -> bool:
        return bool(self._tests.match(path))

    def is_protected(self, path: str) -> bool:
        # case-insensitively too: on macOS or Windows `.FLUFFY/policy.yaml` *is* the policy
        return bool(self._protected.match(path) or self._protected.match(path.lower()))

    def refusal(self, state: str, path: str) -> str | None:
        """Why ``state`` refuses a write to ``path`` (None: allowed)."""
        rule = WRITES.get(state, "none")
        norm = _normal(path)
        if rule == "none":
            return f"{state} allows no writes"
        if norm is None:
            return f"{path!r} is outside the project"
        shown = norm or "the whole project"
        if norm == "":
            return f"{state} allows writes to single files only; {shown} is not one"
        if self.is_protected(norm):
            protected = ", ".join(self.protected_globs)
            return f"{state} never allows writes to protected paths ({protected}); {shown} is one"
        tests = ", ".join(self.test_globs)
        if rule == "tests" and not self.is_test(norm):
            return f"{state} allows writes to test files only ({tests}); {shown} is a source file"
        if rule == "sources" and self.is_test(norm):
            return (
                f"{state} allows writes to source files only (tests are read-only: {tests}); "
                f"{shown} is a test file"
            )
        return None


_DEFAULT_SCOPE = WriteScope()


def check(
    tool: str,
    kind: Kind,
    state: str,
    mode: str,
    paths: Sequence[str],
    all_tools: Sequence[ToolInfo],
    *,
    scope: WriteScope | None = None,
) -> None:
    """Raise :class:`ToolUnavailable` unless ``tool`` may run now on ``paths``.

    ``paths`` are the project paths the call writes (reads are never restricted here).
    """
    scope = scope or _DEFAULT_SCOPE
    reason: str | None = None
    if not tool_allowed(tool, kind, state, mode):
        reason = _kind_refusal(tool, kind, state, mode)
    elif kind == "write":
        reasons = [r for r in (scope.refusal(state, p) for p in paths) if r]
        reason = reasons[0] if reasons else None
        if len(reasons) > 1:
            reason = f"{reason} (and {len(reasons) - 1} more path(s) refused)"
    if reason is None:
        return
    reason = f"{reason}. {NEXT_STEP[state]}"
    raise ToolUnavailable(
        f"{tool} is not available in {state}",
        tool_name=tool,
        current_state=state,
        reason=reason,
        available_tools=available(state, mode, all_tools),
        fix="Use a tool the answer lists as available, or move the workflow on first.",
    )


def _kind_refusal(tool: str, kind: str, state: str, mode: str) -> str:
    if kind == "write":
        return f"{state} allows no writes"
    if kind == "commit":
        return f"{tool} is available only in committing"
    if kind == "execute" and tool in TEST_RUNNERS:
        where = ", ".join(sorted(TEST_RUN_STATES))
        return f"{tool} runs only in {where}"
    if kind == "execute":
        return f"{tool} is available only in debug mode ({mode} now), while tests may run"
    if kind == "workflow":
        return f"{tool} is available only in {', '.join(sorted(WORKFLOW_STATES[tool]))}"
    return f"{tool} has an unknown kind {kind!r}"
