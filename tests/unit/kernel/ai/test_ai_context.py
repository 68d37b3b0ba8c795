"""The context manager: budgets, tool summaries, the sliding window, summaries."""

from __future__ import annotations

import contextlib
import json
import re

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluffy.errors import ConfigError, WorkflowError
from fluffy.ipc.ai_types import Message, ToolCall, ToolDefinition
from fluffy.kernel.ai.context import (
    CONTINUE,
    ContextWindow,
    TokenBudget,
    base_prompt,
    build_messages,
    context_cost,
    fallback_summary,
    rounds,
    shorten_old_results,
    summary_request,
    system_prompt,
    tool_summaries,
    workflow_line,
)
from fluffy.kernel.ai.prompt import PINNED_HEADER, SUMMARY_HEADER, TOOLS_HEADER
from fluffy.kernel.ai.token_estimate import estimate_tokens, message_tokens, messages_tokens
from fluffy.kernel.workflow.states import MODES, STATES
from fluffy.settings import MIN_CONTEXT_WINDOW

pytestmark = pytest.mark.unit

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}


def user(text: str) -> Message:
    return Message(role="user", content=text)


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


def tool_round(call_id: str, name: str, args: dict[str, object], result: str) -> list[Message]:
    call = ToolCall(id=call_id, name=name, arguments=args)
    return [
        Message(role="assistant", content="", tool_calls=[call]),
        Message(role="tool", content=result, tool_call_id=call_id, name=name),
    ]


# -- tokens and budget ------------------------------------------------------------------


def test_tokens_are_four_characters_rounded_up_and_messages_pay_for_calls() -> None:
    assert [estimate_tokens("x" * n) for n in (0, 1, 4, 5)] == [0, 1, 1, 2]
    plain = message_tokens(say("abcd"))
    with_call = message_tokens(
        Message(
            role="assistant",
            content="abcd",
            tool_calls=[ToolCall(id="c1", name="fs.read", arguments={"path": "x" * 400})],
        )
    )
    assert with_call >= plain + 100


def test_budget_leaves_the_rest_for_recent_messages() -> None:
    budget = TokenBudget(total=128_000)
    assert budget.recent_messages == 128_000 - 4000 - 2000 - 3000 - 500 - 2000
    assert budget.system_prompt == 3500
    # unused pin allowance goes to the window, but never more than the whole allowance
    assert budget.recent_for(0) == budget.recent_messages + 2000
    assert budget.recent_for(500) == budget.recent_messages + 1500
    assert budget.recent_for(10_000) == budget.recent_messages


def test_a_context_window_too_small_is_refused_with_the_minimum() -> None:
    with pytest.raises(ConfigError) as caught:
        TokenBudget(total=8192)
    assert "8192" in caught.value.what and str(MIN_CONTEXT_WINDOW) in caught.value.fix
    assert TokenBudget(total=MIN_CONTEXT_WINDOW).recent_messages == 2000
    with pytest.raises(ConfigError):
        TokenBudget(total=100_000, reserved=-1)


# -- tool summaries ---------------------------------------------------------------------


def tool(name: str, description: str, params: dict[str, object] | None = None) -> ToolDefinition:
    return ToolDefinition(name=name, description=description, parameters=params or SCHEMA)


def test_tools_that_fit_are_listed_with_their_whole_description() -> None:
    text = tool_summaries(
        [tool("fs.read", "Read a file. Returns numbered lines."), tool("git.diff", "Show diff.")]
    )
    assert text.splitlines() == [
        TOOLS_HEADER,
        "- fs.read: Read a file. Returns numbered lines.",
        "- git.diff: Show diff.",
    ]


def test_context_cost_counts_description_and_schema() -> None:
    small = tool("a", "short")
    big = tool("b", "short", {"type": "object", "properties": {f"p{i}": {} for i in range(50)}})
    assert (
        context_cost(big)
        > context_cost(small)
        == estimate_tokens("short") + estimate_tokens(json.dumps(SCHEMA, separators=(",", ":")))
    )


