"""One-line descriptions of tool calls and their results, for the CLI's rendering.

``tool_executing`` says what starts ("Reading /src/app.py"), ``tool_result`` what came
of it ("Read 85 lines", "1 failed (tests/test_x.py::test_y)", or the refusal).
"""

from __future__ import annotations

import shlex
from typing import Any

import msgspec

VERBS = {
    "fs.read": "Reading",
    "fs.list": "Listing",
    "fs.exists": "Checking",
    "fs.write": "Writing",
    "fs.edit": "Editing",
    "fs.delete": "Deleting",
    "search.grep": "Searching",
    "search.glob": "Finding",
    "test.run": "Running tests",
    "git.status": "Git status",
    "git.diff": "Git diff",
    "git.commit": "Committing",
    "plan.complete": "Completing the plan",
    "container.run": "Running",
}
#: Lines of a command's output the person is shown under its result (the model gets all
#: the call kept).
COMMAND_LINES = 12


def _where(args: Any) -> str:
    if not isinstance(args, dict):
        return ""
    for key in ("path", "pattern", "message", "summary"):
        value = args.get(key)
        if isinstance(value, str) and value:
            text = value if key != "path" or value.startswith("/") else "/" + value
            return text if len(text) <= 80 else text[:77] + "..."
    return ""


def describe_call(tool: str, args: Any) -> str:
    verb = VERBS.get(tool, f"Calling {tool}")
    where = _where(args)
    if tool == "git.commit" and where:
        return f'Committing: "{where}"'
    if tool == "plan.complete":
        return "Completing the plan"
    if tool == "test.run":
        paths = args.get("paths") if isinstance(args, dict) else None
        return "Running " + (" ".join(paths) if isinstance(paths, list) and paths else "tests")
    if tool == "container.run":
        argv = args.get("argv") if isinstance(args, dict) else None
        line = shlex.join(str(a) for a in argv) if isinstance(argv, list) else "a command"
        return "Running $ " + (line if len(line) <= 80 else line[:77] + "...")
    return f"{verb} {where}".rstrip()


def _lines(text: Any) -> int:
    return text.count("\n") + (0 if text.endswith("\n") else 1) if isinstance(text, str) else 0


def summarize_result(tool: str, args: Any, answer: dict[str, Any]) -> str:
    if not answer.get("ok"):
        error = answer.get("error") or {}
        return str(error.get("what") or error.get("message") or "refused")
    out = answer.get("output")
    if not isinstance(out, dict):
        return "done" if out is None else _preview(out)
    if tool == "fs.read":
        if out.get("binary"):
            return f"Binary file, {out.get('size')} bytes"
        return f"Read {out.get('end_line', 0) - out.get('start_line', 1) + 1} lines"
    if tool in ("fs.write", "fs.edit", "fs.delete"):
        content = args.get("content") if isinstance(args, dict) else None
        staged = ", ".join(out.get("staged") or []) or "nothing"
        if tool == "fs.write" and isinstance(content, str):
            return f"Wrote {_lines(content)} lines (staged: {staged})"
        return f"Staged {staged}"
    if tool == "test.run":
        counts = out.get("counts") or {}
        failed = out.get("failed") or []
        shown = {"passed": "passed", "failed": "failed", "error": "error", "errors": "error"}
        parts = [f"{v} {shown[k]}" for k, v in counts.items() if v and k in shown]
        text = ", ".join(parts) or f"exit code {out.get('exit_code')}"
        if not counts.get("found") and out.get("exit_code") not in (0, 5, None):
            text += _output_lines(out.get("output_tail"))  # no test ran: the runner says why
        for case in failed[:5]:  # each with what it said (its assertion's first line)
            said = str(case.get("message") or "").strip().splitlines()
            text += f"\n  {case.get('id')}" + (f": {said[0][:200]}" if said else "")
        if len(failed) > 5:
            text += f"\n  ... and {len(failed) - 5} more"
        before = out.get("preexisting")
        for note in (
            before.get("note") if isinstance(before, dict) else None,
            out.get("red_reason"),
            out.get("environment"),
            out.get("interpreter"),
            out.get("limits"),
            out.get("secrets"),
        ):
            if isinstance(note, str) and note:
                text += f"\n  {note}"  # test_writing: red or not and why; a stale environment
        for step in out.get("workflow") or []:  # why a green run did not lead to the merge
            held = step.get("not_taken") if isinstance(step, dict) else None
            if isinstance(held, str) and step.get("event") != "tests_red":  # (red_reason)
                text += f"\n  not moved on: {held}"
        return text
    if tool == "container.run":
        return _command_summary(out)
    if tool == "git.commit":
        return f"Committed {str(out.get('commit') or '')[:12]}"
    if tool == "fs.list":
        return f"{len(out.get('entries') or [])} entries"
    if tool in ("search.grep", "search.glob"):
        found = out.get("matches") or out.get("paths") or []
        return f"{len(found)} found" + (" (truncated)" if out.get("truncated") else "")
    if tool == "plan.complete":
        steps = [s for s in out.get("workflow") or [] if isinstance(s, dict) and s.get("to")]
        return f"Plan accepted; now {steps[-1]['to']}" if steps else "Plan noted"
    if tool.startswith("mcp.") and isinstance(out.get("content"), list):
        return _mcp_summary(out)
    return _preview(out)


