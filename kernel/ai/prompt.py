"""The system prompt: role, workflow state, tool summaries, pins, summary (design: Context
Management, Tool context).

The model gets every tool's full JSON schema through function calling; the prompt only
names the tools with a one-line summary, inside a 3,000-token budget.  Over budget, the
costliest tools (``context_cost``: the tokens of description + parameters, computed
here, never declared by a plugin) are trimmed first: full description -> first sentence
-> name only -> dropped, and a dropped name is always counted in a ``(+N more ...)``
line.  The workflow line tells the model what it may write now (prevention); the
router's :class:`~fluffy.errors.ToolUnavailable` is the fallback when it tries anyway.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Final

from fluffy.errors import WorkflowError
from fluffy.ipc.ai_types import ToolDefinition
from fluffy.kernel.ai.token_estimate import estimate_tokens, json_tokens
from fluffy.kernel.tools.routing.availability import PROTECTED_GLOBS, TEST_RUN_STATES
from fluffy.kernel.workflow.evidence import DEFAULT_TEST_GLOBS
from fluffy.kernel.workflow.states import MODES, STATES

TOOLS_BUDGET: Final = 3000
SUMMARY_CHARS: Final = 100
TOOLS_HEADER: Final = "Tools (full schemas come with function calling):"
PINNED_HEADER: Final = "Pinned by the user:"
SUMMARY_HEADER: Final = "Summary of earlier conversation:"

ROLE: Final = (
    "You are fluffy, a coding assistant working on the user's project through tools only. "
    "Rules: use the tools to read files, search and run tests; never guess a file's content "
    "or a test's outcome. Paths are relative to the project root, without a leading / "
    "(e.g. src/app.py). In strict mode, follow TDD: write a failing test first, run it, "
    "then change the source until the tests pass. Every call goes through a policy check; "
    "when a tool is refused, read the reason and follow its fix instead of retrying."
)

#: What each state allows and asks for (writes are filled in from ``writable``).
_NEXT: Final[Mapping[str, str]] = {
    "idle": "No task is running; a user message starts planning.",
    "planning": (
        "All read tools available; no writes yet. Call plan.complete when the plan is ready."
    ),
    "test_writing": "Source code modification available after the new tests run and fail.",
    "code_writing": "Make the failing tests pass, then run test.run.",
    "validating": "Run test.run: passing tests go to review, failing ones back to code_writing.",
    "reviewing": "Waiting for the user's merge decision (/approve or /reject).",
    "committing": "Call git.commit with a message describing the change.",
    "exploring": "Existing tests must still pass; the change is recorded as unverified.",
    "retroactive_testing": "Write tests for the change, then run test.run.",
}
_TEST_STATES: Final = frozenset({"test_writing", "retroactive_testing"})
#: Debug mode's addition (design: "Same as explore, plus container.run").
_DEBUG: Final = (
    "Debug mode: container.run runs one command (argv) in a sandbox; the user reviews it "
    "unless a rule allows it."
)


def _valid(state: str, mode: str) -> None:
    if state not in STATES or mode not in MODES:
        raise WorkflowError(
            f"unknown workflow state {state!r} or mode {mode!r}",
            why=f"states are {', '.join(STATES)}; modes are {', '.join(MODES)}",
            fix="This is a bug in fluffy's AI loop; please report it.",
        )


def workflow_line(state: str, mode: str, writable: Sequence[str] | None = None) -> str:
    """The ~30-50 token line that tells the model its state and what it may write.

    ``writable``: the globs the state may write (None: the defaults of
    :mod:`fluffy.kernel.tools.routing.availability`); ignored in states that write nothing.
    """
    _valid(state, mode)
    head = f"Workflow state: {state} ({mode} mode)."
    if state in _TEST_STATES:
        globs = ", ".join(writable if writable is not None else DEFAULT_TEST_GLOBS)
        writes = f"Writable paths: {globs} only."
    elif state == "code_writing":
        if writable is not None:
            writes = f"Writable paths: {', '.join(writable)} only; tests are read-only."
        else:
            writes = "Writable paths: source files only; tests are read-only."
    elif state == "exploring":
        if writable is not None:
            writes = f"Writable paths: {', '.join(writable)} only."
        else:
            writes = f"Writable paths: all except {', '.join(PROTECTED_GLOBS)}."
    elif state == "committing":
        writes = "No file writes; git.commit is available."
    elif state == "planning":
        writes = ""
    else:
        writes = "No writes."
    debug = _DEBUG if mode == "debug" and state in TEST_RUN_STATES else ""
    return " ".join(part for part in (head, writes, _NEXT[state], debug) if part)


# -- tool summaries --------------------------------------------------------------------


def context_cost(tool: ToolDefinition) -> int:
    """What a tool costs in context: tokens of its description plus its JSON schema."""
    return estimate_tokens(tool.description) + json_tokens(tool.parameters)


def one_line(text: str, limit: int = SUMMARY_CHARS) -> str:
    """The first sentence of ``text`` on one line, at most ``limit`` characters."""
    flat = " ".join(text.split())
    match = re.match(r"(.+?[.!?])(\s|$)", flat)
    first = match.group(1) if match else flat
    return first if len(first) <= limit else first[: limit - 3].rstrip() + "..."


def _forms(tool: ToolDefinition) -> list[str]:
    """The three ways to show a tool: full description, first sentence, name."""
    full, short = " ".join(tool.description.split()), one_line(tool.description)
    name = f"- {tool.name}"
    return [f"{name}: {full}" if full else name, f"{name}: {short}" if short else name, name]


def tool_summaries(tools: Sequence[ToolDefinition], budget: int = TOOLS_BUDGET) -> str:
    """``- name: summary`` lines for every tool, fitted into ``budget`` tokens.

    Each tool starts at its full (one-line) description; while over budget the costliest
    tool still at the richest level is trimmed one level: description -> first sentence
    -> name -> dropped.  Dropped tools are counted in a final ``(+N more ...)`` line.
    """
    if not tools:
        return ""
    ordered = sorted(tools, key=lambda t: t.name)
    costs = {t.name: context_cost(t) for t in ordered}
    forms = {t.name: _forms(t) for t in ordered}
    level = {t.name: 0 for t in ordered}  # index into forms; 3 = dropped

    def rendered() -> str:
        lines = [TOOLS_HEADER]
        lines += [forms[n][level[n]] for n in level if level[n] < 3]
        dropped = sum(1 for n in level if level[n] == 3)
        if dropped:
            lines.append(
                f"(+{dropped} more tools: their names and schemas are in function calling)"
            )
        return "\n".join(lines)

    text = rendered()
    while estimate_tokens(text) > budget:
        richest = min(level.values())
        if richest == 3:
            break  # only the header and the note are left
        candidates = [n for n in level if level[n] == richest]
        victim = max(candidates, key=lambda n: (costs[n], n))
        level[victim] += 1
        # skip a level that says nothing more than the next one
        while (
            level[victim] < 2 and forms[victim][level[victim]] == forms[victim][level[victim] + 1]
        ):
            level[victim] += 1
        text = rendered()
    return text


# -- the whole prompt ------------------------------------------------------------------


def pinned_section(pins: Sequence[str]) -> str:
    if not pins:
        return ""
    return "\n".join([PINNED_HEADER, *(f"- {pin.strip()}" for pin in pins)])


def summary_section(summary: str) -> str:
    return f"{SUMMARY_HEADER}\n{summary.strip()}" if summary.strip() else ""


def base_prompt(
    state: str,
    mode: str,
    writable: Sequence[str] | None,
    tools: Sequence[ToolDefinition],
    *,
    tools_budget: int = TOOLS_BUDGET,
) -> str:
    """Role text, workflow line and tool summaries (no pins, no summary)."""
    parts = (ROLE, workflow_line(state, mode, writable), tool_summaries(tools, tools_budget))
    return "\n\n".join(part for part in parts if part)


def with_context(base: str, pins: Sequence[str], summary: str) -> str:
    """``base`` followed by the pinned context and the summary of earlier conversation."""
    parts = (base, pinned_section(pins), summary_section(summary))
    return "\n\n".join(part for part in parts if part)


def system_prompt(
    state: str,
    mode: str,
    writable: Sequence[str] | None,
    tools: Sequence[ToolDefinition],
    pins: Sequence[str] = (),
    summary: str = "",
) -> str:
    """The whole system prompt of one request."""
    return with_context(base_prompt(state, mode, writable, tools), pins, summary)
