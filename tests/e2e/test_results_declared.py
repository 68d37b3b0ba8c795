"""Every syscall the kernel serves answers its declared result type, on a real kernel.

The L1 kernel started by `fluffy start` (the real bootstrap, Docker) type-checks each
result it sends (``FLUFFY_CHECK_RESULTS=1``, set by tests/conftest.py and passed on by
the bootstrap): a result its declaration (fluffy/ipc/results/) does not allow fails the
call.  This test calls every method of the served table at least once, in the states
where they say the most: sessions driven by a scripted model through a review that gets
tests added and is approved, one that is rejected, a call held for the user, an
exemption the AI asks for, a plugin's install plan and a policy change's plan.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fluffy.ipc.client import SyncClient
from tests.e2e.project_kernel import Session, call, project_kernel
from tests.unit.kernel_table import served_table

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
EXPLORE = """
  - name: explore-allowed
    match: {syscall: session.set_mode, session_mode: [explore]}
    action: allow
"""
CODE = "def triple(x: int) -> int:\n    return 3 * x\n"
TEST = "from democonfig.extra import triple\n\n\ndef test_triple():\n    assert triple(3) == 9\n"
#: a change to the project's configuration: a person reviews it, --yes or not
PYPROJECT = (ROOT / "examples" / "demo-project" / "pyproject.toml").read_text() + "# changed\n"


class Calls:
    """The kernel's client, noting every method it called."""

    def __init__(self, client: SyncClient) -> None:
        self.client = client
        self.called: set[str] = set()

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        self.called.add(method)
        return self.client.call(method, params)


def _allow_explore(project: Path) -> None:
    policy = project / ".fluffy" / "policy.yaml"
    policy.write_text(policy.read_text() + EXPLORE)


def test_every_served_syscall_answers_its_declared_type(tmp_path: Path) -> None:
    with (
        project_kernel("docker", tmp_path, _allow_explore) as kit,
        SyncClient(str(kit["socket"]), timeout=300) as client,
    ):
        calls = Calls(client)
        _kernel_wide(calls)
        _a_session_at_rest(calls)
        _explore_review_with_tests_added(calls)
        _strict_review_rejected(calls)
        _held_call_and_exemption(calls)
    served = {syscall.name for syscall in served_table().syscalls()}
    assert served - calls.called == set()


def _kernel_wide(calls: Calls) -> None:
    assert calls.call("kernel.ping")["pong"] is True
    calls.call("audit.flush")
    policy = calls.call("policy.get")
    planned = calls.call("policy.update", {"text": policy["text"]})  # a plan: not applied
    assert planned["applied"] is False
    assert calls.call("project.info")["layout"]["language"] == "python"
    assert calls.call("tool.list")["tools"]
    calls.call("tool.status")
    assert calls.call("mcp.list")["servers"] == []
    calls.call("mcp.reload")
    from fluffy.host.plugins import encode_files, read_tree

    source = ROOT / "examples" / "plugins" / "lint-tool"
    files = encode_files(read_tree(source))
    asked = calls.call("plugin.install", {"source": str(source), "files": files})
    assert asked["approved"] is False and asked["plan"]["name"] == "lint-tool"


def _a_session_at_rest(calls: Calls) -> None:
    session = Session(calls)  # Session calls through ``calls`` as its client
    sid = session.id
    assert calls.call("session.get", {"session_id": sid})["state"] == "idle"
    assert calls.call("session.get")["session_id"] == sid  # the latest
    calls.call("session.pin", {"session_id": sid, "text": "keep parse_config pure"})
    calls.call("session.pin", {"session_id": sid, "text": "second"})
    assert calls.call("session.unpin", {"session_id": sid, "index": 1})["pins"] == [
        "keep parse_config pure"
    ]
    calls.call("session.pins", {"session_id": sid})
    calls.call("session.instructions", {"session_id": sid})
    calls.call("session.budget", {"session_id": sid})
    calls.call("session.usage", {"session_id": sid})
    calls.call("tool.list", {"session_id": sid})
    read = calls.call(
        "tool.call",
        {"session_id": sid, "tool": "fs.read", "args": {"path": "src/democonfig/config.py"}},
    )
    assert read["ok"] is True
    batch = [{"tool": "fs.list", "args": {"path": "src"}}, {"tool": "fs.read", "args": {}}]
    answers = calls.call("tool.batch", {"session_id": sid, "calls": batch})
    assert [a["ok"] for a in answers] == [True, False]  # a refused call is an answer too
    assert calls.call("tool.pending", {"session_id": sid})["pending"] is None
    session.start("hello", [{"say": "Hello.", "calls": []}], auto_approve=False)
    assert session.until("turn_end")["status"] == "done"  # planning now
    granted = calls.call(
        "workflow.request_exemption",
        {"session_id": sid, "category": "documentation", "paths": ["README.md"],
         "reason": "a typo"},
    )  # fmt: skip
    assert granted["exemption"]["category"] == "documentation"
    calls.call("session.lift_quarantine", {"session_id": sid})
    calls.call("session.history", {"session_id": sid})
    calls.call("session.list", {"limit": 5})
    calls.call("session.cancel", {"session_id": sid})


