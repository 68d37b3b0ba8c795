"""The router on a real database, audit log, policy and project (plugins stubbed here;
tests/integration/test_tool_path.py runs the real sandboxes)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace

from fluffy.errors import FluffyError, MergeConflict, ToolFailed, ToolTransient
from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.audit.query import Filters, entries
from fluffy.kernel.memory_guard import MemoryGuard
from fluffy.kernel.policy.audited import AuditedPolicy
from fluffy.kernel.policy.builtin import default_builtins
from fluffy.kernel.policy.engine import PolicyEngine
from fluffy.kernel.policy.model import load_policy
from fluffy.kernel.syscalls.assemble_tools import ToolPath, assemble_tools
from fluffy.kernel.workflow.machine import Workflow
from fluffy.kernel.workflow.store import WorkflowStore

ROOT = Path(__file__).resolve().parents[4]
SECRET = "sk-" + "a1B2" * 10


class Harness:
    def __init__(self, tmp_path: Path) -> None:
        self.project = tmp_path / "project"
        (self.project / "src").mkdir(parents=True)
        (self.project / "tests").mkdir()
        (self.project / ".fluffy").mkdir()
        (self.project / "src" / "app.py").write_text(f"KEY = '{SECRET}'\n")
        policy = (ROOT / "examples" / "policies" / "default.yaml").read_text()
        (self.project / ".fluffy" / "policy.yaml").write_text(policy)
        self.state = tmp_path / "state"
        self.state.mkdir()

    async def open(self) -> tuple[ToolPath, str]:
        self.audit = await AuditLog.open(self.state)
        await self.audit.record(Event("kernel_start", input_summary="test kernel"))
        self.store = await WorkflowStore.open(self.state)
        policy = load_policy(self.project / ".fluffy" / "policy.yaml")
        front = AuditedPolicy(
            PolicyEngine(policy, builtins=default_builtins(self.project), root=self.project),
            self.audit,
        )
        workflow = Workflow(self.store, self.project, audit=self.audit, policy=front)
        tools = await assemble_tools(
            self.state, self.project, policy, workflow, front, self.audit, MemoryGuard(),
            engine=False,
        )  # fmt: skip
        session = await workflow.new_session()
        await workflow.fire(session.id, "user_message")
        return tools, session.id

    async def close(self, tools: ToolPath) -> None:
        await tools.close()
        await self.store.close()
        await self.audit.close()

    def entries(self, event_type: str) -> list[dict[str, Any]]:
        return list(entries(self.state, Filters(event_type=event_type)))


def run(harness: Harness, body: Any) -> Any:
    async def main() -> Any:
        tools, sid = await harness.open()
        try:
            return await body(tools, sid)
        finally:
            await harness.close(tools)

    return asyncio.run(main())


def test_read_is_sanitised_and_both_versions_audited(tmp_path: Path) -> None:
    harness = Harness(tmp_path)

    async def body(tools: ToolPath, sid: str) -> dict[str, Any]:
        return await tools.router.call(sid, "fs.read", {"path": "src/app.py"})

    answer = run(harness, body)
    assert answer["ok"] and answer["route"] == "fast"
    assert SECRET not in json.dumps(answer)
    assert "[REDACTED" in answer["output"]["content"]
    (result,) = harness.entries("tool_result")
    meta = result["metadata"]
    assert meta["redactions"] == "1" and len(meta["original_sha256"]) == 64
    assert SECRET not in json.dumps(result)  # the audit log never holds the secret
    assert json.loads(result["input_summary"]) == {"path": "src/app.py"}  # what was asked
    assert "[REDACTED" in result["output_summary"]  # and what the model was answered
    assert result["policy_decision"] == "allowed" and result["syscall_type"] == "fs.read"
    assert result["policy_rule_name"] == "read-project"  # the rule that allowed it
    assert harness.entries("tool_execute") == []  # a fast read is one entry, not two


def test_reads_are_retried_once_writes_never(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    attempts: list[str] = []

    async def body(tools: ToolPath, sid: str) -> tuple[dict[str, Any], dict[str, Any]]:
        real = tools.router.fast.run

        def flaky(tool: str, args: Any, stage: Any, **options: Any) -> dict[str, Any]:
            attempts.append(tool)
            if len(attempts) == 1:
                raise ToolTransient("disk hiccup")
            return real(tool, args, stage, **options)

        tools.router.fast.run = flaky  # type: ignore[method-assign]
        read = await tools.router.call(sid, "fs.read", {"path": "src/app.py"})
        tools.router.fast.run = lambda *a, **k: (_ for _ in ()).throw(ToolFailed("gone"))  # type: ignore[method-assign]
        failed = await tools.router.call(sid, "fs.read", {"path": "src/app.py"})
        return read, failed

    read, failed = run(harness, body)
    assert read["ok"] and read["retries"] == 1 and attempts == ["fs.read", "fs.read"]
    assert not failed["ok"] and failed["retries"] == 0  # not retryable: no second try
    retried = [e for e in harness.entries("tool_execute") if e["metadata"]["attempt"] == "2"]
    assert len(retried) == 1 and retried[0]["metadata"]["retry_after"] == "tool.transient"


def test_unavailable_tool_policy_denial_and_bad_paths_are_results(tmp_path: Path) -> None:
    harness = Harness(tmp_path)

    async def body(tools: ToolPath, sid: str) -> list[dict[str, Any]]:
        router = tools.router
        await router.call(sid, "plan.complete", {})  # -> test_writing
        return [
            await router.call(sid, "fs.write", {"path": "src/app.py", "content": "x"}),
            await router.call(sid, "fs.write", {"path": ".fluffy/policy.yaml", "content": "x"}),
            await router.call(sid, "fs.write", {"path": "tests/../../x.py", "content": "x"}),
            await router.call(sid, "git.commit", {"message": "m"}),
            await router.call(sid, "nope.tool", {}),
            await router.call(sid, "fs.read", {"path": "src/app.py", "bogus": 1}),
        ]

    src, policy_file, escape, commit, unknown, bad_args = run(harness, body)
    assert src["error"]["error"] == "tool_unavailable"
    assert src["error"]["current_state"] == "test_writing"
    assert "fs.read" in src["error"]["available_tools"]
    assert "test.run" in src["error"]["available_tools"]
    assert "git.commit" not in src["error"]["available_tools"]
    assert policy_file["error"]["code"] in ("tool.unavailable", "tool.input_invalid")
    assert escape["error"]["code"] == "tool.input_invalid"
    assert commit["error"]["error"] == "tool_unavailable"  # only in committing
    assert unknown["error"]["code"] == "tool.not_found"
    assert bad_args["error"]["code"] == "tool.input_invalid"
    assert (harness.project / ".fluffy" / "policy.yaml").read_text().startswith("#")
    assert not (tmp_path / "x.py").exists()
    denied = [e for e in harness.entries("tool_result") if e["policy_decision"] == "denied"]
    assert len(denied) >= 3


def test_writes_without_an_engine_fail_clearly_and_the_breaker_stays_closed(
    tmp_path: Path,
) -> None:
    harness = Harness(tmp_path)

    async def body(tools: ToolPath, sid: str) -> dict[str, Any]:
        await tools.router.call(sid, "plan.complete", {})
        return await tools.router.call(sid, "fs.write", {"path": "tests/t.py", "content": "x"})

    answer = run(harness, body)
    assert not answer["ok"] and "container engine" in answer["error"]["what"]
    assert answer["error"]["code"] == "engine.unavailable"  # policy allowed it
    assert not (harness.project / "tests" / "t.py").exists()


def test_edits_and_deletes_pass_the_size_limit_and_client_ids_name_no_folder(
    tmp_path: Path,
) -> None:
    harness = Harness(tmp_path)
    (harness.project / "tests" / "test_a.py").write_text("def test_a():\n    assert 1\n")

    async def body(tools: ToolPath, sid: str) -> list[dict[str, Any]]:
        router = tools.router
        await router.call(sid, "plan.complete", {})
        edit = {"path": "tests/test_a.py", "old_string": "1", "new_string": "0"}
        return [
            await router.call(sid, "fs.edit", edit, call_id="../../../escape"),
            await router.call(sid, "fs.delete", {"path": "tests/test_a.py"}),
        ]

    edited, deleted = run(harness, body)
    # both reached the sandbox step (no engine here): the policy's max_file_size held
    assert edited["error"]["code"] == "engine.unavailable", edited
    assert deleted["error"]["code"] == "engine.unavailable", deleted
    assert edited["client_call_id"] == "../../../escape"
    assert edited["call_id"] != "../../../escape" and "/" not in edited["call_id"]
    assert not (tmp_path / "escape").exists() and not list(tmp_path.rglob("escape*"))


def test_batch_keeps_order_and_serialises_conflicts(tmp_path: Path) -> None:
    harness = Harness(tmp_path)

    async def body(tools: ToolPath, sid: str) -> list[dict[str, Any]]:
        calls = [{"tool": "fs.read", "args": {"path": "src/app.py"}}] * 3
        calls += [{"tool": "fs.exists", "args": {"path": "tests"}}]
        return await tools.router.batch(sid, calls)

    answers = run(harness, body)
    assert [a["tool"] for a in answers] == ["fs.read"] * 3 + ["fs.exists"]
    assert all(a["ok"] for a in answers)


def test_the_breaker_opens_after_five_consecutive_plugin_failures(tmp_path: Path) -> None:
    harness = Harness(tmp_path)

    class Broken:
        calls = 0

        async def run(self, **kwargs: Any) -> Any:
            Broken.calls += 1
            raise ToolTransient("the sandbox exited before asking for work")

        async def release(self, outcome: Any) -> None:
            raise AssertionError("nothing to release")

    async def body(tools: ToolPath, sid: str) -> list[tuple[str, int]]:
        tools.router.runners = replace(tools.router.runners, plugins=Broken())
        seen = []
        for _ in range(4):  # git.status is a read: each call is tried twice
            answer = await tools.router.call(sid, "git.status", {})
            seen.append((answer["error"]["code"], Broken.calls))
        return seen

    seen = run(harness, body)
    assert seen == [
        ("tool.transient", 2),
        ("tool.transient", 4),
        ("tool.circuit_open", 5),  # the fifth failure opened it; the retry was refused
        ("tool.circuit_open", 5),  # open: the broken plugin is not called again
    ]


class FakePlugins:
    """Stands in for the sandboxes (tests/integration runs the real ones): fs.write
    answers with a real patch file, test.run with a real junit report."""

    def __init__(self, root: Path, project: Path) -> None:
        self.root = root
        self.project = project
        self.green = False
        self.count = 0
        self.pool = None  # no warm sandboxes

    async def run(
        self, *, tool: str, args: dict[str, Any], call_id: str, settings: Any = None, **_: Any
    ) -> Any:
        from fluffy.kernel.containers.lifecycle import Sandbox
        from fluffy.kernel.merge.patch import unified_diff
        from fluffy.kernel.tools.sandbox.pluginjob import PluginOutcome

        self.count += 1
        call_dir = self.root / call_id
        call_dir.mkdir(parents=True)
        if tool == "fs.write":
            target = self.project / args["path"]
            old = target.read_text() if target.exists() else None
            (call_dir / "0.diff").write_text(unified_diff(args["path"], old, args["content"]))
            result: dict[str, Any] = {
                "changes": [{"path": args["path"], "op": "patch", "file": "0.diff"}]
            }
        else:  # test.run
            body = "" if self.green else '<failure message="assert 1 == 2">assert</failure>'
            token = (settings or {}).get("canary")  # the real plugin's canary, failed
            canary = "".join(
                f'<testcase classname="tests.test_x" name="test_{token}_{kind}" '
                'file="tests/test_x.py"><failure message="canary">canary</failure></testcase>'
                for kind in ("a", "e")
                if token
            )
            (call_dir / "junit.xml").write_text(
                f'<testsuite>{canary}<testcase classname="tests.test_x" name="test_x" '
                f'file="tests/test_x.py">{body}</testcase></testsuite>'
            )
            result = {"exit_code": 0 if self.green else 1, "junit": "junit.xml"}
        sandbox = Sandbox(call_id, "code-executor", f"fake-{call_id}", call_dir)
        return PluginOutcome(result, call_dir, sandbox, {"ready_ms": 0.0, "tool_ms": 0.0})

    async def release(self, outcome: Any) -> None:
        return None


class CountingPool:
    """What the router announces to the warm pool."""

    def __init__(self) -> None:
        self.expected: list[tuple[str, int]] = []

    def expect(self, recipe: Any, count: int = 1) -> None:
        self.expected.append((recipe, count))


class PooledPlugins(FakePlugins):
    def __init__(self, root: Path, project: Path) -> None:
        super().__init__(root, project)
        self.pool = CountingPool()  # type: ignore[assignment]

    def recipe(self, *, plugin: str, **_: Any) -> str:
        return plugin


def test_a_batch_of_writes_has_that_many_sandboxes_made_ahead(tmp_path: Path) -> None:
    harness = Harness(tmp_path)

    async def body(tools: ToolPath, sid: str) -> list[tuple[str, int]]:
        router = tools.router
        fake = PooledPlugins(tmp_path / "outputs", harness.project)
        router.runners = replace(router.runners, plugins=fake)
        await router.call(sid, "plan.complete", {})
        writes = [
            {"tool": "fs.write", "args": {"path": f"tests/test_{i}.py", "content": "x = 1\n"}}
            for i in range(3)
        ]
        reads = [{"tool": "fs.read", "args": {"path": "README.md"}}] * 4
        answers = await router.batch(sid, [*writes, *reads])
        assert all(a["ok"] for a in answers[:3]), answers
        return fake.pool.expected

    expected = run(harness, body)
    assert ("fs-tool", 3) in expected  # the batch's three writes, at once
    assert all(count == 1 for plugin, count in expected if plugin != "fs-tool")


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_a_sensitive_change_waits_in_reviewing_for_the_user(tmp_path: Path, decision: str) -> None:
    harness = Harness(tmp_path)
    (harness.project / "pyproject.toml").write_text("[project]\nname = 'x'\n")

    async def body(tools: ToolPath, sid: str) -> tuple[dict[str, Any], dict[str, Any], str]:
        router = tools.router
        fake = FakePlugins(tmp_path / "outputs", harness.project)
        router.runners = replace(router.runners, plugins=fake)
        await router.call(sid, "plan.complete", {})
        test = "def test_x():\n    assert 1 == 2\n"
        assert (await router.call(sid, "fs.write", {"path": "tests/test_x.py", "content": test}))[
            "ok"
        ]
        red = await router.call(sid, "test.run", {})
        assert red["session"]["state"] == "code_writing", red
        await router.call(sid, "fs.write", {"path": "src/app.py", "content": "KEY = 1\n"})
        wrote = await router.call(
            sid, "fs.write", {"path": "pyproject.toml", "content": "[project]\n"}
        )
        diff = wrote["output"]["diff"]  # this call's change, not the whole session's
        assert "+++ b/pyproject.toml" in diff and "app.py" not in diff, diff
        fake.green = True
        green = await router.call(sid, "test.run", {})
        assert green["session"]["state"] == "reviewing", green
        review = green["output"]["review"]
        if decision == "approve":
            with pytest.raises(MergeConflict, match="not the ones you reviewed"):
                await router.flow.approve(sid, by="user", plan_id="0" * 32)
            assert not (harness.project / "tests" / "test_x.py").exists()
            done = await router.flow.approve(sid, by="user", plan_id=review["plan_id"])
        else:
            done = await router.flow.reject(sid)
        state = (await router.workflow.get(sid)).state
        return green["output"]["review"], done, state

    review, done, state = run(harness, body)
    assert review["auto_merged"] is False
    assert any("Sensitive" in r or "pyproject" in r for r in review["reasons"]), review
    assert "pyproject.toml" in review["diff"]
    if decision == "approve":
        assert state == "committing" and set(done["merged"]) >= {"pyproject.toml", "src/app.py"}
        assert (harness.project / "pyproject.toml").read_text() == "[project]\n"
        assert (harness.project / "tests" / "test_x.py").exists()
        assert len(harness.entries("merge_approved")) == 1
    else:
        assert state == "code_writing" and done["discarded"]
        assert (harness.project / "pyproject.toml").read_text() == "[project]\nname = 'x'\n"
        assert not (harness.project / "tests" / "test_x.py").exists()
        assert len(harness.entries("merge_rejected")) == 1


def test_a_locked_tech_debt_budget_merges_nothing(tmp_path: Path) -> None:
    from fluffy.errors import TransitionDenied
    from fluffy.kernel.policy.engine import Caller
    from fluffy.kernel.workflow.baseline import write_baseline
    from fluffy.kernel.workflow.coverage import CoverageReport

    harness = Harness(tmp_path)
    policy = harness.project / ".fluffy" / "policy.yaml"
    policy.write_text(
        policy.read_text()
        + "\n  - name: explore-ok\n    match: {syscall: session.set_mode, session_mode: [explore]}"
        + "\n    action: allow\n"
    )

    class Covered(FakePlugins):
        async def run(self, **kwargs: Any) -> Any:
            outcome = await super().run(**kwargs)
            if kwargs["tool"] == "test.run":  # 1 of 10 lines covered: far below the baseline
                summary = {"covered_lines": 1, "num_statements": 10}
                report = {"totals": summary, "files": {"src/app.py": {"summary": summary}}}
                (outcome.call_dir / "coverage.json").write_text(json.dumps(report))
                outcome.result["coverage"] = "coverage.json"
            return outcome

    async def body(tools: ToolPath, sid: str) -> tuple[dict[str, Any], str]:
        router, workflow = tools.router, tools.router.workflow
        baseline = CoverageReport(9, 10, {}, "coverage.py-json")  # the file is the baseline
        write_baseline(harness.project, ".fluffy/coverage-baseline.json", baseline, "earlier")
        await workflow.set_mode(sid, "explore", Caller("user"))
        fake = Covered(tmp_path / "outputs", harness.project)
        fake.green = True
        router.runners = replace(router.runners, plugins=fake)
        await router.call(sid, "plan.complete", {})  # -> exploring
        await router.call(sid, "fs.write", {"path": "src/app.py", "content": "KEY = 2\n"})
        green = await router.call(sid, "test.run", {})
        with pytest.raises(TransitionDenied):
            await router.flow.approve(sid, by="user")
        return green, (await workflow.get(sid)).state

    green, state = run(harness, body)
    review = green["output"]["review"]
    assert review["auto_merged"] is False and state == "reviewing"
    assert any("coverage" in r.lower() or "budget" in r.lower() for r in review["reasons"]), review
    assert (harness.project / "src" / "app.py").read_text() == f"KEY = '{SECRET}'\n"  # unmerged


def test_a_huge_replace_all_is_refused_by_its_size_without_building_it(tmp_path: Path) -> None:
    """20 KB of matches, each replaced by 100 KB: the kernel counts (it would need ~2 GB to
    build the result) and the policy's max_file_size refuses it; memory stays flat."""
    import resource

    harness = Harness(tmp_path)
    (harness.project / "tests" / "test_big.py").write_text("a" * 20_000)

    async def body(tools: ToolPath, sid: str) -> dict[str, Any]:
        await tools.router.call(sid, "plan.complete", {})
        edit = {"path": "tests/test_big.py", "old_string": "a", "new_string": "b" * 100_000,
                "replace_all": True}  # fmt: skip
        return await tools.router.call(sid, "fs.edit", edit)

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    answer = run(harness, body)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert not answer["ok"] and answer["error"]["code"].startswith("policy."), answer
    assert "max_file_size" in answer["error"]["why"] or "100KiB" in answer["error"]["why"]
    assert grown_kib < 200 * 1024  # far below the 2 GB the edited text would take


