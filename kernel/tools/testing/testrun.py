"""``test.run``: the tests run in a sandbox, their evidence recorded for the workflow.

The kernel lays down the session's view for the run (its tree hashes are the
evidence's), runs pytest in the test plugin's sandbox, reads the junit and coverage
reports the plugin wrote (regular files only, capped), records the run and, in
``test_writing``, the red verdict, and moves the workflow on.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from fluffy.errors import EngineUnavailable, FluffyError, ToolInputInvalid
from fluffy.junit import parse_junit
from fluffy.kernel.confined_files import read_regular, safe_relpath
from fluffy.kernel.project.envstate import ENV_PYTHON
from fluffy.kernel.project.interpreter import mismatch
from fluffy.kernel.tools.changes.flow import Flow
from fluffy.kernel.tools.changes.workspace import Workspaces
from fluffy.kernel.tools.core.routedcall import RoutedCall
from fluffy.kernel.tools.sandbox.pluginjob import PluginOutcome
from fluffy.kernel.tools.testing.baserun import BaseResult, base_run
from fluffy.kernel.tools.testing.canary import without_canaries
from fluffy.kernel.tools.testing.guardrun import (
    Verdict,
    as_evidence,
    cross_check,
    is_whole,
    test_side,
)
from fluffy.kernel.tools.testing.loadfail import load_failure
from fluffy.kernel.tools.testing.testprep import TestPlan, TestPreparer
from fluffy.kernel.workflow.coverage import CoverageReport, parse_coverage
from fluffy.kernel.workflow.evidence import OUTPUT_CHARS, TestRun
from fluffy.kernel.workflow.machine import Workflow
from fluffy.kernel.workflow.store import SessionRow

MAX_REPORT_BYTES = 32 * 1024 * 1024


async def run_tests(
    call: RoutedCall,
    *,
    preparer: TestPreparer | None,
    flow: Flow,
    workflow: Workflow,
    workspaces: Workspaces,
    sandbox: Callable[[RoutedCall, TestPlan], Awaitable[PluginOutcome]],
    release: Callable[[PluginOutcome], Awaitable[None]],
    expect: Callable[[SessionRow, str], None],
    require_all_green: bool = False,
) -> dict[str, Any]:
    """Run ``call`` (a test.run; ``preparer``: its environment and the session's view,
    None without an engine): ``sandbox`` runs it in the plugin's sandbox with the
    plan's view and environment, ``release`` ends that sandbox, ``expect`` warms the
    pool for the session's next tool."""
    session_id = call.session.id
    before = await flow.before_test_run(session_id)
    if preparer is None:
        raise EngineUnavailable(
            "test.run needs a sandbox, and this kernel has no container engine",
            fix="Start Docker or Podman (`scripts/setup`), then restart the kernel.",
        )
    stage = workspaces.get(session_id)
    # the evidence's tree hashes are the kernel's: of the view it lays down for the run
    state = (await workflow.get(session_id)).state
    plan = await asyncio.to_thread(
        preparer.prepare,
        session_id,
        stage.overlay(),
        stage.tree,
        workflow.test_globs,
        coverage=state != "test_writing",  # the tech-debt budget reads green runs only
    )
    tests, sources = plan.synced.tests, plan.synced.sources
    started = time.time()
    clock = time.monotonic()
    outcome = await sandbox(call, plan)
    try:
        result = outcome.result
        junit = output_file(outcome, result.get("junit"))
        cases = (
            without_canaries(
                parse_junit(junit, name="the test run's junit report", dialect=plan.dialect),
                plan.canary,
                run="this test run",
            )
            if junit
            else []
        )
        coverage: CoverageReport | None = None
        raw_coverage = output_file(outcome, result.get("coverage"))
        if raw_coverage:
            try:
                coverage = parse_coverage(raw_coverage, name="coverage.json")
            except FluffyError:
                coverage = None
        exit_code = int(result.get("exit_code", -1))
    finally:
        await release(outcome)
    tail = str(result.get("output_tail", ""))
    if junit is None and exit_code not in (0, 5):
        # mocha writes no report when a test file does not load: that file's failure
        # (the importer must be one of the test files this run saw)
        failed_load = (
            load_failure(tail, tests.files.__contains__) if plan.dialect == "javascript" else None
        )
        if failed_load is None:
            what = "collection error" if plan.runner == "pytest" else "error"
            fix = f"Fix the {what} shown, then run the tests again."
            if plan.custom:
                fix += " The command in .fluffy/config.yaml must write its JUnit XML to {junit}."
            raise ToolInputInvalid(
                f"test.run: {plan.runner} exited with {exit_code} and wrote no report",
                why=tail[-1500:],
                fix=fix,
            )
        cases = [failed_load]
    crashed = not cases and exit_code not in (0, 5)  # no test ran: its output says why
    run = TestRun(
        command=("test.run", json.dumps(call.args, sort_keys=True)),
        exit_code=exit_code,
        cases=tuple(cases),
        tests=tests,
        sources=sources,
        started_at=started,
        duration_s=time.monotonic() - clock,
        runner=plan.runner,
        output=tail[-OUTPUT_CHARS:] if crashed else "",
    )
    whole = is_whole(call.args)
    deciding = state == "validating" and whole  # this run decides the merge
    base: BaseResult | None = None

    async def on_base() -> BaseResult:
        return await base_run(
            call, preparer=preparer, test_globs=workflow.test_globs, sandbox=sandbox,
            release=release, read=output_file,
        )  # fmt: skip

    if deciding and not run.is_green() and not require_all_green and run.counts["passed"]:
        # failures that were there before the change are reported, not the change's
        base = await on_base()
        known = sorted({c.id for c in cases if c.outcome in ("failed", "error")} & base.failing)
        run = msgspec.structs.replace(run, preexisting=tuple(known))
    checked: Verdict | None = None
    if deciding and run.is_green() and test_side(stage.overlay(), workflow.test_globs):
        base = base or await on_base()  # what the person's suite passes without the change
        checked = await cross_check(
            call, preparer=preparer, overlay=stage.overlay(), staged_tree=stage.tree,
            test_globs=workflow.test_globs, sandbox=sandbox, release=release, read=output_file,
            known=set(run.preexisting), seen=cases, expected=base.passing if base.found else None,
        )  # fmt: skip
        if checked is not None and checked.broken:  # the green was not the truth
            cases = [*cases, *(as_evidence(c) for c in checked.broken)]
            run = msgspec.structs.replace(run, cases=tuple(cases), exit_code=exit_code or 1)
        elif checked is not None and not checked.holds:
            reasons = list((await workflow.get(session_id)).data.review_required)
            await workflow.annotate(
                session_id, "review_required", review_required=[*reasons, *checked.review_reasons()]
            )
    await workflow.record_test_run(session_id, run, coverage)
    verdict = await workflow.red_verdict(session_id, run) if state == "test_writing" else None
    after, review = await flow.after_test_run(session_id, run, whole=whole)
    old = set(run.preexisting)
    failed = [
        {"id": c.id, "message": c.message[:500]}
        for c in cases
        if c.outcome in ("failed", "error") and c.id not in old
    ]
    answer: dict[str, Any] = {
        "exit_code": exit_code,
        "counts": run.counts,
        "failed": failed[:50],
        "coverage_percent": None if coverage is None else round(coverage.percent, 2),
        "output_tail": tail[-4000:],
        "workflow": [s.to_dict() for s in (*before, *after)],
    }
    if verdict is not None:  # test_writing: red or not, and why (what the user sees)
        answer["red"], answer["red_reason"] = verdict
    said = " ".join([tail, *(c.message for c in cases)])
    answer.update(run_notes(plan, preparer, said, call.spec.template))
    if run.preexisting:
        answer["preexisting"] = {
            "count": len(run.preexisting),
            "ids": list(run.preexisting)[:50],
            "note": f"{len(run.preexisting)} failed before this change too (on the project "
            "without it): reported, not blocking",
        }
    if checked is not None:
        answer["cross_check"] = {
            "found": checked.found,
            "broken": [c.id for c in checked.broken][:50],
            "changed_tests_failing": list(checked.changed)[:50],
            "did_not_run": list(checked.vanished)[:50],
            "note": "the person's tests, as they were before this session's test changes, "
            "run against this session's code",
        }
    if review is not None:
        answer["review"] = review
    if review is not None and (await workflow.get(session_id)).state == "committing":
        expect(call.session, "git.commit")  # merged: the commit comes next
    return answer