def _explore_review_with_tests_added(calls: Calls) -> None:
    session = Session(calls, "explore")
    turns = [
        {"say": "Planning.", "calls": [call("plan.complete", summary="add triple")]},
        {"say": "The change.", "calls": [
            call("fs.write", path="src/democonfig/extra.py", content=CODE),
            call("fs.write", path="pyproject.toml", content=PYPROJECT)]},
        {"say": "Run the tests.", "calls": [call("test.run")]},
        {"say": "triple has no test.", "calls": [call("workflow.add_tests",
                                                      reason="triple is untested")]},
        {"say": "The test.", "calls": [call("fs.write", path="tests/test_extra.py",
                                            content=TEST)]},
        {"say": "Run them again.", "calls": [call("test.run")]},
        {"say": "It has its test now.", "calls": []},
    ]  # fmt: skip
    session.start("add triple", turns, auto_approve=False)
    review = session.until("review")
    calls.call("review.show", {"session_id": session.id})
    calls.call("review.add_tests", {"session_id": session.id, "plan_id": review["plan_id"]})
    again = session.until("review")
    approved = calls.call("review.approve", {"session_id": session.id, "plan_id": again["plan_id"]})
    assert "src/democonfig/extra.py" in approved["merged"]
    assert session.until("turn_end")["status"] == "done", session.events[-6:]
    calls.call("session.usage", {"session_id": session.id})  # after a turn's requests
    calls.call("session.budget", {"session_id": session.id})  # after a test run


def _strict_review_rejected(calls: Calls) -> None:
    session = Session(calls)
    turns = [
        {"say": "Planning.", "calls": [call("plan.complete", summary="a README line")]},
        {"say": "A test first.", "calls": [call("fs.write", path="tests/test_more.py",
                                                content=TEST.replace("extra", "more"))]},
        {"say": "Red.", "calls": [call("test.run")]},
        {"say": "The code.", "calls": [
            call("fs.write", path="src/democonfig/more.py", content=CODE),
            call("fs.write", path="pyproject.toml", content=PYPROJECT)]},
        {"say": "Green.", "calls": [call("test.run")]},
        {"say": "Done.", "calls": []},
    ]  # fmt: skip
    session.start("add more", turns, auto_approve=False)
    review = session.until("review")
    rejected = calls.call("review.reject", {"session_id": session.id, "plan_id": review["plan_id"]})
    assert rejected["discarded"] is True
    session.until("turn_end")


def _held_call_and_exemption(calls: Calls) -> None:
    session = Session(calls)
    asked = {"category": "documentation", "paths": ["README.md"], "reason": "a typo"}
    turns = [
        {"say": "Another mode?", "calls": [call("workflow.request_mode", mode="explore",
                                                reason="a spike")]},
        {"say": "Only the README, then.", "calls": [call("workflow.request_exemption",
                                                         **asked)]},
        {"say": "Understood.", "calls": []},
    ]  # fmt: skip
    session.start("fix the README typo", turns, auto_approve=False)
    session.until("tool_review")
    held = calls.call("tool.pending", {"session_id": session.id})["pending"]
    calls.call(
        "tool.decide",
        {"session_id": session.id, "review_id": held["review_id"], "decision": "deny"},
    )
    shown = session.until("exemption")
    decided = calls.call(
        "workflow.decide_exemption",
        {"session_id": session.id, "grant": False, "request_id": shown["request_id"]},
    )
    assert decided["exemption"] is None
    session.until("turn_end")
    calls.call("session.events", {"session_id": session.id, "after": 0})
