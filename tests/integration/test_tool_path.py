"""The design's end-to-end scenario, phases 3-7, over the kernel's IPC with a real engine.

No AI: the test plays the model's tool calls.  Every write runs in an L2 sandbox of
fs-tool, tests in test-tool, the commit in git-tool; the project changes only through
the kernel's merge.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fluffy.demo_session import git
from tests.conftest import connect_engine
from tests.integration.tool_support import Kernel, call, demo_project

NEW_TEST = """import pytest

from democonfig import parse_config


def test_line_without_equals_is_an_error() -> None:
    with pytest.raises(ValueError, match="line 2"):
        parse_config("a = 1\\nbroken\\n")
"""

CODE = '''"""Parse `key = value` configuration text."""


class ConfigError(ValueError):
    """A line of the configuration is not `key = value`."""


def parse_config(text: str) -> dict[str, str]:
    """Return the settings in ``text``; blank lines and `#` comments are skipped."""
    settings: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            raise ConfigError(f"line {number}: expected `key = value`, got {line!r}")
        key, value = line.split("=", 1)
        settings[key.strip()] = value.strip()
    return settings
'''


STEPS = (
    "plan_complete: planning -> test_writing",
    "tests_red: test_writing -> code_writing",
    "code_changed: code_writing -> validating",
    "tests_passed: validating -> reviewing",
    "merge_approved: reviewing -> committing",
    "commit_complete: committing -> idle",
)


@pytest.fixture(scope="module", params=["docker", "podman"])
def runtime(request: pytest.FixtureRequest) -> str:
    from fluffy.images.builder import build_images

    with connect_engine(request.param) as connected:
        build_images(connected)
    return str(request.param)


def _tree(project: Path) -> dict[str, tuple[str, int]]:
    """Every file of the project (.git included): content hash and mode."""
    import hashlib

    return {
        p.relative_to(project).as_posix(): (
            hashlib.sha256(p.read_bytes()).hexdigest(),
            p.stat().st_mode,
        )
        for p in sorted(project.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def _ok(answer: dict[str, Any]) -> dict[str, Any]:
    assert answer["ok"], answer.get("error")
    output: dict[str, Any] = answer["output"]
    return output


def _state(answer: dict[str, Any]) -> str:
    return str(answer["session"]["state"])


def test_tdd_flow_through_sandboxes_merge_and_commit(tmp_path: Path, runtime: str) -> None:
    project = demo_project(tmp_path)
    head_before = git(project, "rev-parse", "HEAD").strip()
    original_code = (project / "src/democonfig/config.py").read_text()
    untouched = _tree(project)
    kernel = Kernel(tmp_path, project, runtime).start()
    try:
        with kernel.client() as client:
            sid = client.call("session.create")["session_id"]
            assert (
                client.call("session.message", {"session_id": sid, "text": "errors"})["state"]
                == "planning"
            )
            # phase 2: a fast-path read
            read = call(client, sid, "fs.read", path="/src/democonfig/config.py")
            assert read["route"] == "fast"
            assert _ok(read)["content"] == original_code
            # phase 3: tests first; a source write is refused with ToolUnavailableError
            assert _state(call(client, sid, "plan.complete")) == "test_writing"
            refused = call(client, sid, "fs.write", path="src/democonfig/config.py", content=CODE)
            assert not refused["ok"]
            error = refused["error"]
            assert error["error"] == "tool_unavailable"
            assert error["tool_name"] == "fs.write"
            assert error["current_state"] == "test_writing"
            assert "fs.read" in error["available_tools"]
            assert "tests" in error["reason"]
            wrote = call(client, sid, "fs.write", path="tests/test_errors.py", content=NEW_TEST)
            assert wrote["route"] == "plugin"
            assert _ok(wrote)["staged"] == ["tests/test_errors.py"]
            assert not (project / "tests/test_errors.py").exists()  # staged, not merged
            # the view shows the staged file to reads
            assert _ok(call(client, sid, "fs.read", path="tests/test_errors.py"))["staged"]
            # run it red (on an assertion: the message names no line yet)
            red = call(client, sid, "test.run")
            out = _ok(red)
            assert out["counts"]["failed"] == 1, out
            assert out["failed"][0]["id"].endswith("test_line_without_equals_is_an_error")
            assert _state(red) == "code_writing", out["workflow"]
            # phase 4: the code
            code = call(client, sid, "fs.write", path="src/democonfig/config.py", content=CODE)
            assert _ok(code)["staged"] == ["src/democonfig/config.py"]
            assert (project / "src/democonfig/config.py").read_text() == original_code
            # the invariant: reads, writes and test runs never wrote the project
            assert _tree(project) == untouched
            # phase 5-6: green, reviewing, auto-merge (tests pass, small, nothing sensitive)
            green = call(client, sid, "test.run")
            out = _ok(green)
            assert out["counts"]["failed"] == 0 and out["counts"]["passed"] == 4, out
            assert out["review"]["auto_merged"], out["review"]
            assert _state(green) == "committing"
            assert (project / "src/democonfig/config.py").read_text() == CODE
            assert (project / "tests/test_errors.py").read_text() == NEW_TEST
            # phase 7: commit with git-tool; the kernel merges the objects and the ref
            commit = call(client, sid, "git.commit", message="Add error handling to parseConfig")
            out = _ok(commit)
            assert _state(commit) == "idle"
        log = git(project, "log", "--format=%H %P %s", "-n", "2").splitlines()
        assert log[0].split() == [out["commit"], head_before, "Add", "error", "handling",
                                  "to", "parseConfig"]  # fmt: skip
        assert git(project, "status", "--porcelain") == ""
        subprocess_check = git(project, "fsck", "--no-progress")
        assert "error" not in subprocess_check
    finally:
        kernel.stop()
    # the audit log shows each step and verifies
    transitions = [e["input_summary"] for e in kernel.entries("state_transition")]
    for step in STEPS:
        assert any(t.startswith(step) for t in transitions), (step, transitions)
    assert len(kernel.entries("merge_approved")) == 1
    results = kernel.entries("tool_result")
    assert {e["syscall_type"] for e in results} >= {"fs.read", "fs.write", "test.run", "git.commit"}
    verify = kernel.audit("verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr


SOURCES = {f"src/democonfig/extra_{i}.py": f"VALUE_{i} = {i}\n" for i in range(4)}


@pytest.fixture(scope="module")
def docker_runtime() -> str:
    """The merge is the kernel's own work; one engine is enough to stage the files."""
    from fluffy.images.builder import build_images

    with connect_engine("docker") as connected:
        build_images(connected)
    return "docker"


