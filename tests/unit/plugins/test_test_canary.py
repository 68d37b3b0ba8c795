"""The canary in real pytest runs: hidden from an honest run, fatal to a forged one.

test.run runs here as in its sandbox (the plugin's job against temp folders), with the
kernel's ``canary`` setting; its JUnit report is read by the kernel's rule.  Forgeries
are the ways code in the run turns failures into passes without knowing the token: a
``conftest.py`` report rewriter (the red-team's cloned repository), one that turns
failures into skips, a test module that patches pytest's report class, and a
collection hook that drops the items fluffy added.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fluffy.errors import ForgedEvidence
from fluffy.junit import TestCase, parse_junit
from fluffy.kernel.tools.testing.canary import draw, without_canaries
from fluffy.pathnames import matchable, shown
from fluffy.plugins.sdk import Roots
from fluffy.plugins.test_tool.canary import NAMES
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


def test_tests_under_names_that_are_not_utf8_are_run_and_reported(project: Roots) -> None:
    # a Latin-1 checkout, or a repository that would stop every run with one such name;
    # ids quoted as fluffy.pathnames quotes them (a control character too); a failure's
    # message with a lone surrogate in it is reported, not an internal error
    odd_bodies = (
        (b"tests/caf\xe9", "assert True, __file__"),
        (b"tests/caf\xff", "assert False, __file__"),
        (b"tests/ctl\x01", "raise ValueError('\\ud800')"),
    )
    for raw, body in odd_bodies:
        odd = project.workspace / os.fsdecode(raw)
        odd.mkdir()
        name = f"test_odd_{raw[-1]:o}.py"  # pytest needs distinct basenames without __init__
        (odd / name).write_text(f"def test_odd():\n    {body}\n")
    result, cases, token = run(project, "c1")
    own = {c.id: c.outcome for c in without_canaries(cases, token, run="this run")}
    assert own == {
        '"tests/caf\\351/test_odd_351.py"::test_odd': "passed",
        '"tests/caf\\377/test_odd_377.py"::test_odd': "failed",
        '"tests/ctl\\001/test_odd_1.py"::test_odd': "failed",
        "tests/test_calc.py::test_sub": "failed",
        "tests/sub/test_more.py::TestMore::test_one": "passed",
    }
    assert "3 failed, 2 passed" in result["output_tail"], result["output_tail"]


@given(
    st.lists(
        st.sampled_from(
            [b'"', b"\\", b"3", b"5", b"\xe9", b"\xc3", b"\xa9", b"/", b"\x01", b"\xef\xbf\xbf"]
        ),
        min_size=1,
        max_size=8,
    ).map(b"".join)
)
def test_the_plugin_quotes_a_test_files_path_as_the_kernel_does(raw: bytes) -> None:
    # the plugin runs in the project's interpreter: its own copy of fluffy.pathnames.shown
    path = os.fsdecode(raw)
    assert PLUGIN_NAMES["_quoted"](path) == shown(path)
    assert PLUGIN_NAMES["_readable"](path) == matchable(path)


def _plugin_names() -> dict[str, Any]:
    """The plugin's naming helpers, run apart from its hooks (which patch pytest)."""
    source = NAMES[NAMES.index("_SURROGATE") : NAMES.index("def _readable_names")]
    scope: dict[str, Any] = {"re": re}
    exec(compile(source, "fluffy_canary_names", "exec"), scope)
    return scope


PLUGIN_NAMES = _plugin_names()


def test_a_failure_raised_in_a_quoted_test_file_is_raised_in_that_file() -> None:
    # the traceback names it with U+FFFD; the case's file is quoted (natural red)
    case = TestCase(
        id='"tests/caf\\351/test_m.py"::test_m',
        file='"tests/caf\\351/test_m.py"',
        outcome="failed",
        assertion=False,
        message="ImportError: cannot import name 'm'",
        origin="/workspace/tests/caf\ufffd/test_m.py",
    )
    assert case.raised_in_test()
    assert not msgspec.structs.replace(case, origin="/workspace/src/m.py").raised_in_test()
    # a control character: pytest writes it #xNN in the report's text
    ctl = msgspec.structs.replace(
        case, file='"tests/ctl\\001/test_m.py"', origin="/workspace/tests/ctl#x01/test_m.py"
    )
    assert ctl.raised_in_test()
