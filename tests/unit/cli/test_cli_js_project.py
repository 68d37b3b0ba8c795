"""A JavaScript project as the person sees it: ``fluffy init``'s config.yaml names its
runner (not pytest), and a runner that crashed before any test shows why."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fluffy.cli.project import init_project
from fluffy.kernel.ai.narrate import summarize_result
from fluffy.kernel.project.testcmd import TestCommand
from unit.trees import write_tree

pytestmark = pytest.mark.unit


def _config(root: Path, files: dict[str, object]) -> str:
    write_tree(root, files)
    assert init_project(root)["config.yaml"] == "written"
    text = (root / ".fluffy" / "config.yaml").read_text()
    from fluffy.settings import load_settings

    load_settings(root, {}, env={})  # what is written is a valid config
    return text


def _uncommented_tests(text: str) -> object:
    lines = text.split("# tests:\n", 1)[1].splitlines()
    block = "tests:\n" + "\n".join(line[1:] for line in lines if line.startswith("#   "))
    return yaml.safe_load(block)["tests"]


def test_init_names_a_javascript_projects_runner_not_pytest(tmp_path: Path) -> None:
    package = {"name": "a", "devDependencies": {"vitest": "3"}}
    text = _config(tmp_path / "v", {"package.json": package, "src/a.ts": "", "test/a.test.ts": ""})
    assert "pytest" not in text
    assert "# test.run uses vitest" in text


def test_init_tells_a_mocha_project_to_name_its_command_with_an_example(tmp_path: Path) -> None:
    package = {"name": "a", "scripts": {"test": "mocha"}, "devDependencies": {"mocha": "11"}}
    text = _config(tmp_path / "m", {"package.json": package, "index.js": "", "test/t.js": ""})
    assert "pytest" not in text
    words = " ".join(text.replace("#", " ").split())
    assert "test.run cannot run mocha's tests until a command is named here" in words
    assert "no JUnit route of its own for mocha" in words
    example = TestCommand.model_validate(_uncommented_tests(text))  # ready to uncomment
    assert example.command is not None and "xunit" in example.command
    assert "output={junit}" in example.command


def test_init_still_says_pytest_for_a_python_project(tmp_path: Path) -> None:
    text = _config(tmp_path / "py", {"src/app/__init__.py": "", "tests/test_a.py": ""})
    assert "# test.run uses pytest in the project's environment." in text


def test_a_run_that_reported_no_test_shows_the_end_of_the_runners_output() -> None:
    tail = "\n".join(f"line {n}" for n in range(20)) + "\nError: Cannot find module 'vite-x'\n"
    answer = {"ok": True, "output": {"exit_code": 1, "counts": {"found": 0, "passed": 0},
                                     "failed": [], "output_tail": tail}}  # fmt: skip
    text = summarize_result("test.run", {}, answer)
    lines = text.splitlines()
    assert lines[0] == "exit code 1"
    assert "  | Error: Cannot find module 'vite-x'" in lines
    assert "  | line 0" not in lines  # the end of it only
    ran = {"ok": True, "output": {"exit_code": 1, "counts": {"found": 1, "failed": 1},
                                  "failed": [], "output_tail": tail}}  # fmt: skip
    assert "|" not in summarize_result("test.run", {}, ran)  # tests ran: their failures say it