def test_the_search_tool_runs_in_its_sandbox_with_gitignore_globs(
    tmp_path: Path, runtime: str
) -> None:
    # with the kernel's fast path off, search.* run in the search-tool's L2 sandbox: its
    # globs are pathspec's (the code-executor image carries it), as the fast path's are
    project = demo_project(tmp_path)
    policy = project / ".fluffy" / "policy.yaml"
    policy.write_text(policy.read_text() + "\ntools: {fast_path: false}\n")
    kernel = Kernel(tmp_path, project, runtime).start()
    try:
        with kernel.client() as client:
            sid = client.call("session.create")["session_id"]
            client.call("session.message", {"session_id": sid, "text": "look"})
            found = call(client, sid, "search.glob", pattern="tests/test_*.py")
            assert found["route"] == "plugin" and "create_ms" in found["timings"], found
            assert _ok(found)["paths"] == ["tests/test_config.py"]
            folder = _ok(call(client, sid, "search.glob", pattern="src"))["paths"]
            assert "src/democonfig/config.py" in folder  # a folder: what is inside it
            hits = _ok(call(client, sid, "search.grep", pattern="def parse_config", glob="*.py"))
            assert [m["path"] for m in hits["matches"]] == ["src/democonfig/config.py"]
            refused = call(client, sid, "search.glob", pattern="!*.py")
            assert not refused["ok"] and "exclusion" in json.dumps(refused["error"])
    finally:
        kernel.stop()


