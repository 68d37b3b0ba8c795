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
from unit.trees import write_tree


def test_runtime_dependencies_and_test_extras_and_groups(tmp_path: Path) -> None:
    write_tree(tmp_path, {"pyproject.toml": """
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
    write_tree(tmp_path, {
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
    refused = {r.where: r.text for r in reqs.refused}
    assert refused == {  # the project itself (-e .) is installed anyway: not refused
        "requirements/base.txt:4": "./local",
        "requirements-dev.txt:3": "--index-url http://example.invalid/simple",
    }
    assert reqs.files == ["dev-requirements.txt", "requirements-dev.txt", "requirements.txt",
                          "requirements/base.txt", "constraints.txt"]  # fmt: skip
    assert "constraints.txt" in env_inputs(tmp_path)  # a change to an include rebuilds
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
    pyproject = "[project]\nname = 'calc'\ndependencies = ['wcwidth']\n"
    write_tree(tmp_path, {"pyproject.toml": pyproject, lock: text})
    reqs = collect_requirements(tmp_path)
    assert reqs.lock == lock and reqs.constraints == ["wcwidth==0.2.13"]
    assert lock in env_inputs(tmp_path)


def test_poetry_projects_and_their_constraints(tmp_path: Path) -> None:
    write_tree(tmp_path, {"pyproject.toml": """
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
    assert [(r.where, r.text) for r in reqs.refused] == [("pyproject.toml:8", "local")]


@pytest.mark.parametrize(
    ("spec", "pep440"),
    [("^1.2.3", ">=1.2.3,<2"), ("^0.2.3", ">=0.2.3,<0.3"), ("^0.0.3", ">=0.0.3,<0.0.4"),
     ("~1.2.3", ">=1.2.3,<1.3"), ("~1", ">=1,<2"), ("1.2.3", "==1.2.3"), ("*", ""),
     (">=1,<2", ">=1,<2"), ("1 || 2", None)],
)  # fmt: skip
def test_poetry_version_constraints(spec: str, pep440: str | None) -> None:
    assert poetry_spec(spec) == pep440


def test_setup_cfg_setup_py_and_pipfile_lock(tmp_path: Path) -> None:
    write_tree(tmp_path, {
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
    assert [r.text for r in reqs.refused] == ["vcs"]


def test_no_dependencies_no_environment_and_the_key_follows_the_inputs(tmp_path: Path) -> None:
    write_tree(
        tmp_path, {"pyproject.toml": "[project]\nname = 'demo'\n", "src/demo/__init__.py": ""}
    )
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


# -- a hostile repository's lines never reach pip as written (issue 31) -----------------
def test_build_requires_are_parsed_and_a_url_or_an_option_is_refused(tmp_path: Path) -> None:
    write_tree(tmp_path, {"pyproject.toml": """
[build-system]
requires = ["setuptools>=61", "x @ http://127.0.0.1:9/x-1.0.tar.gz",
            "--extra-index-url=http://127.0.0.1:9/simple", "--no-binary=:all:",
            "wheel ; python_version >= '3'"]
[project]
name = "calc"
dependencies = ["git-dep @ git+https://example.invalid/r.git", "plain>=1"]
"""})  # fmt: skip
    reqs = collect_requirements(tmp_path)
    assert reqs.build_requires == ["setuptools>=61", 'wheel; python_version >= "3"']
    assert reqs.requirements == ["plain>=1"]
    refused = {r.text: (r.where, r.why) for r in reqs.refused}
    assert refused["x @ http://127.0.0.1:9/x-1.0.tar.gz"][0] == "pyproject.toml:3"
    assert "direct URL" in refused["x @ http://127.0.0.1:9/x-1.0.tar.gz"][1]
    assert "pip option" in refused["--extra-index-url=http://127.0.0.1:9/simple"][1]
    assert "--no-binary=:all:" in refused
    assert "VCS" in refused["git-dep @ git+https://example.invalid/r.git"][1]
    assert refused["git-dep @ git+https://example.invalid/r.git"][0] == "pyproject.toml:8"


def test_constraints_with_a_url_and_includes_out_of_the_project_are_refused(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("token-abc\n")
    project = write_tree(tmp_path / "p", {
        "requirements.txt": "-c constraints.txt\nlib\n-r ../secret.txt\n-r /etc/passwd\n"
                            "ok==1.0 --hash=sha256:" + "a" * 64 + " \\\n  --hash=sha256:"
                            + "B" * 64 + "\n",
        "constraints.txt": "lib @ http://127.0.0.1:9/lib-1.0.tar.gz\nlib[extra]==2.0\n",
    })  # fmt: skip
    reqs = collect_requirements(project)
    assert reqs.constraints == ["lib==2.0"]  # extras dropped, the URL line refused
    assert set(reqs.requirements) == {"lib", "ok==1.0"}
    assert not any("token" in line for line in reqs.requirements)
    assert reqs.hashes == {"ok==1.0": {"a" * 64, "b" * 64}}
    wheres = {r.where for r in reqs.refused}
    assert {"constraints.txt:1", "requirements.txt:3", "requirements.txt:4"} <= wheres


@pytest.mark.parametrize(
    "name",
    ["pkg @ http://127.0.0.1:9/pkg-1.0.tar.gz#", "pkg\\n--extra-index-url=http://x/", "-e ."],
)
def test_a_lock_entry_whose_name_is_not_a_name_is_refused(tmp_path: Path, name: str) -> None:
    write_tree(tmp_path, {
        "pyproject.toml": "[project]\nname = 'calc'\ndependencies = ['wcwidth']\n",
        "uv.lock": f'[[package]]\nname = "{name}"\nversion = "1.0"\n'
                   'source = { registry = "https://pypi.org/simple" }\n'
                   '[[package]]\nname = "wcwidth"\nversion = "0.2.13"\n'
                   'source = { registry = "https://pypi.org/simple" }\n'
                   'sdist = { url = "https://x/w.tar.gz", hash = "sha256:' + "c" * 64 + '" }\n'
                   'wheels = [{ url = "https://x/w.whl", hash = "sha256:' + "d" * 64 + '" }]\n',
    })  # fmt: skip
    reqs = collect_requirements(tmp_path)
    assert reqs.constraints == ["wcwidth==0.2.13"]
    assert reqs.hashes == {"wcwidth==0.2.13": {"c" * 64, "d" * 64}}
    assert [r.where for r in reqs.refused] == ["uv.lock:2"]
    assert "\n" not in reqs.refused[0].text  # shown, never written out as a line


def test_every_line_handed_on_parses_back_to_a_named_index_requirement(tmp_path: Path) -> None:
    from packaging.requirements import Requirement

    from fluffy.kernel.project.reqlines import check_line

    write_tree(tmp_path, {
        "pyproject.toml": '[project]\nname = "a"\ndependencies = ["A.b_c[X,y] >= 1 ; os_name '
                          "== 'posix'\", \"z@file:///etc\"]\n",
        "requirements.txt": "q ==1.*\nr @ https://x/r.whl\n",
    })  # fmt: skip
    reqs = collect_requirements(tmp_path)
    assert reqs.requirements == ['A.b_c[X,y]>=1; os_name == "posix"', "q==1.*"]
    for line in [*reqs.requirements, *reqs.constraints, *reqs.build_requires]:
        assert check_line(line) == line and Requirement(line).url is None
    with pytest.raises(ValueError):
        check_line("x @ https://example.invalid/x.whl")


def test_a_requirements_folder_that_links_out_of_the_project_is_not_read(tmp_path: Path) -> None:
    secrets = write_tree(tmp_path / "home", {"keys/token-requirements.txt": "sekrit-token\n"})
    project = write_tree(
        tmp_path / "p", {"requirements.txt": "-r requirements/token-requirements.txt\n"}
    )
    (project / "requirements").symlink_to(secrets / "keys")
    reqs = collect_requirements(project)
    assert reqs.requirements == [] and "requirements/token-requirements.txt" not in reqs.files
    assert [r.where for r in reqs.refused] == ["requirements/token-requirements.txt"]


@pytest.mark.parametrize(
    "line", ["iniconfig===${HOME}", "x==1; extra == 'a --opt'", "y>=1 #frag", "z;os_name=='a\\\\b'"]
)
def test_what_pip_would_read_as_more_than_a_requirement_is_refused(
    tmp_path: Path, line: str
) -> None:
    from fluffy.kernel.project.reqlines import check_line

    write_tree(tmp_path, {"pyproject.toml": f"[project]\nname='a'\ndependencies = [{line!r}]\n"})
    reqs = collect_requirements(tmp_path)
    assert reqs.requirements == [] and len(reqs.refused) == 1, reqs.refused
    with pytest.raises(ValueError):
        check_line(line)


@pytest.mark.parametrize("name", ["evil.tar.gz", "evil.zip", "Evil-1.0-py3-none-any.WHL", "x.tgz"])
def test_a_name_pip_would_take_for_a_local_archive_is_refused(tmp_path: Path, name: str) -> None:
    """Red team pass 2: PEP 508 names may hold dots, and pip installs `evil.tar.gz` from
    the folder it runs in (building it there), not from the index."""
    from fluffy.kernel.project.reqlines import check_line

    write_tree(tmp_path, {
        "requirements.txt": f"{name}\nok\n",
        "uv.lock": f'[[package]]\nname = "{name}"\nversion = "1.0"\n',
    })  # fmt: skip
    reqs = collect_requirements(tmp_path)
    assert reqs.requirements == ["ok"] and reqs.constraints == []
    assert {r.where for r in reqs.refused} == {"requirements.txt:1", "uv.lock:2"}
    assert any("local archive" in r.why for r in reqs.refused)
    with pytest.raises(ValueError):
        check_line(name)


@pytest.mark.parametrize(
    "line", ["foo===1/../../project", "foo===/../../../../home/x", "foo===1.0", "bar>=1,===2"]
)
def test_arbitrary_equality_never_reaches_pip(tmp_path: Path, line: str) -> None:
    """Review of red team pass 2: `===` takes any text, and pip read `foo===1/../../x`
    as the folder `x` and ran its build backend on the host."""
    from fluffy.images.environment import _missing_build
    from fluffy.kernel.project.reqlines import Refusal, check_line

    write_tree(tmp_path, {"requirements.txt": f"{line}\nok==1.*\n"})
    reqs = collect_requirements(tmp_path)
    assert reqs.requirements == ["ok==1.*"]
    assert [r.where for r in reqs.refused] == ["requirements.txt:1"]
    assert "===" in reqs.refused[0].why
    with pytest.raises(ValueError):
        check_line(line)
    refused: list[Refusal] = []
    assert _missing_build({"missing_build": [line]}, refused) == [] and len(refused) == 1


@pytest.mark.parametrize(
    ("lock", "entries"),
    [
        ("poetry.lock", ['markers = "python_version == \\"3.9\\""',
                         'markers = { dev = "python_version >= \\"3.10\\"" }']),
        ("pdm.lock", ['marker = "python_version == \\"3.9\\""',
                      'marker = "python_version >= \\"3.10\\""']),
        ("uv.lock", ['resolution-markers = ["python_full_version < \'3.10\'"]',
                     'resolution-markers = ["python_full_version >= \'3.10\'"]']),
    ],
)  # fmt: skip
def test_two_versions_locked_for_different_pythons_keep_their_markers(
    tmp_path: Path, lock: str, entries: list[str]
) -> None:
    """tomlkit's poetry.lock pins filelock 3.19.1 for Python 3.9 and 3.20.3 for later
    ones: as two bare pins they contradict each other and pip installs nothing."""
    old, new = entries
    entry = '[[package]]\nname = "filelock"\nversion = "{}"\n{}\n'
    pyproject = "[project]\nname = 'calc'\ndependencies = ['filelock']\n"
    write_tree(
        tmp_path,
        {
            "pyproject.toml": pyproject,
            lock: entry.format("3.19.1", old) + entry.format("3.20.3", new),
        },
    )
    reqs = collect_requirements(tmp_path)
    assert len(reqs.constraints) == 2 and reqs.refused == []
    (older, newer) = reqs.constraints
    assert older.startswith("filelock==3.19.1; python") and newer.startswith("filelock==3.20.3;")
    from packaging.requirements import Requirement

    chosen = [c for c in reqs.constraints if Requirement(c).marker.evaluate({"python_version":
              "3.11", "python_full_version": "3.11.7"})]  # fmt: skip
    assert chosen == [newer]


def test_a_requirements_file_compiled_for_another_python_is_left_for_the_main_one(
    tmp_path: Path,
) -> None:
    """jinja's requirements/tests37.txt pins for Python 3.7 what tests.txt pins for now:
    both read, ``attrs==24.2.0`` and ``attrs==24.3.0`` leave pip nothing to install."""
    write_tree(tmp_path, {"requirements/tests.txt": "attrs==24.3.0\npytest==8.3.4\n",
                    "requirements/tests37.txt": "attrs==24.2.0\npytest==7.4.4\n",
                    "requirements-py38.txt": "idna==3.0\n",
                    "requirements/solo311.txt": "six\n"})  # fmt: skip
    assert requirement_files(tmp_path) == ["requirements-py38.txt", "requirements/solo311.txt",
                                           "requirements/tests.txt"]  # fmt: skip
    reqs = collect_requirements(tmp_path)
    assert reqs.requirements == ["idna==3.0", "six", "attrs==24.3.0", "pytest==8.3.4"]
