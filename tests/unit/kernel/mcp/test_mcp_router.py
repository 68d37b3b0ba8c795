"""MCP tools on the router: policy first (unmatched: the user is asked; a rule allows or
denies a server's family), the arguments against the tool's schema, the answer audited
and sanitised; a refusal never starts the server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from fluffy.kernel.mcp.record import save_record
from fluffy.kernel.syscalls.mcp import mcp_methods
from fluffy.kernel.tools.core.routedcall import TURN_PRIORITY
from tests.unit.kernel.tools.test_tool_router import Harness
from tests.unit.mcp_support import fake_server

pytestmark = pytest.mark.timeout(60)
SECRET = "sk-" + "Zz9" * 10


class Asker:
    """Stands for the session loop: records what the user was shown, answers."""

    def __init__(self, *answers: dict[str, Any]) -> None:
        self.answers = list(answers)
        self.shown: list[dict[str, Any]] = []

    async def __call__(self, session_id: str, shown: dict[str, Any]) -> dict[str, Any]:
        self.shown.append(shown)
        return self.answers.pop(0)


def _harness(tmp_path: Path, rules: str = "") -> Harness:
    harness = Harness(tmp_path)
    save_record(harness.project, fake_server("fake"))
    if rules:
        policy = harness.project / ".fluffy" / "policy.yaml"
        policy.write_text(policy.read_text() + rules)
    return harness


def _run(harness: Harness, manager: Any, asker: Asker | None, body: Any) -> Any:
    async def main() -> Any:
        tools, sid = await harness.open()
        router = tools.router
        assert tools.mcp is not None and router.runners.mcp is tools.mcp
        tools.mcp.manager = lambda: manager
        tools.mcp.start_timeout_s = 20
        router.reviewer = asker
        try:
            return await body(router, sid)
        finally:
            await harness.close(tools)

    return asyncio.run(main())


def test_an_unmatched_mcp_call_asks_the_user_each_time(tmp_path: Path, local_manager: Any) -> None:
    harness = _harness(tmp_path)
    asker = Asker({"decision": "allow"}, {"decision": "allow"})

    async def body(router: Any, sid: str) -> list[dict[str, Any]]:
        assert "mcp.fake.echo" in await router.available(sid)
        return [
            await router.call(sid, "mcp.fake.echo", {"text": t}, priority=TURN_PRIORITY)
            for t in ("a", SECRET)
        ]

    first, second = _run(harness, local_manager, asker, body)
    assert first["ok"] and first["output"]["content"][0]["text"] == "a"
    assert second["ok"] and SECRET not in str(second["output"])  # sanitised like any tool
    assert [s["tool"] for s in asker.shown] == ["mcp.fake.echo"] * 2
    assert "MCP tools ask the user first" in asker.shown[0]["reason"]
    results = harness.entries("tool_result")
    assert [e["policy_decision"] for e in results] == ["review_required"] * 2
    assert results[0]["metadata"]["review"] == "allowed once by the user"
    assert results[0]["sandbox_id"]


def test_allowed_for_the_session_is_not_asked_again(tmp_path: Path, local_manager: Any) -> None:
    harness = _harness(tmp_path)
    asker = Asker({"decision": "allow_session"})

    async def body(router: Any, sid: str) -> None:
        for text in ("a", "b", "c"):
            answer = await router.call(sid, "mcp.fake.echo", {"text": text}, priority=TURN_PRIORITY)
            assert answer["ok"]

    _run(harness, local_manager, asker, body)
    assert len(asker.shown) == 1
    reviews = [e["metadata"].get("review") for e in harness.entries("tool_result")]
    assert reviews == ["allowed for this session by the user"] * 3


def test_a_refused_call_never_starts_the_server(tmp_path: Path, local_manager: Any) -> None:
    harness = _harness(tmp_path)
    asker = Asker({"decision": "deny", "reason": "not now"})

    async def body(router: Any, sid: str) -> dict[str, Any]:
        answer: dict[str, Any] = await router.call(
            sid, "mcp.fake.echo", {"text": "a"}, priority=TURN_PRIORITY
        )
        return answer

    answer = _run(harness, local_manager, asker, body)
    assert not answer["ok"]
    assert answer["error"]["code"] == "tool.refused"  # the user's no: no quarantine count
    assert "the user refused mcp.fake.echo" in answer["error"]["what"]
    assert '"not now"' in answer["error"]["why"]
    assert answer["error"]["fix"]
    assert not local_manager.created
    assert harness.entries("tool_result")[0]["policy_decision"] == "denied"


def test_without_anyone_to_ask_the_call_is_refused_with_the_rule_to_write(
    tmp_path: Path, local_manager: Any
) -> None:
    harness = _harness(tmp_path)

    async def body(router: Any, sid: str) -> dict[str, Any]:
        answer: dict[str, Any] = await router.call(sid, "mcp.fake.echo", {"text": "a"})
        return answer

    answer = _run(harness, local_manager, None, body)
    assert not answer["ok"] and "needs the user's review" in answer["error"]["what"]
    assert "syscall: mcp.fake.*" in answer["error"]["fix"]
    assert not local_manager.created


RULES = """  - name: fake-tools
    match: {syscall: "mcp.fake.*"}
    action: allow
  - name: no-crashing
    match: {syscall: mcp.fake.crash}
    action: deny
    reason: crashing is not allowed here
