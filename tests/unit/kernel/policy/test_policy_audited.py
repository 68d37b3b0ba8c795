"""The kernel's policy front: failing rules are denials *and* audit entries; requests replay."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.audit.query import Filters, entries
from fluffy.kernel.policy.audited import AuditedPolicy, recent_requests, request_data
from fluffy.kernel.policy.engine import Caller, EvalContext, PolicyEngine, Request, Verdict
from fluffy.kernel.policy.model import parse_policy

ALLOW_ALL_READS = (
    "capabilities:\n  - name: reads\n    match: {syscall: fs.read}\n    action: allow\n"
)


def broken_rule(request: Request, ctx: EvalContext) -> Verdict | None:
    raise RuntimeError("bug in a rule")


def test_a_failing_rule_denies_and_is_audited(tmp_path: Path) -> None:
    async def main() -> None:
        audit = await AuditLog.open(tmp_path)
        await audit.record(Event("kernel_start"))
        engine = PolicyEngine(parse_policy(ALLOW_ALL_READS), builtins=[broken_rule])
        decision = AuditedPolicy(engine, audit).evaluate(Request("fs.read", Caller("ai"), "a.py"))
        assert decision.result == "deny"
        assert any(v.failed for v in decision.matched)
        await audit.close()

    asyncio.run(main())
    failed = list(entries(tmp_path, Filters(event_type="policy_rule_failed")))
    assert len(failed) == 1
    assert failed[0]["policy_rule_name"] == "broken_rule"
    assert "bug in a rule" in failed[0]["deny_reason"]


def test_request_data_round_trips_through_the_audit_log(tmp_path: Path) -> None:
    request = Request(
        "fs.write",
        Caller("tool", frozenset({"core_plugin"})),
        "src/a.py",
        "code_writing",
        "strict",
        10,
        "L2",
    )

    async def main() -> None:
        audit = await AuditLog.open(tmp_path)
        await audit.record(Event("kernel_start"))
        import msgspec

        payload = msgspec.json.encode(request_data(request)).decode()
        for _ in range(3):
            audit.record_nowait(Event("syscall", metadata={"policy_request": payload}))
        audit.record_nowait(Event("syscall", metadata={"policy_request": "{broken"}))
        await audit.close()

    asyncio.run(main())
    found = recent_requests(tmp_path, limit=2)
    assert found == [request, request]


def test_the_model_s_tool_calls_are_replayed_from_their_tool_result_entries(
    tmp_path: Path,
) -> None:
    """The last 100 decisions *and* the model's last 100: a busy socket cannot push the
    model's decisions out of the trial; a tool.call's syscall entry is not counted twice."""
    import msgspec

    ai = Caller("ai", frozenset({"ai"}))
    model = [Request("fs.write", ai, f"src/m{i}.py", "code_writing") for i in range(3)]
    user = Request("session.set_mode", Caller("user"))
    encode = msgspec.json.encode

    async def main() -> None:
        audit = await AuditLog.open(tmp_path)
        await audit.record(Event("kernel_start"))
        audit.record_nowait(  # one call naming two paths: two requests
            Event("tool_result", metadata={"policy_requests": encode(
                [request_data(model[0]), request_data(model[1])]).decode()}),
        )  # fmt: skip
        audit.record_nowait(
            Event("syscall", syscall_type="tool.call",
                  metadata={"policy_request": encode(request_data(model[2])).decode()}),
        )  # fmt: skip
        audit.record_nowait(
            Event("tool_result", metadata={"policy_requests": encode(
                [request_data(model[2])]).decode()}),
        )  # fmt: skip
        payload = encode(request_data(user)).decode()
        for _ in range(5):
            audit.record_nowait(Event("syscall", metadata={"policy_request": payload}))
        audit.record_nowait(Event("tool_result", metadata={"policy_requests": "[{broken"}))
        await audit.close()

    asyncio.run(main())
    assert recent_requests(tmp_path, limit=100) == [*model, *[user] * 5]
    # two slots: the newest two of all (user's) plus the model's newest two
    assert recent_requests(tmp_path, limit=2) == [model[1], model[2], user, user]
