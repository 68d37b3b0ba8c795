"""Summaries of the conversation outside the window (design: Context Management, Summary
fallback).

The normal path is a lightweight, separate request to the model
(:func:`summary_request`), run in the ai-provider sandbox like any other.  When there
is no model to ask (the scripted provider) or that request fails, :func:`fallback_summary`
extracts the same essentials without a model: the user's requests, the files read and
changed (from the tool calls), the test results (from the tool results), commits and
the first sentence of each assistant text as its decision.  Both keep what the design
says a summary keeps -- key decisions, file modifications, test results -- and drop
intermediate reasoning.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Final

from fluffy.ipc.ai_types import Message, ToolCall
from fluffy.kernel.ai.prompt import one_line
from fluffy.kernel.ai.token_estimate import estimate_tokens
from fluffy.kernel.tools.reading.sanitizer import CHARS_PER_TOKEN, cut

SUMMARY_TOKENS: Final = 2000
#: The transcript sent for summarising is cut to this many tokens (middle first).
REQUEST_TOKENS: Final = 24_000
RESULT_CHARS: Final = 800  # one tool result in the transcript
ARGS_CHARS: Final = 200  # one tool call's arguments in the transcript
LINE_CHARS: Final = 200  # one extracted item in the fallback summary

WRITE_TOOLS: Final = {"fs.write": "written", "fs.edit": "edited", "fs.delete": "deleted"}
READ_PREFIXES: Final = ("fs.",)
TEST_TOOLS: Final = frozenset({"test.run"})
COMMIT_TOOLS: Final = frozenset({"git.commit"})

INSTRUCTIONS: Final = (
    "You summarise the earlier part of a coding session for the assistant that continues "
    "it. Merge the previous summary (if any) with the new conversation; your summary "
    "replaces both. Keep: the user's requests, key decisions and their reasons, every file "
    "read, created, modified or deleted, test results (which tests, passed or failed), "
    "commits, and open problems. Drop: intermediate reasoning, tool output details, "
    f"pleasantries. Plain text in short sections, at most about {SUMMARY_TOKENS} tokens. "
    "Never repeat secrets or keys."
)
_PYTEST_LINE: Final = re.compile(r"\b\d+ (passed|failed|errors?|skipped)\b")


def _arguments(call: ToolCall) -> str:
    raw = call.invalid_arguments
    if raw is None:
        raw = json.dumps(call.arguments, separators=(",", ":"), ensure_ascii=False)
    return cut(raw, ARGS_CHARS, "head").strip()


def transcript(messages: Sequence[Message]) -> str:
    """The messages as plain text, tool results shortened (head and tail)."""
    lines: list[str] = []
    for message in messages:
        if message.role == "tool":
            body = cut(message.content, RESULT_CHARS, "middle")
            lines.append(f"[tool result {message.name or message.tool_call_id}]\n{body}")
            continue
        if message.content:
            lines.append(f"[{message.role}]\n{message.content}")
        for call in message.tool_calls:
            lines.append(f"[{message.role} calls {call.name}] {_arguments(call)}")
    return "\n\n".join(lines)


def summary_request(
    old: Sequence[Message], previous_summary: str = "", *, limit_tokens: int = REQUEST_TOKENS
) -> list[Message]:
    """The two messages of the summarising request (no tools, its own small budget)."""
    text = transcript(old)
    text = cut(text, limit_tokens * CHARS_PER_TOKEN, "middle")
    previous = previous_summary.strip() or "(none)"
    body = (
        f"Previous summary:\n{previous}\n\nConversation since then:\n{text}\n\n"
        "Write the new summary now."
    )
    return [Message(role="system", content=INSTRUCTIONS), Message(role="user", content=body)]


# -- the extractive fallback -----------------------------------------------------------


def _test_result(content: str) -> str | None:
    """One line describing a test run's result, from its JSON or its pytest output."""
    try:
        data: Any = json.loads(content)
    except ValueError:
        data = None
    if isinstance(data, dict):
        inner = data.get("result")
        record = inner if isinstance(inner, dict) else data
        counts = record.get("counts")
        if isinstance(counts, dict):
            shown = [f"{v} {k}" for k, v in counts.items() if k != "found" and v]
            code = record.get("exit_code")
            tail = f" (exit {code})" if code is not None else ""
            return (", ".join(shown) or "no tests ran") + tail
        content = str(record.get("output_tail") or record.get("output") or "")
    found = [line.strip() for line in content.splitlines() if _PYTEST_LINE.search(line)]
    return one_line(found[-1].strip("= "), LINE_CHARS) if found else None


def _add(items: list[str], item: str) -> None:
    if item and item not in items:
        items.append(item)


def _extract(old: Sequence[Message]) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {
        "User requests": [],
        "Decisions": [],
        "Files read": [],
        "Files changed": [],
        "Test results": [],
        "Commits": [],
    }
    calls: dict[str, str] = {}
    for message in old:
        if message.role == "user":
            _add(sections["User requests"], one_line(message.content, LINE_CHARS))
        elif message.role == "assistant":
            _add(sections["Decisions"], one_line(message.content, LINE_CHARS))
            for call in message.tool_calls:
                calls[call.id] = call.name
                path = call.arguments.get("path")
                if call.name in WRITE_TOOLS and isinstance(path, str):
                    _add(sections["Files changed"], f"{path} ({WRITE_TOOLS[call.name]})")
                elif call.name.startswith(READ_PREFIXES) and isinstance(path, str):
                    _add(sections["Files read"], path)
                elif call.name in COMMIT_TOOLS:
                    text = call.arguments.get("message")
                    _add(sections["Commits"], one_line(str(text or "(no message)"), LINE_CHARS))
        elif message.role == "tool":
            name = message.name or calls.get(message.tool_call_id, "")
            if name in TEST_TOOLS:
                result = _test_result(message.content)
                if result:
                    sections["Test results"].append(result)
    return sections


def _render(previous: str, sections: dict[str, list[str]]) -> str:
    parts = [f"Earlier:\n{previous}"] if previous else []
    for title, items in sections.items():
        if items:
            parts.append(f"{title}:\n" + "\n".join(f"- {item}" for item in items))
    return "\n".join(parts)


def fallback_summary(
    old: Sequence[Message], previous: str = "", *, budget: int = SUMMARY_TOKENS
) -> str:
    """An extractive summary of ``old`` (merged after ``previous``), at most ``budget`` tokens.

    Over budget, the oldest item of the largest section goes first (the previous summary
    is one section, shortened from its start), so every kind of fact keeps its newest
    entries.
    """
    sections = _extract(old)
    previous = previous.strip()
    text = _render(previous, sections)
    while estimate_tokens(text) > budget:
        sizes = {title: sum(len(i) for i in items) for title, items in sections.items()}
        largest = max(sizes, key=lambda t: sizes[t])
        if len(previous) >= sizes[largest] and previous:
            keep = max(0, len(previous) - max(len(previous) // 4, 200))
            previous = cut(previous, keep, "tail").strip() if keep else ""
        elif sections[largest]:
            sections[largest].pop(0)
        else:
            break
        text = _render(previous, sections)
    return text
