"""The session loop on a real kernel stack (database, audit log, policy, router, IPC) with
the scripted provider in a real ai_host child process (the container runs are in
tests/integration/test_ai_session.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from fluffy.ipc.ai_types import ProviderConfig, ScriptedCall, ScriptedTurn
from fluffy.kernel.ai.provider import ProviderSession
from fluffy.kernel.policy.model import load_policy
from fluffy.kernel.syscalls.assemble_ai import AiLayer, assemble_ai
from fluffy.kernel.syscalls.assemble_tools import ToolPath
from fluffy.kernel.tools.routing import router as router_module
from fluffy.kernel.tools.routing.scheduling import run_in_turn
from tests.unit.kernel.tools.test_tool_router import SECRET, Harness

pytestmark = pytest.mark.unit


async def _events(ai: AiLayer, sid: str, timeout_s: float = 30) -> list[dict[str, Any]]:
    """Every event of the session until the turn ends."""
    seen: list[dict[str, Any]] = []
    after = 0
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        # the events as the wire carries them (session.events)
        found = msgspec.to_builtins(await ai.loop.stream(sid).wait(after, 1.0))
        seen += found
        after = found[-1]["seq"] if found else after
        if any(e["type"] == "turn_end" for e in found):
            return seen
    raise AssertionError(f"the turn did not end: {seen[-5:]}")


def _script(*turns: tuple[str, list[tuple[str, dict[str, Any]]]]) -> ProviderConfig:
    return ProviderConfig(
        name="scripted",
        turns=[
            ScriptedTurn(say=say, calls=[ScriptedCall(tool=t, args=a) for t, a in calls])
            for say, calls in turns
        ],
    )


def run(harness: Harness, body: Any) -> Any:
    async def main() -> Any:
        tools, sid = await harness.open()
        await tools.router.workflow.cancel(sid)  # the loop starts from idle itself
        policy = load_policy(harness.project / ".fluffy" / "policy.yaml")
        ai = await assemble_ai(harness.state, policy, tools, harness.audit, launcher="process")
        try:
            return await body(tools, ai, sid)
        finally:
            await ai.close()
            await harness.close(tools)

    return asyncio.run(main())


def test_a_turn_reads_plans_and_streams_its_events(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    provider = _script(
        ("Reading the code first.", [("fs.read", {"path": "/src/app.py"})]),
        ("The plan is ready.", [("plan.complete", {"summary": "test first"})]),
        ("Tests come next.", []),
    )

    async def body(tools: ToolPath, ai: AiLayer, sid: str) -> tuple[list[dict[str, Any]], Any]:
        await ai.loop.start(sid, "Add error handling", provider)
        events = await _events(ai, sid)
        return events, await ai.store.load(sid)

    events, history = run(harness, body)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "turn_start" and kinds[-1] == "turn_end"
    assert events[-1]["status"] == "done" and events[-1]["text"] == "Tests come next."
    states = [(e["from"], e["to"]) for e in events if e["type"] == "state"]
    assert states == [("idle", "planning"), ("planning", "test_writing")]
    (read,) = [e for e in events if e["type"] == "tool_result" and e["tool_name"] == "fs.read"]
    assert read["ok"] and read["summary"] == "Read 1 lines" and read["duration_ms"] > 0
    executing = [e["description"] for e in events if e["type"] == "tool_executing"]
    assert executing[0] == "Reading /src/app.py"
    text = "".join(e["content"] for e in events if e["type"] == "text_delta")
    assert "Reading the code first." in text
    # the conversation is persisted; the secret the AI read reached it redacted only
    roles = [m.role for m in history]
    assert roles[:4] == ["user", "assistant", "tool", "assistant"]
    assert SECRET not in json.dumps([m.content for m in history])
    assert "[REDACTED" in history[2].content


def test_a_response_of_fast_reads_runs_in_its_order_outside_the_scheduler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads the kernel answers on the loop's own thread run one after the other, each
    answered for itself (a missing file too); a response with a call that runs
    elsewhere (search.grep: a worker thread) still goes through the scheduler (ADR-100)."""
    harness = Harness(tmp_path)
    scheduled: list[list[str]] = []
    real = router_module.run_ordered

    async def spy(scheduler: Any, calls: Any, tools: Any, *rest: Any, **options: Any) -> Any:
        scheduled.append(list(tools))
        return await real(scheduler, calls, tools, *rest, **options)

    monkeypatch.setattr(router_module, "run_ordered", spy)
    reads = [
        ("fs.read", {"path": "/src/app.py"}),
        ("fs.list", {"path": "/src"}),
        ("fs.read", {"path": "/src/missing.py"}),
        ("fs.exists", {"path": "/tests"}),
    ]
    provider = _script(
        ("Looking around.", reads),
        (
            "And searching.",
            [("fs.read", {"path": "/src/app.py"}), ("search.grep", {"pattern": "KEY"})],
        ),
        ("Done.", []),
    )

    async def body(tools: ToolPath, ai: AiLayer, sid: str) -> list[dict[str, Any]]:
        await ai.loop.start(sid, "Look at the code", provider)
        return await _events(ai, sid)

    events = run(harness, body)
    steps = [
        (e["type"], e["tool_name"])
        for e in events
        if e["type"] in ("tool_executing", "tool_result")
    ]
    first = [
        step for tool, _ in reads for step in (("tool_executing", tool), ("tool_result", tool))
    ]
    assert steps[: len(first)] == first  # each read answered before the next began
    results = [e for e in events if e["type"] == "tool_result"]
    assert [r["ok"] for r in results[: len(reads)]] == [True, True, False, True]
    assert len(results) == len(reads) + 2 and all(r["ok"] for r in results[len(reads) :])
    assert scheduled == [["fs.read", "search.grep"]]


