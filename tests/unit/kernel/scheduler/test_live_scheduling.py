"""Scheduling on the live path (ADR-043): the priority each kind of work gets, and the
order a batch's dependent calls are run in, on a real kernel stack (database, audit,
policy, router; the scripted model in a child process)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace

from fluffy.errors import ToolFailed
from fluffy.kernel.scheduler import PRIORITY_HIGH, PRIORITY_NORMAL
from fluffy.kernel.syscalls.assemble_ai import AiLayer
from fluffy.kernel.syscalls.assemble_tools import ToolPath
from tests.unit.kernel.ai.test_ai_loop import _events, _script
from tests.unit.kernel.ai.test_ai_loop import run as run_ai
from tests.unit.kernel.tools.test_tool_router import Harness, run

pytestmark = pytest.mark.unit


class Recorder:
    """Stands for the scheduler: records (template, priority) and fails the call (no
    engine here: what matters is what the router asked for)."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []

    async def __call__(
        self, template: str, key: str, work: Callable[[], Awaitable[Any]], priority: int
    ) -> Any:
        self.asked.append((template, priority))
        raise ToolFailed("no sandbox in this test")


def _recording(tools: ToolPath) -> Recorder:
    recorder = Recorder()
    tools.router.runners = replace(tools.router.runners, schedule=recorder)
    tools.router.runners = replace(tools.router.runners, plugins=object())
    return recorder


def test_a_clients_tool_call_runs_at_normal_priority(tmp_path: Path) -> None:
    async def body(tools: ToolPath, sid: str) -> list[tuple[str, int]]:
        recorder = _recording(tools)
        answer = await tools.router.call(sid, "git.status", {})
        assert not answer["ok"]
        return recorder.asked

    assert run(Harness(tmp_path), body) == [("code-executor", PRIORITY_NORMAL)]


def test_a_model_turns_calls_run_at_high_priority(tmp_path: Path) -> None:
    provider = _script(("Checking the tree.", [("git.status", {})]), ("Done.", []))

    async def body(tools: ToolPath, ai: AiLayer, sid: str) -> list[tuple[str, int]]:
        recorder = _recording(tools)
        await ai.loop.start(sid, "Look around", provider)
        await _events(ai, sid)
        return recorder.asked

    assert run_ai(Harness(tmp_path), body) == [("code-executor", PRIORITY_HIGH)]


def test_a_turns_ai_provider_sandbox_holds_a_counted_slot(tmp_path: Path) -> None:
    provider = _script(("Checking the tree.", [("git.status", {})]), ("Done.", []))
    seen: list[dict[str, Any]] = []

    async def body(tools: ToolPath, ai: AiLayer, sid: str) -> dict[str, Any]:
        recorder = _recording(tools)

        async def look(*args: Any) -> Any:
            seen.append(tools.scheduler.figures())  # while the turn is running
            return await recorder(*args)

        tools.router.runners = replace(tools.router.runners, schedule=look)
        await ai.loop.start(sid, "Look around", provider)
        await _events(ai, sid)
        await asyncio.sleep(0.05)
        return tools.scheduler.figures()

    after = run_ai(Harness(tmp_path), body)
    (during,) = seen
    assert during["running_by_template"] == {"ai-provider": 1}
    assert during["running_by_priority"] == {str(PRIORITY_HIGH): 1}
    assert after["running_by_template"] == {}  # released with its sandbox


class FakeHost:
    """An ExtensionHost without a container."""

    def __init__(self, manager: Any, rules_dir: Path) -> None:
        self.rules_dir = rules_dir
        self.release_slot: Callable[[], None] | None = None
        self.stopped = False

    def start(self) -> None:
        return None

    def stop(self) -> None:
        self.stopped = True


