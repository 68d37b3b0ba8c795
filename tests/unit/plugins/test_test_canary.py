"""The canary in real pytest runs: hidden from an honest run, fatal to a forged one.

test.run runs here as in its sandbox (the plugin's job against temp folders), with the
kernel's ``canary`` setting; its JUnit report is read by the kernel's rule.  Forgeries
are the ways code in the run turns failures into passes without knowing the token: a
``conftest.py`` report rewriter (the red-team's cloned repository), one that turns
failures into skips, a test module that patches pytest's report class, and a
collection hook that drops the items fluffy added.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fluffy.errors import ForgedEvidence
from fluffy.junit import TestCase, parse_junit
from fluffy.kernel.tools.testing.canary import draw, without_canaries
from fluffy.plugins.sdk import Roots
from tests.project_support import REWRITES_FAILURES
from tests.unit.builtin_support import call, ok
from tests.unit.trees import write_tree

pytestmark = pytest.mark.unit

CALC = "def sub(a, b):\n    return 999\n"
TESTS = {
    "calc.py": CALC,
    "tests/test_calc.py": "from calc import sub\n\n\ndef test_sub():\n    assert sub(3, 1) == 2\n",
    "tests/sub/test_more.py": (
        "import unittest\n\n\nclass TestMore(unittest.TestCase):\n"
        "    def test_one(self):\n        self.assertTrue(1)\n"
    ),
}
REWRITE = REWRITES_FAILURES
TO_SKIPS = """\
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.outcome = "skipped"
        report.longrepr = (str(item.path), 1, "Skipped: flaky")
"""
PATCH_PYTEST = """\
import _pytest.reports

_made = _pytest.reports.TestReport.from_item_and_call.__func__


def _passing(cls, item, call):
    report = _made(cls, item, call)
    report.outcome = "passed"
    return report


_pytest.reports.TestReport.from_item_and_call = classmethod(_passing)
"""
#: Drops fluffy's items after every collection hook (it knows their class's name).
DROP = REWRITE + (
    "\n\ndef pytest_collection_finish(session):\n"
    "    session.items[:] = [i for i in session.items if 'Canary' not in type(i).__name__]\n"
)
#: Soft assertions: only assertion failures become passes (errors stay errors).
ASSERTIONS_PASS = """\
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is not None and call.excinfo.errisinstance(AssertionError):
        report.outcome = "passed"
"""
#: Errors of the code under test are swallowed; assertions still fail.
ERRORS_PASS = """\
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    outcome = yield
    if outcome.excinfo is not None and not isinstance(outcome.excinfo[1], AssertionError):
        outcome.force_result(True)
"""
#: Every collected item's test wrapped so that nothing it raises escapes.
WRAPS_ITEMS = """\
def pytest_collection_modifyitems(items):
    for item in items:
        def quiet(run=item.runtest):
            try:
                run()
            except Exception:
                pass
        item.runtest = quiet
"""
#: Every test marked xfail as it is set up: failures become expected ones.
XFAIL_ALL = """\
import pytest


def pytest_runtest_setup(item):
    item.add_marker(pytest.mark.xfail(reason="known flaky"))
