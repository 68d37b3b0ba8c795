"""The policy's parts on the live path, through the real bootstrap and L1 kernel (Docker
and Podman): a scripted model works the demo task in a kernel started by `fluffy start`
for a project with an extension rule (.fluffy/rules), which refuses one of its writes;
then the user tries policy and rule changes on what the model did (meta-policy trial)
and applies one, which the kernel runs at once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fluffy.ipc.client import SyncClient
from tests.e2e.project_kernel import ROOT, audit, fluffy, project_kernel

pytestmark = pytest.mark.e2e

SCRIPT = ROOT / "examples" / "sessions" / "add-error-handling.yaml"
NO_TODO = """NAME = "no-todo-files"


def evaluate(request):
    if request["syscall"].startswith("fs.") and "TODO" in (request.get("path") or ""):
        return {"vote": "deny", "reason": "TODO files are not kept in this repository"}
    return None
"""
NO_CONFIG_READS = """def evaluate(request):
    if request["syscall"] == "fs.read" and request.get("path") == "src/democonfig/config.py":
        return {"vote": "deny", "reason": "config.py is read by people only"}
"""


def _script(folder: Path) -> Path:
    """The demo task, plus a write the project's extension rule refuses."""
    data = yaml.safe_load(SCRIPT.read_text())
    steps = data["steps"]
    at = next(
        i
        for i, s in enumerate(steps)
        if s["tool"] == "fs.write"
        and s["args"]["path"].startswith("src/")
        and "ConfigError" in s["args"]["content"]
    )
    steps.insert(
        at + 1,
        {
            "say": "Keep a TODO list next to the code.",
            "tool": "fs.write",
            "args": {"path": "src/democonfig/TODO.txt", "content": "- more\n"},
        },
    )
    path = folder / "script.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _prepare(project: Path) -> None:
    policy = project / ".fluffy" / "policy.yaml"  # the design's fs-write-source example
    written = policy.read_text().replace(
        'constraints: {require_sandbox: L2, max_file_size: "100KiB"}',
        'constraints: {require_sandbox: L2, max_file_size: "100KiB", '
        "require_capability_token: true}",
    )
    assert written.count("require_capability_token") >= 2
    policy.write_text(written)
    (project / ".fluffy" / "rules").mkdir()
    (project / ".fluffy" / "rules" / "no-todo.py").write_text(NO_TODO)