def run_notes(plan: TestPlan, preparer: TestPreparer, said: str, template: str) -> dict[str, str]:
    """What a run in the project's environment adds to its answer: the environment's note,
    an interpreter that differs from the project's, the sandbox's limits hit (``said``:
    the run's output), the person's files it did not see."""
    notes: dict[str, str] = {}
    if plan.choice is not None and plan.choice.note:
        notes["environment"] = plan.choice.note
    record = plan.choice.record if plan.choice is not None else None
    differs = mismatch(preparer.project, record.python if record and record.python else ENV_PYTHON)
    if differs:
        notes["interpreter"] = differs
    limit = limit_hit(said, template)
    if limit:
        notes["limits"] = limit
    hidden = plan.synced.hidden
    if hidden:
        more = f" and {len(hidden) - 5} more" if len(hidden) > 5 else ""
        notes["secrets"] = (
            f"not in this run: {', '.join(hidden[:5])}{more}: files that hold secrets and "
            "that git does not hold as they are (never committed, or changed since) are the "
            "person's, and tests do not see them; if the tests need one, ask the person to "
            "run `fluffy config tests secrets --allow PATH` in the project"
        )
    return notes


#: What a test's output says when the sandbox's pid limit stopped it.
_PID_LIMIT = ("can't start new thread", "Resource temporarily unavailable", "[Errno 11]")


def limit_hit(output: str, template: str) -> str | None:
    """A note when the tests ran into the sandbox's process limit (not the code's bug)."""
    if not any(sign in output for sign in _PID_LIMIT):
        return None
    from fluffy.kernel.containers.config import TEMPLATES

    pids = TEMPLATES[template].max_pids if template in TEMPLATES else "a few"
    return (
        f"the test sandbox allows {pids} processes and threads in all (the {template} "
        "template's limit); a test that starts more fails there, not in the code"
    )


def output_file(outcome: PluginOutcome, name: Any) -> bytes | None:
    """A file the plugin named in its result, read without following links (capped)."""
    if not isinstance(name, str) or not name:
        return None
    data: bytes = read_regular(outcome.call_dir, safe_relpath(name), MAX_REPORT_BYTES)
    return data
