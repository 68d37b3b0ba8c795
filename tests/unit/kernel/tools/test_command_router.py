"""container.run on the router (ADR-062): only in debug mode; a command no rule allows
is shown to the person before anything starts, each command on its own (a yes for the
session covers that command only); a client's direct call has no one to ask and is
refused with the rule that would allow it.  (Running it: tests/integration/
test_container_run.py; this kernel has no engine, so an allowed command ends there.)"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from fluffy.kernel.policy.engine import Caller
from fluffy.kernel.tools.core.routedcall import TURN_PRIORITY
from tests.unit.kernel.mcp.test_mcp_router import Asker
from tests.unit.kernel.tools.test_tool_router import Harness

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]
PERSON = Caller("user", frozenset({"person"}))


def _run(
    tmp_path: Path, asker: Asker | None, body: Any, *, mode: str = "debug", rules: str = ""
) -> Any:
    harness = Harness(tmp_path)
    policy = harness.project / ".fluffy" / "policy.yaml"
    policy.write_text(policy.read_text().replace("capabilities:\n", "capabilities:\n" + rules, 1))

    async def main() -> Any:
        tools, _ = await harness.open()
        workflow = tools.router.workflow
        session = await workflow.new_session(mode, PERSON, approved=True)  # type: ignore[arg-type]
        await workflow.fire(session.id, "user_message")
        await tools.router.call(session.id, "plan.complete", {"summary": "look"})
        tools.router.reviewer = asker
        try:
            return await body(tools.router, session.id)
        finally:
            await harness.close(tools)

    return asyncio.run(main()), harness


def _results(harness: Harness) -> list[dict[str, Any]]:
    return [e for e in harness.entries("tool_result") if e["syscall_type"] == "container.run"]


def _command(argv: list[str]) -> Any:
    async def body(router: Any, sid: str) -> dict[str, Any]:
        answer: dict[str, Any] = await router.call(
            sid, "container.run", {"argv": argv}, priority=TURN_PRIORITY
        )
        return answer

    return body


def test_each_command_is_shown_to_the_person_before_it_starts(tmp_path: Path) -> None:
    asker = Asker({"decision": "allow"}, {"decision": "deny", "reason": "not that"})

    async def body(router: Any, sid: str) -> list[dict[str, Any]]:
        assert "container.run" in await router.available(sid)
        return [
            await router.call(sid, "container.run", {"argv": argv}, priority=TURN_PRIORITY)
            for argv in (["python", "-m", "pkg"], ["sh", "-c", "rm -rf /tmp/x"])
        ]

    (allowed, refused), harness = _run(tmp_path, asker, body)
    first = asker.shown[0]
    assert first["tool"] == "container.run" and first["command"] == "python -m pkg"
    assert "commands the model runs ask the person" in first["reason"]
    assert "command: ['python -m pkg']" in first["allow_with"]
    assert asker.shown[1]["command"] == "sh -c 'rm -rf /tmp/x'"
    # allowed: it went on to its sandbox (none here); refused: never started
    assert allowed["error"]["code"] == "engine.unavailable", allowed["error"]
    assert refused["error"]["code"] == "tool.refused" and '"not that"' in refused["error"]["why"]
    results = _results(harness)
    assert [e["metadata"].get("review") for e in results] == ["allowed once by the user", None]


def test_a_yes_for_the_session_covers_that_command_only(tmp_path: Path) -> None:
    asker = Asker({"decision": "allow_session"}, {"decision": "allow"})

    async def body(router: Any, sid: str) -> None:
        for argv in (["pytest", "-x"], ["pytest", "-x"], ["pytest", "-x", "-k", "a"]):
            await router.call(sid, "container.run", {"argv": argv}, priority=TURN_PRIORITY)

    _, harness = _run(tmp_path, asker, body)
    assert [s["command"] for s in asker.shown] == ["pytest -x", "pytest -x -k a"]
    reviews = [e["metadata"].get("review") for e in _results(harness)]
    assert reviews == ["allowed for this session by the user"] * 2 + ["allowed once by the user"]


def test_without_anyone_to_ask_a_command_is_refused_with_the_rule_to_write(
    tmp_path: Path,
) -> None:
    async def body(router: Any, sid: str) -> dict[str, Any]:
        answer: dict[str, Any] = await router.call(sid, "container.run", {"argv": ["make"]})
        return answer

    answer, _ = _run(tmp_path, Asker(), body)
    assert not answer["ok"] and "needs the user's review" in answer["error"]["what"]
    assert "command: ['make']" in answer["error"]["fix"]


@pytest.mark.parametrize(
    ("args", "said"),
    [({"argv": "make test"}, "not a string"), ({"argv": []}, "1 to 256"),
     ({"argv": [""]}, "is empty"), ({"argv": ["a\x00b"]}, "NUL")],
)  # fmt: skip
def test_a_bad_argv_is_refused_before_anyone_is_asked(
    tmp_path: Path, args: dict[str, Any], said: str
) -> None:
    asker = Asker()

    async def body(router: Any, sid: str) -> dict[str, Any]:
        answer: dict[str, Any] = await router.call(
            sid, "container.run", args, priority=TURN_PRIORITY
        )
        return answer

    answer, _ = _run(tmp_path, asker, body)
    assert answer["error"]["code"] == "tool.input_invalid" and said in answer["error"]["what"]
    assert not asker.shown


def test_outside_debug_mode_there_is_no_container_run(tmp_path: Path) -> None:
    asker = Asker()
    answer, _ = _run(tmp_path, asker, _command(["ls"]), mode="explore")
    assert answer["error"]["code"] == "tool.unavailable"
    assert "only in debug mode (explore now)" in str(answer["error"])
    assert not asker.shown


def test_a_rule_s_deny_is_a_refusal_that_names_it(tmp_path: Path) -> None:
    rules = (
        "  - name: never-curl\n"
        "    match: {syscall: container.run, command: ['curl **']}\n"
        "    action: deny\n"
    )
    asker = Asker()
    answer, _ = _run(tmp_path, asker, _command(["curl", "-s", "http://x"]), rules=rules)
    assert answer["error"]["code"] == "policy.denied"  # the policy is fine; this is refused
    assert "(rule never-curl)" in answer["error"]["why"] and not asker.shown