def _allow_explore(harness: Harness) -> None:
    policy = harness.project / ".fluffy" / "policy.yaml"
    policy.write_text(
        policy.read_text()
        + "\n  - name: explore-ok\n    match: {syscall: session.set_mode, session_mode: [explore]}"
        + "\n    action: allow\n"
    )


def test_the_user_asks_for_tests_at_review_and_the_change_merges_with_them(
    tmp_path: Path,
) -> None:
    from fluffy.errors import WorkflowError
    from fluffy.kernel.policy.engine import Caller

    harness = Harness(tmp_path)
    _allow_explore(harness)
    (harness.project / "pyproject.toml").write_text("[project]\nname = 'x'\n")

    async def body(tools: ToolPath, sid: str) -> list[str]:
        router, workflow = tools.router, tools.router.workflow
        fake = FakePlugins(tmp_path / "outputs", harness.project)
        fake.green = True
        router.runners = replace(router.runners, plugins=fake)
        with pytest.raises(WorkflowError, match="no review to add tests to"):
            await router.flow.add_tests(sid, by="user")
        await workflow.set_mode(sid, "explore", Caller("user"))
        await router.call(sid, "plan.complete", {})  # -> exploring
        await router.call(sid, "fs.write", {"path": "src/app.py", "content": "KEY = 1\n"})
        await router.call(sid, "fs.write", {"path": "pyproject.toml", "content": "[project]\n"})
        green = await router.call(sid, "test.run", {})  # a sensitive file: waits for review
        review = green["output"]["review"]
        assert green["session"]["state"] == "reviewing" and not review["auto_merged"]
        with pytest.raises(MergeConflict, match="not the ones you reviewed"):
            await router.flow.add_tests(sid, by="user", plan_id="0" * 32)
        asked = await router.flow.add_tests(sid, by="user", plan_id=review["plan_id"])
        assert asked["state"] == "retroactive_testing" and asked["kept"]
        assert (harness.project / "src" / "app.py").read_text() == f"KEY = '{SECRET}'\n"
        source = await router.call(sid, "fs.write", {"path": "src/app.py", "content": "X = 2\n"})
        assert source["error"]["code"] == "tool.unavailable"  # tests only, now
        early = await router.call(sid, "test.run", {})  # no test written yet: stays
        assert early["session"]["state"] == "retroactive_testing"
        assert "Tests must have been written" in early["output"]["workflow"][0]["not_taken"]
        test = "def test_x():\n    assert 1\n"
        await router.call(sid, "fs.write", {"path": "tests/test_x.py", "content": test})
        again = await router.call(sid, "test.run", {})  # tests_written, tests_passed
        steps = [s["event"] for s in again["output"]["workflow"] if "to" in s]
        assert steps == ["tests_written", "tests_passed"] and again["session"]["state"] == (
            "reviewing"
        )
        plan = again["output"]["review"]["plan_id"]
        done = await router.flow.approve(sid, by="user", plan_id=plan)
        assert done["state"] == "committing"
        history = await workflow.store.history(sid)
        return [f"{h['event']}:{h['to']}" for h in history]

    history = run(harness, body)
    assert "add_tests:retroactive_testing" in history
    assert history.index("add_tests:retroactive_testing") < history.index(
        "merge_approved:committing"
    )
    assert (harness.project / "src" / "app.py").read_text() == "KEY = 1\n"  # merged together
    assert (harness.project / "tests" / "test_x.py").exists()
    decided = [e for e in harness.entries("state_transition") if "add_tests" in e["input_summary"]]
    assert decided and decided[0]["metadata"]["by"] == "user"


