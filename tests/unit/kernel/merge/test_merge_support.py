"""Test-support code a session changes never merges on a green run alone (issue 31)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fluffy.kernel.merge.merger import Merger
from fluffy.kernel.merge.staging import Staging
from fluffy.kernel.merge.support import support_changes, touches_machinery

FORGE = """\
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
"""


def _reader(files: dict[str, str]):  # type: ignore[no-untyped-def]
    return lambda rel: files[rel].encode() if rel in files else None


@pytest.mark.parametrize(
    ("path", "text", "why"),
    [
        ("tests/conftest.py", "import pytest\n", "pytest loads it"),
        ("conftest.py", FORGE, "pytest loads it"),
        ("src/sitecustomize.py", "x = 1\n", "when the test process starts"),
        ("src/zz_patch.pth", "import os\n", "when the test process starts"),
        ("pytest.ini", "[pytest]\naddopts = -q\n", "configures the test runner"),
        ("pyproject.toml", "[project]\nname='x'\n", "configures the test runner"),
        ("tests/test_new.py", "from _pytest import runner\n", "internals (_pytest)"),
        ("tests/test_new.py", "import importlib\nm = importlib.import_module('_pytest.runner')\n",
         "names pytest's internals"),
        ("tests/test_new.py", "def pytest_runtest_logreport(report):\n    pass\n",
         "hook pytest_runtest_logreport"),
        ("tests/test_new.py", "import atexit\n", "when the test process exits"),
        ("tests/test_new.py",
         "def test_x(request):\n    request.config.pluginmanager.register(1)\n",
         "plugin manager"),
        ("tests/test_new.py", "import pytest\npytest.TestReport.outcome = 'passed'\n",
         "changes the pytest module"),
    ],
)  # fmt: skip
def test_support_code_is_named_with_why(path: str, text: str, why: str) -> None:
    (found,) = support_changes([path], _reader({path: text}))
    assert found.path == path and why in found.why


def test_plugins_named_by_the_configuration_or_a_conftest_are_support_code() -> None:
    files = {
        "pyproject.toml": "[tool.pytest.ini_options]\naddopts = ['-p', 'tests.plug', '-q']\n",
        "tests/conftest.py": "pytest_plugins = ['helpers.fixtures']\n",
        "tests/plug.py": "X = 1\n",
        "helpers/fixtures.py": "Y = 1\n",
        "tox.ini": "[pytest]\naddopts = -p=other.plugin -p no:cacheprovider\n",
        "other/plugin/__init__.py": "Z = 1\n",
    }
    changed = ["tests/plug.py", "helpers/fixtures.py", "other/plugin/__init__.py"]
    found = {c.path: c.why for c in support_changes(changed, _reader(files))}
    assert found == {
        "tests/plug.py": "pytest loads it as the plugin tests.plug",
        "helpers/fixtures.py": "pytest loads it as the plugin helpers.fixtures",
        "other/plugin/__init__.py": "pytest loads it as the plugin other.plugin",
    }


def test_ordinary_tests_and_code_are_not_support_code() -> None:
    files = {
        "tests/test_calc.py": "import pytest\nfrom calc import add\n\n"
        "@pytest.mark.parametrize('x', [1])\ndef test_add(x, monkeypatch):\n"
        "    monkeypatch.setattr('calc.K', 2)\n    assert add(x, 1) == 2\n",
        "tests/test_gen.py": "def pytest_generate_tests(metafunc):\n    pass\n",
        "src/calc.py": "def add(a, b):\n    return a + b\n",
        "README.md": "# hi\n",
    }
    assert support_changes(list(files), _reader(files)) == []
    assert touches_machinery("def broken(:\n") is None  # does not parse: nothing to see


def test_the_merge_plan_waits_for_a_person_when_support_code_changed(tmp_path: Path) -> None:
    project = tmp_path / "p"
    (project / "tests").mkdir(parents=True)
    (project / "tests" / "conftest.py").write_text("import pytest\n")  # the person's: fine
    (project / "calc.py").write_text("def sub(a, b):\n    return a - b\n")
    merger = Merger(project, tmp_path / "state", roots=("calc.py", "tests/**"))
    stage = Staging(tmp_path / "stage", project)
    stage.stage("calc.py", b"def sub(a, b):\n    return 999\n")
    assert merger.plan(stage, tests_pass=True).auto  # an ordinary change merges alone
    stage.stage("tests/conftest.py", FORGE.encode())
    plan = merger.plan(stage, tests_pass=True)
    assert not plan.auto and [s.path for s in plan.support] == ["tests/conftest.py"]
    assert any("tests/conftest.py (pytest loads it" in r for r in plan.reasons)


@pytest.mark.parametrize(
    ("path", "text", "why"),
    [
        ("tests/.pytest.ini", "[pytest]\naddopts = -p helper\n", "configures the test runner"),
        ("tests/sub/setup.cfg", "[tool:pytest]\n", "configures the test runner"),
        ("tests/sub/local.toml", "x = 1\n", "when tests run from its folder"),
        ("tests/helper.py", "import pytest\n\ndef _wrap(item, call):\n    yield\n\n"
         "pytest_runtest_makereport = pytest.hookimpl(hookwrapper=True)(_wrap)\n",
         "binds the pytest hook pytest_runtest_makereport"),
        ("src/calc.py", "import pytest\nR = pytest.TestReport\n",
         "code outside the tests imports the test runner (pytest)"),
    ],
)  # fmt: skip
def test_what_the_red_team_used_is_named_too(path: str, text: str, why: str) -> None:
    (found,) = support_changes([path], _reader({path: text}))
    assert why in found.why


def test_a_plugin_named_by_a_test_module_is_support_code() -> None:
    files = {"tests/test_x.py": "pytest_plugins = ['tests.forge']\n", "tests/forge.py": "X = 1\n"}
    found = {c.path: c.why for c in support_changes(list(files), _reader(files))}
    assert found == {"tests/forge.py": "pytest loads it as the plugin tests.forge"}


@pytest.mark.parametrize(
    ("path", "files", "why"),
    [
        ("pytest.py", {}, "in place of the test runner's pytest"),
        (
            "coverage/__main__.py",
            {"coverage/__init__.py": ""},
            "in place of the test runner's coverage",
        ),
        ("pygments/__init__.py", {}, "in place of the test runner's pygments"),
        ("Evil-1.0.DIST-INFO/entry_points.txt", {}, "package's metadata"),
        ("src/distutils.py", {}, "in place of Python's own distutils"),
        ("src/pluggy.py", {}, "in place of the test runner's pluggy"),
        (
            "pytest_cov/plugin.py",
            {"pytest_cov/__init__.py": ""},
            "in place of the test runner's pytest_cov",
        ),
        ("tests/json.py", {}, "in place of Python's own json"),
        (
            "lib/unittest/case.py",
            {"lib/unittest/__init__.py": ""},
            "in place of Python's own unittest",
        ),
        ("site.py", {}, "the test runner's site"),
        ("evil-1.0.dist-info/entry_points.txt", {}, "package's metadata"),
        ("src/x.egg-info/entry_points.txt", {}, "package's metadata"),
    ],
)
def test_a_module_that_takes_the_runners_place_is_support_code(
    path: str, files: dict[str, str], why: str
) -> None:
    """Red team pass 2: a flat layout's new top-level pytest.py replaced the runner in the
    sandbox (the working folder comes first on sys.path) and its fake report auto-merged."""
    (found,) = support_changes([path], _reader({path: "x = 1\n", **files}))
    assert why in found.why


def test_a_module_inside_a_package_may_share_a_standard_name() -> None:
    files = {
        "src/app/__init__.py": "",
        "src/app/json.py": "x = 1\n",
        "app2/__init__.py": "",
        "app2/types.py": "x = 1\n",
        "tests/__init__.py": "",
        "tests/queue.py": "x = 1\n",
        "calc.py": "x = 1\n",
        "config/secrets/db.yaml": "x: 1\n",
    }
    changed = ["src/app/json.py", "app2/types.py", "tests/queue.py", "calc.py"]
    changed.append("config/secrets/db.yaml")  # data under a folder named like a module
    # namespace folders (no __init__.py) never take a regular package's place
    files |= {"tests/http/test_client.py": "x = 1\n", "examples/asyncio/basic.py": "x = 1\n"}
    changed += ["tests/http/test_client.py", "examples/asyncio/basic.py"]
    assert support_changes(changed, _reader(files)) == []
