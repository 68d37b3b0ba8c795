"""The CLI's side of MCP servers: `fluffy mcp add`'s arguments (the server's own options
after `--`), a held tool call answered at the prompt (/approve, /approve all, /reject),
after a resume too, and how calls and their results are shown."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from fluffy.cli.interactive import Context, handle
from fluffy.cli.main import parse
from fluffy.cli.session_view import SessionRenderer
from fluffy.cli.turns import follow
from fluffy.kernel.ai.narrate import summarize_result
from tests.unit.cli.test_cli_interactive import OPTIONS, STATUS, Seen
from tests.unit.cli_fakes import FakeKernel, shown, turn

HELD = {
    "type": "tool_review",
    "review_id": "c0ffee000001",
    "tool": "mcp.time.get_current_time",
    "arguments": '{"timezone":"Europe/Paris"}',
    "reason": "no rule allows mcp.time.get_current_time: MCP tools ask the user first",
    "kernel_decides": False,
}
DONE = {"type": "tool_result", "call_id": "c", "tool_name": HELD["tool"], "ok": True,
        "summary": "12:00", "duration_ms": 3.0}  # fmt: skip


def test_the_server_s_own_options_after_the_double_dash_are_its_command() -> None:
    args = parse(["mcp", "add", "time", "--pip", "mcp-server-time", "--yes", "--",
                  "mcp-server-time", "--local-timezone", "UTC", "--yes"])  # fmt: skip
    assert args.name == "time" and args.pip == ["mcp-server-time"] and args.yes
    assert args.command == ["mcp-server-time", "--local-timezone", "UTC", "--yes"]
    plain = parse(["mcp", "add", "x", "--path", "srv", "--", "python3", "server.py"])
    assert plain.path == "srv" and plain.command == ["python3", "server.py"]


def _held(answer: str) -> tuple[FakeKernel, str, Any, Any]:
    kernel = FakeKernel([[*turn("x")[:1], HELD], [DONE, turn("x")[-1]]])
    sid = kernel.call("session.create")["session_id"]
    seen = Seen()
    ctx = Context(renderer=seen, options=OPTIONS, confirm=lambda q: False)
    first = handle("what time is it", kernel, sid, STATUS, ctx)
    assert first.event is not None and first.event.status == "waiting_review"
    reply = handle(answer, kernel, sid, STATUS, ctx)
    return kernel, sid, reply, seen


@pytest.mark.parametrize(
    ("answer", "decision", "said"),
    [
        ("/approve", "allow", "allowed mcp.time.get_current_time"),
        ("/approve all", "allow_session", "allowed for this session mcp.time.get_current_time"),
        ("/reject not now", "deny", "refused mcp.time.get_current_time"),
    ],
)
def test_a_held_call_is_answered_at_the_prompt(answer: str, decision: str, said: str) -> None:
    kernel, _, reply, _ = _held(answer)
    (decided,) = kernel.methods("tool.decide")
    assert decided["decision"] == decision and decided["review_id"] == HELD["review_id"]
    assert decided.get("reason") == ("not now" if decision == "deny" else None)
    assert reply.text == said
    assert reply.event is not None and reply.event.status == "done"
    assert not kernel.methods("review.approve")  # not taken for a merge


def test_a_held_call_shown_before_a_resume_is_found_through_the_kernel() -> None:
    kernel = FakeKernel([[*turn("x")[:1], HELD], [DONE, turn("x")[-1]]])
    sid = kernel.call("session.create")["session_id"]
    first = Context(renderer=Seen(), options=OPTIONS)
    handle("what time is it", kernel, sid, STATUS, first)
    seen = Seen()
    later = Context(renderer=seen, options=OPTIONS)  # a new prompt (fluffy session resume)
    first_answer = handle("/approve", kernel, sid, STATUS, later)
    assert "waits for your answer (shown above)" in first_answer.text
    assert seen.events[-1]["type"] == "tool_review"  # shown before anything is decided
    assert not kernel.methods("tool.decide")
    reply = handle("/approve", kernel, sid, STATUS, later)
    assert reply.text == "allowed mcp.time.get_current_time"
    assert kernel.methods("tool.pending")


def test_a_one_shot_task_asks_on_a_terminal_and_leaves_it_waiting_without_one() -> None:
    kernel = FakeKernel([[*turn("x")[:1], HELD], [DONE, turn("x")[-1]]])
    sid = kernel.call("session.create")["session_id"]
    end = follow(kernel, sid, 0, Seen(), on_review=lambda event: None)
    assert end.status == "waiting_review" and end.tool_review == HELD["review_id"]
    assert end.tool == HELD["tool"] and not kernel.methods("tool.decide")
    done = follow(kernel, sid, 0, Seen(), on_review=lambda event: "approve", review_decided=False)
    assert kernel.methods("tool.decide")[0]["decision"] == "allow"
    assert done.status == "done"


def test_a_held_call_is_shown_with_its_arguments_and_the_answers() -> None:
    out = io.StringIO()
    renderer = SessionRenderer(Console(file=out, width=120, color_system=None))
    renderer.render(shown(HELD))
    text = out.getvalue()
    assert "The AI wants to call mcp.time.get_current_time" in text
    assert "Europe/Paris" in text and "/approve all" in text and "/reject [why]" in text


def test_an_mcp_result_is_summarised_by_its_text() -> None:
    answer = {"ok": True, "output": {"is_error": False, "content": [
        {"type": "text", "text": "{\n  \"datetime\": \"12:00\"\n}"}]}}  # fmt: skip
    assert summarize_result("mcp.time.x", {}, answer) == '{ "datetime": "12:00" }'
    failed = {"ok": True, "output": {"is_error": True, "content": [{"type": "text",
              "text": "bad zone"}]}}  # fmt: skip
    assert summarize_result("mcp.time.x", {}, failed) == "The server reported an error: bad zone"
    image = {"ok": True, "output": {"content": [{"type": "image", "bytes": 3}]}}
    assert summarize_result("mcp.x.y", {}, image) == "image"


def test_a_one_shot_task_asks_under_the_held_call_with_its_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fluffy.cli import connect

    out = io.StringIO()
    console = Console(file=out, width=120, color_system=None, force_terminal=True)
    renderer = SessionRenderer(console, asks_below=True)
    renderer.render(shown({"type": "tool_executing", "call_id": "c", "tool_name": HELD["tool"]}))
    assert renderer.spinner is not None  # a running tool, on a terminal
    renderer.render(shown(HELD))
    assert renderer.spinner is None  # stopped: the question is not drawn over
    assert "nothing runs until you answer below" in out.getvalue()
    assert "/approve all" not in out.getvalue()  # the prompt's commands are not asked for here

    monkeypatch.setattr(connect.sys.stdin, "isatty", lambda: True)
    asked: list[str] = []
    for reply, decision in [("y", "approve"), ("/approve", "approve"), ("A", "approve_session"),
                            ("/approve  all", "approve_session"), ("", "reject"),
                            ("/approve please", "reject"), ("no", "reject")]:  # fmt: skip
        monkeypatch.setattr("builtins.input", lambda q, r=reply: asked.append(q) or r)
        assert connect.ask_call("Allow mcp.time.get_current_time?") == decision, reply
    assert asked[0].endswith("[y]es once, [a]ll this session, [N]o: ")

    def closed(question: str) -> str:
        raise EOFError

    monkeypatch.setattr("builtins.input", closed)
    assert connect.ask_call("Allow x?") == "reject"