def test_a_strict_change_has_no_add_tests(tmp_path: Path) -> None:
    from fluffy.errors import WorkflowError

    harness = Harness(tmp_path)
    (harness.project / "pyproject.toml").write_text("[project]\nname = 'x'\n")

    async def body(tools: ToolPath, sid: str) -> str:
        router = tools.router
        fake = FakePlugins(tmp_path / "outputs", harness.project)
        router.runners = replace(router.runners, plugins=fake)
        await router.call(sid, "plan.complete", {})
        await router.call(sid, "fs.write", {"path": "tests/test_x.py", "content": "x = 1\n"})
        await router.call(sid, "test.run", {})  # red
        await router.call(sid, "fs.write", {"path": "pyproject.toml", "content": "[project]\n"})
        fake.green = True
        await router.call(sid, "test.run", {})
        with pytest.raises(WorkflowError, match="has its tests already"):
            await router.flow.add_tests(sid, by="user")
        return (await router.workflow.get(sid)).state

    assert run(harness, body) == "reviewing"


def test_the_trial_replays_a_plugin_s_call_with_the_tags_it_was_judged_with(
    tmp_path: Path,
) -> None:
    """A third-party plugin's write is judged with the third_party tag: its tool_result
    entry records that request, so a policy change is tried on what really happened."""
    from fluffy.kernel.policy.audited import recent_requests
    from fluffy.kernel.policy.engine import Caller
    from fluffy.kernel.policy.meta import plan_update

    harness = Harness(tmp_path)
    _allow_explore(harness)

    async def body(tools: ToolPath, sid: str) -> None:
        router = tools.router
        router.runners = replace(
            router.runners, plugins=FakePlugins(tmp_path / "outputs", harness.project)
        )
        router.checks.policy.third_party = lambda: {"fs-tool"}  # type: ignore[attr-defined]
        await router.workflow.set_mode(sid, "explore", Caller("user"))
        await router.call(sid, "plan.complete", {})
        answer = await router.call(sid, "fs.write", {"path": "src/app.py", "content": "X=1\n"})
        assert answer["ok"] and answer["output"]["review_required"]
        await harness.audit.flush()
        text = (harness.project / ".fluffy" / "policy.yaml").read_text()
        lifted = text.replace("caller_tag: [third_party]}", "caller_tag: [nobody]}")
        assert lifted != text
        plan = plan_update(router.checks.policy.engine, lifted, recent_requests(harness.state, 100))
        assert [c.line() for c in plan.changes] == [
            "fs.write src/app.py by fs-tool for the model: require_review -> allow"
        ]

    run(harness, body)


