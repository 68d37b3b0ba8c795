"""The canary check: a pytest run counts only if the tests that must fail did.

A run's report is written by the test process, and code in it -- a cloned repository's
``conftest.py``, a plugin it loads, product code that patches pytest -- can turn
failures into passes.  So every pytest run fluffy starts carries a canary (the test
tool's :mod:`fluffy.plugins.test_tool.canary`): two tests named with a token the kernel
draws for that run alone, added to each collected test file, which always fail (one on
an assertion, one on an error, as wrong code fails).  It
runs under the same hooks, plugins and patches as the file's own tests, so code that
rewrites their outcomes rewrites the canary's too, unless it was written to spare it.

:func:`without_canaries` takes the canaries out of a run's cases and refuses the run
(:class:`~fluffy.errors.ForgedEvidence`) when a canary passed, or when a file with a
passing test reported a canary skipped or not at all.  A canary that errored (a
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


#: Each file's canaries: one whose assertion fails, one that raises an error.
KINDS = ("a", "e")


def draw() -> str:
    """A new run's canary token (the test tool's ``canary`` setting): 32 decimal digits,
    so that no project's skip by a word in a test's name matches it."""
    return f"{secrets.randbelow(10**32):032d}"


def canary_name(token: str, kind: str) -> str:
    """The name of a file's canary of ``kind`` in a run with ``token``."""
    return f"test_{token}_{kind}"


def canary_kind(case: TestCase, token: str) -> str | None:
    """The kind of canary ``case`` is in a run with ``token`` (None: not one)."""
    name = case.id.rpartition("::")[2]
    prefix = f"test_{token}_"
    kind = name[len(prefix) :] if name.startswith(prefix) else None
    return kind if kind in KINDS else None


def without_canaries(cases: Sequence[TestCase], token: str | None, *, run: str) -> list[TestCase]:
    """``cases`` without the run's canaries; ``run``: which run, for the error (``"the
    test run"``).  ``token`` None: the run had none (a project's own command)."""
    if token is None:
        return list(cases)
    canaries: dict[str, dict[str, str]] = {}  # file -> kind -> outcome (the worst)
    own: list[TestCase] = []
    for case in cases:
        kind = canary_kind(case, token)
        if kind is None:
            own.append(case)
            continue
        outcomes = canaries.setdefault(case.file, {})
        if outcomes.get(kind) != "passed":  # xdist may report one twice: a pass counts
            outcomes[kind] = case.outcome
    passing = sorted({case.file for case in own if case.outcome == "passed"})
    wrong: list[tuple[str, str]] = []
    for file, outcomes in sorted(canaries.items()):
        if "passed" in outcomes.values():
            wrong.append((file, "passed"))
    for file in passing:
        outcomes = canaries.get(file, {})
        if "passed" in outcomes.values():
            continue  # named above
        if len(outcomes) < len(KINDS):
            wrong.append((file, "not reported"))
        elif not all(outcome in _FAILED for outcome in outcomes.values()):
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
        why="fluffy adds to each test file it runs two tests that always fail, under a "
        "name drawn for this run alone; code in the run -- a conftest.py hook such as "
        "pytest_runtest_makereport, a pytest plugin the project loads, or code that "
        "patches pytest -- changed its outcome, so no outcome of this run can be trusted",
        fix="Read the project's conftest.py files and the plugins its pytest settings "
        "load (-p, pytest_plugins) for code that rewrites test reports or outcomes, remove "
        "it, then run the tests again. A repository you have not read may do this on "
        "purpose: do not run its tests outside a sandbox.",
    )