def test_the_policy_sandbox_reserves_its_slot_without_queueing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fluffy.kernel.policy import rules as rules_module
    from fluffy.kernel.policy.tool_settings import SchedulerSettings
    from fluffy.kernel.tools.routing.scheduling import SchedulerBridge

    monkeypatch.setattr(rules_module, "ExtensionHost", FakeHost)
    folder = tmp_path / "rules"
    folder.mkdir()
    (folder / "r.py").write_text("def evaluate(request):\n    return None\n")

    async def main() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        bridge = SchedulerBridge(SchedulerSettings(), None, lambda: True)
        await bridge.start()
        # the template's one slot and every other slot are taken by user work
        gate = asyncio.Event()

        async def work() -> None:
            await gate.wait()

        calls = [
            asyncio.ensure_future(bridge.schedule("code-executor", f"c{i}", work, 3))
            for i in range(2)
        ]
        turns = [
            await bridge.lease("ai-provider", f"t{i}", priority=2, kind="ai_generate")
            for i in range(2)
        ]
        await asyncio.sleep(0.05)
        rules = rules_module.ProjectRules(
            folder,
            lambda: None,  # type: ignore[arg-type,return-value]
            tmp_path / "scratch",
            reserve=bridge.reserver("policy-sandbox", "validate"),
        )
        await asyncio.to_thread(rules.load)  # as the kernel does: off the event loop
        loaded = bridge.figures()
        await asyncio.to_thread(rules.close)
        await asyncio.sleep(0.05)
        closed = bridge.figures()
        gate.set()
        await asyncio.gather(*calls)
        for lease in turns:
            lease.release()
        await asyncio.sleep(0.05)
        empty = bridge.figures()
        await bridge.close()
        return loaded, closed, empty

    loaded, closed, empty = asyncio.run(main())
    assert loaded["running_by_template"] == {
        "code-executor": 2,
        "ai-provider": 2,
        "policy-sandbox": 1,
    }
    assert loaded["running_by_priority"]["1"] == 1
    assert loaded["over_limit"] == 1  # 5 slots held, global_max 4: said, not hidden
    assert closed["running_by_template"] == {"code-executor": 2, "ai-provider": 2}
    assert empty["running_by_template"] == {}


def test_tool_status_and_ping_show_the_scheduler_by_priority(tmp_path: Path) -> None:
    from fluffy.kernel.ipc.server import KernelServer
    from fluffy.kernel.ipc.syscalls import SyscallTable
    from fluffy.kernel.syscalls.kernel import PingParams, ping

    async def body(tools: ToolPath, sid: str) -> tuple[dict[str, Any], dict[str, Any]]:
        lease = await tools.scheduler.lease("ai-provider", "t", priority=2, kind="ai_generate")
        status = await tools.methods()["tool.status"](None, None)  # type: ignore[arg-type]
        server = KernelServer(SyscallTable())
        server.scheduler = tools.scheduler.figures

        class Context:
            peer = type("Peer", (), {"pid": 1, "uid": 0, "gid": 0})()
            binding, plugin_name, api_version, container_id = "cli", None, 1, None

            def identity(self) -> dict[str, Any]:
                return {"binding": self.binding}

        Context.server = server  # type: ignore[attr-defined]
        pong = ping(Context(), PingParams())  # type: ignore[arg-type]
        lease.release()
        return status["scheduler"], pong["scheduler"]

    status, pong = run(Harness(tmp_path), body)
    for figures in (status, pong):
        assert figures["running_by_template"] == {"ai-provider": 1}
        assert figures["running_by_priority"] == {"2": 1}
        assert figures["queued_by_priority"] == {}
        assert figures["limits"]["per_template"]["ai-provider"] == 2


# -- a response's dependent calls (run_ordered) ----------------------------------------