def test_a_refusal_says_where_the_refusing_rule_lives() -> None:
    from fluffy.kernel.tools.routing.authorise import denied_fix

    assert "(.fluffy/rules)" in denied_fix("ext:no-todo") and "no-todo" in denied_fix("ext:no-todo")
    assert "built-in rule" in denied_fix("builtin:policy-files")
    assert ".fluffy/policy.yaml" in denied_fix("write-src") and denied_fix(None) == denied_fix("x")


def test_a_merge_that_fails_before_writing_leaves_nothing_for_the_commit(tmp_path: Path) -> None:
    """The record of what the commit takes is written before the merge: a merge that
    stops before writing (its operation log cannot be created) takes it back, so a later
    commit never holds a change the project does not (review of issue 37's stop)."""
    harness = Harness(tmp_path)

    async def body(tools: ToolPath, sid: str) -> tuple[dict[str, Any], bool]:
        router = tools.router
        fake = FakePlugins(tmp_path / "outputs", harness.project)
        router.runners = replace(router.runners, plugins=fake)
        await router.call(sid, "plan.complete", {})
        await router.call(sid, "fs.write", {"path": "tests/test_x.py", "content": "x = 1\n"})
        await router.call(sid, "test.run", {})
        await router.call(sid, "fs.write", {"path": "pyproject.toml", "content": "[x]\n"})
        fake.green = True
        review = (await router.call(sid, "test.run", {}))["output"]["review"]
        log = router.flow.merger.log.root
        shutil.rmtree(log, ignore_errors=True)
        log.write_text("not a folder")  # the operation cannot be created
        with pytest.raises(FluffyError):
            await router.flow.approve(sid, by="user", plan_id=review["plan_id"])
        landed = router.workspaces.landed(sid)
        return landed.paths(), landed.unsettled()

    paths, unsettled = run(harness, body)
    assert paths == {} and unsettled is False
    assert not (harness.project / "tests" / "test_x.py").exists()
