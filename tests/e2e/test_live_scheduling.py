"""Scheduling on the live path (ADR-043, ADR-065), through the real bootstrap and L1
kernel (Docker and Podman): an idle warm-pool sandbox holds no slot of its template, so
other calls run at once and it waits for its own; the policy sandbox and a turn's
ai-provider sandbox are counted by the scheduler (kernel.ping's figures)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fluffy.ipc.client import SyncClient
from tests.e2e.project_kernel import audit, fluffy, project_kernel

pytestmark = pytest.mark.e2e

ALLOW_ALL = "def evaluate(request):\n    return None\n"
SCHEDULER = {
    "global_max": 4,
    # one code-executor slot: an idle pool sandbox must leave it to other calls
    "per_template": {"ai-provider": 1, "code-executor": 1, "policy-sandbox": 1},
    # never drained while the test runs, and not emptied by a busy test machine
    "pool": {"idle_after": "1h", "min_free_memory": 0.0},
}
SCRIPT = {
    "task": "Look at the project",
    "done": "Looked.",
    "steps": [
        {"say": "Reading first.", "tool": "fs.read", "args": {"path": "README.md"}},
        {"say": "And the tree.", "tool": "git.status", "args": {}},
    ],
}


def _prepare(project: Path) -> None:
    (project / ".fluffy" / "rules").mkdir()
    (project / ".fluffy" / "rules" / "allow-all.py").write_text(ALLOW_ALL)
    policy_path = project / ".fluffy" / "policy.yaml"
    policy = yaml.safe_load(policy_path.read_text())
    policy["scheduler"] = SCHEDULER
    policy_path.write_text(yaml.safe_dump(policy, sort_keys=False))


@pytest.fixture(scope="module", params=["docker", "podman"])
def kernel(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """A running project kernel with an extension rule and tight scheduler limits."""
    runtime = str(request.param)
    with project_kernel(runtime, tmp_path_factory.mktemp(f"sched-{runtime}"), _prepare) as kit:
        yield kit


def _ping(kit: dict[str, Any]) -> dict[str, Any]:
    with SyncClient(str(kit["socket"]), timeout=60) as client:
        answer: dict[str, Any] = client.call("kernel.ping")
    return answer


def _wait_for(kit: dict[str, Any], ok: Any, what: str, timeout_s: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    pong = _ping(kit)
    while not ok(pong):
        assert time.monotonic() < deadline, f"{what}: {pong['scheduler']} {pong['memory']}"
        time.sleep(0.2)
        pong = _ping(kit)
    return pong


def test_the_policy_sandbox_holds_a_counted_slot(kernel: dict[str, Any]) -> None:
    figures = _ping(kernel)["scheduler"]
    assert figures["running_by_template"].get("policy-sandbox") == 1, figures
    assert figures["running_by_priority"].get("1") == 1, figures  # system priority
    assert figures["limits"]["per_template"]["code-executor"] == 1


def test_an_idle_pool_sandbox_holds_no_slot_and_waits_for_its_call(
    kernel: dict[str, Any],
) -> None:
    """The pool's idle sandbox runs nothing: it leaves the template's only slot to
    other work (a git.status runs at once) and is still there for the write it was made
    for, which takes it (ADR-065)."""
    with SyncClient(str(kernel["socket"]), timeout=300) as client:
        sid = client.call("session.create")["session_id"]
        client.call("session.message", {"session_id": sid, "text": "look around"})
        done = client.call("tool.call", {"session_id": sid, "tool": "plan.complete",
                                         "args": {"summary": "tests first"}})  # fmt: skip
        assert done["ok"], done  # writes come next: the pool warms an fs-tool sandbox
        idle = _wait_for(
            kernel,
            lambda p: p["memory"]["pool"]["idle"] == 1 and p["memory"]["pool"]["making"] == 0,
            "the pool never made its fs-tool sandbox",
        )
        assert idle["scheduler"]["running_by_template"].get("code-executor") is None, idle
        # the pool's sandbox_created entry is an operational one, committed within the
        # audit log's flush interval (500 ms): wait for it rather than race the flush
        deadline = time.monotonic() + 30
        while True:
            created = [
                e
                for e in audit(kernel, "sandbox_created")
                if e["input_summary"].startswith("code-executor ")
            ]
            if created or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert len(created) == 1, created  # the pool's, idle
        pool_sandbox = created[0]["sandbox_id"]
        # another plugin (git-tool) cannot take it, and need not wait for it
        status = client.call("tool.call", {"session_id": sid, "tool": "git.status",
                                           "args": {}})  # fmt: skip
        assert status["ok"], status
        between = _ping(kernel)
        assert between["memory"]["pool"]["idle"] >= 1, between["memory"]["pool"]
        assert between["scheduler"]["over_limit"] == 0, between["scheduler"]
        # the write it was made for takes it
        probe = {"path": "tests/test_pool_probe.py", "content": "def test_probe():\n    pass\n"}
        write = client.call("tool.call", {"session_id": sid, "tool": "fs.write", "args": probe})
        assert write["ok"], write
        assert write["timings"]["warm"] == 1.0, write["timings"]
    deadline = time.monotonic() + 120  # single use: it goes after the call (in the
    while True:  # background), and its entry names the call it served
        destroyed = [
            e for e in audit(kernel, "sandbox_destroyed") if e["sandbox_id"] == pool_sandbox
        ]
        if destroyed or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    (result,) = [e for e in audit(kernel, "tool_result") if e["syscall_type"] == "fs.write"]
    assert result["sandbox_id"] == pool_sandbox, (result, pool_sandbox)
    assert destroyed, [(e["id"], e["sandbox_id"]) for e in audit(kernel, "sandbox_destroyed")]
    assert destroyed[0]["metadata"]["call_id"] == result["metadata"]["call_id"]


def test_a_turns_ai_provider_sandbox_is_counted(kernel: dict[str, Any]) -> None:
    script = kernel["base"] / "look.yaml"
    script.write_text(yaml.safe_dump(SCRIPT))
    seen: list[dict[str, Any]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                seen.append(_ping(kernel)["scheduler"])
            except Exception:  # the socket is busy; look again
                pass
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        task = fluffy(kernel, "look at the project", "--script", str(script), "--yes",
                      "--project", str(kernel["project"]))  # fmt: skip
    finally:
        stop.set()
        watcher.join(10)
    assert task.returncode == 0, task.stdout[-3000:] + task.stderr[-2000:]
    during = [f for f in seen if f["running_by_template"].get("ai-provider")]
    assert during, seen[-3:]
    assert all(f["running_by_template"]["ai-provider"] == 1 for f in during)  # its limit
    assert all(f["running_by_priority"].get("2", 0) >= 1 for f in during)  # user-facing
    assert _ping(kernel)["scheduler"]["running_by_template"].get("ai-provider") is None
