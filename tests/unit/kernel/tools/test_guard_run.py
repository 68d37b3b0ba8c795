"""The cross-check of a green run, with its sandbox faked: what counts as the person's
tests passing (kernel.tools.testing.guardrun).  The real sandboxes: tests/integration/
test_forged_green.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from xml.sax.saxutils import escape

import msgspec

from fluffy.junit import TestCase
from fluffy.kernel.tools.testing.guardrun import Verdict, cross_check
from fluffy.pathnames import shown

OVERLAY = {"tests/test_new.py": "a" * 64, "src/calc.py": "b" * 64}
GLOBS = ("tests/**",)


class _Call(msgspec.Struct):  # a RoutedCall's fields the cross-check reads
    call_id: str = "c1"
    args: dict[str, Any] = msgspec.field(default_factory=dict)
    session: Any = msgspec.field(default_factory=lambda: SimpleNamespace(id="s1"))


def _junit(cases: list[tuple[str, str]]) -> bytes:
    """A pytest-style report: (node id, outcome)."""
    body = ""
    for node, outcome in cases:
        path, name = node.split("::")
        inner = {"passed": "", "failed": "<failure message='boom'>x</failure>",
                 "skipped": "<skipped message='later'/>"}[outcome]  # fmt: skip
        body += (
            f'<testcase classname="{path[:-3].replace("/", ".")}" name="{name}">{inner}</testcase>'
        )
    return f'<testsuites><testsuite name="pytest">{body}</testsuite></testsuites>'.encode()


def _check(
    report: bytes | None,
    exit_code: int,
    *,
    expected: set[tuple[str, str]] | None = None,
    seen: tuple[TestCase, ...] = (),
    overlay: dict[str, str] = OVERLAY,
) -> Verdict:
    plan = SimpleNamespace(custom=False, dialect="pytest", runner="pytest", canary=None)
    preparer = SimpleNamespace(prepare=lambda *a, **k: plan)
    outcome = SimpleNamespace(result={"junit": "r.xml", "exit_code": exit_code}, call_dir=Path())

    async def sandbox(call: Any, plan: Any) -> Any:
        return outcome

    async def release(outcome: Any) -> None:
        return None

    verdict = asyncio.run(
        cross_check(
            _Call(),  # type: ignore[arg-type]
            preparer=preparer,  # type: ignore[arg-type]
            overlay=overlay,
            staged_tree=None,
            test_globs=GLOBS,
            sandbox=sandbox,
            release=release,
            read=lambda outcome, name: report,
            seen=seen,
            expected=expected,
        )
    )
    assert verdict is not None
    return verdict


BASE = {("tests/test_calc.py::test_add", "tests/test_calc.py")}


def test_all_the_persons_passing_tests_pass_again_holds() -> None:
    report = _junit([("tests/test_calc.py::test_add", "passed")])
    assert _check(report, 0, expected=BASE).holds


def test_no_report_or_an_interrupted_run_counts_as_failing() -> None:
    (case,) = _check(None, 0, expected=BASE).broken
    assert case.id == "(no report)" and "exited with 0 and wrote no report" in case.message
    interrupted = _check(_junit([]), 2, expected=BASE)
    assert [c.id for c in interrupted.broken] == ["(unfinished run)"]
    assert interrupted.vanished == ("tests/test_calc.py::test_add",)
    quiet = _check(_junit([("tests/test_calc.py::test_add", "passed")]), 1, expected=BASE)
    assert [c.id for c in quiet.broken] == ["(unfinished run)"]  # "failed", yet no failure


def test_a_test_that_passes_on_the_base_but_is_skipped_now_goes_to_a_person() -> None:
    skipped = _check(_junit([("tests/test_calc.py::test_add", "skipped")]), 0, expected=BASE)
    assert not skipped.broken and skipped.vanished == ("tests/test_calc.py::test_add",)
    assert "did not run (or were skipped)" in skipped.review_reasons()[0]


def test_a_test_new_in_the_green_run_is_not_expected_of_the_base() -> None:
    """Data-driven tests: the session's new data file adds an id to an unchanged test
    file; the base never had it, so its absence from the cross-check is no reason."""
    new = TestCase("tests/test_calc.py::test_golden[new]", "tests/test_calc.py", "passed",
                   False, "")  # fmt: skip
    report = _junit([("tests/test_calc.py::test_add", "passed")])
    assert _check(report, 0, expected=BASE, seen=(new,)).holds
    # without a base run to compare with, the green run's own passes are the reference
    assert _check(report, 0, expected=None, seen=(new,)).vanished == (new.id,)


def test_a_session_test_file_under_a_quoted_name_is_the_sessions_change() -> None:
    # the report names the file as fluffy.pathnames quotes it; the overlay has the raw name
    raw = "tests/a\x01/test_y.py"  # a control character: quoted whole
    quoted = escape(shown(raw), {'"': "&quot;"})
    classname = quoted.replace("/", ".")
    report = (
        "<testsuites><testsuite>"
        f'<testcase classname="tests.test_calc" name="test_add" file="tests/test_calc.py"/>'
        f'<testcase classname="{classname}" name="test_y" file="{quoted}">'
        "<failure message='boom'>x</failure></testcase></testsuite></testsuites>"
    ).encode()
    verdict = _check(report, 1, expected=BASE, overlay={raw: "a" * 64})
    assert verdict.changed == (f"{shown(raw)}::test_y",) and not verdict.broken
