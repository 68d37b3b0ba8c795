"""JavaScript projects on Docker and Podman: the environment is built from each lock file
(npm's, pnpm's, yarn's; archives from a registry on loopback, checked against the lock),
Node runs the suite in the sandbox through fluffy's JUnit reporter, a test importing a
function the code lacks is a natural red, and the change merges and commits.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fluffy.images.environment import ensure_environment
from fluffy.images.npmfetch import REGISTRY_VARIABLE
from fluffy.images.templates import template_images
from tests.conftest import connect_engine
from tests.integration.test_project_shapes import play
from tests.integration.tool_support import Kernel, git
from tests.node_support import SCRIPT_MARK, node_project, npm_registry
from tests.project_support import GIT

pytestmark = pytest.mark.integration

TEST = (
    "import { test } from 'node:test';\nimport assert from 'node:assert/strict';\n"
    "import { triple } from '../src/calc.js';\n\n"
    "test('triple', () => {\n  assert.equal(triple(3), 9);\n});\n"
)
CODE = (
    "import { pad } from 'tinyfmt';\n\nexport function show(x) {\n  return pad(String(x), 3);\n}\n"
    "\nexport function triple(x) {\n  return 3 * x;\n}\n"
)
STEPS: list[dict[str, Any]] = [
    {"tool": "plan.complete", "args": {"summary": "triple, test first"}},
    {"tool": "fs.write", "args": {"path": "test/triple.test.js", "content": TEST}},
    {"tool": "test.run", "args": {"paths": ["test/triple.test.js"]},
     "expect": {"state": "code_writing"}},
    {"tool": "fs.write", "args": {"path": "src/calc.js", "content": CODE}},
    {"tool": "test.run", "args": {}, "expect": {"state": "committing"}},
    {"tool": "git.commit", "args": {"message": "Add triple"}, "expect": {"state": "idle"}},
]  # fmt: skip


def committed_project(root: Path, manager: str, extra: dict[str, str] | None = None) -> Path:
    """A Node project (tests/node_support.py) with ``extra`` files, committed once."""
    node_project(root, manager)
    for rel, text in (extra or {}).items():
        (root / rel).write_text(text)
    env = {**os.environ, **GIT}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "initial"]):
        subprocess.run(["git", "-C", str(root), *args], check=True, env=env, capture_output=True)
    return root


def environment(runtime: str, project: Path, state: Path) -> tuple[Any, bool]:
    with connect_engine(runtime) as engine:
        return ensure_environment(engine, project, state, template_images(engine)["code-executor"])


@pytest.fixture(scope="module")
def registry() -> Iterator[tuple[str, list[str]]]:
    with npm_registry() as served:
        yield served


@pytest.fixture(scope="module", params=["docker", "podman"])
def runtime(request: pytest.FixtureRequest) -> str:
    from fluffy.images.builder import build_images

    with connect_engine(request.param) as connected:
        build_images(connected)  # and the Node wheel, as `fluffy images build` fetches it
    return str(request.param)


@pytest.mark.parametrize("manager", ["npm", "pnpm", "yarn"])
def test_a_node_project_of_each_lock_goes_red_green_and_commits(
    tmp_path: Path, runtime: str, manager: str, registry: tuple[str, list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    url, _asked = registry
    monkeypatch.setenv(REGISTRY_VARIABLE, url)
    project = committed_project(tmp_path / "repo", manager)
    (project / ".env").write_text("TOKEN=mine\n")  # the person's own file: never committed
    record, built = environment(runtime, project, tmp_path / "state")
    assert built and record is not None and record.node == "v24"
    assert record.packages == {"tinyfmt": "1.0.0", "tinycore": "2.0.0"}
    assert not record.refused
    assert not (project / "node_modules").exists()  # the person's tree is untouched
    assert not Path(SCRIPT_MARK).exists()  # no install script ran on this host...
    ran = [w for w in record.warnings if "install script(s) ran in the build" in w]
    assert ran and "tinycore@2.0.0: preinstall" in ran[0], record.warnings  # ...but in the build
    kernel = Kernel(tmp_path, project, runtime).start()
    try:
        answers = play(kernel, STEPS)
    finally:
        kernel.stop()
    red, green = answers[2]["output"], answers[4]["output"]
    assert red["red"] is True and "fail on missing code" in red["red_reason"], red
    assert "does not provide an export named 'triple'" in red["red_reason"]
    assert green["exit_code"] == 0 and green["counts"]["failed"] == 0, green["output_tail"]
    assert green["counts"]["passed"] == 2, green["output_tail"]  # the old test and the new
    assert git(project, "log", "-1", "--format=%s") == "Add triple"
    assert git(project, "status", "--porcelain") == "?? .env"
    assert "triple" in (project / "src/calc.js").read_text()


def test_a_type_error_on_code_the_project_has_is_not_red(
    tmp_path: Path, runtime: str, registry: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only an assertion, or code the tree lacks, is red: a test that fails with a
    TypeError on a function the project has (a wrong first test) is not."""
    url, _asked = registry
    monkeypatch.setenv(REGISTRY_VARIABLE, url)
    project = committed_project(tmp_path / "repo", "npm")
    environment(runtime, project, tmp_path / "state")
    not_red = (
        "import { test } from 'node:test';\nimport { show } from '../src/calc.js';\n\n"
        "test('show', () => {\n  show.call(null)();\n});\n"  # TypeError on code it has
    )
    steps = [
        {"tool": "plan.complete", "args": {"summary": "a wrong first test"}},
        {"tool": "fs.write", "args": {"path": "test/x.test.js", "content": not_red}},
        {"tool": "test.run", "args": {"paths": ["test/x.test.js"]},
         "expect": {"state": "test_writing"}},
    ]  # fmt: skip
    kernel = Kernel(tmp_path, project, runtime).start()
    try:
        answers = play(kernel, steps)
    finally:
        kernel.stop()
    verdict = answers[2]["output"]
    assert verdict["red"] is False, verdict
    assert (
        verdict["counts"]["failed"] == 1 and "is not a function" in verdict["failed"][0]["message"]
    )


def test_a_failure_the_project_had_before_the_change_does_not_block_it(
    tmp_path: Path, runtime: str, registry: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Green relative to the base: a test failing on the project as it was is reported as
    failing before the change too, and the change merges and commits."""
    url, _asked = registry
    monkeypatch.setenv(REGISTRY_VARIABLE, url)
    broken = (
        "import { test } from 'node:test';\nimport assert from 'node:assert/strict';\n\n"
        "test('known broken', () => {\n  assert.equal(1, 2);\n});\n"
    )
    project = committed_project(tmp_path / "repo", "npm", {"test/flaky.test.js": broken})
    environment(runtime, project, tmp_path / "state")
    kernel = Kernel(tmp_path, project, runtime).start()
    try:
        answers = play(kernel, STEPS)
    finally:
        kernel.stop()
    green = answers[4]["output"]
    assert green["failed"] == [] and green["counts"]["failed"] == 1, green
    assert green["preexisting"]["ids"] == ["test/flaky.test.js::known broken"], green
    assert git(project, "log", "-1", "--format=%s") == "Add triple"