def test_kernel_killed_in_the_middle_of_a_merge_completes_it_once(
    tmp_path: Path, docker_runtime: str
) -> None:
    project = demo_project(tmp_path)
    kernel = Kernel(tmp_path, project, docker_runtime)
    # every merge step slowed by 0.4 s: a window to kill the kernel in the middle
    root = str(Path(__file__).resolve().parents[2])
    kernel.env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, kernel.env.get("PYTHONPATH")]))
    kernel.launcher = [sys.executable, "-m", "tests.integration.slow_merge_kernel", "0.4"]
    kernel.start()
    with kernel.client() as client:
        sid = client.call("session.create")["session_id"]
        client.call("session.message", {"session_id": sid, "text": "extras"})
        call(client, sid, "plan.complete")
        _ok(call(client, sid, "fs.write", path="tests/test_errors.py", content=NEW_TEST))
        assert _state(call(client, sid, "test.run")) == "code_writing"
        _ok(call(client, sid, "fs.write", path="src/democonfig/config.py", content=CODE))
        for path, text in SOURCES.items():
            _ok(call(client, sid, "fs.write", path=path, content=text))

    def run_green() -> None:  # auto-merges; the kernel dies under it
        try:
            with kernel.client() as runner:
                call(runner, sid, "test.run")
        except Exception:
            pass

    import threading

    merges = kernel.state / "merges"
    worker = threading.Thread(target=run_green, daemon=True)
    worker.start()
    deadline = time.monotonic() + 180

    def mid_merge() -> bool:
        for op in merges.glob("*.json") if merges.exists() else []:
            data = json.loads(op.read_text())
            if data["status"] == "in_progress" and data["completed_steps"]:
                return True
        return False

    while not mid_merge():
        assert time.monotonic() < deadline, "the merge never started"
        time.sleep(0.02)
    kernel.kill()
    worker.join(timeout=30)
    intended = {"src/democonfig/config.py": CODE, "tests/test_errors.py": NEW_TEST, **SOURCES}
    done = [
        p for p, t in intended.items() if (project / p).is_file() and (project / p).read_text() == t
    ]
    assert 0 < len(done) < len(intended), done  # really interrupted in the middle
    # restart: the operation log completes the merge, the session moves on, once
    kernel.launcher = Kernel(tmp_path, project, docker_runtime).launcher  # full speed
    kernel.start()
    with kernel.client() as client:
        session = client.call("session.get", {"session_id": sid})
        # the commit holds what the merge recorded before the kill (issue 32), no more
        (project / "untracked-notes.txt").write_text("the person's\n")
        committed = call(client, sid, "git.commit", message="Add extras")
    kernel.stop()
    assert session["state"] == "committing"
    assert committed["ok"], committed.get("error")
    assert sorted(committed["output"]["files"]) == sorted(
        ["src/democonfig/config.py", "tests/test_errors.py", *SOURCES]
    )
    for path, text in intended.items():
        assert (project / path).read_text() == text
    operations = [json.loads(p.read_text()) for p in merges.glob("*.json")]
    operations = [op for op in operations if op["kind"] == "files"]  # not the commit's
    assert [op["status"] for op in operations] == ["completed"]
    steps = operations[0]["completed_steps"]
    assert len(steps) == len(set(steps))  # no step applied twice
    assert len(kernel.entries("merge_approved")) == 1
    assert not list(project.rglob(".*.fluffy-*.tmp"))  # no temp file left behind
    verify = kernel.audit("verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr


BENCH_ARGS = ["--n", "50", "--plugin-n", "3", "--think-ms", "400", "--test-files", "300"]


def test_the_tools_benchmark_measures_plugin_overhead(docker_runtime: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.tools", "--json", *BENCH_ARGS],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "FLUFFY_RUNTIME": docker_runtime},
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["engine"] == "docker" and result["plugin_n"] == 3
    assert 0 < result["plugin_call_overhead_p50_ms"] < result["plugin_call_total_p50_ms"]
    # paced writes find a warm sandbox; the baselines are measured in the same run
    assert result["fs_write_warm_share"] > 0 and result["raw_exec_p50_ms"] > 0
    cold = result["fs_write_cold_p50_ms"]  # back-to-back calls that found the pool empty
    assert cold is None or result["fs_write_p50_ms"] < cold
    assert result["pool_idle_sandboxes"] >= 1 and result["pool_idle_memory_mib_per_sandbox"] > 0
    assert result["test_run_files"] >= 300 and result["test_run_direct_p50_ms"] > 0
    ratio = result["test_run_p50_ms"] / result["test_run_direct_p50_ms"]
    assert abs(result["test_run_overhead_ratio"] - ratio) < 0.02
