"""The kernel's canary rule: every file with a passing test reports its canary failed."""

from __future__ import annotations

import pytest

from fluffy.errors import ForgedEvidence
from fluffy.junit import TestCase
from fluffy.kernel.tools.testing.canary import KINDS, canary_name, draw, without_canaries

pytestmark = pytest.mark.unit

TOKEN = "0123456789" * 3 + "42"


def case(file: str, name: str, outcome: str) -> TestCase:
    return TestCase(f"{file}::{name}", file, outcome, outcome == "failed", "")  # type: ignore[arg-type]


def canary(file: str, outcome: str, kind: str = "a") -> TestCase:
    return case(file, canary_name(TOKEN, kind), outcome)


def canaries(file: str, outcome: str) -> list[TestCase]:
    """A file's canaries, both of one outcome."""
    return [canary(file, outcome, kind) for kind in KINDS]


def test_the_canaries_are_taken_out_of_an_honest_run() -> None:
    one = case("tests/test_a.py", "test_one", "passed")
    two = case("tests/test_b.py", "test_two", "failed")
    three = case("tests/test_c.py", "test_three", "skipped")  # no pass here: needs no canary
    cases = [
        *canaries("tests/test_a.py", "failed"),
        one,
        canary("tests/test_b.py", "error"),  # a fixture of the file's failed it: still failed
        two,
        three,
    ]
    assert without_canaries(cases, TOKEN, run="this run") == [one, two, three]


PASS = case("t/test_a.py", "test_x", "passed")


@pytest.mark.parametrize(
    ("cases", "said"),
    [
        ([*canaries("t/test_a.py", "passed"), case("t/test_a.py", "test_x", "passed")], "passed"),
        # only the error canary passed: failures that are not assertions were rewritten
        (
            [canary("t/test_a.py", "failed"), canary("t/test_a.py", "passed", "e"), PASS],
            "passed",
        ),
        ([canary("t/test_a.py", "failed"), canary("t/test_a.py", "skipped", "e"), PASS], "skip"),
        ([PASS], "not reported"),
        ([canary("t/test_a.py", "failed"), PASS], "not reported"),  # one of the two
        # a canary that passed condemns the run even where nothing else passed
        ([canary("t/test_a.py", "passed"), case("t/test_a.py", "test_x", "failed")], "passed"),
        # another file's canaries do not vouch for this one
        ([*canaries("t/test_b.py", "failed"), PASS], "not rep"),
    ],
)
def test_a_run_whose_canary_did_not_fail_is_refused(cases: list[TestCase], said: str) -> None:
    with pytest.raises(ForgedEvidence, match=f"t/test_a.py: {said}") as info:
        without_canaries(cases, TOKEN, run="this test run")
    assert info.value.code == "workflow.evidence_forged"
    assert "conftest.py" in info.value.why and "rewrites test reports" in info.value.fix


def test_another_runs_token_is_an_ordinary_test_name() -> None:
    other = case("t/test_a.py", canary_name(draw(), "a"), "passed")
    mine = canaries("t/test_a.py", "failed")
    assert without_canaries([*mine, other], TOKEN, run="r") == [other]


def test_a_run_without_a_canary_is_taken_as_it_is() -> None:
    cases = [case("t/test_a.py", "test_x", "passed")]
    assert without_canaries(cases, None, run="r") == cases


def test_many_files_are_named_in_short() -> None:
    cases = [case(f"t/test_{n}.py", "test_x", "passed") for n in range(8)]
    with pytest.raises(ForgedEvidence, match=r"and 3 more files"):
        without_canaries(cases, TOKEN, run="r")


def test_each_run_draws_a_new_token() -> None:
    tokens = {draw() for _ in range(50)}
    assert len(tokens) == 50 and all(len(t) == 32 and t.isdigit() for t in tokens)
