"""Capability tokens on the live path: the router's check is the one before issuing;
every change a sandbox returns is one use of its call's token, checked by the engine
(real PolicyEngine, TokenStore and audit log; the sandbox is played by data here,
tests/e2e/test_live_policy.py runs the real ones)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fluffy.errors import MergeRefused
from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.audit.query import Filters, entries
from fluffy.kernel.policy.builtin import default_builtins
from fluffy.kernel.policy.engine import Caller, PolicyEngine, Request
from fluffy.kernel.policy.model import parse_policy
from fluffy.kernel.tools.changes.staging import check_uses
from fluffy.kernel.tools.core.capabilities import Capabilities, Scope, token_ref
from fluffy.sandboxes.plugin_host import present_capability

POLICY = """capabilities:
  - name: fs-write-source
    match: {syscall: fs.write, path_glob: ["src/**"]}
    action: allow
    constraints: {require_sandbox: L2, require_capability_token: true}
"""


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def setup(tmp_path: Path) -> tuple[PolicyEngine, Capabilities, Clock]:
    clock = Clock()
    engine = PolicyEngine(
        parse_policy(POLICY), builtins=default_builtins(tmp_path), root=tmp_path, clock=clock
    )
    return engine, Capabilities(engine.tokens, clock), clock


def issue(caps: Capabilities, *paths: str) -> Any:
    async def durable() -> Any:
        token, recorded = caps.begin_issue(
            Scope("fs.write", paths), container_id="c1" * 32, connection="sock:1", ttl_s=30,
            call_id="k1", plugin="fs-tool",
        )  # fmt: skip
        await recorded
        return token

    return asyncio.run(durable())


def check(
    engine: PolicyEngine, token: Any, result: dict[str, Any], connection: str = "sock:1"
) -> Any:
    call = SimpleNamespace(
        capability=Scope("fs.write", ("src/a.py",)),
        spec=SimpleNamespace(name="fs.write", plugin="fs-tool", template="code-executor"),
        session=SimpleNamespace(state="code_writing", mode="strict"),
        token=None,
        token_ops=None,
    )
    outcome = SimpleNamespace(token=token, result=result, connection=connection)
    check_uses(call, outcome, result["changes"], runner=None, policy=engine)  # type: ignore[arg-type]
    return call


def returned(token: Any, *paths: str) -> dict[str, Any]:
    """What fluffy's plugin host sends back: its changes and the token's uses."""
    changes = [{"path": p, "op": "full", "file": "x"} for p in paths]
    job = {"capability": {"token": token.token_id}}
    reply = present_capability(job, {"ok": True, "result": {"changes": changes}})
    result: dict[str, Any] = reply["result"]
    return result


def test_require_capability_token_is_met_only_by_the_check_before_issuing(
    tmp_path: Path,
) -> None:
    engine, _, _ = setup(tmp_path)
    ask = Request("fs.write", Caller("fs-tool", frozenset({"ai"})), "src/a.py",
                  sandbox="code-executor")  # fmt: skip
    assert engine.evaluate(ask).result == "deny"  # e.g. the kernel's fast path
    from msgspec.structs import replace

    assert engine.evaluate(replace(ask, issuing=True)).result == "allow"


def test_each_change_is_one_use_of_the_token(tmp_path: Path) -> None:
    engine, caps, _ = setup(tmp_path)
    token = issue(caps, "src/a.py")
    call = check(engine, token, returned(token, "src/a.py"))
    assert (call.token, call.token_ops) == (token_ref(token.token_id), "1/1")
    with pytest.raises(MergeRefused):  # the same uses again: replayed, and used up
        check(engine, token, returned(token, "src/a.py"))


@pytest.mark.parametrize(
    "case", ["other path", "no token", "wrong token", "other connection", "expired", "nonce"]
)
def test_a_change_the_token_does_not_cover_is_refused(tmp_path: Path, case: str) -> None:
    engine, caps, clock = setup(tmp_path)
    token = issue(caps, "src/a.py")
    result = returned(token, "src/b.py" if case == "other path" else "src/a.py")
    connection = "sock:2" if case == "other connection" else "sock:1"
    if case == "no token":
        del result["capability"]
    if case == "wrong token":
        result["capability"]["token"] = "forged"
    if case == "expired":
        clock.now += 31
    if case == "nonce":
        result["capability"]["uses"][0]["nonce"] = 0
    with pytest.raises(MergeRefused) as info:
        check(engine, token, result, connection)
    assert "not covered by the call's capability token" in info.value.what
    assert engine.tokens.tokens[token.token_id].ops_used == 0  # nothing consumed


def test_issued_and_expired_tokens_are_audited(tmp_path: Path) -> None:
    secrets: list[str] = []

    async def main() -> None:
        audit = await AuditLog.open(tmp_path)
        await audit.record(Event("kernel_start"))
        engine, _, clock = setup(tmp_path)
        caps = Capabilities(engine.tokens, clock, audit)
        scope = Scope("fs.write", ("src/a.py", "src/b.py"))
        token, recorded = caps.begin_issue(
            scope, container_id="c2", connection="s", ttl_s=30, call_id="k2", plugin="fs-tool"
        )
        await recorded
        secrets.append(token.token_id)
        token.ops_used = 1
        caps.expire(token.token_id, "k2")
        assert token.token_id not in engine.tokens.tokens  # revoked: no later use
        await audit.close()

    asyncio.run(main())
    issued = list(entries(tmp_path, Filters(event_type="capability_issued")))
    expired = list(entries(tmp_path, Filters(event_type="capability_expired")))
    assert len(issued) == 1 and issued[0]["metadata"]["max_ops"] == "2"
    assert expired[0]["metadata"]["ops_used"] == "1"
    assert expired[0]["metadata"]["reason"] == "the call is over"
    assert issued[0]["metadata"]["token"] == expired[0]["metadata"]["token"]
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("*.db*"))
    assert stored and secrets[0].encode() not in stored  # named by a digest only


def test_each_call_s_token_end_is_recorded_when_the_next_call_s_was_issued_first(
    tmp_path: Path,
) -> None:
    """A used-up (or timed-out) token stays until its call ends: the next call's issue
    does not forget it, so its end and uses are in the log whichever comes first (the
    first call's teardown runs in the background, after the next call may start)."""

    async def main() -> list[str]:
        audit = await AuditLog.open(tmp_path)
        try:
            await audit.record(Event("kernel_start"))
            engine, _, clock = setup(tmp_path)
            caps = Capabilities(engine.tokens, clock, audit)
            refs: list[str] = []
            first = None
            for call in ("k1", "k2", "k3"):
                token, recorded = caps.begin_issue(
                    Scope("fs.write", ("src/a.py",)), container_id=f"c-{call}",
                    connection="s", ttl_s=30, call_id=call, plugin="fs-tool",
                )  # fmt: skip
                await recorded
                refs.append(token_ref(token.token_id))
                if first is None:
                    first = token
                    token.ops_used = 1  # used up
                else:
                    clock.now += 31  # the first timed out too
            assert first is not None
            caps.expire(first.token_id, "k1")
            await audit.flush()
            return refs
        finally:
            await audit.close()

    refs = asyncio.run(main())
    (ended,) = list(entries(tmp_path, Filters(event_type="capability_expired")))
    assert ended["metadata"]["token"] == refs[0] and ended["metadata"]["call_id"] == "k1"
    assert ended["metadata"]["ops_used"] == "1"
    assert ended["metadata"]["reason"] == "its time ran out"


def test_a_token_whose_call_never_ended_is_forgotten_long_after_it_expired() -> None:
    from fluffy.kernel.policy.tokens import FORGET_AFTER_S, TokenStore

    store = TokenStore()
    lost = store.issue(container_id="c", connection="s", syscall="fs.write", now=0, ttl_s=30)
    store.issue(container_id="c", connection="s", syscall="fs.write", now=31, ttl_s=30)
    assert lost.token_id in store.tokens  # expired, but its call may still end
    store.issue(container_id="c", connection="s", syscall="fs.write", now=30 + FORGET_AFTER_S,
                ttl_s=30)  # fmt: skip
    assert lost.token_id not in store.tokens and len(store.tokens) == 2


def test_changes_without_the_call_s_token_are_refused_where_tokens_are_issued(
    tmp_path: Path,
) -> None:
    engine, caps, _ = setup(tmp_path)
    call = SimpleNamespace(
        capability=Scope("fs.write", ("src/a.py",)),
        spec=SimpleNamespace(name="fs.write", plugin="fs-tool", template="code-executor"),
        session=SimpleNamespace(state="code_writing", mode="strict"),
    )
    outcome = SimpleNamespace(token=None, result={"changes": []}, connection="sock:1")
    runner = SimpleNamespace(capabilities=caps)
    with pytest.raises(MergeRefused) as info:
        check_uses(call, outcome, [{"path": "src/a.py"}], runner=runner, policy=engine)  # type: ignore[arg-type]
    assert "without the call's capability token" in info.value.what


def test_a_token_issued_as_its_call_ends_is_revoked_at_once(tmp_path: Path) -> None:
    """If the call is torn down while its token is being issued, the token is revoked
    then, not left to its TTL."""
    from fluffy.kernel.tools.sandbox.pluginjob import Job
    from fluffy.kernel.tools.sandbox.plugins import PluginRunner

    async def main() -> None:
        audit = await AuditLog.open(tmp_path)
        await audit.record(Event("kernel_start"))
        engine, _, clock = setup(tmp_path)
        runner = PluginRunner(lambda: None, tmp_path, environment=dict)  # type: ignore[arg-type,return-value]
        runner.capabilities = Capabilities(engine.tokens, clock, audit)
        job = Job("k3", "fs.write", {}, "strict", plugin="fs-tool", sandbox_id="sb1")
        job.capability = Scope("fs.write", ("src/a.py",))
        # the teardown ran while the issue was being recorded: the job is no longer there
        context = SimpleNamespace(binding="tool-x", connection=object())
        shown = await runner.socket.issue(job, context)  # type: ignore[arg-type]
        assert job.token is None and shown["token"] not in engine.tokens.tokens
        await audit.close()

    asyncio.run(main())
    (expired,) = list(entries(tmp_path, Filters(event_type="capability_expired")))
    assert expired["metadata"]["reason"] == "the call ended first"


def test_a_result_waits_until_its_token_s_issue_is_durable(tmp_path: Path) -> None:
    """The token goes to the host at once and the capability_issued commit overlaps the
    tool's run; but the call's result, where the token's uses come back, is taken only
    once that entry is durable (the design's synchronous write)."""
    from fluffy.kernel.tools.sandbox.pluginjob import Job
    from fluffy.kernel.tools.sandbox.plugins import PluginRunner
    from fluffy.kernel.tools.sandbox.pluginsocket import ToolResultParams

    committed = asyncio.Event()

    class SlowAudit:
        def record_soon(self, event: Event) -> asyncio.Future[None]:
            durable = asyncio.get_running_loop().create_future()

            async def commit() -> None:
                await committed.wait()
                durable.set_result(None)

            self.commit = asyncio.ensure_future(commit())
            return durable

    async def main() -> None:
        engine, _, clock = setup(tmp_path)
        caps = Capabilities(engine.tokens, clock, SlowAudit())  # type: ignore[arg-type]
        runner = PluginRunner(lambda: None, tmp_path, environment=dict)  # type: ignore[arg-type,return-value]
        runner.capabilities = caps
        job = Job("k4", "fs.write", {}, "strict", plugin="fs-tool", sandbox_id="sb1")
        job.capability = Scope("fs.write", ("src/a.py",))
        context = SimpleNamespace(binding="tool-y", connection=object())
        runner.socket.jobs["tool-y"] = job
        job.context = context  # type: ignore[assignment]
        shown = await runner.socket.issue(job, context)  # type: ignore[arg-type]
        assert shown["token"] in engine.tokens.tokens  # handed out before the commit
        answer = ToolResultParams(call_id="k4", ok=True, result={"changes": []})
        taking = asyncio.ensure_future(runner.socket.result(context, answer))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        assert not job.future.done()  # the issue is not durable yet
        committed.set()
        await taking
        assert job.future.result()["ok"] is True

    asyncio.run(main())


def test_a_result_for_a_call_ended_meanwhile_is_refused(tmp_path: Path) -> None:
    """The call is torn down while its token's issue commits: the late result is
    refused, never set on the finished call."""
    from fluffy.errors import InvalidPayload
    from fluffy.kernel.tools.sandbox.pluginjob import Job
    from fluffy.kernel.tools.sandbox.plugins import PluginRunner
    from fluffy.kernel.tools.sandbox.pluginsocket import ToolResultParams

    committed = asyncio.Event()

    class SlowAudit:
        def record_soon(self, event: Event) -> asyncio.Future[None]:
            durable = asyncio.get_running_loop().create_future()
            committed_soon = asyncio.ensure_future(committed.wait())
            committed_soon.add_done_callback(lambda _: durable.set_result(None))
            return durable

    async def main() -> None:
        engine, _, clock = setup(tmp_path)
        runner = PluginRunner(lambda: None, tmp_path, environment=dict)  # type: ignore[arg-type,return-value]
        runner.capabilities = Capabilities(engine.tokens, clock, SlowAudit())  # type: ignore[arg-type]
        job = Job("k5", "fs.write", {}, "strict", plugin="fs-tool", sandbox_id="sb1")
        job.capability = Scope("fs.write", ("src/a.py",))
        context = SimpleNamespace(binding="tool-z", connection=object())
        runner.socket.jobs["tool-z"] = job
        job.context = context  # type: ignore[assignment]
        await runner.socket.issue(job, context)  # type: ignore[arg-type]
        answer = ToolResultParams(call_id="k5", ok=True, result={"changes": []})
        taking = asyncio.ensure_future(runner.socket.result(context, answer))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        job.future.set_result({"call_id": "k5", "ok": False})  # torn down meanwhile
        committed.set()
        with pytest.raises(InvalidPayload):
            await taking
        assert job.future.result()["ok"] is False

    asyncio.run(main())
