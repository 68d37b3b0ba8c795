"""The canary check: a pytest run counts only if the tests that must fail did.

A run's report is written by the test process, and code in it -- a cloned repository's
``conftest.py``, a plugin it loads, product code that patches pytest -- can turn
failures into passes.  So every pytest run fluffy starts carries a canary (the test
tool's :mod:`fluffy.plugins.test_tool.canary`): a test named with a token the kernel
draws for that run alone, added to each collected test file, which always fails.  It
runs under the same hooks, plugins and patches as the file's own tests, so code that
rewrites their outcomes rewrites the canary's too, unless it was written to spare it.

:func:`without_canaries` takes the canaries out of a run's cases and refuses the run
(:class:`~fluffy.errors.ForgedEvidence`) when a canary passed, or when a file with a
passing test reported its canary skipped or not at all.  A canary that errored (a
fixture of the file's that fails) still failed.  A file with no passing test needs no
canary: it is no evidence of green (with ``-x``, pytest stops before later files).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

from fluffy.errors import ForgedEvidence
from fluffy.junit import TestCase

#: The canary's outcomes that mean the run reports failures as failures.
_FAILED = ("failed", "error")
#: Files named in an error, at most.
_NAMED = 5


def draw() -> str:
    """A new run's canary token (32 hex digits: the test tool's ``canary`` setting)."""
    return secrets.token_hex(16)


def canary_name(token: str) -> str:
    """The canary's test name in a run with ``token``."""
    return f"test_{token}"


def is_canary(case: TestCase, token: str) -> bool:
    return case.id.rpartition("::")[2] == canary_name(token)


def without_canaries(cases: Sequence[TestCase], token: str | None, *, run: str) -> list[TestCase]:
    """``cases`` without the run's canaries; ``run``: which run, for the error (``"the
    test run"``).  ``token`` None: the run had none (a project's own command)."""
    if token is None:
        return list(cases)
    canaries: dict[str, list[str]] = {}
    own: list[TestCase] = []
    for case in cases:
        if is_canary(case, token):
            canaries.setdefault(case.file, []).append(case.outcome)
        else:
            own.append(case)
    passing = sorted({case.file for case in own if case.outcome == "passed"})
    wrong: list[tuple[str, str]] = [
        (file, "passed") for file, outcomes in sorted(canaries.items()) if "passed" in outcomes
    ]
    for file in passing:
        outcomes = canaries.get(file)
        if not outcomes:
            wrong.append((file, "not reported"))
        elif not all(outcome in _FAILED for outcome in outcomes) and "passed" not in outcomes:
            wrong.append((file, "skipped"))
    if wrong:
        raise _forged(wrong, run)
    return own


def _forged(wrong: list[tuple[str, str]], run: str) -> ForgedEvidence:
    named = "; ".join(f"{file or '(no file)'}: {said}" for file, said in wrong[:_NAMED])
    more = f" (and {len(wrong) - _NAMED} more files)" if len(wrong) > _NAMED else ""
    return ForgedEvidence(
        f"{run} cannot count as evidence: a test that must fail was not reported as a "
        f"failure ({named}{more})",
        why="fluffy adds to each test file it runs one test that always fails, under a "
        "name drawn for this run alone; code in the run -- a conftest.py hook such as "
        "pytest_runtest_makereport, a pytest plugin the project loads, or code that "
        "patches pytest -- changed its outcome, so no outcome of this run can be trusted",
        fix="Read the project's conftest.py files and the plugins its pytest settings "
        "load (-p, pytest_plugins) for code that rewrites test reports or outcomes, remove "
        "it, then run the tests again. A repository you have not read may do this on "
        "purpose: do not run its tests outside a sandbox.",
    )