def test_fast_reads_go_through_the_scheduler_while_the_memory_guard_holds_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Short of memory the scheduler starts no new work: a response of reads is held by
    it too (the spy answers in its place, or the turn would wait for memory)."""
    harness = Harness(tmp_path)
    scheduled: list[list[str]] = []

    async def spy(
        scheduler: Any, calls: Any, tools: Any, changes: Any, one: Any, refuse: Any, **_: Any
    ) -> Any:
        scheduled.append(list(tools))
        return await run_in_turn(len(tools), one, refuse)

    monkeypatch.setattr(router_module, "run_ordered", spy)
    provider = _script(("Reading.", [("fs.read", {"path": "/src/app.py"})]), ("Done.", []))

    async def body(tools: ToolPath, ai: AiLayer, sid: str) -> list[dict[str, Any]]:
        tools.router.runners = replace(tools.router.runners, accepting_work=lambda: False)
        await ai.loop.start(sid, "Read it", provider)
        return await _events(ai, sid)

    events = run(harness, body)
    assert [e["ok"] for e in events if e["type"] == "tool_result"] == [True]
    assert scheduled == [["fs.read"]]


def test_repeated_refusals_quarantine_the_session(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    write = ("fs.write", {"path": "src/app.py", "content": "x = 1\n"})
    provider = _script(
        ("Plan.", [("plan.complete", {"summary": "s"})]),
        *[("Writing the code.", [write]) for _ in range(6)],
        ("never reached", []),
    )

    async def body(tools: ToolPath, ai: AiLayer, sid: str) -> Any:
        await ai.loop.start(sid, "change src now", provider)
        events = await _events(ai, sid)
        session = await tools.router.workflow.get(sid)
        refused = None
        try:
            await ai.loop.start(sid, "again", provider)
        except Exception as exc:
            refused = exc
        await ai.loop.lift_quarantine(sid)
        lifted = await tools.router.workflow.get(sid)
        return events, session, refused, lifted

    events, session, refused, lifted = run(harness, body)
    results = [e for e in events if e["type"] == "tool_result" and e["tool_name"] == "fs.write"]
    assert len(results) == 5 and not any(r["ok"] for r in results)
    assert results[0]["error"]["code"] == "tool.unavailable"  # src/ in test_writing
    (quarantine,) = [e for e in events if e["type"] == "quarantine"]
    assert quarantine["denials"] == 5
    assert events[-1]["status"] == "quarantined"
    assert session.data.quarantined and session.state == "test_writing"
    assert refused is not None and getattr(refused, "code", "") == "ai.quarantined"
    assert not lifted.data.quarantined
    recorded = harness.entries("session_quarantined")
    assert len(recorded) == 2 and "5 tool calls were refused" in recorded[0]["input_summary"]


def test_a_second_message_while_a_turn_runs_is_refused(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    provider = _script(*[("Reading.", [("fs.read", {"path": "/src/app.py"})]) for _ in range(3)])

    async def body(tools: ToolPath, ai: AiLayer, sid: str) -> Any:
        await ai.loop.start(sid, "first", provider)
        with pytest.raises(Exception, match="still working") as info:
            await ai.loop.start(sid, "second", provider)
        await ai.loop.cancel(sid)
        events = await _events(ai, sid)
        return info.value, events

    error, events = run(harness, body)
    assert getattr(error, "code", "") == "ai.turn_running"
    assert events[-1]["type"] == "turn_end" and events[-1]["status"] == "cancelled"


def test_a_call_left_unanswered_gets_a_result_before_the_model_sees_it() -> None:
    from fluffy.ipc.ai_types import Message, ToolCall
    from fluffy.kernel.ai.memory import answered

    calls = [ToolCall("c1", "fs.read", {"path": "a"}), ToolCall("c2", "test.run", {})]
    history = [
        Message(role="user", content="task"),
        Message(role="assistant", content="", tool_calls=calls),
        Message(role="tool", content="{}", tool_call_id="c1", name="fs.read"),
        Message(role="user", content="next"),
    ]
    fixed = answered(history)
    assert [m.tool_call_id for m in fixed if m.role == "tool"] == ["c1", "c2"]
    assert fixed[3].name == "test.run" and "interrupted" in fixed[3].content
    assert fixed[4].content == "next"
    assert answered(fixed) == fixed  # nothing more to add


def test_cancelling_mid_call_still_records_a_result_for_every_call(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    provider = _script(
        ("Reading twice.", [("fs.read", {"path": "/src/app.py"}), ("fs.read", {"path": "x"})]),
    )

    async def body(tools: ToolPath, ai: AiLayer, sid: str) -> Any:
        real = tools.router.call
        started = asyncio.Event()

        async def slow(*args: Any, **kwargs: Any) -> Any:
            started.set()
            await asyncio.sleep(30)
            return await real(*args, **kwargs)

        tools.router.call = slow  # type: ignore[method-assign]
        await ai.loop.start(sid, "read", provider)
        await asyncio.wait_for(started.wait(), 30)
        assert await ai.loop.cancel(sid)
        events = await _events(ai, sid)
        return events, await ai.store.load(sid)

    events, history = run(harness, body)
    assert events[-1]["status"] == "cancelled"
    assistant = [m for m in history if m.role == "assistant"][-1]
    results = [m for m in history if m.role == "tool"]
    assert {m.tool_call_id for m in results} == {c.id for c in assistant.tool_calls}
    assert all("cancelled" in m.content for m in results)


def test_without_sandboxes_a_turn_fails_closed_not_in_a_child(tmp_path: Path) -> None:
    """No container manager (a kernel without --project): the adapter does not fall
    back to running as an unsandboxed child process; the error says how to fix it."""
    from fluffy.errors import SandboxConfigError
    from fluffy.kernel.ai.provider import ProviderRunner

    async def no_proxy(*_args: Any) -> Any:
        raise AssertionError("nothing may start")

    runner = ProviderRunner(tmp_path, manager=None, start_proxy=no_proxy)
    with pytest.raises(SandboxConfigError, match="no sandbox") as caught:
        asyncio.run(runner.open("s", "t"))
    assert "--project" in (caught.value.why or "") and caught.value.fix
    assert not runner.sessions and not any(tmp_path.iterdir())


def test_the_audit_is_committed_before_every_model_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the model is told (its tool results) is in the committed log first: a crash
    after the answer cannot lose the entries the answer was about.  The commit starts
    while the context is built (on the audit connection's thread) and what was recorded
    meanwhile is committed too: every entry is durable when the request goes out."""
    harness = Harness(tmp_path)
    provider = _script(
        ("Reading.", [("fs.read", {"path": "/src/app.py"})]),
        ("Planned.", [("plan.complete", {"summary": "test first"})]),
        ("Done.", []),
    )
    seen: list[tuple[int, int]] = []
    real = ProviderSession.request

    async def request(self: ProviderSession, *args: Any, **kwargs: Any) -> Any:
        audit = harness.audit
        assert audit is not None
        seen.append((audit.durable_head.seq, audit.head.seq))
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(ProviderSession, "request", request)

    async def body(tools: ToolPath, ai: AiLayer, sid: str) -> None:
        await ai.loop.start(sid, "Add error handling", provider)
        await _events(ai, sid)

    run(harness, body)
    assert len(seen) == 3  # one per model request
    assert all(durable == recorded for durable, recorded in seen), seen
    assert seen[-1][0] > seen[0][0]  # the tool calls' entries were among them