#: A result's fields that say what it is in words, tried in this order.
SAID_FIELDS = ("summary", "message", "text", "status", "result")
PREVIEW_CHARS = 160


def _preview(out: Any) -> str:
    """Any other tool's answer (a plugin's, git.status, ...): the first line of a field
    that says what it is, else its compact JSON; short, on one line, every control
    character escaped as JSON escapes it (a plugin's text is not trusted)."""
    if isinstance(out, dict):
        said = next((out[k] for k in SAID_FIELDS if isinstance(out.get(k), str) and out[k]), "")
        if said.strip():
            first = said.strip().splitlines()[0]
            return _short(msgspec.json.encode(first).decode()[1:-1])
    if out in ({}, []):
        return "done (nothing returned)"
    try:
        return _short(msgspec.json.encode(out).decode())
    except (TypeError, ValueError):
        return "done"


def _short(text: str) -> str:
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 3] + "..."


def _command_summary(out: dict[str, Any]) -> str:
    """A command's exit, then the end of what it printed (already made visible)."""
    code = out.get("exit_code")
    text = f"exit code {code}" + (f" ({out['signal']})" if out.get("signal") else "")
    if out.get("timed_out"):
        text += ", stopped at its time-out"
    text += f" in {out.get('duration_s', 0)} s"
    lines = str(out.get("output") or "").rstrip("\n").splitlines()
    if len(lines) > COMMAND_LINES:
        text += f"\n  ... {len(lines) - COMMAND_LINES} earlier line(s) not shown"
    for line in lines[-COMMAND_LINES:]:
        text += f"\n  | {line[:200]}"
    notes = ("environment", "interpreter", "limits", "secrets")
    for note in (out.get(key) for key in notes):
        if isinstance(note, str) and note:
            text += f"\n  {note}"
    return text


def _output_lines(output: Any) -> str:
    """The last lines of a run's output, each under its result (as a command's are)."""
    lines = [line for line in str(output or "").splitlines() if line.strip()]
    return "".join(f"\n  | {line[:200]}" for line in lines[-COMMAND_LINES:])


def _mcp_summary(out: dict[str, Any]) -> str:
    """An MCP tool's answer: its first line of text (or what kinds of content came)."""
    texts = [str(c.get("text")) for c in out["content"] if isinstance(c, dict) and c.get("text")]
    first = " ".join(" ".join(texts).split())[:100] if texts else ""
    said = first or ", ".join(str(c.get("type")) for c in out["content"] if isinstance(c, dict))
    prefix = "The server reported an error: " if out.get("is_error") else ""
    return prefix + (said or "no content")