@pytest.fixture(scope="module", params=["docker", "podman"])
def worked(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """A running project kernel on which the scripted model has done the demo task."""
    runtime = str(request.param)
    base = tmp_path_factory.mktemp(f"live-{runtime}")
    with project_kernel(runtime, base, _prepare) as kit:
        task = fluffy(
            kit,
            "add error handling",
            "--script",
            str(_script(base)),
            "--yes",
            "--project",
            str(kit["project"]),
        )
        kit["task"] = task
        assert task.returncode == 0, task.stdout[-3000:] + task.stderr[-2000:]
        yield kit


def test_a_policy_change_is_tried_on_the_model_s_decisions(worked: dict[str, Any]) -> None:
    """The model's tool calls ran in the background, outside any socket call; the trial
    still replays them (from their tool_result entries) and counts what would change."""
    policy = worked["project"] / ".fluffy" / "policy.yaml"
    before = policy.read_text()
    # the model wrote tests/ in test_writing; this policy no longer lets it
    strict = before.replace("name: write-tests-while-test-writing", "name: gone").replace(
        'path_glob: ["tests/**"], state_machine_state: [test_writing',
        'path_glob: ["nothing/**"], state_machine_state: [test_writing',
    )
    assert strict != before
    new = worked["base"] / "new-policy.yaml"
    new.write_text(strict)
    tried = fluffy(worked, "config", "policy", "edit", "--project", str(worked["project"]),
                   "--file", str(new), "--json")  # fmt: skip
    assert tried.returncode == 1, tried.stdout + tried.stderr  # no --yes: nothing applied
    plan = json.loads(tried.stdout)
    assert plan["applied"] is False
    assert plan["ai_trial_size"] >= 5, plan  # reads, plan.complete, writes, test runs
    assert plan["ai_changes"] >= 1, plan
    assert any(
        line.startswith("[BREAKING] fs.write tests/") and "for the model" in line
        for line in plan["changes"]
    ), plan
    assert policy.read_text() == before
    results = [e for e in audit(worked, "tool_result") if e["metadata"].get("policy_requests")]
    assert any(e["syscall_type"] == "fs.write" for e in results)


def test_the_project_s_extension_rule_refuses_the_model_by_name(worked: dict[str, Any]) -> None:
    """Loaded into the warmed policy sandbox at start; the model's write is refused, and
    the model and the user both read the rule's name and reason."""
    out = worked["task"].stdout
    assert "TODO files are not kept in this repository" in out, out[-3000:]
    assert "ext:no-todo-files" in out
    assert "extension rule no-todo-files (.fluffy/rules) refuses it" in out  # the fix says where
    assert not (worked["project"] / "src" / "democonfig" / "TODO.txt").exists()
    assert "Committed " in out  # the task went on
    refused = [
        e for e in audit(worked, "tool_result")
        if e["policy_decision"] == "denied" and "TODO.txt" in (e["input_summary"] or "")
    ]  # fmt: skip
    assert refused and "TODO files are not kept" in (refused[0]["output_summary"] or "")
    created = audit(worked, "sandbox_created")
    assert any("policy-sandbox" in (e["input_summary"] or "") for e in created)


def test_a_rule_change_is_loaded_tried_reviewed_and_then_runs(worked: dict[str, Any]) -> None:
    project = worked["project"]
    rule = worked["base"] / "no-config-reads.py"
    rule.write_text(NO_CONFIG_READS)
    args = ("config", "rules", "set", "no-config-reads.py", "--file", str(rule),
            "--project", str(project), "--json")  # fmt: skip
    tried = fluffy(worked, *args)
    assert tried.returncode == 1, tried.stdout + tried.stderr  # not approved: nothing done
    plan = json.loads(tried.stdout)
    assert plan["applied"] is False and plan["ai_changes"] >= 1, plan  # the model's read
    assert any("fs.read src/democonfig/config.py" in line for line in plan["changes"]), plan
    assert not (project / ".fluffy" / "rules" / "no-config-reads.py").exists()
    broken = worked["base"] / "broken.py"
    broken.write_text("def evaluate(request):\n    return 1 +\n")
    refused = fluffy(worked, "config", "rules", "set", "broken.py", "--file", str(broken),
                     "--project", str(project), "--yes")  # fmt: skip
    assert refused.returncode != 0 and "broken.py:2" in refused.stdout + refused.stderr
    applied = fluffy(worked, *args, "--yes")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert (project / ".fluffy" / "rules" / "no-config-reads.py").read_text() == NO_CONFIG_READS
    listed = json.loads(fluffy(worked, "config", "rules", "list", "--project", str(project),
                               "--json").stdout)  # fmt: skip
    assert listed["rules"] == ["no-config-reads.py", "no-todo.py"]
    with SyncClient(str(worked["socket"]), timeout=60) as client:
        sid = client.call("session.create")["session_id"]
        read = client.call("tool.call", {"session_id": sid, "tool": "fs.read",
                                         "args": {"path": "src/democonfig/config.py"}})  # fmt: skip
        assert read["ok"] is False, read
        assert "config.py is read by people only" in read["error"]["why"]
        assert "(rule ext:no-config-reads)" in read["error"]["why"]
        other = client.call("tool.call", {"session_id": sid, "tool": "fs.read",
                                          "args": {"path": "README.md"}})  # fmt: skip
        assert other["ok"] is True, other
    updates = audit(worked, "policy_update")
    assert updates and updates[-1]["metadata"]["rules_changed"] == "no-config-reads.py"


def test_writes_ran_on_capability_tokens_bound_to_their_sandbox(worked: dict[str, Any]) -> None:
    """The project's write rules say require_capability_token (the design's example): each
    write was checked before its token was issued, and its sandbox's change was staged on
    the token -- issued, used once, expired, all in the audit log."""
    writes = [
        e for e in audit(worked, "tool_result")
        if e["syscall_type"] == "fs.write" and e["metadata"].get("capability")
    ]  # fmt: skip
    assert len(writes) >= 2, writes  # the test, then the code
    assert all(e["policy_decision"] == "allowed_by_token" for e in writes)
    assert all(e["metadata"]["capability_ops"] == "1/1" for e in writes)
    issued = {e["metadata"]["token"]: e for e in audit(worked, "capability_issued")}
    expired = {e["metadata"]["token"]: e for e in audit(worked, "capability_expired")}
    for entry in writes:
        token = entry["metadata"]["capability"]
        assert issued[token]["metadata"]["call_id"] == expired[token]["metadata"]["call_id"]
        assert expired[token]["metadata"]["ops_used"] == "1"
        assert issued[token]["sandbox_id"] == entry["sandbox_id"]  # that call's sandbox
