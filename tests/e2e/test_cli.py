"""The installed `fluffy` command and the scripts, run as a user runs them."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLUFFY = str(Path(sys.executable).parent / "fluffy")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "FLUFFY_MUST_WORK")}
    env.update(extra)
    return env


def _fluffy(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FLUFFY, *args],
        capture_output=True,
        text=True,
        env=env or _env(),
        timeout=600,
        stdin=subprocess.DEVNULL,
    )


def test_doctor_json_names_the_engine(engine: object, images: dict[str, str]) -> None:
    proc = _fluffy("doctor", "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stdout
    assert report["ok"] is True
    assert report["engine"]["engine"] in ("docker", "podman")
    assert report["engine"]["socket"].startswith("unix://")
    names = {c["name"]: c["status"] for c in report["checks"]}
    assert all(names[f"image:{n}"] == "ok" for n in images)
    sandboxes = {n: s for n, s in names.items() if n.startswith("sandbox:")}
    assert sandboxes == {
        f"sandbox:{t}": "ok"
        for t in (
            "ai-provider",
            "code-executor",
            "policy-sandbox",
            "integration-test",
            "mcp-server",
        )
    }


@pytest.fixture()
def stopped_engine(tmp_path: Path) -> dict[str, str]:
    """An engine socket nobody answers on: what a stopped daemon leaves behind."""
    path = tmp_path / "docker.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()
    return _env(FLUFFY_RUNTIME="docker", DOCKER_HOST=f"unix://{path}")


def test_doctor_with_the_engine_stopped_fails_with_a_fix(stopped_engine: dict[str, str]) -> None:
    proc = _fluffy("doctor", env=stopped_engine)
    assert proc.returncode == 1
    assert "FAIL engine" in proc.stdout and "refused" in proc.stdout
    assert "fix:" in proc.stdout and "docker" in proc.stdout


def test_demo_runs_the_project_tests_in_a_sandbox(engine: object, images: dict[str, str]) -> None:
    proc = _fluffy("demo", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["ok"] is True and result["probe_failures"] == {}
    assert "3 passed" in result["tests"]["output"]
    assert result["image"] == images["code-executor"]


def test_demo_session_plays_the_scenario_through_the_l1_kernel(
    engine: object, images: dict[str, str], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    env = _env(FLUFFY_HOME=str(home), FLUFFY_KERNEL_IMAGE=images["kernel"])
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "FLUFFY_API_KEY", "FLUFFY_BASE_URL"):
        env.pop(key, None)  # offline: the scripted provider
    proc = _fluffy("demo", "--session", "--json", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["ok"] and result["audit_verified"] and len(result["commit"]) == 40
    assert result["provider"] == "scripted" and result["status"] == "done"
    steps = result["calls"]
    assert [s["tool"] for s in steps][:3] == ["fs.read", "plan.complete", "fs.write"]
    assert steps[2]["ok"] is False  # the early source write was refused, as scripted
    assert all(s["problem"] is None for s in steps)
    assert [s["state"] for s in steps][-3:] == ["code_writing", "committing", "idle"]
    project = Path(result["project"])
    assert project.is_relative_to(home)  # a fresh copy: the shipped demo is never changed
    log = subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", str(project), "log", "--format=%H %s"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert log[0] == f"{result['commit']} Add error handling to parseConfig"
    assert "class ConfigError" in (project / "src" / "democonfig" / "config.py").read_text()
    shipped = ROOT / "examples" / "demo-project" / "src" / "democonfig" / "config.py"
    assert "ConfigError" not in shipped.read_text()


def test_the_demo_session_shows_the_task_once(
    tmp_path: Path, engine: object, images: dict[str, str]
) -> None:
    env = _env(FLUFFY_HOME=str(tmp_path / "home"), FLUFFY_KERNEL_IMAGE=images["kernel"])
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "FLUFFY_API_KEY", "FLUFFY_BASE_URL"):
        env.pop(key, None)
    proc = _fluffy("demo", "--session", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("You: Add error handling to parseConfig") == 1, proc.stdout


def test_a_broken_session_script_is_refused_with_its_place(tmp_path: Path) -> None:
    script = tmp_path / "bad.yaml"
    script.write_text("task: x\nsteps:\n  - tool: fs.read\n    argz: {}\n")
    proc = _fluffy(
        "demo", "--session", "--script", str(script), env=_env(FLUFFY_HOME=str(tmp_path))
    )
    assert proc.returncode == 3  # an error (what, why, fix), not a failed demo
    assert "steps.0.argz" in proc.stdout + proc.stderr and "Fix:" in proc.stderr


def test_setup_again_changes_nothing(engine: object, images: dict[str, str]) -> None:
    for _ in range(2):  # the first run may finish an install; the second must do nothing
        proc = subprocess.run(
            ["bash", str(ROOT / "scripts" / "setup")],
            capture_output=True,
            text=True,
            env=_env(),
            timeout=600,
            stdin=subprocess.DEVNULL,
        )
        assert proc.returncode == 0, proc.stderr
    assert "fluffy is installed" in proc.stderr
    assert "installing" not in proc.stderr and "building" not in proc.stdout
    assert proc.stdout.count("current") == len(images)


def test_setup_without_an_engine_prints_the_install_guide(tmp_path: Path) -> None:
    # --no-system: behave as for a user who may not install packages (not root).
    env = _env(FLUFFY_RUNTIME="docker", DOCKER_HOST=f"unix://{tmp_path}/none.sock")
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup"), "--no-images", "--no-system"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 1, proc.stderr
    assert "ERROR: no container engine answers" in proc.stderr
    assert "apt install docker.io" in proc.stderr and "dnf install podman" in proc.stderr


@pytest.mark.parametrize(
    ("ci", "expected_rc", "word"), [("true", 1, "FLUFFY_MUST_WORK"), ("", 0, "skipped")]
)
def test_ci_turns_a_missing_engine_into_a_failure(
    stopped_engine: dict[str, str], ci: str, expected_rc: int, word: str
) -> None:
    env = dict(stopped_engine)
    if ci:
        env["CI"] = ci
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/integration/test_engine.py::test_connected_engine_reports_itself",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == expected_rc, proc.stdout
    assert word in proc.stdout


def _left_behind(engine: object, output: str) -> list[str]:
    """fluffy's containers whose id the sandbox printed as its hostname: none once the run
    is over.  (Asked by id, not by counting every fluffy container: other tests' sandboxes
    come and go meanwhile.)"""
    hostname = re.search(r"^host=([0-9a-f]{12})$", output, re.M)
    assert hostname, output
    api = engine.client.api  # type: ignore[attr-defined]
    filters = {"id": hostname.group(1), "label": "org.fluffy.managed=1"}
    return [c["Id"] for c in api.containers(all=True, filters=filters)]


def test_sandbox_run_streams_output_and_returns_the_exit_code(
    engine: object, images: dict[str, str]
) -> None:
    proc = _fluffy(
        "sandbox",
        "run",
        "--template",
        "code-executor",
        "--project",
        str(ROOT / "examples" / "demo-project"),
        "--",
        "sh",
        "-c",
        "echo out-line; echo host=$(hostname); ls /workspace; id -u; exit 3",
    )
    assert proc.returncode == 3, proc.stderr
    assert "out-line" in proc.stdout and "pyproject.toml" in proc.stdout
    assert "10001" in proc.stdout
    assert _left_behind(engine, proc.stdout) == []  # cleaned up


def test_sandbox_run_kills_at_the_timeout(engine: object, images: dict[str, str]) -> None:
    proc = _fluffy(
        "sandbox", "run", "--template", "code-executor", "--timeout", "1", "--",
        "sh", "-c", "echo host=$(hostname); sleep 30",
    )  # fmt: skip
    assert proc.returncode == 124
    assert "ran past 1s" in proc.stderr and "Fix:" in proc.stderr
    assert _left_behind(engine, proc.stdout) == []


def test_sandbox_run_without_a_command_explains(engine: object) -> None:
    proc = _fluffy("sandbox", "run", "--template", "code-executor")
    assert proc.returncode == 3
    assert "no command given" in proc.stderr and "Fix:" in proc.stderr
