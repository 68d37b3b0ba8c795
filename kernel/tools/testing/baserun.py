"""Which tests fail on the base tree: a failure that was there before is not the change's.

A real repository often has a test that fails on the person's machine too (a flaky one,
a missing service).  When the run that decides a merge fails, the kernel runs the suite
once on the base tree -- the project as it is, without the session's changes -- and
keeps the failing and passing ids by the base tree's and the environment's hash
(``<state>/baselines/<hash>.json``), so the next session on the same tree does not run it
again.  The cross-check of a green run (:mod:`.guardrun`) reads the passing ones: each
must still run and pass against the session's code.  A failure found there too is
*pre-existing*: reported ("N failed before this change too"), not blocking, unless the
policy says ``tdd.require_all_green: true``.  Every test that passed on the base must
still pass, and the session's new and changed tests must pass.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable, Sequence

import msgspec

from fluffy.junit import parse_junit
from fluffy.kernel.tools.core.routedcall import RoutedCall
from fluffy.kernel.tools.sandbox.pluginjob import PluginOutcome
from fluffy.kernel.tools.testing.canary import without_canaries
from fluffy.kernel.tools.testing.testprep import TestPlan, TestPreparer
from fluffy.kernel.workflow.evidence import snapshot_trees
from fluffy.pathnames import unshown

BASE_SUFFIX = ".base"


class BaseResult(msgspec.Struct, frozen=True):
    """What the suite did on the base tree (``found`` 0: no report to compare with)."""

    failing: frozenset[str]
    passing: frozenset[tuple[str, str]]  # (id, file) of each test that passed
    found: int


async def base_run(
    call: RoutedCall,
    *,
    preparer: TestPreparer,
    test_globs: Sequence[str],
    sandbox: Callable[[RoutedCall, TestPlan], Awaitable[PluginOutcome]],
    release: Callable[[PluginOutcome], Awaitable[None]],
    read: Callable[[PluginOutcome, object], bytes | None],
) -> BaseResult:
    """The suite's outcome on the base tree (cached by its hash, the environment and the
    files it cannot see)."""
    tests, sources = await asyncio.to_thread(snapshot_trees, preparer.project, test_globs, {})
    choice = await asyncio.to_thread(preparer.environment)
    env = (choice.key or "") if choice is not None else ""
    # what the run cannot see is part of what it found (a person's allowance, ADR-097)
    hide = preparer.views.hidden()
    unseen = "\0".join(rel for rel in (*tests.files, *sources.files) if hide(unshown(rel)))
    found = f"{tests.digest}\0{sources.digest}\0{env}\0\0{unseen}"
    key = hashlib.sha256(found.encode()).hexdigest()[:24]
    cache = preparer.state_dir / "baselines" / f"{key}.json"
    try:
        data = json.loads(cache.read_text())
        return BaseResult(
            frozenset(data["failing"]),
            frozenset((str(i), str(f)) for i, f in data["passing"]),
            int(data["found"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        pass
    # measured as the deciding run is: a test may fail under coverage alone (structlog's
    # test_recursive), and then it fails on the base too, not because of the change
    plan = await asyncio.to_thread(
        preparer.prepare, call.session.id + BASE_SUFFIX, {}, None, test_globs, coverage=True
    )
    base_call = msgspec.structs.replace(call, call_id=call.call_id + BASE_SUFFIX, args={})
    outcome = await sandbox(base_call, plan)
    try:
        junit = read(outcome, outcome.result.get("junit"))
    finally:
        await release(outcome)
    if junit is None:
        return BaseResult(frozenset(), frozenset(), 0)  # nothing to compare with
    cases = without_canaries(
        parse_junit(junit, name="the base tree's junit report", dialect=plan.dialect),
        plan.canary,
        run="the run of the project without this session's changes",
    )
    failing = sorted(c.id for c in cases if c.outcome in ("failed", "error"))
    passing = sorted((c.id, c.file) for c in cases if c.outcome == "passed")
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp")
    tmp.write_text(json.dumps({"failing": failing, "passing": passing, "found": len(cases)}))
    tmp.replace(cache)
    return BaseResult(frozenset(failing), frozenset(passing), len(cases))
