"""Users' repositories of each shape, on Docker and Podman: the environment is built from
their own files (downloads from a package index on loopback), the suite runs green
through test.run in the sandbox, a natural red is red, and a change merges and commits.

Shapes: a src layout with a runtime dependency, a test extra and an installed project
whose build generates ``_version.py``; a flat layout with a dependency group; requirements
files; a lock file pinning an older version; no dependencies at all.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fluffy.errors import EnvironmentFailed
from fluffy.images.environment import ensure_environment
from fluffy.images.spec import REQUIREMENTS_DIR
from fluffy.images.templates import template_images
from fluffy.images.wheelhouse import ensure_wheelhouse, linux_arch
from tests.conftest import connect_engine
from tests.integration.tool_support import Kernel, git
from tests.project_support import fixture_wheels, local_index, pip_env, session_steps, shape


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from fluffy.kernel.containers.engine import connect

    with connect() as engine:
        arch = linux_arch(engine.info.arch)
    wheelhouse = ensure_wheelhouse(REQUIREMENTS_DIR / "code-executor.lock", arch)
    folder = tmp_path_factory.mktemp("index")
    fixture_wheels(folder, wheelhouse)
    with local_index(folder) as url:
        yield url


@pytest.fixture(scope="module", params=["docker", "podman"])
def runtime(request: pytest.FixtureRequest) -> str:
    from fluffy.images.builder import build_images

    with connect_engine(request.param) as connected:
        build_images(connected)
    return str(request.param)


def build_env(
    project: Path, state: Path, runtime: str, index: str, monkeypatch: pytest.MonkeyPatch
) -> Any:
    for key, value in pip_env(index).items():
        monkeypatch.setenv(key, value)
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        if key not in pip_env(index):
            monkeypatch.delenv(key)
    with connect_engine(runtime) as engine:
        base = template_images(engine)["code-executor"]
        return ensure_environment(engine, project, state, base)


def play(kernel: Kernel, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    answers = []
    with kernel.client() as client:
        sid = client.call("session.create")["session_id"]
        client.call("session.message", {"session_id": sid, "text": "add triple"})
        for step in steps:
            answer = client.call(
                "tool.call", {"session_id": sid, "tool": step["tool"], "args": step["args"]}
            )
            assert answer["ok"], (step, answer.get("error"))
            expect = step.get("expect") or {}
            if "state" in expect:
                assert answer["session"]["state"] == expect["state"], (step, answer["output"])
            answers.append(answer)
    return answers


@pytest.mark.parametrize("kind", ["src", "flat", "requirements", "lock", "plain"])
def test_a_repository_of_each_shape_goes_green_and_merges(
    tmp_path: Path, runtime: str, index: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "repo"
    where = shape(project, kind)
    state = tmp_path / "state"
    record, built = build_env(project, state, runtime, index, monkeypatch)
    if kind == "plain":
        assert record is None and not built  # nothing to install: fluffy's own image
    else:
        assert built and record is not None
        names = {name.lower() for name in record.packages}
        assert {"pytest", "coverage"} <= names
    if kind == "src":
        assert record.project_installed and record.generated == ["src/calc/_version.py"]
        assert {"fixturelib", "fixturedep", "fixturetest"} <= names
        assert not (project / "src/calc/_version.py").exists()  # never in the user's tree
    if kind == "lock":
        assert record.packages["fixturedep"] == "1.0"  # pinned by uv.lock; 2.0 is newest
    kernel = Kernel(tmp_path, project, runtime).start()
    try:
        answers = play(kernel, session_steps(where))
    finally:
        kernel.stop()
    red, green = answers[2]["output"], answers[4]["output"]
    assert red["red"] is True and red["red_reason"].startswith("red: ")
    assert "fail on missing code" in red["red_reason"]
    assert green["exit_code"] == 0 and green["counts"]["failed"] == 0
    assert green["counts"]["passed"] == 2, green["output_tail"]  # the old test and the new
    assert "environment" not in green  # current: no note
    assert (project / where["code"]).read_text() == "def triple(x):\n    return 3 * x\n"
    assert git(project, "log", "-1", "--format=%s") == "Add triple"
    assert git(project, "status", "--porcelain") == ""


def test_a_package_without_a_wheel_is_named_with_the_fix(
    tmp_path: Path, runtime: str, index: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fixturesrc has only an sdist, which would build with setuptools (it declares no
    backend), and the index has no setuptools wheel: the error names both, with the ways
    out, and nothing is recorded."""
    project = tmp_path / "repo"
    project.mkdir()
    (project / "requirements.txt").write_text("fixturelib\nfixturesrc\n")
    with pytest.raises(EnvironmentFailed) as caught:
        build_env(project, tmp_path / "state", runtime, index, monkeypatch)
    error = caught.value
    assert "fixturesrc-1.0.tar.gz from source" in error.what and ".fluffy/wheels/" in error.fix
    assert "setuptools" in error.what  # what it lacks: no wheel of its build backend here
    assert not (tmp_path / "state" / "envs" / "built").exists() or not any(
        (tmp_path / "state" / "envs" / "built").rglob("*.whl")
    )
    assert not list((tmp_path / "state" / "envs").glob("*/env.json"))  # nothing recorded


def test_a_stale_environment_is_used_and_said(
    tmp_path: Path, runtime: str, index: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dependency file changed since the build: the tests run in the last environment,
    and the result says it predates the change."""
    project = tmp_path / "repo"
    shape(project, "flat")
    state = tmp_path / "state"
    build_env(project, state, runtime, index, monkeypatch)
    with (project / "pyproject.toml").open("a") as handle:
        handle.write("# a comment changes the file\n")
    kernel = Kernel(tmp_path, project, runtime).start()
    try:
        with kernel.client() as client:
            sid = client.call("session.create")["session_id"]
            client.call("session.message", {"session_id": sid, "text": "x"})
            client.call("tool.call", {"session_id": sid, "tool": "plan.complete", "args": {}})
            answer = client.call("tool.call", {"session_id": sid, "tool": "test.run", "args": {}})
            info = client.call("project.info")
    finally:
        kernel.stop()
    assert answer["output"]["counts"]["passed"] == 1  # the dependency group is there
    assert "predates the change to pyproject.toml" in answer["output"]["environment"]
    assert info["environment"]["current"] is False and info["policy"]["default"] is True


def test_sandbox_run_uses_the_projects_environment(
    tmp_path: Path, runtime: str, index: str
) -> None:
    """`fluffy sandbox run` reproduces a test run by hand: the project's environment by
    default (its dependencies import), fluffy's own image with --no-env (issue 33)."""
    import sys

    fluffy = str(Path(sys.executable).parent / "fluffy")
    project = tmp_path / "repo"
    shape(project, "requirements")
    env = {**pip_env(index), "FLUFFY_HOME": str(tmp_path / "home"), "FLUFFY_RUNTIME": runtime}
    built = subprocess.run([fluffy, "env", "build", "--project", str(project)], env=env,
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    probe = ["python", "-c", "import fixturelib; print(fixturelib.double(21))"]
    ran = subprocess.run(
        [fluffy, "sandbox", "run", "--template", "code-executor", "--project", str(project),
         "--", *probe],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert ran.returncode == 0 and ran.stdout.strip() == "42", ran.stdout + ran.stderr
    assert "the project's test environment fluffy/env-" in ran.stderr
    bare = subprocess.run(
        [fluffy, "sandbox", "run", "--template", "code-executor", "--project", str(project),
         "--no-env", "--", *probe],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert bare.returncode != 0 and "ModuleNotFoundError" in bare.stdout + bare.stderr
