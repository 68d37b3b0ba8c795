"""The user's TDD decisions through the real bootstrap and L1 kernel, on Docker and Podman:
the coverage baseline file a strict commit writes, an explore change sent back for tests at
its review (reviewing -> retroactive_testing -> merge) with a small coverage drop that is
not "ok", and an exemption the AI asks for, held until the user grants it with
`fluffy exemption grant`.  A scripted model drives each turn over the kernel's socket."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from fluffy.demo_session import init_repository
from tests.conftest import connect_engine
from tests.e2e.project_kernel import Session, call

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo-project"
FLUFFY = str(Path(sys.executable).parent / "fluffy")
EXPLORE = """
  - name: explore-allowed
    match: {syscall: session.set_mode, session_mode: [explore]}
    action: allow
"""
#: A tool's settings whose hooks run shell commands on the user's machine (issue 31).
HOOKS = '{"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "touch /tmp/owned"}]}]}}\n'
#: 60 lines the tests run on import, and one they never reach: a drop of about one point.
EXTRA = "".join(f"A{n} = {n}\n" for n in range(60)) + (
    "\n\ndef triple(x: int) -> int:\n    return 3 * x\n\n\ndef unused() -> int:\n    return 1\n"
)
EXTRA_TEST = "from democonfig.extra import A59, triple\n\n\ndef test_triple():\n" + (
    "    assert triple(3) == 9 and A59 == 59\n"
)


@pytest.fixture(scope="module", params=["docker", "podman"])
def kernel_image(request: pytest.FixtureRequest) -> tuple[str, str]:
    from fluffy.images.builder import build_images

    with connect_engine(request.param) as connected:
        refs = {status.name: status.ref for status in build_images(connected)}
    return str(request.param), refs["kernel"]


def _strict_turns() -> list[dict[str, Any]]:
    steps = yaml.safe_load((ROOT / "examples/sessions/add-error-handling.yaml").read_text())
    return [
        {"say": s.get("say", ""), "calls": [{"tool": s["tool"], "args": s.get("args", {})}]}
        for s in steps["steps"]
    ]


def _audit(env: dict[str, str], home: Path, kind: str) -> list[dict[str, Any]]:
    (state,) = list((home / "projects").glob("*/state"))
    out = subprocess.run(
        [FLUFFY, "audit", "log", "--state-dir", str(state), "--type", kind, "--json"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return list(json.loads(out.stdout)["entries"])


def test_tests_first_exemptions_and_the_baseline_file_on_a_real_kernel(
    tmp_path: Path, kernel_image: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime, image = kernel_image
    project = tmp_path / "project"
    shutil.copytree(DEMO, project)
    policy = project / ".fluffy" / "policy.yaml"
    policy.write_text(policy.read_text() + EXPLORE)
    init_repository(project)
    if os.getuid() == 0:
        for path in [project, *project.rglob("*")]:
            os.lchown(path, 1000, 1000)
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update(FLUFFY_HOME=str(home), FLUFFY_KERNEL_IMAGE=image, FLUFFY_RUNTIME=runtime)
    for key in ("FLUFFY_HOME", "FLUFFY_KERNEL_IMAGE", "FLUFFY_RUNTIME"):
        monkeypatch.setenv(key, env[key])
    started = subprocess.run(
        [FLUFFY, "start", "--project", str(project), "--json"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        from fluffy.bootstrap.supervisor import paths
        from fluffy.ipc.client import SyncClient

        sock = paths(home, str(project))["run"] / "kernel.sock"
        with SyncClient(str(sock), timeout=300) as client:
            _strict_commit_writes_the_baseline(client, project)
            _explore_change_gets_tests_at_its_review(client, project, env, home)
            _ai_exemption_waits_for_the_user(client, project, env, home)
    finally:
        subprocess.run(
            [FLUFFY, "stop", "--project", str(project)], env=env, capture_output=True, timeout=120
        )


def _strict_commit_writes_the_baseline(client: Any, project: Path) -> None:
    baseline = project / ".fluffy" / "coverage-baseline.json"
    assert not baseline.exists()
    strict = Session(client)
    strict.start("Add error handling to parseConfig", _strict_turns(), auto_approve=True)
    end = strict.until("turn_end")
    assert end["status"] == "done", strict.events[-6:]
    assert strict.state() == "idle"
    written = json.loads(baseline.read_text())
    assert written["covered_lines"] > 0 and written["percent"] > 90
    assert written["written_by"].startswith("fluffy kernel")
    budget = client.call("session.budget", {"session_id": strict.id})
    assert budget["baseline"] == pytest.approx(written["percent"], abs=1e-3)
    assert budget["baseline_file"] == ".fluffy/coverage-baseline.json" and not budget["notes"]


def _explore_change_gets_tests_at_its_review(
    client: Any, project: Path, env: dict[str, str], home: Path
) -> None:
    before = json.loads((project / ".fluffy" / "coverage-baseline.json").read_text())["percent"]
    pyproject = (project / "pyproject.toml").read_text() + "# triple added\n"
    explore = Session(client, "explore")
    turns: list[dict[str, Any]] = [
        {"say": "Planning.", "calls": [call("plan.complete", summary="add triple")]},
        {"say": "The change.", "calls": [
            call("fs.write", path="src/democonfig/extra.py", content=EXTRA),
            call("fs.write", path="pyproject.toml", content=pyproject),
            call("fs.write", path=".claude/settings.json", content=HOOKS)]},
        {"say": "Run the tests.", "calls": [call("test.run")]},
        # the review round: the model asks for tests; the user decides
        {"say": "triple has no test.", "calls": [call("workflow.add_tests",
                                                       reason="triple is untested")]},
        {"say": "The test.", "calls": [
            call("fs.write", path="tests/test_extra.py", content=EXTRA_TEST)]},
        {"say": "Run them again.", "calls": [call("test.run")]},
        {"say": "It has its test now.", "calls": []},  # the second review's round
        {"say": "Commit.", "calls": [call("git.commit", message="Add triple, with a test")]},
    ]  # fmt: skip
    explore.start("add triple", turns, auto_approve=False)
    review = explore.until("review")  # pyproject.toml is sensitive: a person reviews
    assert review["can_add_tests"] and review["tests_requested"] == "triple is untested"
    # a tool's settings outside the code and tests wait for a person, --yes or not (ADR-054)
    assert review["needs_person"] is True and ".claude/settings.json" in review["files"]
    assert any(r.startswith(".claude/settings.json: a dotfile") for r in review["reasons"])
    assert not (project / ".claude").exists()
    assert explore.state() == "reviewing"
    client.call("review.add_tests", {"session_id": explore.id, "plan_id": review["plan_id"]})
    again = explore.until("review")
    states = [(e["from"], e["to"]) for e in explore.events if e["type"] == "state"]
    assert ("reviewing", "retroactive_testing") in states
    assert ("retroactive_testing", "validating") in states
    assert "tests/test_extra.py" in again["files"] and not again.get("tests_requested")
    assert not (project / "src" / "democonfig" / "extra.py").exists()  # nothing merged yet
    client.call("review.approve", {"session_id": explore.id, "plan_id": again["plan_id"]})
    end = explore.until("turn_end")
    assert end["status"] == "done", explore.events[-6:]
    assert explore.state() == "idle"
    assert (project / "tests" / "test_extra.py").read_text() == EXTRA_TEST
    # one line of 60-odd new ones is never run: coverage fell a little, and that is not ok
    notices = [e["what"] for e in explore.events if e["type"] == "notice"]
    dropped = [n for n in notices if "below min_delta" in n]
    assert dropped and "coverage fell" in dropped[0], notices
    merges = _audit(env, home, "merge_approved")
    assert "below min_delta" in merges[-1]["metadata"]["budget"]
    after = json.loads((project / ".fluffy" / "coverage-baseline.json").read_text())["percent"]
    assert after == before  # an explore commit never moves the baseline


def _ai_exemption_waits_for_the_user(
    client: Any, project: Path, env: dict[str, str], home: Path
) -> None:
    docs = Session(client)
    asked = {"category": "documentation", "paths": ["README.md"], "reason": "a typo"}
    turns: list[dict[str, Any]] = [
        {"say": "Only the README.", "calls": [call("workflow.request_exemption", **asked)]},
        {"say": "Granted; fixing the typo now.", "calls": []},
    ]
    docs.start("fix the README typo", turns, auto_approve=True)  # --yes never grants it
    shown = docs.until("exemption")
    assert (shown["category"], shown["paths"]) == ("documentation", ["README.md"])
    time.sleep(2)  # the turn waits; nothing is granted on the model's say
    session = client.call("session.get", {"session_id": docs.id})
    assert session["state"] == "planning" and session["exemption"] is None
    assert session["exemption_pending"]["reason"] == "a typo"
    assert session["exemption_pending"]["request_id"] == shown["request_id"]
    grant_argv = [FLUFFY, "exemption", "grant", "--project", str(project), "--session", docs.id]
    blind = subprocess.run(grant_argv, env=env, capture_output=True, text=True, timeout=120)
    assert blind.returncode != 0 and "name the request you grant with --id" in blind.stderr
    granted = subprocess.run(
        [*grant_argv, "--id", shown["request_id"]],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert granted.returncode == 0, granted.stdout + granted.stderr
    assert "exemption granted: documentation for README.md" in granted.stdout
    end = docs.until("turn_end")
    assert end["status"] == "done"
    session = client.call("session.get", {"session_id": docs.id})
    assert session["state"] == "exploring" and session["exemption"]["category"] == "documentation"
    requested = [e for e in _audit(env, home, "exemption_requested") if e["session_id"] == docs.id]
    assert [(e["caller"], e["output_summary"]) for e in requested] == [("ai", "held for review")]
    assert requested[0]["metadata"]["request_id"] == shown["request_id"]
    (grant,) = [e for e in _audit(env, home, "exemption_granted") if e["session_id"] == docs.id]
    assert grant["caller"] == "user" and grant["metadata"]["requested_by"] == "ai"
    assert grant["metadata"]["request_id"] == shown["request_id"]
    client.call("session.cancel", {"session_id": docs.id})
