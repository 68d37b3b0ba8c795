"""What a test run is prepared with: a JavaScript project's runner or its own command,
read as a JavaScript report -- never pytest in a JavaScript project."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fluffy.errors import ConfigError
from fluffy.kernel.project.layout import Layout, detect_layout
from fluffy.kernel.project.nodelayout import NodeFacts
from fluffy.kernel.project.testcmd import approve as approve_command
from fluffy.kernel.project.testcmd import load_test_command
from fluffy.kernel.tools.testing.testprep import TestPreparer
from unit.trees import write_tree

pytestmark = pytest.mark.unit

MOCHA_COMMAND = """\
tests:
  command: [node, /node_modules/mocha/bin/mocha.js, --reporter, xunit, --reporter-option,
            "output={junit}", test/test.js]
"""


class Views:
    """The session views, recording each sync (a run's view is laid down by one)."""

    def __init__(self) -> None:
        self.synced = 0

    def sync(self, *_: Any, **__: Any) -> Any:
        self.synced += 1
        return SimpleNamespace(folder=Path("/view"), tests=None, sources=None)


def _preparer(root: Path, layout: Layout, *, approve: bool = True) -> tuple[TestPreparer, Views]:
    """``approve``: the person said yes to the project's test command, if it has one."""
    views = Views()
    state = root.parent / "state"
    state.mkdir(exist_ok=True)
    command = load_test_command(root)
    if approve and command is not None and command.command is not None:
        approve_command(state, command)
    return TestPreparer(root, state, layout, views, lambda: None), views  # type: ignore[arg-type]


def _mocha_project(root: Path, config: str | None = None) -> Layout:
    package = {"name": "mime", "scripts": {"test": "mocha"}, "devDependencies": {"mocha": "11"}}
    write_tree(root, {"package.json": json.dumps(package), "index.js": "exports.a = 1\n",
                      "test/test.js": "require('assert')\n"})  # fmt: skip
    if config is not None:
        write_tree(root, {".fluffy/config.yaml": config})
    layout = detect_layout(root)
    assert layout.language == "javascript" and layout.node is not None
    assert layout.node.runner == "mocha"
    return layout


def test_a_javascript_project_with_no_junit_route_is_refused_not_run_with_pytest(
    tmp_path: Path,
) -> None:
    root = tmp_path / "p"
    preparer, views = _preparer(root, _mocha_project(root))
    with pytest.raises(ConfigError) as refused:
        preparer.prepare("s1", {}, None, ("test/**",))
    error = refused.value
    assert "mocha" in error.what and "no JUnit route" in error.what
    assert error.why and "pytest" in error.why  # why: it is never run with pytest
    assert error.fix and "tests:" in error.fix and "command:" in error.fix
    assert "{junit}" in error.fix and "mocha.js" in error.fix and "xunit" in error.fix
    assert views.synced == 0  # nothing was prepared for a run
    # a command in the test environment (container.run) needs no test runner
    plan = preparer.prepare("s1", {}, None, ("test/**",), coverage=False, tests=False)
    assert plan.runner == "pytest" and "command" not in plan.settings


def test_a_javascript_projects_own_command_is_read_as_a_javascript_report(
    tmp_path: Path,
) -> None:
    root = tmp_path / "p"
    preparer, _ = _preparer(root, _mocha_project(root, MOCHA_COMMAND))
    plan = preparer.prepare("s1", {}, None, ("test/**",))
    assert plan.custom and plan.dialect == "javascript"
    assert plan.settings["command"][1] == "/node_modules/mocha/bin/mocha.js"
    assert plan.runner == "the project's test command"


def test_runners_are_named_and_a_python_projects_command_stays_junit(tmp_path: Path) -> None:
    vitest = Layout("node", language="javascript", node=NodeFacts(runner="vitest"))
    (tmp_path / "js").mkdir()
    preparer, _ = _preparer(tmp_path / "js", vitest)
    plan = preparer.prepare("s1", {}, None, ("test/**",))
    assert (plan.dialect, plan.runner) == ("javascript", "vitest")
    python = tmp_path / "py"
    write_tree(python, {"src/app/__init__.py": "", ".fluffy/config.yaml": MOCHA_COMMAND})
    preparer, _ = _preparer(python, detect_layout(python))
    plan = preparer.prepare("s1", {}, None, ("tests/**",))
    assert (plan.dialect, plan.runner) == ("junit", "the project's test command")
    (python / ".fluffy" / "config.yaml").unlink()
    plan = preparer.prepare("s1", {}, None, ("tests/**",))
    assert (plan.custom, plan.dialect, plan.runner) == (False, "pytest", "pytest")


def test_a_projects_own_command_runs_only_once_the_person_approved_it(tmp_path: Path) -> None:
    """A cloned repository's .fluffy/config.yaml names the command whose report is the
    evidence: unapproved, nothing is prepared and the error says how to approve it."""
    root = tmp_path / "p"
    preparer, views = _preparer(root, _mocha_project(root, MOCHA_COMMAND), approve=False)
    with pytest.raises(ConfigError) as refused:
        preparer.prepare("s1", {}, None, ("test/**",))
    error = refused.value
    assert "not approved" in error.what and "mocha.js" in error.what
    assert "cloned" in error.why and "fluffy config tests approve" in error.fix
    assert views.synced == 0
    # a command in the test environment (container.run) runs no test command
    assert preparer.prepare("s1", {}, None, ("test/**",), tests=False).custom
    command = load_test_command(root)
    assert command is not None
    approve_command(preparer.state_dir, command)
    assert preparer.prepare("s1", {}, None, ("test/**",)).custom
    # another command (the repository changed it) is a new question
    (root / ".fluffy" / "config.yaml").write_text(MOCHA_COMMAND.replace("test/test.js", "x.js"))
    with pytest.raises(ConfigError, match="not approved"):
        preparer.prepare("s1", {}, None, ("test/**",))
    python = tmp_path / "py"  # variables alone are no command: pytest runs, no question
    write_tree(
        python, {"src/app/__init__.py": "", ".fluffy/config.yaml": "tests:\n  env: {TZ: UTC}\n"}
    )
    preparer, _ = _preparer(python, detect_layout(python), approve=False)
    assert preparer.prepare("s1", {}, None, ("tests/**",)).settings["env"] == {"TZ": "UTC"}