def test_over_budget_the_costliest_tools_are_trimmed_first() -> None:
    long_text = "First sentence here. " + "More detail follows. " * 40
    cheap = tool("cheap.tool", long_text)
    costly = tool("costly.tool", long_text, {"properties": {f"p{i}": {} for i in range(200)}})
    full = tool_summaries([cheap, costly], budget=10_000)
    budget = estimate_tokens(full) - 10  # one trim is enough
    text = tool_summaries([cheap, costly], budget=budget)
    assert "- costly.tool: First sentence here." in text.splitlines()
    assert f"- cheap.tool: {' '.join(long_text.split())}" in text.splitlines()
    # tighter: both at their first sentence, then the costliest loses its summary
    both_short = tool_summaries([cheap, costly], budget=estimate_tokens(text) - 10)
    assert both_short.splitlines()[1:] == [
        "- cheap.tool: First sentence here.",
        "- costly.tool: First sentence here.",
    ]
    text = tool_summaries([cheap, costly], budget=estimate_tokens(both_short) - 1)
    assert text.splitlines()[1:] == ["- cheap.tool: First sentence here.", "- costly.tool"]


def test_dropped_tools_are_always_counted() -> None:
    tools = [tool(f"t{i:02}.run", f"Tool number {i} does things.") for i in range(40)]
    text = tool_summaries(tools, budget=60)
    assert estimate_tokens(text) <= 60
    named = [line for line in text.splitlines() if line.startswith("- ")]
    note = text.splitlines()[-1]
    assert note.startswith(f"(+{40 - len(named)} more tools")


@settings(max_examples=60, deadline=None)
@given(
    descriptions=st.lists(st.text(min_size=0, max_size=300), min_size=1, max_size=25),
    budget=st.integers(min_value=40, max_value=3000),
)
def test_every_tool_is_named_or_counted_and_the_budget_holds(
    descriptions: list[str], budget: int
) -> None:
    tools = [tool(f"tool{i}", text) for i, text in enumerate(descriptions)]
    text = tool_summaries(tools, budget=budget)
    lines = text.splitlines()
    named = {line[2:].split(":")[0] for line in lines if line.startswith("- tool")}
    dropped = int(lines[-1][2:].split()[0]) if lines[-1].startswith("(+") else 0
    assert len(named) + dropped == len(tools)
    assert estimate_tokens(text) <= budget


# -- workflow line and system prompt ------------------------------------------------------


def test_workflow_line_matches_the_design_for_test_writing() -> None:
    line = workflow_line("test_writing", "strict", ["tests/**"])
    assert line.startswith("Workflow state: test_writing (strict mode). Writable paths: tests/**")
    assert "Source code modification available after" in line
    assert "Call plan.complete when the plan is ready." in workflow_line("planning", "strict", None)
    assert "tests are read-only" in workflow_line("code_writing", "strict", None)
    assert ".git/**" in workflow_line("exploring", "explore", None)
    assert "git.commit" in workflow_line("committing", "strict", None)
    assert "No writes" in workflow_line("validating", "strict", ["ignored/**"])


def test_every_tool_the_prompt_names_exists() -> None:
    """The model is told only of tools it can call (debug mode once promised a
    ``container.run`` that no plugin provides)."""
    from fluffy.kernel.tools.core.registry import Registry
    from fluffy.kernel.tools.reading.fastpath import kernel_tools

    tools = set(Registry.builtin(kernel_tools()).specs)
    tool_like = re.compile(r"\b(?:fs|search|git|test|plan|container|review)\.[a-z_]+\b")
    for state in STATES:
        for mode in MODES:
            with contextlib.suppress(WorkflowError, ConfigError):  # not a valid pair
                named = set(tool_like.findall(workflow_line(state, mode, None)))
                assert named <= tools, (state, mode, named - tools)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("state", STATES)
def test_every_state_and_mode_has_a_short_line(state: str, mode: str) -> None:
    line = workflow_line(state, mode, None)
    assert line.startswith(f"Workflow state: {state} ({mode} mode).")
    assert estimate_tokens(line) <= 80


def test_unknown_state_is_a_bug_not_a_prompt() -> None:
    with pytest.raises(WorkflowError):
        workflow_line("coding", "strict", None)
    with pytest.raises(WorkflowError):
        workflow_line("idle", "yolo", None)