"""


@pytest.fixture()
def project(tmp_path: Path) -> Roots:
    roots = Roots(tmp_path / "workspace", tmp_path / "staged", tmp_path / "output")
    for folder in (roots.workspace, roots.staged / "tree", roots.output):
        folder.mkdir(parents=True)
    write_tree(roots.workspace, TESTS)
    return roots


def run(roots: Roots, call_id: str, **args: Any) -> tuple[dict[str, Any], list[TestCase], str]:
    token = draw()
    settings = {"import_roots": ["."], "coverage": False, "canary": token}
    result = ok(call(roots, "test.run", args, call_id, settings))
    junit = (roots.output / call_id / "junit.xml").read_bytes()
    return result, parse_junit(junit), token


def test_an_honest_run_shows_no_canary_and_keeps_its_exit_status(project: Roots) -> None:
    # the project's own settings stop at the first failure and name every test
    (project.workspace / "pytest.ini").write_text("[pytest]\naddopts = -x -v\n")
    result, cases, token = run(project, "c1")
    assert result["exit_code"] == 1  # test_sub fails: 999
    assert token not in result["output_tail"] and "1 failed, 1 passed" in result["output_tail"]
    assert result["counts"]["found"] == 2 and result["counts"]["failed"] == 1
    own = without_canaries(cases, token, run="this run")
    assert {(c.id, c.outcome) for c in own} == {
        ("tests/test_calc.py::test_sub", "failed"),
        ("tests/sub/test_more.py::TestMore::test_one", "passed"),
    }
    assert len(cases) == 6  # two canaries per file, each failed, -x notwithstanding
    (project.workspace / "calc.py").write_text("def sub(a, b):\n    return a - b\n")
    green, cases, token = run(project, "c2")
    assert green["exit_code"] == 0 and "2 passed" in green["output_tail"]
    assert "[100%]" in green["output_tail"] or "PASSED" in green["output_tail"]
    assert len(without_canaries(cases, token, run="this run")) == 2


def test_an_honest_run_in_workers_has_its_canaries(project: Roots) -> None:
    (project.workspace / "pytest.ini").write_text("[pytest]\naddopts = -p xdist -n 2\n")
    (project.workspace / "calc.py").write_text("def sub(a, b):\n    return a - b\n")
    result, cases, token = run(project, "c1")
    assert result["exit_code"] == 0, result["output_tail"]
    assert len(without_canaries(cases, token, run="this run")) == 2


CALC_TEST, MORE_TEST = "tests/test_calc.py", "tests/sub/test_more.py"


@pytest.mark.parametrize(
    ("path", "code", "said"),  # files in sorted order
    [
        ("tests/conftest.py", REWRITE, f"{MORE_TEST}: passed; {CALC_TEST}: passed"),
        # the failures skip; the other file's pass keeps its canary's skip in view
        ("conftest.py", TO_SKIPS, f"{MORE_TEST}: skipped"),
        ("tests/sub/conftest.py", REWRITE, f"({MORE_TEST}: passed)"),  # one folder's hooks
        ("tests/test_calc.py", PATCH_PYTEST + TESTS[CALC_TEST], f"{CALC_TEST}: passed"),
        ("conftest.py", DROP, f"{MORE_TEST}: not reported; {CALC_TEST}: not reported"),
        ("conftest.py", ASSERTIONS_PASS, f"{MORE_TEST}: passed; {CALC_TEST}: passed"),
        ("conftest.py", ERRORS_PASS, f"{MORE_TEST}: passed; {CALC_TEST}: passed"),
        ("conftest.py", WRAPS_ITEMS, f"{MORE_TEST}: passed; {CALC_TEST}: passed"),
        ("conftest.py", XFAIL_ALL, f"{MORE_TEST}: skipped"),  # test_one passes (xpass)
    ],
)
def test_a_run_that_turns_failures_into_passes_is_refused(
    project: Roots, path: str, code: str, said: str
) -> None:
    (project.workspace / path).write_text(code)
    _, cases, token = run(project, "c1", paths=["tests"])
    with pytest.raises(ForgedEvidence) as info:
        without_canaries(cases, token, run="this test run")
    assert said in info.value.what


HONEST: dict[str, dict[str, str]] = {
    # a fixture skips every test of a folder (no database here): skipped, not refused
    "autouse skip": {
        "tests/sub/conftest.py": (
            "import pytest\n\n\n@pytest.fixture(autouse=True)\ndef db():\n"
            "    pytest.skip('no DATABASE_URL')\n"
        )
    },
    "module skip": {"tests/sub/test_more.py": "import pytest\n\npytestmark = pytest.mark.skip\n"},
    "stepwise": {"pytest.ini": "[pytest]\naddopts = --sw\n"},
    "a skip by a word in the name": {
        "conftest.py": (
            "import pytest\n\n\ndef pytest_runtest_setup(item):\n"
            "    if any(word in item.name for word in ('db', 'e2e', 'a1')):\n"
            "        pytest.skip('needs a database')\n"
        )
    },
}


@pytest.mark.parametrize("shape", sorted(HONEST))
def test_an_honest_project_is_not_refused(project: Roots, shape: str) -> None:
    (project.workspace / "calc.py").write_text("def sub(a, b):\n    return a - b\n")
    write_tree(project.workspace, HONEST[shape])
    result, cases, token = run(project, "c1")
    assert result["exit_code"] in (0, 5), result["output_tail"]
    own = without_canaries(cases, token, run="this run")
    assert "tests/test_calc.py::test_sub" in {c.id for c in own if c.outcome == "passed"}


def test_a_keyword_run_keeps_its_canaries_and_its_summary(project: Roots) -> None:
    (project.workspace / "calc.py").write_text("def sub(a, b):\n    return a - b\n")
    result, cases, token = run(project, "c1", keyword="test_sub")
    assert "1 passed, 1 deselected" in result["output_tail"]
    assert [c.id for c in without_canaries(cases, token, run="r")] == [
        "tests/test_calc.py::test_sub"
    ]
