"""Debug mode as the design has it, through the real bootstrap and L1 kernel (Docker and
Podman): a scripted model asks the person for debug mode (``workflow.request_mode``) and
gets it, then runs the project's module with ``container.run``; the person is shown the
command and allows it; a rule added with `fluffy config policy edit` then
lets the same command run without asking, and the audit log names the rule and the
sandbox of each run (issue 33, ADR-062)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fluffy.ipc.client import SyncClient
from tests.e2e.project_kernel import audit, fluffy, project_kernel
from tests.e2e.test_tdd_decisions import Session

pytestmark = pytest.mark.e2e

MAIN = "import sys\nprint('democonfig says hello', *sys.argv[1:])\n"
RULE = """  - name: run-the-module
    match: {syscall: container.run, command: ["python -m democonfig **"]}
    action: allow

"""


@pytest.fixture(scope="module", params=["docker", "podman"])
def kit(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp(f"debug-{request.param}")

    def prepare(project: Path) -> None:
        (project / "src" / "democonfig" / "__main__.py").write_text(MAIN)

    with project_kernel(str(request.param), base, prepare) as kit:
        client = SyncClient(str(kit["socket"]), timeout=600)
        with client:
            kit["client"] = client
            yield kit


def _run(*argv: str) -> dict[str, Any]:
    return {"tool": "container.run", "args": {"argv": list(argv)}}


def _results(session: Session) -> list[dict[str, Any]]:
    return [
        e
        for e in session.events
        if e["type"] == "tool_result" and e["tool_name"] == "container.run"
    ]


def test_the_module_runs_reviewed_then_allowed_by_a_rule(kit: dict[str, Any]) -> None:
    client = kit["client"]
    session = Session(client)  # strict: the model asks the person for debug mode
    ask = {"mode": "debug", "reason": "to run the module and read what it prints"}
    session.start("why does the module print that?", [
        {"say": "I need to run it.", "calls": [{"tool": "workflow.request_mode", "args": ask}]},
        {"say": "Planning.", "calls": [{"tool": "plan.complete", "args": {"summary": "run it"}}]},
        {"say": "Run it.", "calls": [_run("python", "-m", "democonfig")]},
        {"say": "It greets.", "calls": []},
    ], auto_approve=True)  # fmt: skip  # --yes approves merges, never a command
    asked = session.until("tool_review")
    assert asked["tool"] == "workflow.request_mode" and "from strict to debug" in asked["reason"]
    client.call("tool.decide", {"session_id": session.id, "review_id": asked["review_id"],
                                "decision": "allow"})  # fmt: skip
    shown = session.until("tool_review")
    assert client.call("session.get", {"session_id": session.id})["mode"] == "debug"
    assert shown["tool"] == "container.run" and shown["command"] == "python -m democonfig"
    assert "commands the model runs ask the person" in shown["reason"]
    client.call("tool.decide", {"session_id": session.id, "review_id": shown["review_id"],
                                "decision": "allow"})  # fmt: skip
    assert session.until("turn_end")["status"] == "done", session.events[-6:]
    (first,) = _results(session)
    assert first["ok"], first
    assert first["summary"].startswith("exit code 0 in ")
    assert "| democonfig says hello" in first["summary"]

    policy = kit["project"] / ".fluffy" / "policy.yaml"
    new = kit["base"] / "policy-with-rule.yaml"
    new.write_text(policy.read_text().replace("capabilities:\n", "capabilities:\n" + RULE, 1))
    edited = fluffy(kit, "config", "policy", "edit", "--project", str(kit["project"]),
                    "--file", str(new), "--yes", "--json")  # fmt: skip
    assert edited.returncode == 0, edited.stdout + edited.stderr
    assert json.loads(edited.stdout)["applied"] is True

    seen = len(session.events)
    session.start("and with an argument?", [
        {"say": "Again.", "calls": [_run("python", "-m", "democonfig", "--twice")]},
        {"say": "Same greeting.", "calls": []},
    ], auto_approve=True)  # fmt: skip
    assert session.until("turn_end")["status"] == "done", session.events[-6:]
    assert not [e for e in session.events[seen:] if e["type"] == "tool_review"]
    second = _results(session)[-1]
    assert second["ok"] and "| democonfig says hello --twice" in second["summary"], second

    entries = [e for e in audit(kit, "tool_result") if e["syscall_type"] == "container.run"]
    assert [(e["policy_decision"], e["policy_rule_name"], e["metadata"].get("review"))
            for e in entries] == [
        ("review_required", None, "allowed once by the user"),
        ("allowed", "run-the-module", None),
    ]  # fmt: skip
    created = {e["sandbox_id"] for e in audit(kit, "sandbox_created")}
    assert all(e["sandbox_id"] in created for e in entries)
    assert entries[0]["sandbox_id"] != entries[1]["sandbox_id"]  # a fresh sandbox each