def test_system_prompt_has_role_state_tools_pins_and_summary_in_order() -> None:
    text = system_prompt(
        "test_writing",
        "strict",
        None,
        [tool("fs.read", "Read a file.")],
        pins=["Use pytest, not unittest."],
        summary="The user wants parseConfig to raise.",
    )
    order = [
        text.index("TDD"),
        text.index("Workflow state: test_writing"),
        text.index("- fs.read: Read a file."),
        text.index(PINNED_HEADER),
        text.index("- Use pytest, not unittest."),
        text.index(SUMMARY_HEADER),
        text.index("The user wants parseConfig to raise."),
    ]
    assert order == sorted(order)
    bare = system_prompt("idle", "strict", None, [])
    assert PINNED_HEADER not in bare and SUMMARY_HEADER not in bare


# -- the sliding window -------------------------------------------------------------------


def conversation(rounds_count: int, result_chars: int = 400) -> list[Message]:
    history = [user("Add error handling to parseConfig")]
    for i in range(rounds_count):
        history.append(say(f"Step {i}. I will read a file."))
        history += tool_round(f"c{i}", "fs.read", {"path": f"src/m{i}.py"}, "x" * result_chars)
    return history


def test_everything_is_kept_while_under_seventy_percent() -> None:
    budget = TokenBudget(total=20_000)
    history = conversation(5)
    assert messages_tokens(history) < 0.7 * budget.recent_for(0)
    window = ContextWindow.fit(history, budget)
    assert window.recent == history and window.old == [] and not window.needs_summary
    assert not window.triggered and window.upto == 0


def test_over_seventy_percent_the_window_halves_and_returns_the_old_part() -> None:
    budget = TokenBudget(total=20_000)
    limit = budget.recent_for(0)
    history = conversation(60)
    assert 0.7 * limit < messages_tokens(history) < limit  # it would still fit: no matter
    window = ContextWindow.fit(history, budget)
    assert window.triggered and window.needs_summary
    assert window.old + window.recent == history
    assert window.tokens <= 0.5 * limit
    assert window.upto == len(window.old)
    assert window.recent[0].role != "tool"


def test_compacting_halves_a_window_the_estimate_thought_fitted() -> None:
    budget = TokenBudget(total=20_000)
    history = conversation(5)
    pending = messages_tokens(history)
    window = ContextWindow.fit(history, budget, compact=True)
    assert window.triggered and window.needs_summary
    assert window.old + window.recent == history
    assert window.tokens <= 0.5 * pending
    assert window.recent[0].role != "tool"


def test_a_calibration_scale_shrinks_the_window_and_never_grows_it() -> None:
    budget = TokenBudget(total=20_000)
    history = conversation(30)
    assert messages_tokens(history) < 0.7 * budget.recent_for(0)
    assert not ContextWindow.fit(history, budget).needs_summary
    scaled = ContextWindow.fit(history, budget, scale=2.0)  # real counts are twice the estimate
    assert scaled.triggered and scaled.needs_summary
    assert ContextWindow.fit(history, budget, scale=0.5) == ContextWindow.fit(history, budget)


def test_the_trigger_counts_only_messages_after_the_summary() -> None:
    budget = TokenBudget(total=20_000)
    history = conversation(60)
    start = len(history) - 9  # a round's first message
    window = ContextWindow.fit(history, budget, start=start)
    assert window.recent == history[start:] and not window.needs_summary and window.upto == start


def test_the_newest_round_is_kept_even_when_it_alone_is_over_budget() -> None:
    budget = TokenBudget(total=MIN_CONTEXT_WINDOW)
    history = [user("go"), *tool_round("c1", "test.run", {}, "y" * 40_000)]
    window = ContextWindow.fit(history, budget)
    assert [m.role for m in window.recent] == ["assistant", "tool"]
    assert window.old == [history[0]]


def test_a_leading_orphan_tool_result_is_never_sent() -> None:
    budget = TokenBudget(total=20_000)
    orphan = Message(role="tool", content="late result", tool_call_id="gone", name="fs.read")
    history = [orphan, user("next"), say("ok")]
    window = ContextWindow.fit(history, budget)
    assert window.recent == history[1:] and window.old == [orphan]


