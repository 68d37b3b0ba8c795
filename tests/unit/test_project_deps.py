"""What a project's tests need, read from its files (never by running them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fluffy.kernel.project.deps import (
    collect_requirements,
    env_inputs,
    env_key,
    poetry_spec,
    requirement_files,
)


def make(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_runtime_dependencies_and_test_extras_and_groups(tmp_path: Path) -> None:
    make(tmp_path, {"pyproject.toml": """
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"
[project]
name = "Calc"
dependencies = ["wcwidth>=0.2"]
[project.optional-dependencies]
tests = ["pytest>=8", "calc[speed]"]
speed = ["ujson"]
docs = ["sphinx"]
[dependency-groups]
test = ["freezegun", {include-group = "lint"}]
lint = ["ruff"]
typing = ["mypy"]
"""})  # fmt: skip
    reqs = collect_requirements(tmp_path)
    assert reqs.requirements == ["wcwidth>=0.2", "pytest>=8", "ujson", "freezegun", "ruff"]
    assert "sphinx" not in reqs.requirements and "mypy" not in reqs.requirements
    assert "calc" not in reqs.names  # the project itself is installed from the tree
    assert reqs.installable and reqs.build_requires == ["hatchling"] and reqs.name == "Calc"
    assert reqs.wanted()


def test_requirements_files_with_includes_constraints_and_local_lines(tmp_path: Path) -> None:
    make(tmp_path, {
        "requirements.txt": "requests==2.0  # pinned\n-r requirements/base.txt\n",
        "requirements/base.txt": "-c ../constraints.txt\nidna\n-e .\n./local\n",
        "requirements/docs.txt": "sphinx\n",
        "constraints.txt": "idna==3.4\n",
        "requirements-dev.txt": "pytest \\\n  >=8\n--index-url http://example.invalid/simple\n",
        "dev-requirements.in": "black\n", "dev-requirements.txt": "black==24.1\n",
    })  # fmt: skip
    assert "requirements/docs.txt" not in requirement_files(tmp_path)
    assert "dev-requirements.in" not in requirement_files(tmp_path)  # the compiled .txt wins
    reqs = collect_requirements(tmp_path)
    assert set(reqs.requirements) == {"requests==2.0", "idna", "pytest>=8", "black==24.1"}
    assert reqs.constraints == ["idna==3.4"]
    assert any("'-e .'" in s for s in reqs.skipped) and any("./local" in s for s in reqs.skipped)
    assert not reqs.installable and reqs.wanted()


@pytest.mark.parametrize(
    ("lock", "text"),
    [
        ("uv.lock", '[[package]]\nname = "calc"\nversion = "0.1"\nsource = { editable = "." }\n'
                    '[[package]]\nname = "wcwidth"\nversion = "0.2.13"\n'
                    'source = { registry = "https://pypi.org/simple" }\n'),
        ("poetry.lock", '[[package]]\nname = "wcwidth"\nversion = "0.2.13"\n[[package]]\n'
                        'name = "lib"\nversion = "1"\n[package.source]\ntype = "git"\n'),
        ("pdm.lock", '[[package]]\nname = "wcwidth"\nversion = "0.2.13"\n'),
    ],
)  # fmt: skip
def test_a_lock_file_pins_what_the_sources_ask_for(tmp_path: Path, lock: str, text: str) -> None:
    make(tmp_path, {"pyproject.toml": "[project]\nname = 'calc'\ndependencies = ['wcwidth']\n",
                    lock: text})  # fmt: skip
    reqs = collect_requirements(tmp_path)
    assert reqs.lock == lock and reqs.constraints == ["wcwidth==0.2.13"]
    assert lock in env_inputs(tmp_path)


def test_poetry_projects_and_their_constraints(tmp_path: Path) -> None:
    make(tmp_path, {"pyproject.toml": """
[tool.poetry]
name = "app"
[tool.poetry.dependencies]
python = "^3.11"
requests = "^2.31"
rich = {version = "~13.7", extras = ["jupyter"]}
local = {path = "../local"}
maybe = {version = "*", optional = true}
[tool.poetry.group.test.dependencies]
pytest = "^8.0"
[tool.poetry.group.docs.dependencies]
mkdocs = "*"
"""})  # fmt: skip
    reqs = collect_requirements(tmp_path)
    assert reqs.requirements == ["requests<3,>=2.31", "rich[jupyter]<13.8,>=13.7", "pytest<9,>=8.0"]
    assert any("local" in s for s in reqs.skipped)


@pytest.mark.parametrize(
    ("spec", "pep440"),
    [("^1.2.3", ">=1.2.3,<2"), ("^0.2.3", ">=0.2.3,<0.3"), ("^0.0.3", ">=0.0.3,<0.0.4"),
     ("~1.2.3", ">=1.2.3,<1.3"), ("~1", ">=1,<2"), ("1.2.3", "==1.2.3"), ("*", ""),
     (">=1,<2", ">=1,<2"), ("1 || 2", None)],
)  # fmt: skip
def test_poetry_version_constraints(spec: str, pep440: str | None) -> None:
    assert poetry_spec(spec) == pep440


def test_setup_cfg_setup_py_and_pipfile_lock(tmp_path: Path) -> None:
    make(tmp_path, {
        "setup.cfg": "[metadata]\nname = a\n[options]\ninstall_requires =\n    six\n"
                     "[options.extras_require]\ntesting = pytest\nall = huge\n",
        "setup.py": "REQS = ['attrs>=20']\nsetup(install_requires=REQS,"
                    " extras_require={'test:python_version>\"3\"': ['hypothesis']},"
                    " tests_require=open('x').read().split())\n",  # not literal: not run
        "Pipfile.lock": json.dumps({"default": {"idna": {"version": "==3.4"}},
                                    "develop": {"mock": {"version": "==5.0",
                                                         "markers": "python_version >= '3.8'"},
                                                "vcs": {"git": "https://x"}}}),
    })  # fmt: skip
    reqs = collect_requirements(tmp_path)
    assert {"six", "pytest", "attrs>=20", "hypothesis", "idna==3.4"} <= set(reqs.requirements)
    assert 'mock==5.0; python_version >= "3.8"' in reqs.requirements
    assert "huge" not in reqs.requirements and reqs.installable
    assert any("vcs" in s for s in reqs.skipped)


def test_no_dependencies_no_environment_and_the_key_follows_the_inputs(tmp_path: Path) -> None:
    make(tmp_path, {"pyproject.toml": "[project]\nname = 'demo'\n", "src/demo/__init__.py": ""})
    reqs = collect_requirements(tmp_path)
    assert not reqs.wanted()  # the code-executor image serves it, PYTHONPATH finds it
    inputs = env_inputs(tmp_path)
    assert list(inputs) == ["pyproject.toml"]
    key = env_key(inputs, "fluffy/code-executor:1", "3.11", 1)
    assert key == env_key(dict(reversed(inputs.items())), "fluffy/code-executor:1", "3.11", 1)
    assert key != env_key(inputs, "fluffy/code-executor:2", "3.11", 1)  # the base image
    assert key != env_key(inputs, "fluffy/code-executor:1", "3.12", 1)  # the interpreter
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\ndependencies = ['x']\n")
    assert env_key(env_inputs(tmp_path), "fluffy/code-executor:1", "3.11", 1) != key
    (tmp_path / ".fluffy" / "wheels").mkdir(parents=True)
    (tmp_path / ".fluffy" / "wheels" / "x-1-py3-none-any.whl").write_bytes(b"zip")
    assert ".fluffy/wheels/x-1-py3-none-any.whl" in env_inputs(tmp_path)
