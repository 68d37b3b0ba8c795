"""A user's project without .fluffy/: its layout, the default policy fitted to it,
`fluffy init`, and the first-run block."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fluffy.cli.project import first_run_block, init_project
from fluffy.kernel.policy.engine import Caller, PolicyEngine, Request
from fluffy.kernel.policy.model import load_policy, parse_policy
from fluffy.kernel.project.defaults import default_policy_text, render_policy
from fluffy.kernel.project.layout import detect_layout
from unit.trees import write_tree

SHAPES = {
    "src": (
        {"pyproject.toml": "[project]\nname='calc'\n", "src/calc/__init__.py": "",
         "tests/test_calc.py": ""},
        "src", ("src",), ("src/calc",), ("src/**",),
    ),
    "flat": (
        {"setup.cfg": "[metadata]\nname = mypkg\n", "mypkg/__init__.py": "", "mypkg/core.py": "",
         "test/test_core.py": "", "docs/conf.py": "", "setup.py": ""},
        "flat", (".",), ("mypkg",), ("mypkg/**", "*.py"),
    ),
    "modules": (
        {"calc.py": "", "tests/test_calc.py": "", "conftest.py": "", "noxfile.py": ""},
        "modules", (".",), ("calc.py",), ("calc.py", "*.py"),
    ),
    "empty": ({"README.md": "hi\n"}, "empty", (".",), (), ("*.py",)),
    "hatch": (
        {"pyproject.toml": "[tool.hatch.build.targets.wheel]\npackages = ['lib/pkg']\n",
         "lib/pkg/__init__.py": "", "tests/t.py": ""},
        "src", ("lib",), ("lib/pkg",), ("lib/**",),
    ),
    "setuptools-package-dir": (
        {"pyproject.toml": '[tool.setuptools]\npackage-dir = {"" = "code"}\n',
         "code/app/__init__.py": ""},
        "src", ("code",), ("code/app",), ("code/**",),
    ),
}  # fmt: skip


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_layouts_are_detected_from_the_projects_own_files(tmp_path: Path, shape: str) -> None:
    files, kind, roots, packages, source_globs = SHAPES[shape]
    layout = detect_layout(write_tree(tmp_path, files))
    assert (layout.kind, layout.source_roots, layout.packages) == (kind, roots, packages)
    assert layout.source_globs == source_globs
    assert layout.test_globs[-3:] == ("**/test_*.py", "**/*_test.py", "**/conftest.py")


def test_pytest_settings_name_the_test_folders_and_pythonpath(tmp_path: Path) -> None:
    write_tree(tmp_path, {
        "pytest.ini": "[pytest]\ntestpaths = checks integration\npythonpath = lib\n",
        "checks/test_a.py": "", "integration/test_b.py": "", "lib/m.py": "",
        "pyproject.toml": "[tool.pytest.ini_options]\ntestpaths = ['ignored']\n",
    })  # fmt: skip
    layout = detect_layout(tmp_path)
    assert layout.test_roots == ("checks", "integration")  # pytest.ini wins, as in pytest
    assert layout.test_globs[:2] == ("checks/**", "integration/**")
    assert layout.pythonpath == ("lib",)
    assert "lib" in layout.import_roots()


def test_a_broken_or_hostile_config_never_stops_detection(tmp_path: Path) -> None:
    write_tree(tmp_path, {
        "pyproject.toml": "[project\nname=",  # not TOML
        "setup.cfg": "[options\n",  # not INI
        "src/pkg/__init__.py": "",
    })  # fmt: skip
    (tmp_path / "pytest.ini").symlink_to("/etc/passwd")  # a link out: never followed
    layout = detect_layout(tmp_path)
    assert layout.kind == "src" and layout.packages == ("src/pkg",)
    assert any("not valid TOML" in note for note in layout.notes)
    escape = write_tree(tmp_path / "esc", {"pyproject.toml": "[tool.setuptools.packages.find]\n"
                                      "where = ['../../etc']\n"})  # fmt: skip
    assert "../../etc" not in " ".join(detect_layout(escape).source_roots)


def test_the_default_policy_is_strict_tdd_fitted_to_the_layout(tmp_path: Path) -> None:
    write_tree(tmp_path, {"mypkg/__init__.py": "", "tests/test_x.py": ""})
    text = default_policy_text(tmp_path)
    policy = parse_policy(text)
    engine = PolicyEngine(policy, root=tmp_path)
    ai = Caller("fs-tool", frozenset({"ai", "core_plugin"}))

    def decide(syscall: str, path: str | None, state: str, mode: str = "strict") -> str:
        request = Request(syscall, ai, path=path, state=state, mode=mode, size=10,
                          sandbox="code-executor")  # fmt: skip
        return engine.evaluate(request).result

    assert decide("plan.complete", None, "planning") == "allow"
    assert decide("fs.write", "tests/test_new.py", "test_writing") == "allow"
    assert decide("fs.write", "mypkg/core.py", "test_writing") == "deny"  # tests first
    assert decide("fs.write", "mypkg/core.py", "code_writing") == "allow"  # flat layout
    assert decide("fs.write", "calc.py", "code_writing") == "allow"  # a new top-level module
    assert decide("fs.write", "docs/index.md", "code_writing") == "deny"  # default deny
    for sensitive in (
        "pyproject.toml",
        ".pre-commit-config.yaml",
        ".vscode/tasks.json",
        "requirements-dev.txt",
        "noxfile.py",
        ".envrc",
        ".github/workflows/x",
        # what the host runs: git hooks, editor tasks, dev containers, task runners
        ".husky/pre-commit",
        ".devcontainer/devcontainer.json",
        ".npmrc",
        "tox.ini",
        "Makefile",
    ):
        assert decide("fs.write", sensitive, "exploring", "explore") == "require_review"
    assert decide("git.commit", None, "committing") == "allow"
    assert decide("git.commit", None, "code_writing") == "deny"
    assert "Layout fluffy found: flat layout: mypkg; tests in tests/" in text


def test_init_writes_commented_files_that_load_and_keeps_existing_ones(tmp_path: Path) -> None:
    write_tree(tmp_path, {"src/app/__init__.py": ""})
    done = init_project(tmp_path)
    assert done == {"policy.yaml": "written", "config.yaml": "written"}
    policy_text = (tmp_path / ".fluffy" / "policy.yaml").read_text()
    assert policy_text.startswith("# fluffy's policy for this project")
    assert "# Written by `fluffy init` on" in policy_text
    policy = load_policy(tmp_path / ".fluffy" / "policy.yaml")
    assert policy.capabilities == parse_policy(default_policy_text(tmp_path)).capabilities
    from fluffy.settings import load_settings

    load_settings(tmp_path, {}, env={})  # the commented config.yaml is a valid config
    (tmp_path / ".fluffy" / "policy.yaml").write_text("capabilities: []\n")
    again = init_project(tmp_path)
    assert again["policy.yaml"].startswith("kept")
    assert (tmp_path / ".fluffy" / "policy.yaml").read_text() == "capabilities: []\n"
    assert init_project(tmp_path, force=True)["policy.yaml"] == "written"


def test_init_says_what_it_found_and_what_the_policy_makes_of_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fluffy.cli.main import main

    write_tree(tmp_path, {"src/app/__init__.py": "", "spec/test_app.py": "", "pytest.ini":
                    "[pytest]\ntestpaths = spec\n"})  # fmt: skip
    assert main(["init", "--project", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "layout  src layout: src/app; tests in spec/" in text
    assert "tests first in spec/**, then code in src/**" in text
    assert main(["init", "--project", str(tmp_path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["layout"]["test_roots"] == ["spec"] and shown["files"]["policy.yaml"].startswith(
        "kept"
    )


def test_render_is_stable_yaml_for_odd_paths(tmp_path: Path) -> None:
    write_tree(tmp_path, {"pytest.ini": "[pytest]\ntestpaths = 'weird dir' t#2\n"})
    (tmp_path / "weird dir").mkdir()
    (tmp_path / "t#2").mkdir()
    text = render_policy(detect_layout(tmp_path))
    rules = {rule.name: rule for rule in parse_policy(text).capabilities}
    globs = rules["write-tests-while-test-writing"].match.path_glob or []
    assert "t#2/**" in globs  # quoted: a '#' is data, not a comment


def test_the_first_run_block_says_what_was_applied_once_there_is_no_fluffy() -> None:
    info = {
        "policy": {"default": True},
        "layout": {"summary": "src layout: src/calc; tests in tests/",
                   "test_globs": ["tests/**"], "source_globs": ["src/**"]},
        "environment": {"image": "fluffy/project-env:abc", "packages": 7},
    }  # fmt: skip
    block = first_run_block(info)
    assert block[0].startswith("No .fluffy/ here") and "fluffy init" in block[0]
    assert "src layout: src/calc" in block[1] and "tests/**" in block[2] and "src/**" in block[2]
    assert "7 packages" in block[3]
    assert first_run_block({**info, "policy": {"default": False}}) == []


def test_a_projects_own_test_command_is_read_from_its_config(tmp_path: Path) -> None:
    from fluffy.errors import ConfigError
    from fluffy.kernel.project.testcmd import load_test_command
    from fluffy.settings import load_settings

    assert load_test_command(tmp_path) is None  # no config: pytest
    write_tree(tmp_path, {".fluffy/config.yaml": "provider: scripted\ntests:\n  command: [npx, "
                    "vitest, run, '--outputFile={junit}']\n  env: {CI: '1'}\n"})  # fmt: skip
    command = load_test_command(tmp_path)
    assert command is not None
    assert command.settings() == {"command": ["npx", "vitest", "run", "--outputFile={junit}"],
                                  "env": {"CI": "1"}, "junit": "{junit}"}  # fmt: skip
    load_settings(tmp_path, {}, env={})  # the CLI's hierarchy accepts the project setting
    write_tree(
        tmp_path, {".fluffy/config.yaml": "tests:\n  command: [x]\n  junit: reports/j.xml\n"}
    )
    with pytest.raises(ConfigError, match="read-only in the test sandbox"):
        load_test_command(tmp_path)
    write_tree(tmp_path, {".fluffy/config.yaml": "tests: {command: []}\n"})
    with pytest.raises(ConfigError, match=r"tests\.command"):
        load_test_command(tmp_path)
    # only the variables, for the runner fluffy picks
    write_tree(tmp_path, {".fluffy/config.yaml": "tests:\n  env: {TZ: America/New_York}\n"})
    command = load_test_command(tmp_path)
    assert command is not None and command.settings() == {"env": {"TZ": "America/New_York"}}
    load_settings(tmp_path, {}, env={})


def test_tests_is_a_project_setting_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fluffy.errors import ConfigError
    from fluffy.settings import load_settings

    home = tmp_path / "home"
    write_tree(home, {"config.yaml": "tests:\n  command: [make, test]\n"})
    monkeypatch.setenv("FLUFFY_HOME", str(home))
    with pytest.raises(ConfigError, match="`tests` is a project setting"):
        load_settings(tmp_path / "project", {}, env={})


def test_a_project_the_kernels_user_cannot_read_is_named_before_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fluffy.bootstrap.l1 as l1
    from fluffy.cli.lifecycle import access_problem

    project = tmp_path / "closed"
    project.mkdir(mode=0o700)
    monkeypatch.setattr(l1, "kernel_user", lambda _project: "1234:1234")
    problem = access_problem(str(project))
    owner = "root" if project.stat().st_uid == 0 else f"uid {project.stat().st_uid}"
    assert problem == f"uid 1234 cannot read {project} (mode 700, owner {owner})"
    project.chmod(0o755)
    assert access_problem(str(project)) is None


@pytest.mark.parametrize("answer", [True, False])
def test_the_first_prompt_offers_to_write_the_defaults(tmp_path: Path, answer: bool) -> None:
    from fluffy.cli.interactive import _offer_init

    write_tree(tmp_path, {"src/app/__init__.py": ""})
    _offer_init(tmp_path, confirm=lambda _question: answer)
    assert (tmp_path / ".fluffy" / "policy.yaml").exists() is answer
