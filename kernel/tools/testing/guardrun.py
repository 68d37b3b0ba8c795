"""The person's tests against the session's code: the cross-check of a green run.

A run's outcome is written by the test process, and the session's own test files run
in it: a test module can patch pytest (``pytest.TestReport.failed = property(...)``)
without a hook, an import of ``_pytest`` or any name a reader could list, and turn the
person's failing tests green.  So before a green run may lead to the merge, the kernel
runs the suite once more in a view of its own where every test-side file is as it was
before the session (the session's new and changed tests, helpers and conftests under
the test folders left out) and the code is the session's.  Nothing the session wrote
on the test side is in that process.

* a failing test in a file the session did not change: the session's code breaks the
  person's test; the green run was not the truth, and the run counts as failing;
* a failing test in a file the session changed: the session changed an existing test
  whose original fails now; a person must look (the merge waits for review);
* a test that passes on the base tree (the project without the session's changes,
  :mod:`.baserun`) in a file the session did not change, but which the cross-check did
  not run or skipped: the session's code changed what the person's suite runs (an import
  that skips, an interrupt); a person must look (the merge waits for review).  Without a
  base run to compare with, the green run's own passes are the reference;
* no report at all, or an exit status pytest gives for neither passes nor failures (an
  interrupt, an internal error), or "tests failed" with no failing test in the report:
  the run counts as failing;
* all pass: the green run stands.

The cross-check runs only when the session changed something on the test side (else the
green run *is* this run), and only for a run that decides the merge (ADR-058).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

import msgspec

from fluffy.junit import TestCase, parse_junit
from fluffy.kernel.globs import GlobSet
from fluffy.kernel.tools.core.routedcall import RoutedCall
from fluffy.kernel.tools.sandbox.pluginjob import PluginOutcome
from fluffy.kernel.tools.testing.canary import without_canaries
from fluffy.kernel.tools.testing.testprep import TestPlan, TestPreparer
from fluffy.pathnames import shown

#: How a failing case of the cross-check is named in the run's evidence.
PREFIX = "[the person's tests, without this session's test changes] "
GUARD_SUFFIX = ".person"


class Verdict(msgspec.Struct, frozen=True):
    """What the cross-check found."""

    broken: tuple[TestCase, ...]  # failing, in files the session did not change
    changed: tuple[str, ...]  # ids failing in files the session changed
    found: int  # tests it ran
    #: ids the green run passed in files the session did not change that the cross-check
    #: did not run, or skipped
    vanished: tuple[str, ...] = ()

    @property
    def holds(self) -> bool:
        return not self.broken and not self.changed and not self.vanished

    def review_reasons(self) -> list[str]:
        """Why a person must look before the merge (none: nothing to look at)."""
        reasons = []
        if self.changed:
            reasons.append(
                "the session changed existing tests whose original versions fail against "
                f"its code: {_shown(self.changed)}"
            )
        if self.vanished:
            reasons.append(
                "tests of the person's that passed in the session's run did not run (or were "
                f"skipped) without the session's test changes: {_shown(self.vanished)}"
            )
        return reasons


def _shown(ids: Sequence[str]) -> str:
    return ", ".join(ids[:10]) + (" ..." if len(ids) > 10 else "")


def test_side(overlay: Mapping[str, str | None], test_globs: Sequence[str]) -> set[str]:
    """The session's changes on the test side (under the test folders)."""
    tests = GlobSet(tuple(test_globs))
    return {path for path in overlay if tests.match(path)}


def is_whole(args: Mapping[str, object]) -> bool:
    """A run of the whole suite: no paths, no keyword (only such a run decides a merge)."""
    return not args.get("paths") and not args.get("keyword")


async def cross_check(
    call: RoutedCall,
    *,
    preparer: TestPreparer,
    overlay: Mapping[str, str | None],
    staged_tree: object,
    test_globs: Sequence[str],
    sandbox: Callable[[RoutedCall, TestPlan], Awaitable[PluginOutcome]],
    release: Callable[[PluginOutcome], Awaitable[None]],
    read: Callable[[PluginOutcome, object], bytes | None],
    known: set[str] | None = None,
    seen: Sequence[TestCase] = (),
    expected: Iterable[tuple[str, str]] | None = None,
) -> Verdict | None:
    """Run the person's tests against the session's code (None: nothing on the test
    side changed, so the session's run already was this one); ``expected``: the (id,
    file) of each test that passed on the base tree, else those ``seen`` pass in the
    green run being checked."""
    changed = test_side(overlay, test_globs)
    if not changed:
        return None
    kept = {path: sha for path, sha in overlay.items() if path not in changed}
    plan = await asyncio.to_thread(
        preparer.prepare,
        call.session.id + GUARD_SUFFIX,
        kept,
        staged_tree,  # type: ignore[arg-type]
        test_globs,
        coverage=False,
    )
    guard_call = msgspec.structs.replace(call, call_id=call.call_id + GUARD_SUFFIX, args={})
    outcome = await sandbox(guard_call, plan)
    try:
        junit = read(outcome, outcome.result.get("junit"))
        exit_code = int(outcome.result.get("exit_code", -1))
    finally:
        await release(outcome)
    tail = str(outcome.result.get("output_tail", ""))[-1000:]
    if junit is None:  # pytest always writes one: the process ended before it could
        unfinished = _unfinished("(no report)", exit_code, "wrote no report", tail, plan.runner)
        return Verdict((unfinished,), (), 0)
    cases = without_canaries(
        parse_junit(junit, name="the cross-check's junit report", dialect=plan.dialect),
        plan.canary,
        run="the run of the person's tests against this session's code",
    )
    old = known or set()  # failing on the base tree too: not the session's doing
    named = {shown(path) for path in changed}  # the changed files as the report names them
    failing = [c for c in cases if c.outcome in ("failed", "error") and c.id not in old]
    broken = tuple(c for c in failing if c.file not in named)
    altered = tuple(c.id for c in failing if c.file in named)
    any_failing = any(c.outcome in ("failed", "error") for c in cases)
    if not plan.custom and (exit_code not in (0, 1, 5) or (exit_code == 1 and not any_failing)):
        said = f"reported {len(cases)} test(s)" + ("" if any_failing else " and no failure")
        broken = (*broken, _unfinished("(unfinished run)", exit_code, said, tail, plan.runner))
    ran = {c.id for c in cases if c.outcome != "skipped"}  # a failure is counted above
    reference = expected if expected is not None else (
        (c.id, c.file) for c in seen if c.outcome == "passed"
    )  # fmt: skip
    vanished = tuple(sorted(i for i, f in reference if f not in named and i not in ran))
    return Verdict(broken, altered, len(cases), vanished)


def _unfinished(name: str, exit_code: int, said: str, tail: str, runner: str) -> TestCase:
    return TestCase(
        id=name,
        file="",
        outcome="error",
        assertion=False,
        message=(
            f"the run of the person's tests against the session's code exited with "
            f"{exit_code} and {said}: {runner} did not finish normally (code that exits, "
            f"interrupts or kills the {'interpreter' if runner == 'pytest' else 'process'} "
            f"at import or in a test). "
            f"Output: {json.dumps(tail)}"
        ),
    )


def as_evidence(case: TestCase) -> TestCase:
    """A failing case of the cross-check as it is recorded in the run's evidence."""
    return msgspec.structs.replace(case, id=PREFIX + case.id)
