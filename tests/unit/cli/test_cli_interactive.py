"""The prompt's lines (`handle`): tasks through follow(), slash commands, reviews, errors."""

from __future__ import annotations

from typing import Any

import pytest

from fluffy.cli.interactive import Context, handle
from fluffy.cli.session import sessions_table, when
from fluffy.cli.slash import COMMANDS
from fluffy.errors import ModeDenied
from unit.cli_fakes import EXEMPTION, REVIEW, FakeKernel, Seen, turn

pytestmark = pytest.mark.unit

STATUS = {"health": "healthy", "runtime": "docker", "container_id": "c" * 20}
OPTIONS = {"provider": {"name": "scripted", "model": "script"}, "max_rounds": 5}


def setup(
    pages: list[list[dict[str, Any]]] | None = None, confirm: bool = False
) -> tuple[FakeKernel, str, Context, Seen]:
    kernel = FakeKernel(pages)
    sid = kernel.call("session.create")["session_id"]
    seen = Seen()
    ctx = Context(renderer=seen, options=OPTIONS, confirm=lambda q: confirm)
    return kernel, sid, ctx, seen


def test_plain_text_is_a_task_followed_to_its_end() -> None:
    kernel, sid, ctx, seen = setup([turn("add a feature", {"type": "text_delta", "content": "k"})])
    reply = handle("add a feature", kernel, sid, STATUS, ctx)
    assert reply.event is not None and reply.event.status == "done" and not reply.quit
    assert kernel.methods("session.message") == [
        {**OPTIONS, "session_id": sid, "text": "add a feature", "auto_approve": False}
    ]
    assert [e["type"] for e in seen.events] == ["turn_start", "text_delta", "turn_end"]
    assert ctx.after == 3  # the next task starts after this one


def test_without_a_provider_nothing_is_sent() -> None:
    kernel, sid, ctx, _ = setup()
    ctx.options = None
    assert "nothing was sent" in handle("add a feature", kernel, sid, STATUS, ctx).text
    assert not kernel.methods("session.message")


def test_a_review_waits_at_the_prompt_for_approve() -> None:
    merged = {"type": "merged", "files": 1, "auto": False, "reason": "approved by the user"}
    kernel, sid, ctx, seen = setup([[*turn("x")[:1], REVIEW], [merged, turn("x")[-1]]])
    first = handle("x", kernel, sid, STATUS, ctx)
    assert first.event is not None and first.event.status == "waiting_review"
    assert kernel.blocked
    reply = handle("/approve", kernel, sid, STATUS, ctx)
    assert reply.text == "approved plan plan-1"
    assert kernel.methods("review.approve") == [{"session_id": sid, "plan_id": "plan-1"}]
    assert reply.event is not None and reply.event.status == "done"
    assert [e["type"] for e in seen.events][-2:] == ["merged", "turn_end"]
    assert handle("/approve", kernel, sid, STATUS, ctx).text == "nothing waits for your review"


def test_add_tests_answers_the_review_and_the_turn_goes_on() -> None:
    state = {"type": "state", "from": "reviewing", "to": "retroactive_testing", "mode": "explore"}
    review = {**REVIEW, "can_add_tests": True}
    kernel, sid, ctx, seen = setup([[*turn("x")[:1], review], [state, turn("x")[-1]]])
    assert handle("x", kernel, sid, STATUS, ctx).event.status == "waiting_review"  # type: ignore[union-attr]
    reply = handle("/add-tests", kernel, sid, STATUS, ctx)
    assert reply.text == "asked for tests before merging plan plan-1"
    assert kernel.methods("review.add_tests") == [{"session_id": sid, "plan_id": "plan-1"}]
    assert not kernel.methods("review.approve") and not kernel.methods("review.reject")
    assert [e["type"] for e in seen.events][-2:] == ["state", "turn_end"]
    assert "/add-tests" in COMMANDS


def test_exempt_asks_for_an_exemption_yourself() -> None:
    kernel, sid, ctx, _ = setup()
    reply = handle(
        "/exempt documentation README.md docs/a.md -- typo fixes", kernel, sid, STATUS, ctx
    )
    assert (
        reply.text == "exemption granted: documentation for README.md, docs/a.md; state exploring"
    )
    assert kernel.methods("workflow.request_exemption") == [
        {"session_id": sid, "category": "documentation", "paths": ["README.md", "docs/a.md"],
         "reason": "typo fixes"}
    ]  # fmt: skip
    for bad in ("/exempt", "/exempt documentation README.md", "/exempt docs -- why"):
        assert handle(bad, kernel, sid, STATUS, ctx).text.startswith("usage: /exempt <category>")
    assert len(kernel.methods("workflow.request_exemption")) == 1
    assert "/exempt" in COMMANDS


