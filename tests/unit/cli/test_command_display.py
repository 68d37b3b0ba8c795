"""What the person sees of container.run: the command held for them (as it will run),
then its exit and the end of its output under the call."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from fluffy.cli.session_view import SessionRenderer
from fluffy.kernel.ai.narrate import COMMAND_LINES, describe_call, summarize_result
from fluffy.kernel.tools.routing.availability import available, tool_allowed
from unit import cli_fakes

pytestmark = pytest.mark.unit


def test_a_command_is_described_by_its_command_line() -> None:
    line = describe_call("container.run", {"argv": ["python", "-m", "pkg", "a b"]})
    assert line == "Running $ python -m pkg 'a b'"
    long = describe_call("container.run", {"argv": ["echo", "x" * 200]})
    assert long.endswith("...") and len(long) <= len("Running $ ") + 80


def test_a_result_shows_the_exit_and_the_last_lines() -> None:
    output = "".join(f"line {i}\n" for i in range(30))
    answer = {"ok": True, "output": {"exit_code": 1, "duration_s": 0.25, "output": output,
                                     "interpreter": "the sandbox runs Python 3.11"}}  # fmt: skip
    text = summarize_result("container.run", {}, answer)
    lines = text.splitlines()
    assert lines[0] == "exit code 1 in 0.25 s"
    assert lines[1] == f"  ... {30 - COMMAND_LINES} earlier line(s) not shown"
    assert lines[2] == f"  | line {30 - COMMAND_LINES}" and "  | line 29" in lines
    assert lines[-1] == "  the sandbox runs Python 3.11"
    stopped = {"ok": True, "output": {"exit_code": -9, "signal": "SIGKILL", "timed_out": True,
                                      "duration_s": 1, "output": ""}}  # fmt: skip
    assert summarize_result("container.run", {}, stopped) == (
        "exit code -9 (SIGKILL), stopped at its time-out in 1 s"
    )


def test_a_held_command_is_shown_as_it_will_run_with_the_rule_that_stops_asking() -> None:
    out = io.StringIO()
    renderer = SessionRenderer(Console(file=out, width=200, color_system=None))
    renderer.render(cli_fakes.shown({
        "type": "tool_review", "review_id": "r1", "tool": "container.run",
        "arguments": '{"argv": ["sh", "-c", "printf \\u001b]0;x"]}',
        "command": "sh -c 'printf \x1b]0;x'",
        "reason": "no rule allows the command", "kernel_decides": False,
        "allow_with": "a rule in .fluffy/policy.yaml: match: {syscall: container.run, ...}",
    }))  # fmt: skip
    text = out.getvalue()
    assert "The AI wants to run a command" in text
    assert "$ sh -c 'printf \\x1b]0;x'" in text and "\x1b" not in text
    assert "to stop asking: a rule in .fluffy/policy.yaml" in text and "/approve all" in text


def test_container_run_is_a_debug_mode_tool_only() -> None:
    class Tool:
        name, kind = "container.run", "execute"

    assert tool_allowed("container.run", "execute", "exploring", "debug")
    assert not tool_allowed("container.run", "execute", "exploring", "explore")
    assert not tool_allowed("container.run", "execute", "code_writing", "strict")
    assert available("exploring", "debug", [Tool()]) == ["container.run"]


def test_any_other_tool_s_result_is_shown_not_just_done() -> None:
    lint = {"problems": [{"path": "src/a.py", "line": 3, "code": "F401"}], "checked": 4}
    shown = summarize_result("lint.check", {}, {"ok": True, "output": lint})
    assert shown.startswith('{"problems":[{"path":"src/a.py","line":3,"code":"F401"}]')
    said = {"summary": "2 problems in 1 file\nsrc/a.py:3 F401", "problems": []}
    assert summarize_result("lint.check", {}, {"ok": True, "output": said}) == (
        "2 problems in 1 file"
    )
    hostile = {"message": "\x1b[2J\x1b[31mall clear\x07"}
    assert summarize_result("x.y", {}, {"ok": True, "output": hostile}) == (
        "\\u001b[2J\\u001b[31mall clear\\u0007"
    )  # a terminal's control sequences arrive as text, never as control
    long = summarize_result("x.y", {}, {"ok": True, "output": {"k": "v" * 500}})
    assert len(long) == 160 and long.endswith("...")
    assert summarize_result("x.y", {}, {"ok": True, "output": {}}) == "done (nothing returned)"
    assert summarize_result("x.y", {}, {"ok": True, "output": ["a", 1]}) == '["a",1]'


@pytest.mark.parametrize("tool", ["test.run", "container.run"])
def test_a_run_shows_the_person_which_of_their_files_it_did_not_see(tool: str) -> None:
    note = "not in this run: .env: files that hold secrets ..."
    out = {"exit_code": 0, "counts": {"found": 1, "passed": 1}, "secrets": note}
    assert note in summarize_result(tool, {}, {"ok": True, "output": out})


def test_a_green_run_that_does_not_lead_to_the_merge_says_why() -> None:
    # the person saved a file while the tests ran: the green run proves nothing now
    held = "All tests must pass before review: files changed since the latest test run"
    out = {
        "exit_code": 0,
        "counts": {"found": 3, "passed": 3},
        "workflow": [{"event": "tests_passed", "from": "validating", "not_taken": held}],
    }
    shown = summarize_result("test.run", {}, {"ok": True, "output": out})
    assert shown == f"3 passed\n  not moved on: {held}"
    red = {"event": "tests_red", "from": "test_writing", "not_taken": "said by red_reason"}
    out = {**out, "workflow": [red], "red_reason": "not red: every test passes"}
    assert "not moved on" not in summarize_result("test.run", {}, {"ok": True, "output": out})