async def _until(ai: AiLayer, sid: str, kind: str, count: int = 1) -> list[dict[str, Any]]:
    """The session's events up to the ``count``-th of ``kind`` (e.g. a review waiting)."""
    seen: list[dict[str, Any]] = []
    after = 0
    deadline = asyncio.get_running_loop().time() + 30
    while asyncio.get_running_loop().time() < deadline:
        # the events as the wire carries them (session.events)
        found = msgspec.to_builtins(await ai.loop.stream(sid).wait(after, 1.0))
        seen += found
        after = found[-1]["seq"] if found else after
        if sum(e["type"] == kind for e in seen) >= count:
            return seen
        if any(e["type"] == "turn_end" for e in found):
            break
    raise AssertionError(f"no {kind} #{count}: {seen[-5:]}")


def test_the_ai_asks_for_tests_and_the_users_review_sends_the_turn_to_retroactive_testing(
    tmp_path: Path,
) -> None:
    from fluffy.kernel.policy.engine import Caller
    from tests.unit.kernel.tools.test_tool_router import FakePlugins, _allow_explore

    harness = Harness(tmp_path)
    _allow_explore(harness)
    (harness.project / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    test = "def test_x():\n    assert 1\n"
    provider = _script(
        ("Plan.", [("plan.complete", {"summary": "explore"})]),
        ("Change.", [("fs.write", {"path": "src/app.py", "content": "KEY = 1\n"}),
                     ("fs.write", {"path": "pyproject.toml", "content": "[project]\n"})]),
        ("Run.", [("test.run", {})]),
        ("I would test it first.", [("workflow.add_tests", {"reason": "KEY is untested"})]),
        ("Tests, as asked.", [("fs.write", {"path": "tests/test_x.py", "content": test})]),
        ("Run again.", [("test.run", {})]),
        ("It has its tests now.", []),  # the second review's round: nothing more to ask
        ("Merged with its tests.", []),
    )  # fmt: skip

    async def body(tools: ToolPath, ai: AiLayer, sid: str) -> Any:
        fake = FakePlugins(tmp_path / "outputs", harness.project)
        fake.green = True
        tools.router.runners = replace(tools.router.runners, plugins=fake)
        await tools.router.workflow.set_mode(sid, "explore", Caller("user"))
        await ai.loop.start(sid, "change it", provider)
        first = await _until(ai, sid, "review")
        review = [e for e in first if e["type"] == "review"][-1]
        result = await tools.router.flow.add_tests(sid, by="user", plan_id=review["plan_id"])
        await ai.loop.resolve_review(sid, "add_tests", result)
        second = await _until(ai, sid, "review", 2)
        again = [e for e in second if e["type"] == "review"][-1]
        result = await tools.router.flow.approve(sid, by="user", plan_id=again["plan_id"])
        await ai.loop.resolve_review(sid, "approve", result)
        events = await _events(ai, sid)
        assert (await tools.router.workflow.get(sid)).state == "committing"
        return review, again, second + events, await ai.store.load(sid)

    review, again, events, history = run(harness, body)
    assert review["can_add_tests"] is True
    assert review["tests_requested"] == "KEY is untested"  # the AI asked; the user decided
    assert again["tests_requested"] is None  # a decision answers the request
    assert set(again["files"]) == {"src/app.py", "pyproject.toml", "tests/test_x.py"}
    states = [(e["from"], e["to"]) for e in events if e["type"] == "state"]
    assert ("reviewing", "retroactive_testing") in states
    assert ("retroactive_testing", "validating") in states
    assert events[-1]["type"] == "turn_end" and events[-1]["status"] == "done"
    notes = [m.content for m in history if m.role == "user" and "[fluffy]" in m.content]
    assert any("wants tests for this change before the merge" in n for n in notes)
    assert (harness.project / "tests" / "test_x.py").read_text() == test


def test_yes_does_not_merge_a_file_outside_the_code_and_tests(tmp_path: Path) -> None:
    """--yes stands for the user on size and sensitive files, not on configuration outside
    the source and test folders (ADR-054): an explore change writing one waits for a person,
    whose review names the file and why; the code beside it merges only with it."""
    from fluffy.kernel.merge.merger import DOTFILE
    from fluffy.kernel.policy.engine import Caller
    from tests.unit.kernel.tools.test_tool_router import FakePlugins, _allow_explore

    harness = Harness(tmp_path)
    _allow_explore(harness)
    provider = _script(
        ("Plan.", [("plan.complete", {"summary": "explore"})]),
        ("Change.", [("fs.write", {"path": "src/app.py", "content": "KEY = 1\n"}),
                     ("fs.write", {"path": ".editorconfig", "content": "root = true\n"})]),
        ("Run.", [("test.run", {})]),
        ("No tests needed.", []),  # the review round
        ("Understood.", []),
    )  # fmt: skip

    async def body(tools: ToolPath, ai: AiLayer, sid: str) -> Any:
        fake = FakePlugins(tmp_path / "outputs", harness.project)
        fake.green = True
        tools.router.runners = replace(tools.router.runners, plugins=fake)
        await tools.router.workflow.set_mode(sid, "explore", Caller("user"))
        await ai.loop.start(sid, "change it", provider, auto_approve=True)
        events = await _until(ai, sid, "review")
        state = (await tools.router.workflow.get(sid)).state
        result = await tools.router.flow.reject(sid)  # the person says no
        await ai.loop.resolve_review(sid, "reject", result)
        return events + await _events(ai, sid), state

    events, state = run(harness, body)
    review = [e for e in events if e["type"] == "review"][-1]
    assert review["kernel_decides"] is False and review["needs_person"] is True
    assert f".editorconfig: {DOTFILE}" in review["reasons"]
    assert state == "reviewing" and not any(e["type"] == "merged" for e in events)
    assert not (harness.project / ".editorconfig").exists()
    assert (harness.project / "src" / "app.py").read_text() != "KEY = 1\n"


@pytest.mark.parametrize("grant", [True, False])
def test_an_exemption_the_ai_asks_for_waits_for_the_users_decision(
    tmp_path: Path, grant: bool
) -> None:
    from types import SimpleNamespace

    harness = Harness(tmp_path)
    asked = {"category": "documentation", "paths": ["README.md"], "reason": "a typo"}
    provider = _script(
        ("Only the README changes.", [("workflow.request_exemption", asked)]),
        ("Understood.", []),
    )

    async def body(tools: ToolPath, ai: AiLayer, sid: str) -> Any:
        methods = ai.methods(tools.methods())
        await ai.loop.start(sid, "fix the README typo", provider)
        before = await _until(ai, sid, "exemption")
        held = await tools.router.workflow.get(sid)
        assert ai.loop.turns[sid].status == "waiting_review"
        plugin = SimpleNamespace(binding="plugin")
        with pytest.raises(Exception, match="only the user"):
            await methods["workflow.decide_exemption"](
                plugin, {"session_id": sid, "grant": True, "request_id": "ex-any"}
            )
        user = SimpleNamespace(binding="cli")
        (shown,) = [e for e in before if e["type"] == "exemption"]
        params = {"session_id": sid, "grant": grant, "reason": "write a test"}
        with pytest.raises(Exception, match="missing request_id"):  # never a blind decision
            await methods["workflow.decide_exemption"](user, params)
        params["request_id"] = shown["request_id"]
        await methods["workflow.decide_exemption"](user, params)
        after = await _events(ai, sid)
        return before, held, after, await tools.router.workflow.get(sid), await ai.store.load(sid)

    before, held, after, session, history = run(harness, body)
    (event,) = [e for e in before if e["type"] == "exemption"]
    assert event["category"] == "documentation" and event["kernel_decides"] is False
    assert event["request_id"] == held.data.exemption_pending.request_id
    assert held.state == "planning" and held.data.exemption is None  # held, not granted
    assert after[-1]["type"] == "turn_end" and after[-1]["status"] == "done"
    notes = [m.content for m in history if m.role == "user" and "[fluffy]" in m.content]
    if grant:
        assert session.state == "exploring" and session.data.exemption.paths == ["README.md"]
        assert any("granted the documentation exemption" in n for n in notes)
    else:
        assert session.state == "planning" and session.data.exemption is None
        assert any('refused the exemption. They said: "write a test"' in n for n in notes)
    kinds = {e["event_type"] for e in harness.entries("exemption_requested")}
    assert kinds == {"exemption_requested"}
    decided = harness.entries("exemption_granted" if grant else "exemption_denied")
    assert len(decided) == 1 and decided[0]["caller"] == "user"
    assert decided[0]["metadata"]["request_id"] == event["request_id"]


def test_two_exemption_requests_in_one_response_cannot_swap_what_the_user_grants(
    tmp_path: Path,
) -> None:
    """The red-team case: the user is shown the first request; the second is refused, so
    the grant (naming the shown request's id) covers exactly what was shown."""
    from types import SimpleNamespace

    harness = Harness(tmp_path)
    shown = {"category": "documentation", "paths": ["README.md"], "reason": "fix a typo"}
    second = {
        "category": "config_change",
        "paths": ["pyproject.toml", ".github/workflows/ci.yml"],
        "reason": "tidy",
    }
    provider = _script(
        ("asking", [("workflow.request_exemption", shown), ("workflow.request_exemption", second)]),
        ("ok", []),
        ("ok", []),
    )

    async def body(tools: ToolPath, ai: AiLayer, sid: str) -> Any:
        methods = ai.methods(tools.methods())
        await ai.loop.start(sid, "fix the README typo", provider)
        before = await _until(ai, sid, "exemption")
        pending = msgspec.to_builtins((await tools.router.workflow.get(sid)).data.exemption_pending)
        (event,) = [e for e in before if e["type"] == "exemption"]
        user = SimpleNamespace(binding="cli")
        stale = {"session_id": sid, "grant": True, "request_id": "ex-0000000000000000"}
        with pytest.raises(Exception, match="is not the one that waits"):
            await methods["workflow.decide_exemption"](user, stale)
        params = {"session_id": sid, "grant": True, "request_id": event["request_id"]}
        await methods["workflow.decide_exemption"](user, params)
        every = await _events(ai, sid)  # from the start of the stream
        return event, pending, every, await tools.router.workflow.get(sid)

    event, pending, events, session = run(harness, body)
    assert {k: event[k] for k in ("category", "paths", "reason")} == shown
    assert pending == {"request_id": event["request_id"], **shown}  # not replaced
    assert session.state == "exploring"
    assert session.data.exemption.paths == ["README.md"]  # exactly what was shown
    results = [e for e in events if e["type"] == "tool_result"]
    refused = [e for e in results if e["tool_name"] == "workflow.request_exemption"]
    assert [e["ok"] for e in refused] == [True, False]
    assert "another exemption request" in str(refused[1]["error"])
    assert len([e for e in events if e["type"] == "exemption"]) == 1
    denied = harness.entries("exemption_denied")
    assert [(e["caller"], e["metadata"]["category"]) for e in denied] == [("ai", "config_change")]


def _histories() -> Any:
    from hypothesis import strategies as st

    from fluffy.ipc.ai_types import Message, ToolCall

    ids = st.sampled_from(["c1", "c2", "c3"])
    one = st.one_of(
        st.just(Message(role="user", content="u")),
        st.lists(ids, min_size=0, max_size=3, unique=True).map(
            lambda cs: Message(role="assistant", tool_calls=[ToolCall(c, "fs.read") for c in cs])
        ),
        ids.map(lambda c: Message(role="tool", content="{}", tool_call_id=c, name="fs.read")),
    )
    return st.lists(one, max_size=30).map(lambda ms: [msgspec.structs.replace(m) for m in ms])


@settings(max_examples=300, deadline=None)
@given(history=_histories(), cuts=st.lists(st.integers(0, 30), max_size=6), fresh=st.booleans())
def test_answering_a_growing_history_walks_it_once_and_answers_as_a_whole_walk(
    history: list[Any], cuts: list[int], fresh: bool
) -> None:
    """Each round's context answers the history as answered() does on all of it, though
    what came before the last tool-call message is walked once (kept by identity)."""
    from fluffy.kernel.ai.memory import Answered, answered

    kept = Answered()
    for cut in [*sorted(min(c, len(history)) for c in cuts), len(history)]:
        assert kept("s", list(history[:cut])) == answered(history[:cut])
    if fresh:  # the store replaced the history (new values): walked anew
        history = [msgspec.structs.replace(m, content=m.content + "!") for m in history]
    assert kept("s", list(history)) == answered(history)