@pytest.mark.parametrize(("line", "grant"), [("/approve", True), ("/reject not now", False)])
def test_approve_and_reject_answer_the_ais_exemption_request(line: str, grant: bool) -> None:
    kernel, sid, ctx, _ = setup([[*turn("x")[:1], EXEMPTION], turn("x")[-1:]])
    assert handle("x", kernel, sid, STATUS, ctx).event.status == "waiting_review"  # type: ignore[union-attr]
    reply = handle(line, kernel, sid, STATUS, ctx)
    expected = {"session_id": sid, "grant": grant, "request_id": EXEMPTION["request_id"]}
    expected.update({} if grant else {"reason": "not now"})
    assert kernel.methods("workflow.decide_exemption") == [expected]
    assert not kernel.methods("review.approve") and not kernel.methods("review.reject")
    assert reply.text.startswith("exemption granted" if grant else "exemption refused")
    if not grant:  # what was refused, as shown
        assert "documentation for README.md (reason: a typo; request ex-0123" in reply.text
    assert reply.event is not None and reply.event.status == "done"


def test_approve_grants_only_the_exemption_request_this_prompt_showed() -> None:
    kernel, sid, ctx, _ = setup([[*turn("x")[:1], EXEMPTION], turn("x")[-1:]])
    assert handle("x", kernel, sid, STATUS, ctx).event.status == "waiting_review"  # type: ignore[union-attr]
    # meanwhile the request shown was decided elsewhere and the AI asked for another
    kernel.exemption = {**EXEMPTION, "request_id": "ex-other", "paths": ["setup.cfg"]}
    first = handle("/approve", kernel, sid, STATUS, ctx)
    assert not kernel.methods("workflow.decide_exemption")  # not granted unseen
    assert first.text.startswith(
        "The AI asks for a TDD exemption: documentation for setup.cfg (reason: a typo; "
        "request ex-other)"
    )
    assert "/approve again grants it" in first.text
    second = handle("/approve", kernel, sid, STATUS, ctx)  # now it was shown
    assert kernel.methods("workflow.decide_exemption") == [
        {"session_id": sid, "grant": True, "request_id": "ex-other"}
    ]
    assert second.text.startswith("exemption granted")


def test_a_fresh_prompt_shows_the_waiting_exemption_before_granting_it() -> None:
    kernel, sid, ctx, _ = setup([])
    kernel.exemption = dict(EXEMPTION)
    kernel.blocked = True
    first = handle("/approve", kernel, sid, STATUS, ctx)
    assert "request ex-0123456789abcdef" in first.text
    assert not kernel.methods("workflow.decide_exemption")
    refused = handle("/reject no", kernel, sid, STATUS, ctx)  # refusing is always safe
    assert refused.text.startswith("exemption refused: documentation for README.md")
    assert kernel.methods("workflow.decide_exemption") == [
        {"session_id": sid, "grant": False, "request_id": EXEMPTION["request_id"], "reason": "no"}
    ]


def test_reject_passes_the_reason() -> None:
    kernel, sid, ctx, _ = setup([[*turn("x")[:1], REVIEW], turn("x")[-1:]])
    handle("x", kernel, sid, STATUS, ctx)
    assert handle("/reject too big", kernel, sid, STATUS, ctx).text == "rejected plan plan-1"
    assert kernel.methods("review.reject") == [
        {"session_id": sid, "plan_id": "plan-1", "reason": "too big"}
    ]


@pytest.mark.parametrize(("confirm", "mode"), [(True, "debug"), (False, "strict")])
def test_debug_asks_first(confirm: bool, mode: str) -> None:
    kernel, sid, ctx, _ = setup(confirm=confirm)
    asked: list[str] = []

    def ask(question: str) -> bool:
        asked.append(question)
        return confirm

    ctx.confirm = ask
    reply = handle("/debug", kernel, sid, STATUS, ctx)
    assert asked == ["Debug mode needs your approval: allow?"]
    assert kernel.sessions[sid]["mode"] == mode
    assert ("mode debug" in reply.text) is confirm