"""


def test_a_rule_allows_a_server_s_family_and_a_deny_beats_it(
    tmp_path: Path, local_manager: Any
) -> None:
    harness = _harness(tmp_path, RULES)
    asker = Asker()

    async def body(router: Any, sid: str) -> tuple[dict[str, Any], dict[str, Any]]:
        echo = await router.call(sid, "mcp.fake.echo", {"text": "ok"})
        crash = await router.call(sid, "mcp.fake.crash", {})
        return echo, crash

    echo, crash = _run(harness, local_manager, asker, body)
    assert echo["ok"] and not asker.shown
    assert not crash["ok"] and "crashing is not allowed here" in crash["error"]["why"]
    assert "(rule no-crashing)" in crash["error"]["why"]
    decisions = [e["policy_decision"] for e in harness.entries("tool_result")]
    assert decisions == ["allowed", "denied"]


def test_bad_arguments_are_refused_before_policy_and_the_server(
    tmp_path: Path, local_manager: Any
) -> None:
    harness = _harness(tmp_path, RULES)

    async def body(router: Any, sid: str) -> dict[str, Any]:
        answer: dict[str, Any] = await router.call(sid, "mcp.fake.echo", {"text": 42})
        return answer

    answer = _run(harness, local_manager, Asker(), body)
    assert answer["error"]["code"] == "tool.input_invalid"
    assert "is not of type 'string'" in answer["error"]["what"]
    assert not local_manager.created


def test_reload_offers_a_server_added_while_the_kernel_runs(
    tmp_path: Path, local_manager: Any
) -> None:
    harness = _harness(tmp_path, RULES)

    async def body(router: Any, sid: str) -> tuple[list[str], dict[str, Any]]:
        save_record(harness.project, fake_server("other"))
        context = type("Context", (), {"binding": "cli"})()
        answer = await mcp_methods(router, router.runners.mcp, router.audit)["mcp.reload"](
            context, {}
        )
        names = sorted(n for n in router.registry.specs if n.startswith("mcp."))
        return names, answer

    names, answer = _run(harness, local_manager, Asker(), body)
    assert "mcp.other.echo" in names and "mcp.fake.echo" in names
    assert answer["tools"] == 8  # four tools of each server
    loaded = harness.entries("mcp_servers_loaded")
    assert loaded and loaded[0]["metadata"]["servers"] == "fake,other"


def test_the_user_sees_every_argument_or_is_not_asked(tmp_path: Path, local_manager: Any) -> None:
    """A hostile model cannot hide a payload behind a cut summary: the user is shown the
    arguments whole (secret-looking ones too: it is their own terminal); arguments too
    long to show are refused without asking."""
    harness = _harness(tmp_path)
    asker = Asker({"decision": "allow"})
    payload = "x" * 600 + "PAYLOAD"

    async def body(router: Any, sid: str) -> tuple[dict[str, Any], dict[str, Any]]:
        shown = await router.call(sid, "mcp.fake.echo", {"text": payload}, priority=TURN_PRIORITY)
        long = await router.call(
            sid, "mcp.fake.echo", {"text": "y" * 20_000}, priority=TURN_PRIORITY
        )
        return shown, long

    shown, long = _run(harness, local_manager, asker, body)
    assert shown["ok"] and "PAYLOAD" in asker.shown[0]["arguments"]
    assert len(asker.shown) == 1  # the long one was never put to the user
    assert long["error"]["code"] == "tool.refused" and "too long" in long["error"]["what"]


def test_a_client_s_direct_call_is_never_put_to_the_user(
    tmp_path: Path, local_manager: Any
) -> None:
    """Only the model's turn asks; a tool.call from a client cannot borrow its review."""
    harness = _harness(tmp_path)
    asker = Asker({"decision": "allow"})

    async def body(router: Any, sid: str) -> dict[str, Any]:
        answer: dict[str, Any] = await router.call(sid, "mcp.fake.echo", {"text": "a"})
        return answer

    answer = _run(harness, local_manager, asker, body)
    assert answer["error"]["code"] == "policy.denied" and not asker.shown
    assert "only a model's turn asks the user" in answer["error"]["why"]