role_lists = st.lists(
    st.sampled_from(["user", "say", "round1", "round3", "orphan"]), min_size=1, max_size=40
)


@settings(max_examples=80, deadline=None)
@given(kinds=role_lists, sizes=st.integers(0, 8000), start=st.integers(0, 5))
def test_the_window_never_splits_a_tool_round(kinds: list[str], sizes: int, start: int) -> None:
    history: list[Message] = []
    for i, kind in enumerate(kinds):
        if kind == "user":
            history.append(user("u" * (sizes // 4)))
        elif kind == "say":
            history.append(say("a" * (sizes // 8)))
        elif kind == "orphan":
            history.append(Message(role="tool", content="o", tool_call_id=f"x{i}"))
        else:
            count = int(kind[-1])
            calls = [ToolCall(id=f"c{i}.{j}", name="fs.read") for j in range(count)]
            history.append(Message(role="assistant", tool_calls=calls))
            history += [
                Message(role="tool", content="r" * sizes, tool_call_id=c.id, name="fs.read")
                for c in calls
            ]
    window = ContextWindow.fit(history, TokenBudget(total=MIN_CONTEXT_WINDOW), start=start)
    start = min(start, len(history))
    assert len(window.old) + len(window.recent) == len(history) - start
    assert window.upto == start + len(window.old)
    if window.recent:
        assert window.recent[0].role != "tool"
    answered = {c.id for m in window.recent for c in m.tool_calls}
    for message in window.recent:
        if message.role == "tool" and message.tool_call_id.startswith("c"):
            assert message.tool_call_id in answered  # its call travels with it
    for group in rounds(window.recent):
        if group[0].tool_calls:
            assert {m.tool_call_id for m in group[1:]} == {c.id for c in group[0].tool_calls}


def test_old_tool_results_are_shortened_but_the_last_rounds_are_not() -> None:
    history = conversation(6, result_chars=10_000)
    shortened = shorten_old_results(history, full_rounds=3, keep=2000)
    results = [m for m in shortened if m.role == "tool"]
    assert [len(m.content) <= 2100 for m in results] == [True] * 3 + [False] * 3
    assert "characters truncated" in results[0].content
    assert results[0].content.startswith("x") and results[0].content.endswith("x")
    assert len(shortened) == len(history)
    # the next round shortens them to the same values (what is kept of a message by
    # identity, its cost and wire form, is kept of these too); another length cuts anew
    again = shorten_old_results(history, full_rounds=3, keep=2000)
    assert all(a is b for a, b in zip(again, shortened, strict=True))
    other = shorten_old_results(history, full_rounds=3, keep=1000)
    assert len(next(m for m in other if m.role == "tool").content) <= 1100


# -- summaries and the request ------------------------------------------------------------


def session_history() -> list[Message]:
    return [
        user("Add error handling to parseConfig in src/utils.py"),
        say("I'll read the module first. Then I will write tests."),
        *tool_round("c1", "fs.read", {"path": "src/utils.py"}, "def parseConfig(): ..."),
        say("Tests go in tests/test_utils.py. They must fail first."),
        *tool_round("c2", "fs.write", {"path": "tests/test_utils.py", "content": "x"}, "ok"),
        *tool_round(
            "c3",
            "test.run",
            {},
            json.dumps({"exit_code": 1, "counts": {"found": 1, "passed": 0, "failed": 1}}),
        ),
        *tool_round("c4", "fs.edit", {"path": "src/utils.py", "old": "a", "new": "b"}, "ok"),
        *tool_round("c5", "test.run", {}, "....\n===== 3 passed, 1 skipped in 0.2s =====\n"),
        *tool_round("c6", "git.commit", {"message": "Add error handling"}, "abc123"),
    ]


def test_fallback_summary_keeps_requests_files_tests_decisions_commits() -> None:
    text = fallback_summary(session_history(), "Earlier the user set up the project.")
    assert text.startswith("Earlier:\nEarlier the user set up the project.")
    assert "- Add error handling to parseConfig in src/utils.py" in text
    assert "- I'll read the module first." in text and "Then I will" not in text
    assert "Files read:\n- src/utils.py" in text
    assert "- tests/test_utils.py (written)" in text and "- src/utils.py (edited)" in text
    assert "- 1 failed (exit 1)" in text and "- 3 passed, 1 skipped in 0.2s" in text
    assert "Commits:\n- Add error handling" in text


def test_fallback_summary_stays_within_its_budget_keeping_the_newest() -> None:
    history: list[Message] = []
    for i in range(400):
        history.append(user(f"request number {i} " + "z" * 100))
        history += tool_round(f"c{i}", "fs.write", {"path": f"src/f{i}.py"}, "ok")
    text = fallback_summary(history, "p" * 20_000, budget=2000)
    assert estimate_tokens(text) <= 2000
    assert "request number 399" in text and "src/f399.py (written)" in text
    assert "request number 0 " not in text


def test_summary_request_asks_for_what_the_design_keeps() -> None:
    request = summary_request(session_history(), "previous facts")
    assert [m.role for m in request] == ["system", "user"]
    instructions = request[0].content
    for phrase in ("key decisions", "test results", "intermediate reasoning", "2000 tokens"):
        assert phrase in instructions
    body = request[1].content
    assert "previous facts" in body and "[assistant calls fs.write]" in body
    assert "src/utils.py" in body
    huge = [user("q" * 400_000)]
    assert estimate_tokens(summary_request(huge, "", limit_tokens=1000)[1].content) < 1200


def test_pins_survive_summarisation() -> None:
    budget = TokenBudget(total=20_000)
    pin = "Never touch src/legacy.py"
    history = [user(pin), *conversation(60)]
    window = ContextWindow.fit(history, budget, pins_tokens=estimate_tokens(pin))
    assert history[0] in window.old  # the pinned message itself left the window
    summary = fallback_summary(window.old, "", budget=50)
    messages = build_messages(base_prompt("idle", "strict", None, []), summary, [pin], window)
    assert messages[0].role == "system"
    assert f"{PINNED_HEADER}\n- {pin}" in messages[0].content
    assert f"{SUMMARY_HEADER}\n{summary}" in messages[0].content


def test_build_messages_opens_with_a_user_message() -> None:
    window = ContextWindow(recent=[say("hello")])
    messages = build_messages("SYSTEM", "", [], window)
    assert [m.role for m in messages] == ["system", "user", "assistant"]
    assert messages[1].content == CONTINUE and messages[0].content == "SYSTEM"
    messages = build_messages("SYSTEM", "", [], [user("hi")])
    assert [m.role for m in messages] == ["system", "user"]


def _per_part(message: Message) -> int:
    """The estimate as the design states it: each part's characters / 4, rounded up."""

    def tokens(text: str) -> int:
        return -(-len(text) // 4)

    total = 4 + tokens(message.content)
    for call in message.tool_calls:
        total += 4 + tokens(call.id) + tokens(call.name)
        if call.invalid_arguments is not None:
            total += tokens(call.invalid_arguments)
        else:
            total += tokens(msgspec.json.encode(call.arguments).decode())
    if message.role == "tool":
        total += tokens(message.tool_call_id) + tokens(message.name)
    return total


CALLS = st.builds(
    ToolCall,
    id=st.text(max_size=9),
    name=st.text(max_size=9),
    arguments=st.dictionaries(st.text(max_size=5), st.text(max_size=7) | st.integers(), max_size=3),
    invalid_arguments=st.none() | st.text(max_size=12),
)


@settings(max_examples=300, deadline=None)
@given(
    role=st.sampled_from(["user", "assistant", "tool", "system"]),
    content=st.text(max_size=40),
    calls=st.lists(CALLS, max_size=3),
    call_id=st.text(max_size=6),
    name=st.text(max_size=6),
)
def test_a_message_costs_each_part_rounded_up(
    role: str, content: str, calls: list[ToolCall], call_id: str, name: str
) -> None:
    message = Message(role, content, calls, call_id, name)  # type: ignore[arg-type]
    assert message_tokens(message) == _per_part(message)


def _grouped(messages: list[Message]) -> list[list[Message]]:
    """rounds() as first written: a tool result joins the group whose head called it."""
    groups: list[list[Message]] = []
    for message in messages:
        head = groups[-1][0] if groups else None
        if (
            message.role == "tool"
            and head is not None
            and head.role == "assistant"
            and any(c.id == message.tool_call_id for c in head.tool_calls)
        ):
            groups[-1].append(message)
        else:
            groups.append([message])
    return groups


IDS = st.sampled_from(["a", "b", "c"])
MESSAGES = st.lists(
    st.one_of(
        st.builds(Message, role=st.just("user"), content=st.just("u")),
        st.builds(
            Message,
            role=st.just("assistant"),
            tool_calls=st.lists(st.builds(ToolCall, id=IDS, name=st.just("fs.read")), max_size=3),
        ),
        st.builds(Message, role=st.just("tool"), tool_call_id=IDS, name=st.just("fs.read")),
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(MESSAGES)
def test_rounds_keep_each_result_with_the_call_that_asked_for_it(
    messages: list[Message],
) -> None:
    assert rounds(messages) == _grouped(messages)


def test_a_message_s_kept_call_cost_is_its_count_and_what_is_kept_stays_bounded() -> None:
    from fluffy.kernel.ai import token_estimate

    content = "x" * 20_000  # 600 writes of 20 KB: past the bound, so it is cleared
    messages = [
        Message(role="assistant", tool_calls=[ToolCall(f"c{i}", "fs.write", {"content": content})])
        for i in range(600)
    ]
    counted = [token_estimate.message_tokens(m) for m in messages]
    assert [token_estimate.message_tokens(m) for m in messages] == counted  # kept or not
    copies = [Message(role="assistant", tool_calls=list(m.tool_calls)) for m in messages]
    assert [token_estimate.message_tokens(m) for m in copies] == counted  # other objects
    kept = sum(cost for _, cost in token_estimate.CALL_COSTS.kept.values())
    assert kept <= token_estimate.CALL_COSTS_TOKENS + max(counted)
    assert len(token_estimate.CALL_COSTS.kept) < len(messages)


def test_a_request_carries_each_message_as_builtins_kept_or_not_and_masked_in_audit() -> None:
    """The body's messages are converted once per message object (every round sends the
    whole conversation); the audit summary still walks them to mask secret fields."""
    import msgspec

    from fluffy.kernel.ai.provider import _wire
    from fluffy.kernel.audit.observer import summarize

    call = ToolCall("c1", "http.get", {"url": "x", "password": "hunter2"})
    messages = [Message(role="user", content="hi"), Message(role="assistant", tool_calls=[call])]
    first = [_wire(m) for m in messages]
    again = [_wire(m) for m in messages]
    assert first == again == msgspec.to_builtins(messages)
    other = Message(role="assistant", tool_calls=[ToolCall("c1", "http.get", {"url": "y"})])
    assert _wire(other) == msgspec.to_builtins(other)  # an equal id is not another's value
    summary = summarize({"job_id": "j", "messages": again})
    assert "hunter2" not in summary and "[REDACTED:field]" in summary


def test_what_is_kept_of_messages_by_identity_is_bounded_by_their_size() -> None:
    """A long-running kernel's many sessions: the wire forms and shortened results kept
    for them stay within a bound of characters, whatever the store has let go."""
    import msgspec

    from fluffy.kernel.ai import context, provider

    big = [
        Message(role="tool", content=f"{i}" + "x" * 40_000, tool_call_id=f"c{i}", name="r")
        for i in range(600)
    ]  # fmt: skip  (24 MB of results)
    wired = [provider._wire(m) for m in big]
    assert wired == msgspec.to_builtins(big)
    assert provider._WIRE.weight <= provider._WIRE.weight_limit + 4 * 10_100
    assert len(provider._WIRE.kept) < len(big)
    short = [context._shortened(m, 2000) for m in big]
    assert all(len(s.content) <= 2100 for s in short)
    assert context._SHORT.weight <= context._SHORT.weight_limit + 40_010
    assert len(context._SHORT.kept) < len(big)
    system = Message(role="system", content="made anew every round")
    provider._wire(system)
    assert provider._WIRE.get(system) is None  # not kept: it would only fill the cache