def test_mode_refusals_use_the_error_standard(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel, sid, ctx, _ = setup()

    def refuse(params: dict[str, Any]) -> None:
        raise ModeDenied("explore mode is not allowed", fix="Ask for it in policy.yaml.")

    monkeypatch.setattr(kernel, "m_session_set_mode", refuse)
    assert handle("/explore", kernel, sid, STATUS, ctx).text == (
        "ERROR: explore mode is not allowed\n"
        "Reason: the policy engine did not allow the mode change\n"
        "Fix: Ask for it in policy.yaml."
    )
    assert kernel.sessions[sid]["mode"] == "strict"


def test_status_budget_pins_history_and_others() -> None:
    kernel, sid, ctx, _ = setup()
    assert f"session {sid}: mode strict, state idle" in handle("/status", kernel, sid, STATUS).text
    budget = handle("/budget", kernel, sid, STATUS, ctx).text
    assert "baseline 80.0, now 77.5, delta -2.5 (warn at -2.0, lock at -5.0)" in budget
    assert handle("/pin use pathlib", kernel, sid, STATUS, ctx).text == "pinned; 1 pin(s)"
    handle("/pin no prints", kernel, sid, STATUS, ctx)
    assert handle("/pins", kernel, sid, STATUS, ctx).text == "1. use pathlib\n2. no prints"
    assert handle("/unpin 1", kernel, sid, STATUS, ctx).text == "unpinned; 1 pin(s) left"
    assert kernel.pins == ["no prints"]
    assert handle("/unpin x", kernel, sid, STATUS, ctx).text.startswith("usage:")
    assert "user_message: idle -> planning (strict)" in handle("/history", kernel, sid, STATUS).text
    assert "quarantine lifted" in handle("/unquarantine", kernel, sid, STATUS, ctx).text
    help_text = handle("/help", kernel, sid, STATUS, ctx).text
    assert all(name in help_text for name in COMMANDS)
    assert "unknown command /nope" in handle("/nope x", kernel, sid, STATUS, ctx).text
    assert handle("/quit", kernel, sid, STATUS, ctx).quit
    assert handle("   ", kernel, sid, STATUS, ctx).text == ""


def test_session_table_and_times() -> None:
    kernel = FakeKernel()
    kernel.call("session.create")
    rows = kernel.call("session.list", {"limit": 5})["sessions"]
    table = sessions_table(rows)
    headers = [c.header for c in table.columns]
    assert headers == ["id", "mode", "state", "updated", "tokens in/out", "title"]
    assert table.row_count == 1
    assert when(1_700_000_000_000)[:4] == "2023" and when(None) == ""


def test_status_shows_the_project_instructions_the_ai_gets() -> None:
    kernel, sid, _, _ = setup()
    assert "project instructions: none" in handle("/status", kernel, sid, STATUS).text
    kernel.instructions = {
        "files": [
            {"path": "AGENTS.md", "size": 120, "used": 120, "truncated": False, "skipped": ""},
            {"path": "CLAUDE.md", "size": 50000, "used": 32648, "truncated": True, "skipped": ""},
            {"path": ".fluffy/instructions.md", "skipped": "a symlink that leads outside the "
             "project"},
        ],
        "limit": 32768,
        "truncated": True,
    }  # fmt: skip
    lines = handle("/status", kernel, sid, STATUS).text.splitlines()
    assert lines[1] == (
        "project instructions: AGENTS.md (120 bytes), CLAUDE.md (32648 of 50000 bytes), "
        ".fluffy/instructions.md not read: a symlink that leads outside the project; "
        "cut to 32768 bytes in all"
    )


def _typed(keys: str) -> str:
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from fluffy.cli.interactive import make_prompt

    with create_pipe_input() as pipe:
        pipe.send_text(keys)
        prompt = make_prompt(input=pipe, output=DummyOutput())
        return str(prompt.prompt("> "))


def test_enter_sends_and_esc_enter_starts_a_new_line() -> None:
    assert _typed("one line\r") == "one line"
    assert _typed("first\x1b\rsecond\x1b\rthird\r") == "first\nsecond\nthird"


def test_a_pasted_block_stays_one_task() -> None:
    assert _typed("\x1b[200~def f():\n    return 1\n\x1b[201~\r") == "def f():\n    return 1\n"


def test_help_says_how_to_write_several_lines() -> None:
    kernel, sid, _, _ = setup()
    assert (
        "Esc then Enter (or Alt+Enter) starts a new line"
        in handle("/help", kernel, sid, STATUS).text
    )


def test_the_prompt_says_it_continues_a_conversation_and_new_starts_another() -> None:
    from fluffy.cli.interactive import continuing

    kernel = FakeKernel()
    first = kernel.call("session.create")
    note = continuing(kernel, first)
    assert note is not None and "continuing session s1" in note and "/new" in note
    assert '"task of s1", 1 task' in note

    asked: list[str] = []
    ctx = Context(options=OPTIONS, confirm=lambda q: asked.append(q) or True, mode="explore")
    ctx.after, ctx.tool_shown = 7, ("r1", "mcp.x")
    reply = handle("/new", kernel, "s1", STATUS, ctx)
    assert reply.session_id == "s2" and "new session s2 (explore mode)" in reply.text
    assert kernel.sessions["s2"]["mode"] == "explore" and kernel.sessions["s1"]  # kept
    assert ctx.after is None and ctx.tool_shown is None  # nothing of s1's stream carried over
    fresh = kernel.call("session.create")
    listed = {"sessions": [{**fresh, "turns": 0}]}
    kernel.m_session_list = lambda params: listed  # type: ignore[method-assign]
    assert continuing(kernel, fresh) is None  # nothing said yet: nothing to continue
    assert "/new" in COMMANDS
