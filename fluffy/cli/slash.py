"""The prompt's slash commands that are one kernel call and a line of text.

The commands that run or decide a turn (/approve, /reject, /add-tests, tasks) and those that ask the
person (/debug) live in :mod:`fluffy.cli.interactive`; these only read or set state.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from fluffy.settings import Price

COMMANDS = {
    "/status": "kernel health, runtime, container, session, mode, state, project instructions",
    "/strict": "switch the session to strict mode (TDD enforced)",
    "/explore": "switch to explore mode (tests optional; tech-debt budget applies)",
    "/debug": "switch to debug mode (asks for your approval)",
    "/budget": "the tech-debt budget (coverage against the baseline)",
    "/approve": "accept what waits for your review (a merge, the AI's exemption request, or "
    "a tool call: /approve all allows that tool for the rest of the session)",
    "/reject": "refuse what waits for your review: /reject [reason]",
    "/add-tests": "ask for tests before the merge of the explore change under review",
    "/exempt": "exempt files from TDD: /exempt <category> <paths...> -- <reason>",
    "/pin": "keep a note in the AI's context for this session: /pin <text>",
    "/pins": "the pinned notes",
    "/unpin": "drop a pinned note: /unpin <number from /pins>",
    "/unquarantine": "lift the session's quarantine (your decision is audited)",
    "/history": "the session's workflow transitions",
    "/usage": "tokens (and cost, with prices set) of the last task and the session",
    "/cancel": "abandon the task in progress: the session goes back to idle",
    "/new": "start a fresh session (a new conversation; the current one is kept)",
    "/help": "this list",
    "/quit": "leave (a kernel this fluffy started is stopped)",
}
HISTORY_LINES = 20
HELP_KEYS = (
    "A task of several lines: Esc then Enter (or Alt+Enter) starts a new line, Enter sends "
    "it; pasted text stays one task, newlines and all."
)


def simple(
    name: str,
    rest: str,
    client: Any,
    session_id: str,
    prices: Mapping[str, Price] | None = None,
) -> str | None:
    """The answer to a simple command, or None if ``name`` is not one of them."""
    sid = {"session_id": session_id}
    if name == "/usage":
        from fluffy.cli.usage import usage_text

        return usage_text(client.call("session.usage", sid) or {}, prices or {})
    if name == "/help":
        lines = [f"{command:<14} {what}" for command, what in COMMANDS.items()]
        return "\n".join([*lines, "", HELP_KEYS])
    if name == "/budget":
        return budget_text(client.call("session.budget", sid))
    if name == "/pin":
        if not rest:
            return "usage: /pin <text>"
        pins = client.call("session.pin", {**sid, "text": rest}).get("pins") or []
        return f"pinned; {len(pins)} pin(s)"
    if name == "/pins":
        return pins_text(client.call("session.pins", sid) or {})
    if name == "/unpin":
        if not rest.isdigit() or int(rest) < 1:
            return "usage: /unpin <number from /pins>"
        answer = client.call("session.unpin", {**sid, "index": int(rest) - 1}) or {}
        return f"unpinned; {len(answer.get('pins') or [])} pin(s) left"
    if name == "/exempt":
        from fluffy.cli.exemption import USAGE, parse_exempt, request
        from fluffy.host.policy import CATEGORIES

        parsed = parse_exempt(rest)
        if parsed is None:
            return f"usage: {USAGE} (categories: {', '.join(CATEGORIES)})"
        return request(client, session_id, *parsed)
    if name == "/unquarantine":
        session = client.call("session.lift_quarantine", sid)
        return f"quarantine lifted: mode {session['mode']}, state {session['state']}"
    if name == "/history":
        return history_text(client.call("session.history", sid) or [])
    if name == "/cancel":
        session = client.call("session.cancel", sid)
        return f"cancelled: mode {session['mode']}, state {session['state']}"
    return None


def instructions_text(client: Any, session_id: str) -> str:
    """Which of AGENTS.md, CLAUDE.md, .fluffy/instructions.md the AI gets, and their sizes."""
    from fluffy.errors import UnknownMethod

    try:
        answer = client.call("session.instructions", {"session_id": session_id}) or {}
    except UnknownMethod:
        return "project instructions: this kernel does not report them"
    files = answer.get("files") or []
    if not files:
        return "project instructions: none (AGENTS.md, CLAUDE.md or .fluffy/instructions.md)"
    parts = []
    for item in files:
        if item.get("skipped"):
            parts.append(f"{item.get('path')} not read: {item['skipped']}")
        elif item.get("truncated"):
            parts.append(f"{item.get('path')} ({item.get('used')} of {item.get('size')} bytes)")
        else:
            parts.append(f"{item.get('path')} ({item.get('size')} bytes)")
    line = "project instructions: " + ", ".join(parts)
    if answer.get("truncated"):
        line += f"; cut to {answer.get('limit')} bytes in all"
    return line


def _number(value: Any) -> str:
    return "n/a" if value is None else f"{float(value):.1f}"


def budget_text(budget: dict[str, Any]) -> str:
    line = (
        f"tech-debt budget ({budget.get('mode')} mode): baseline {_number(budget.get('baseline'))}"
        f", now {_number(budget.get('current'))}, delta {_number(budget.get('delta'))} "
        f"(warn at {_number(budget.get('warn_at'))}, lock at {_number(budget.get('lock_at'))})"
    )
    if budget.get("min_delta") is not None:
        line += f", min_delta {_number(budget.get('min_delta'))}"
    if budget.get("baseline_file"):
        line += f"\nbaseline file: {budget['baseline_file']}"
    for note in budget.get("notes") or []:
        line += f"\nNOTE: {note}"
    if budget.get("locked"):
        line += "\nLOCKED: write tests to raise coverage, or switch to strict mode"
    return line


def pins_text(session: dict[str, Any]) -> str:
    pins = session.get("pins")
    if pins is None:
        return "this kernel does not report pins"
    if not pins:
        return "no pins (/pin <text> adds one)"
    return "\n".join(f"{number}. {text}" for number, text in enumerate(pins, 1))


def _when(value: Any) -> str:
    if isinstance(value, int | float):
        seconds = value / 1000 if value > 1e11 else value  # milliseconds since the epoch
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))
    return str(value)


def history_text(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no transitions yet"
    shown = rows[-HISTORY_LINES:]
    lines = [] if len(shown) == len(rows) else [f"(last {len(shown)} of {len(rows)})"]
    for row in shown:
        lines.append(
            f"{_when(row.get('timestamp'))}  {row.get('event')}: "
            f"{row.get('from')} -> {row.get('to')} ({row.get('mode')})"
        )
    return "\n".join(lines)
