"""The policy's parts on the live path, through the real bootstrap and L1 kernel (Docker
and Podman): a scripted model works the demo task in a kernel started by `fluffy start`,
then the user tries a policy change on what the model did (meta-policy trial)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fluffy.demo_session import init_repository
from tests.conftest import connect_engine

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo-project"
SCRIPT = ROOT / "examples" / "sessions" / "add-error-handling.yaml"
FLUFFY = str(Path(sys.executable).parent / "fluffy")


@pytest.fixture(scope="module", params=["docker", "podman"])
def worked(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """A running project kernel on which the scripted model has done the demo task."""
    from fluffy.bootstrap.supervisor import paths
    from fluffy.images.builder import build_images

    runtime = str(request.param)
    with connect_engine(runtime) as connected:
        image = {status.name: status.ref for status in build_images(connected)}["kernel"]
    base = tmp_path_factory.mktemp(f"live-{runtime}")
    project = base / "project"
    shutil.copytree(DEMO, project)
    init_repository(project)
    if os.getuid() == 0:  # a user's project is theirs: the kernel runs as its owner
        for path in [project, *project.rglob("*")]:
            os.lchown(path, 1000, 1000)
    home = base / "home"
    env = {
        **{k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")},
        "FLUFFY_HOME": str(home),
        "FLUFFY_KERNEL_IMAGE": image,
        "FLUFFY_RUNTIME": runtime,
    }
    kit: dict[str, Any] = {
        "project": project,
        "env": env,
        "state": paths(home, str(project))["state"],
        "base": base,
    }
    started = fluffy(kit, "start", "--project", str(project))
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        task = fluffy(
            kit, "add error handling", "--script", str(SCRIPT), "--yes", "--project", str(project)
        )
        kit["task"] = task
        assert task.returncode == 0, task.stdout[-3000:] + task.stderr[-2000:]
        yield kit
    finally:
        fluffy(kit, "stop", "--project", str(project))


def fluffy(
    kit: dict[str, Any], *args: str, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FLUFFY, *args],
        env=kit["env"],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def audit(kit: dict[str, Any], event_type: str) -> list[dict[str, Any]]:
    out = fluffy(kit, "audit", "log", "--state-dir", str(kit["state"]), "--type", event_type,
                 "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    return list(json.loads(out.stdout)["entries"])


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