def _ordered(
    kinds: list[tuple[str, frozenset[str], frozenset[str], bool]],
    fail: set[int],
) -> tuple[list[dict[str, Any]], list[str]]:
    from fluffy.kernel.tools.routing.parallel import PlannedCall
    from fluffy.kernel.tools.routing.scheduling import run_ordered

    log: list[str] = []
    planned = [PlannedCall(i, reads, writes) for i, (_, reads, writes, _) in enumerate(kinds)]
    tools = [k[0] for k in kinds]

    async def run(i: int) -> dict[str, Any]:
        log.append(f"start {i}")
        await asyncio.sleep(0.02)
        log.append(f"end {i}")
        return {"ok": i not in fail, "error": {"what": "boom"} if i in fail else None}

    async def refuse(i: int, error: Any) -> dict[str, Any]:
        log.append(f"refused {i}")
        return {"ok": False, "error": error.to_dict()}

    async def main() -> list[dict[str, Any]]:
        return await run_ordered(
            None, planned, tools, [k[3] for k in kinds], run, refuse, priority=2
        )

    return asyncio.run(main()), log


WRITE = ("fs.write", frozenset({"src/a.py"}), frozenset({"src/a.py"}), True)
TEST = ("test.run", frozenset({""}), frozenset(), True)
READ_A = ("fs.read", frozenset({"src/a.py"}), frozenset(), False)
READ_B = ("fs.read", frozenset({"src/b.py"}), frozenset(), False)


def test_a_test_run_waits_for_the_write_it_depends_on() -> None:
    answers, log = _ordered([WRITE, READ_B, TEST], fail=set())
    assert all(a["ok"] for a in answers)
    assert log.index("end 0") < log.index("start 2")  # the dependency
    assert log.index("start 1") < log.index("end 0")  # no conflict: side by side


def test_a_failed_write_fails_the_test_run_with_the_reason() -> None:
    answers, log = _ordered([WRITE, TEST], fail={0})
    assert "start 1" not in log and "refused 1" in log
    error = answers[1]["error"]
    assert error["code"] == "scheduler.dependency_failed"
    assert error["what"].startswith("dependency failed: fs.write#0@")
    assert "fs.write (call 0 of the response) failed" in error["why"]
    assert answers[0] == {"ok": False, "error": {"what": "boom"}}  # its own answer


def test_a_failed_read_still_lets_the_write_after_it_run() -> None:
    answers, log = _ordered([READ_A, WRITE], fail={0})
    assert log.index("end 0") < log.index("start 1")  # ordered: read before write
    assert answers[1]["ok"]


def test_a_batch_refuses_a_call_whose_write_failed_and_audits_it(tmp_path: Path) -> None:
    harness = Harness(tmp_path)

    async def body(tools: ToolPath, sid: str) -> list[dict[str, Any]]:
        # planning: the write is refused (tests come after plan.complete)
        return await tools.router.batch(
            sid,
            [
                {"tool": "fs.write", "args": {"path": "tests/test_a.py", "content": "x"}},
                {"tool": "test.run", "args": {}},
            ],
        )

    write, test = run(harness, body)
    assert not write["ok"] and write["error"]["code"] != "scheduler.dependency_failed"
    assert test["error"]["code"] == "scheduler.dependency_failed", test
    assert test["error"]["what"].startswith("dependency failed: fs.write#0@")
    results = [e for e in harness.entries("tool_result") if e["syscall_type"] == "test.run"]
    assert results and "dependency failed" in (results[-1]["output_summary"] or "")


def test_a_turns_dependent_call_is_refused_when_its_write_failed(tmp_path: Path) -> None:
    provider = _script(
        (
            "Writing a test and running it.",
            [("fs.write", {"path": "tests/test_a.py", "content": "x"}), ("test.run", {})],
        ),
        ("Done.", []),
    )

    async def body(tools: ToolPath, ai: AiLayer, sid: str) -> list[dict[str, Any]]:
        await ai.loop.start(sid, "Test first", provider)
        return await _events(ai, sid)

    events = run_ai(Harness(tmp_path), body)
    results = {e["tool_name"]: e for e in events if e["type"] == "tool_result"}
    assert not results["fs.write"]["ok"]
    assert results["test.run"]["error"]["code"] == "scheduler.dependency_failed"
    assert events[-1]["status"] == "done"
