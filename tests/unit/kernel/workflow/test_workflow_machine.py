"""The TDD state machine: the design's tables, guards, exemptions, modes, budget, persistence."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec
import pytest
from msgspec.structs import replace

from fluffy.errors import ExemptionDenied, ModeDenied, TransitionDenied, WorkflowError
from fluffy.kernel.audit.query import Filters, entries
from fluffy.kernel.audit.verify import verify
from fluffy.kernel.policy.engine import Caller
from fluffy.kernel.workflow.coverage import CoverageReport
from fluffy.kernel.workflow.evidence import run_pytest
from fluffy.kernel.workflow.exemptions import type_only_change
from fluffy.kernel.workflow.states import EVENTS, ON_FAIL, STATES, TABLES, next_state
from fluffy.kernel.workflow.store import verify_state_log
from unit.workflow_support import Kit, fake_run, make_project, open_kit

pytestmark = pytest.mark.anyio  # async tests run on asyncio (tests/conftest.py)

PAIRS = [(flow, state, event) for flow in TABLES for state in STATES for event in EVENTS]


def _cov(covered: int, total: int = 100) -> CoverageReport:
    return CoverageReport(covered, total, {"src/calc.py": (covered, total)}, "coverage.py-json")


async def _at(kit: Kit, state: str, mode: str = "strict") -> str:
    """A session put directly into ``state`` (kernel-internal, as a restored session)."""
    session = await kit.workflow.new_session()
    placed = replace(session, state=state, mode=mode)
    await kit.store.save(placed, "test_setup", "idle", {})
    return session.id


@pytest.mark.parametrize(("flow", "state", "event"), PAIRS)
async def test_every_state_event_pair_follows_the_table(
    tmp_path: Path, flow: str, state: str, event: str
) -> None:
    project = make_project(tmp_path / "p")
    kit = await open_kit(tmp_path / "s", project)
    try:
        mode = "strict" if flow == "strict" else "explore"
        sid = await _at(kit, state, mode)
        expected = next_state(flow, state, event)  # type: ignore[arg-type]
        if expected is None:
            with pytest.raises(TransitionDenied, match="not possible"):
                await kit.workflow.fire(sid, event)
            assert (await kit.workflow.get(sid)).state == state
        elif expected.guard is None:
            outcome = await kit.workflow.fire(sid, event)
            assert outcome.session.state == expected.to
        else:  # no evidence, no approval: every guard refuses with the design's text
            with pytest.raises(TransitionDenied) as caught:
                await kit.workflow.fire(sid, event)
            assert caught.value.what == ON_FAIL[expected.guard]
            assert caught.value.why and caught.value.fix
            assert (await kit.workflow.get(sid)).state == state
    finally:
        await kit.close()


def test_the_tables_are_the_designs() -> None:
    strict = {(s, e): t.to for (s, e), t in TABLES["strict"].items()}
    assert strict[("test_writing", "tests_red")] == "code_writing"
    assert strict[("validating", "tests_failed")] == "code_writing"
    assert strict[("reviewing", "merge_rejected")] == "code_writing"
    explore = {(s, e): t.to for (s, e), t in TABLES["explore"].items()}
    assert explore[("planning", "plan_complete")] == "exploring"
    assert explore[("reviewing", "add_tests")] == "retroactive_testing"
    assert explore[("retroactive_testing", "tests_written")] == "validating"
    assert all(next_state(f, s, "cancel").to == "idle" for f in TABLES for s in STATES)  # type: ignore[arg-type, union-attr]


async def test_strict_tdd_flow_with_real_pytest_runs(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p")
    (project / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    kit = await open_kit(tmp_path / "s", project)
    wf = kit.workflow
    try:
        sid = (await wf.new_session()).id
        await wf.fire(sid, "user_message")
        await wf.fire(sid, "plan_complete")
        # an import error is not red
        (project / "tests" / "test_sub.py").write_text(
            "from src.calc import sub\n\ndef test_sub():\n    assert sub(3, 1) == 2\n"
        )
        await wf.record_test_run(sid, run_pytest(project))
        with pytest.raises(TransitionDenied, match="TDD Red") as caught:
            await wf.fire(sid, "tests_red")
        assert "import" in caught.value.why
        # a real assertion failure in a new test is red
        (project / "src" / "calc.py").write_text(
            "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return 0\n"
        )
        await wf.record_test_run(sid, run_pytest(project))
        # ... but not once the files changed after the run (stale)
        (project / "tests" / "test_more.py").write_text("def test_x():\n    assert True\n")
        with pytest.raises(TransitionDenied) as stale:
            await wf.fire(sid, "tests_red")
        assert "changed since the latest test run" in stale.value.why
        (project / "tests" / "test_more.py").unlink()
        await wf.record_test_run(sid, run_pytest(project))
        assert (await wf.fire(sid, "tests_red")).session.state == "code_writing"
        with pytest.raises(TransitionDenied, match="Code changes"):
            await wf.fire(sid, "code_changed")
        (project / "src" / "calc.py").write_text(
            "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"
        )
        assert (await wf.fire(sid, "code_changed")).session.state == "validating"
        with pytest.raises(TransitionDenied, match="All tests must pass"):
            await wf.fire(sid, "tests_passed")  # no run in this state yet
        await wf.record_test_run(sid, run_pytest(project), _cov(90))
        assert (await wf.fire(sid, "tests_passed")).session.state == "reviewing"
        with pytest.raises(TransitionDenied, match="approved"):
            await wf.fire(sid, "merge_approved", approved=False)
        assert (await wf.fire(sid, "merge_approved", approved=True)).session.state == "committing"
        assert (await wf.fire(sid, "commit_complete")).session.state == "idle"
    finally:
        await kit.close()
    transitions = list(entries(tmp_path / "s", Filters(event_type="state_transition")))
    assert [e["state_machine_state"] for e in transitions][-3:] == [
        "reviewing",
        "committing",
        "idle",
    ]
    runs = list(entries(tmp_path / "s", Filters(event_type="test_run_recorded")))
    assert len(runs) == 4  # each run the guards read is on the audit record too
    assert [e["state_machine_state"] for e in runs] == ["test_writing"] * 3 + ["validating"]
    assert runs[-1]["metadata"]["coverage"] == "90.00"
    assert runs[1]["metadata"]["exit_code"] != "0" and "failed" in runs[1]["input_summary"]
    assert verify(tmp_path / "s").ok
    assert verify_state_log(tmp_path / "s" / "fluffy.db")[0]


async def test_red_needs_a_changed_test_failing_on_an_assertion(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p")
    kit = await open_kit(tmp_path / "s", project)
    wf = kit.workflow
    try:
        sid = await _at(kit, "planning")
        await wf.fire(sid, "plan_complete")
        # the old, unchanged test failing is not red
        await wf.record_test_run(
            sid, fake_run(project, [("tests/test_calc.py::test_add", "failed", True)])
        )
        with pytest.raises(TransitionDenied):
            await wf.fire(sid, "tests_red")
        (project / "tests" / "test_new.py").write_text("def test_n():\n    assert 0\n")
        # a changed test failing with ZeroDivisionError is not red
        await wf.record_test_run(
            sid, fake_run(project, [("tests/test_new.py::test_n", "failed", False)])
        )
        with pytest.raises(TransitionDenied):
            await wf.fire(sid, "tests_red")
        await wf.record_test_run(
            sid, fake_run(project, [("tests/test_new.py::test_n", "failed", True)])
        )
        assert (await wf.fire(sid, "tests_red")).session.state == "code_writing"
    finally:
        await kit.close()


async def test_cancel_returns_any_state_to_idle(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p")
    kit = await open_kit(tmp_path / "s", project)
    try:
        for state in STATES:
            sid = await _at(kit, state)
            assert (await kit.workflow.cancel(sid)).session.state == "idle"
    finally:
        await kit.close()


async def test_exemptions_follow_the_policy_globs(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p")
    kit = await open_kit(tmp_path / "s", project)
    wf = kit.workflow
    try:
        sid = await _at(kit, "planning")
        with pytest.raises(ExemptionDenied, match=r"src/calc\.py"):
            await wf.request_exemption(sid, "documentation", ["README.md", "src/calc.py"], "d")
        with pytest.raises(ExemptionDenied, match="unknown exemption category"):
            await wf.request_exemption(sid, "because", ["README.md"], "d")
        assert (await wf.get(sid)).state == "planning"
        outcome = await wf.request_exemption(sid, "documentation", ["README.md"], "typo")
        assert outcome.session.state == "exploring"
        (project / "README.md").write_text("# fixed\n")
        assert (await wf.fire(sid, "code_changed")).session.state == "validating"
        await wf.record_test_run(
            sid, fake_run(project, [("tests/test_calc.py::test_add", "passed", False)]), _cov(1)
        )
        await wf.fire(sid, "tests_passed")
        # an exemption does not spend budget: a coverage collapse is not judged
        outcome = await wf.fire(sid, "merge_approved", approved=True)
        assert outcome.session.state == "committing" and not outcome.warnings
    finally:
        await kit.close()
    requested = list(entries(tmp_path / "s", Filters(event_type="exemption_requested")))
    assert len(requested) == 3
    assert requested[-1]["metadata"]["category"] == "documentation"
    assert {e["caller"] for e in requested} == {"user"}
    denied = list(entries(tmp_path / "s", Filters(event_type="exemption_denied")))
    assert [e["output_summary"].split(":")[0] for e in denied] == ["refused by policy"] * 2
    granted = list(entries(tmp_path / "s", Filters(event_type="exemption_granted")))
    assert len(granted) == 1 and granted[0]["output_summary"] == "granted by user"


async def test_an_ai_exemption_is_held_until_the_user_decides(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p")
    kit = await open_kit(tmp_path / "s", project)
    wf = kit.workflow
    try:
        sid = await _at(kit, "planning")
        with pytest.raises(ExemptionDenied, match="no exemption request waits"):
            await wf.decide_exemption(sid, True, request_id="ex-any")
        with pytest.raises(ExemptionDenied, match=r"does not cover src/calc\.py"):
            await wf.hold_exemption(sid, "documentation", ["src/calc.py"], "sneaky")
        held = await wf.hold_exemption(sid, "documentation", ["README.md"], "a typo")
        assert held.state == "planning" and held.data.exemption is None  # not granted
        assert held.data.exemption_pending.paths == ["README.md"]
        first = held.data.exemption_pending.request_id
        refused = await wf.decide_exemption(sid, False, request_id=first, why="write a test")
        assert refused.session.state == "planning"
        assert refused.session.data.exemption_pending is None
        again = await wf.hold_exemption(sid, "documentation", ["README.md"], "a typo")
        second = again.data.exemption_pending.request_id
        assert second != first  # the same request asked again is a new one
        granted = await wf.decide_exemption(sid, True, request_id=second)
        assert granted.session.state == "exploring"
        assert granted.session.data.exemption.category == "documentation"
        assert granted.session.data.exemption_pending is None
    finally:
        await kit.close()
    log = tmp_path / "s"
    asked = list(entries(log, Filters(event_type="exemption_requested")))
    assert [(e["caller"], e["output_summary"]) for e in asked] == [("ai", "held for review")] * 3
    denied = list(entries(log, Filters(event_type="exemption_denied")))
    assert [(e["caller"], e["output_summary"]) for e in denied] == [
        ("ai", "refused by policy: documentation does not cover src/calc.py"),
        ("user", "refused by user: write a test"),
    ]
    (granted_entry,) = entries(log, Filters(event_type="exemption_granted"))
    assert granted_entry["caller"] == "user"
    assert granted_entry["metadata"]["requested_by"] == "ai"
    ids = [e["metadata"].get("request_id") for e in asked]
    assert ids[1:] == [
        denied[1]["metadata"]["request_id"],
        granted_entry["metadata"]["request_id"],
    ]


async def test_a_second_ai_exemption_request_is_refused_while_one_waits(tmp_path: Path) -> None:
    """Two requests in one response: the second must not replace the one the user sees."""
    from fluffy.errors import ExemptionMismatch, ExemptionPending

    project = make_project(tmp_path / "p")
    shown = ("documentation", ["README.md"], "fix a typo")
    swapped = ("config_change", ["pyproject.toml", ".github/workflows/ci.yml"], "tidy")
    kit = await open_kit(tmp_path / "s", project)
    wf = kit.workflow
    try:
        sid = await _at(kit, "planning")
        held = await wf.hold_exemption(sid, *shown)
        request_id = held.data.exemption_pending.request_id
        assert request_id.startswith("ex-")
        with pytest.raises(ExemptionPending) as second:
            await wf.hold_exemption(sid, *swapped)
        assert second.value.code == "workflow.exemption_pending"
        assert f"another exemption request ({request_id}: documentation for README.md)" in (
            second.value.what
        )
        assert second.value.why and second.value.fix
        pending = msgspec.to_builtins((await wf.get(sid)).data.exemption_pending)
        assert pending == {"request_id": request_id, "category": "documentation",
                           "paths": ["README.md"], "reason": "fix a typo"}  # fmt: skip
        with pytest.raises(ExemptionMismatch) as wrong:  # a stale or made-up id
            await wf.decide_exemption(sid, True, request_id="ex-0000000000000000")
        assert wrong.value.code == "workflow.exemption_mismatch"
        assert f"the request that waits is {request_id}: documentation for README.md" in (
            wrong.value.why
        )
        assert (await wf.get(sid)).state == "planning"  # nothing granted
        granted = await wf.decide_exemption(sid, True, request_id=request_id)
        assert granted.session.data.exemption.paths == ["README.md"]  # what was shown
    finally:
        await kit.close()
    log = tmp_path / "s"
    asked = list(entries(log, Filters(event_type="exemption_requested")))
    assert [e["metadata"]["request_id"] for e in asked] == [request_id]
    (denied,) = entries(log, Filters(event_type="exemption_denied"))
    assert denied["caller"] == "ai" and denied["metadata"]["category"] == "config_change"
    assert denied["output_summary"] == f"refused: {request_id} waits for the user"
    assert denied["metadata"]["pending_request_id"] == request_id
    (granted_entry,) = entries(log, Filters(event_type="exemption_granted"))
    assert granted_entry["metadata"]["request_id"] == request_id


async def test_mode_switching_goes_through_the_policy(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p")
    user = Caller("user")
    kit = await open_kit(tmp_path / "s", project)
    wf = kit.workflow
    try:
        sid = (await wf.new_session()).id
        assert (await wf.set_mode(sid, "explore", user)).session.mode == "explore"
        with pytest.raises(ModeDenied) as refused:
            await wf.set_mode(sid, "debug", user)
        assert "requires review" in refused.value.why
        assert (await wf.get(sid)).mode == "strict"  # the denial fell back to strict
        assert (await wf.set_mode(sid, "debug", user, approved=True)).session.mode == "debug"
        await wf.fire(sid, "user_message")
        await wf.fire(sid, "plan_complete")
        with pytest.raises(ModeDenied, match="cannot change"):
            await wf.set_mode(sid, "strict", user)
    finally:
        await kit.close()
    changes = list(entries(tmp_path / "s", Filters(event_type="session_mode_change")))
    assert [c["session_mode"] for c in changes] == ["explore", "strict", "debug"]


async def test_a_policy_without_a_rule_keeps_strict_mode(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p")
    kit = await open_kit(tmp_path / "s", project, policy="capabilities: []\n")
    try:
        sid = (await kit.workflow.new_session()).id
        with pytest.raises(ModeDenied):
            await kit.workflow.set_mode(sid, "explore", Caller("user"), approved=True)
        assert (await kit.workflow.get(sid)).mode == "strict"
    finally:
        await kit.close()


async def _explore_commit(kit: Kit, project: Path, covered: int) -> list[str]:
    wf = kit.workflow
    sid = await _at(kit, "planning", "explore")
    await wf.fire(sid, "plan_complete")
    with (project / "src" / "calc.py").open("a") as handle:
        handle.write(f"# change {covered}\n")
    await wf.fire(sid, "code_changed")
    await wf.record_test_run(
        sid, fake_run(project, [("tests/test_calc.py::test_add", "passed", False)]), _cov(covered)
    )
    await wf.fire(sid, "tests_passed")
    outcome = await wf.fire(sid, "merge_approved", approved=True)
    await wf.fire(sid, "commit_complete")
    return outcome.warnings


async def _strict_commit(kit: Kit, project: Path, covered: int) -> None:
    sid = await _at(kit, "validating")
    await kit.workflow.record_test_run(
        sid, fake_run(project, [("tests/test_calc.py::test_add", "passed", False)]), _cov(covered)
    )
    await kit.workflow.fire(sid, "tests_passed")
    await kit.workflow.fire(sid, "merge_approved", approved=True)
    await kit.workflow.fire(sid, "commit_complete")


async def test_tech_debt_budget_warns_locks_and_recovers(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p")
    kit = await open_kit(tmp_path / "s", project)
    try:
        await _strict_commit(kit, project, 80)  # baseline 80 %
        assert await _explore_commit(kit, project, 80) == []
        small = await _explore_commit(kit, project, 79)  # min_delta 0: not ok
        assert small and "below min_delta" in small[0]
        warned = await _explore_commit(kit, project, 77)
        assert warned and "fell 3" in warned[0]
        with pytest.raises(TransitionDenied, match="tech-debt budget"):
            await _explore_commit(kit, project, 74)
        sid = (await kit.workflow.new_session()).id
        with pytest.raises(ModeDenied) as refused:
            await kit.workflow.set_mode(sid, "explore", Caller("user"))
        assert "locked" in refused.value.why
        await _strict_commit(kit, project, 81)  # strict work restores coverage
        assert (await kit.workflow.set_mode(sid, "explore", Caller("user"))).session.mode == (
            "explore"
        )
    finally:
        await kit.close()


async def test_an_explore_change_without_coverage_waits_for_a_person(tmp_path: Path) -> None:
    """Red team pass 2: code that kept coverage from writing its report made an explore
    change auto-merge with its budget unchecked, past a lockout."""
    project = make_project(tmp_path / "p")
    kit = await open_kit(tmp_path / "s", project)
    wf = kit.workflow
    try:
        await _strict_commit(kit, project, 80)
        sid = await _at(kit, "planning", "explore")
        await wf.fire(sid, "plan_complete")
        with (project / "src" / "calc.py").open("a") as handle:
            handle.write("# change\n")
        await wf.fire(sid, "code_changed")
        green = fake_run(project, [("tests/test_calc.py::test_add", "passed", False)])
        await wf.record_test_run(sid, green)  # no coverage report
        await wf.fire(sid, "tests_passed")
        with pytest.raises(TransitionDenied, match="no coverage was recorded") as refused:
            await wf.check_budget(sid, automatic=True)
        assert "/approve" in refused.value.fix
        asked = await wf.check_budget(sid)  # the person approving: a notice, no lock
        assert asked and "no coverage was recorded for this explore commit" in asked[0]
        strict = await _at(kit, "validating")
        await wf.record_test_run(strict, green)
        await wf.fire(strict, "tests_passed")
        assert "budget was not checked" in (await wf.check_budget(strict, automatic=True))[0]
    finally:
        await kit.close()


async def test_sessions_persist_and_tampering_is_refused(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p")
    state = tmp_path / "s"

    async def first() -> str:
        kit = await open_kit(state, project)
        try:
            sid = (await kit.workflow.new_session()).id
            await kit.workflow.fire(sid, "user_message")
            await kit.workflow.fire(sid, "plan_complete")
            await kit.workflow.record_test_run(sid, fake_run(project, []))
            return sid
        finally:
            await kit.close()

    async def second(sid: str) -> None:
        kit = await open_kit(state, project)
        try:
            session = await kit.workflow.get(sid)
            assert (session.state, session.mode) == ("test_writing", "strict")
            assert await kit.store.latest_session() == sid
        finally:
            await kit.close()

    sid = await first()
    await second(sid)
    conn = sqlite3.connect(state / "fluffy.db")
    conn.execute("UPDATE test_runs SET run = replace(run, '\"exit_code\":5', '\"exit_code\":1')")
    conn.commit()

    async def forged_run() -> None:
        kit = await open_kit(state, project)
        try:
            with pytest.raises(WorkflowError, match="chained digest"):
                await kit.workflow.fire(sid, "tests_red")
        finally:
            await kit.close()

    await forged_run()
    conn.execute("UPDATE sessions SET state = 'code_writing' WHERE id = ?", (sid,))
    conn.commit()

    async def forged_state() -> None:
        kit = await open_kit(state, project)
        try:
            with pytest.raises(WorkflowError, match="chained state log"):
                await kit.workflow.get(sid)
        finally:
            await kit.close()

    await forged_state()
    assert verify_state_log(state / "fluffy.db")[0]
    conn.execute("UPDATE state_log SET to_state = 'code_writing' WHERE seq = 2")
    conn.commit()
    conn.close()
    ok, _, detail = verify_state_log(state / "fluffy.db")
    assert not ok and "entry 2" in detail


def test_type_only_change() -> None:
    before = "def f(a, b=1):\n    x = a + b\n    return x\n"
    typed = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import os\n"
        "def f(a: int, b: int = 1) -> int:\n    x: int = a + b\n    return x\n"
    )
    assert type_only_change("from typing import TYPE_CHECKING\n" + before, typed)
    assert not type_only_change(before, before.replace("a + b", "a - b"))
    assert not type_only_change(before, "def f(a, b=2):\n    x = a + b\n    return x\n")
    assert not type_only_change(before, "def f(:\n")


async def test_an_exemption_covers_its_own_paths_only(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p")
    kit = await open_kit(tmp_path / "s", project)
    wf = kit.workflow
    try:
        sid = await _at(kit, "planning")
        for sneaky in ("docs/../src/calc.py", "/etc/passwd.md", "./README.md"):
            with pytest.raises(ExemptionDenied, match="plain project-relative"):
                await wf.request_exemption(sid, "documentation", [sneaky], "docs")
        await wf.request_exemption(sid, "documentation", ["README.md"], "typo")
        (project / "README.md").write_text("# fixed\n")
        (project / "src" / "calc.py").write_text("def add(a, b):\n    return 0\n")
        with pytest.raises(TransitionDenied) as caught:
            await wf.fire(sid, "code_changed")
        assert "src/calc.py" in caught.value.why
    finally:
        await kit.close()


def test_annotations_that_run_code_are_not_type_only() -> None:
    before = "def f(x):\n    return x\n"
    assert not type_only_change(before, 'def f(x: __import__("os").system("id")):\n    return x\n')
    future = "from __future__ import annotations\n"
    assert type_only_change(future + before, future + "def f(x: list[int]) -> int:\n    return x\n")


BASELINE_FILE = ".fluffy/coverage-baseline.json"


async def test_a_strict_commit_writes_the_baseline_file(tmp_path: Path) -> None:
    import json

    project = make_project(tmp_path / "p")
    (project / ".fluffy").mkdir(exist_ok=True)  # a project with fluffy's folder (init)
    kit = await open_kit(tmp_path / "s", project)
    try:
        await _strict_commit(kit, project, 80)
        written = json.loads((project / BASELINE_FILE).read_text())
        assert (written["covered_lines"], written["total_lines"]) == (80, 100)
        assert written["percent"] == 80.0 and written["format"] == "coverage.py-json"
        assert written["files"] == {"src/calc.py": [80, 100]}
        assert not [p.name for p in (project / ".fluffy").iterdir() if p.name.endswith("tmp")]
        assert (await kit.workflow.baseline()) == (_cov(80), [])
        await _strict_commit(kit, project, 84)  # each strict commit moves it
        assert json.loads((project / BASELINE_FILE).read_text())["percent"] == 84.0
        # the budget reads the file: a user's reset to 70 % is what explore is judged by
        (project / BASELINE_FILE).write_text(json.dumps(_cov(70).to_dict()))
        report, notes = await kit.workflow.baseline()
        assert report == _cov(70) and "not the 84.00% fluffy last wrote" in notes[0]
        warned = await _explore_commit(kit, project, 70)
        assert warned == notes  # unchanged against the file: only the note
    finally:
        await kit.close()


async def test_a_project_without_fluffy_s_folder_gets_none_written(tmp_path: Path) -> None:
    """fluffy on a project with its defaults writes nothing into it: the baseline stays
    in fluffy's state, and the budget still judges against it."""
    project = make_project(tmp_path / "p")
    assert not (project / ".fluffy").exists()
    kit = await open_kit(tmp_path / "s", project)
    try:
        await _strict_commit(kit, project, 80)
        assert not (project / ".fluffy").exists()
        assert (await kit.workflow.baseline()) == (_cov(80), [])
        warned = await _explore_commit(kit, project, 79)
        assert any("min_delta" in note or "79" in note for note in warned), warned
    finally:
        await kit.close()


async def test_a_strict_commit_that_lowers_coverage_is_flagged_not_ok(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p")
    kit = await open_kit(tmp_path / "s", project)
    try:
        await _strict_commit(kit, project, 80)
        sid = await _at(kit, "validating")
        run_ = fake_run(project, [("tests/test_calc.py::test_add", "passed", False)])
        await kit.workflow.record_test_run(sid, run_, _cov(79))
        await kit.workflow.fire(sid, "tests_passed")
        notices = await kit.workflow.check_budget(sid)  # asked before the merge
        assert len(notices) == 1
        assert "coverage fell 1.0 points (80.0% -> 79.0%): below min_delta" in notices[0]
        assert "strict-mode change" in notices[0]
        await kit.workflow.fire(sid, "merge_approved", approved=True)
        await kit.workflow.fire(sid, "commit_complete")  # allowed; the baseline follows
        assert (await kit.workflow.baseline())[0] == _cov(79)
    finally:
        await kit.close()


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"{not json", "is corrupt"),
        (b"[1, 2]", "is corrupt (it is not a JSON object)"),
        (b'{"percent": 80}', "is corrupt (cannot read stored coverage report"),
        (b"\xff\xfe", "is corrupt"),
        (None, "is missing (fluffy wrote one at 80.00%)"),
    ],
)
async def test_a_missing_or_corrupt_baseline_file_means_no_baseline(
    tmp_path: Path, content: bytes | None, fragment: str
) -> None:
    project = make_project(tmp_path / "p")
    (project / ".fluffy").mkdir(exist_ok=True)
    kit = await open_kit(tmp_path / "s", project)
    try:
        await _strict_commit(kit, project, 80)
        path = project / BASELINE_FILE
        if content is None:
            path.unlink()
        else:
            path.write_bytes(content)
        report, notes = await kit.workflow.baseline()
        assert report is None and fragment in notes[0]
        assert "until a strict-mode commit with a coverage run writes it again" in notes[0]
        # never a crash, never a lock: the explore commit is judged without a baseline
        assert await _explore_commit(kit, project, 10) == notes
        await _strict_commit(kit, project, 81)  # and the next strict commit repairs it
        assert (await kit.workflow.baseline()) == (_cov(81), [])
    finally:
        await kit.close()


def _read_in_thread(project: Path, rel: str) -> tuple[CoverageReport | None, list[str]]:
    """read_baseline, failing (not hanging) when it blocks."""
    import threading

    from fluffy.kernel.workflow.baseline import read_baseline

    result: list[tuple[CoverageReport | None, list[str]]] = []
    worker = threading.Thread(target=lambda: result.append(read_baseline(project, rel)))
    worker.daemon = True
    worker.start()
    worker.join(10)
    if worker.is_alive():  # blocked opening a FIFO: give it a writer so the thread ends
        with open(project / rel, "wb"):
            pass
        worker.join(10)
        pytest.fail(f"read_baseline blocked on {rel}")
    return result[0]


def test_a_baseline_file_that_is_a_link_is_not_followed(tmp_path: Path) -> None:
    from fluffy.kernel.workflow.baseline import write_baseline

    project = make_project(tmp_path / "p")
    (project / ".fluffy").mkdir(exist_ok=True)
    write_baseline(tmp_path, "elsewhere.json", _cov(80), "sid")  # a valid baseline
    (project / BASELINE_FILE).symlink_to(tmp_path / "elsewhere.json")
    report, notes = _read_in_thread(project, BASELINE_FILE)
    assert report is None and len(notes) == 1
    assert "is a symbolic link, which fluffy does not follow" in notes[0]
    assert "a strict-mode commit with a coverage run writes it again" in notes[0]


@pytest.mark.parametrize(
    ("kind", "fragment"), [("fifo", "is a named pipe (FIFO)"), ("folder", "is a folder")]
)
def test_a_baseline_file_that_is_no_regular_file_is_noted_not_read(
    tmp_path: Path, kind: str, fragment: str
) -> None:
    import os

    project = make_project(tmp_path / "p")
    (project / ".fluffy").mkdir(exist_ok=True)
    path = project / BASELINE_FILE
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    report, notes = _read_in_thread(project, BASELINE_FILE)
    assert report is None and len(notes) == 1
    assert f"the coverage baseline file {BASELINE_FILE} {fragment}" in notes[0]
    assert "which fluffy does not read; remove it" in notes[0]


async def test_a_baseline_file_that_cannot_be_written_is_noted(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p")
    blocked = project / BASELINE_FILE  # a folder where the file should be
    blocked.mkdir(parents=True)
    (blocked / "keep").write_text("x\n")
    kit = await open_kit(tmp_path / "s", project)
    try:
        sid = await _at(kit, "validating")
        run_ = fake_run(project, [("tests/test_calc.py::test_add", "passed", False)])
        await kit.workflow.record_test_run(sid, run_, _cov(80))
        await kit.workflow.fire(sid, "tests_passed")
        await kit.workflow.fire(sid, "merge_approved", approved=True)
        done = await kit.workflow.fire(sid, "commit_complete")
        assert done.session.state == "idle"
        assert done.warnings and "cannot write the coverage baseline file" in done.warnings[0]
    finally:
        await kit.close()


async def test_a_session_row_with_a_mode_the_workflow_never_writes_is_refused(
    tmp_path: Path,
) -> None:
    project = make_project(tmp_path / "p")
    state = tmp_path / "s"
    kit = await open_kit(state, project)
    try:
        sid = (await kit.workflow.new_session()).id
    finally:
        await kit.close()
    with sqlite3.connect(state / "fluffy.db") as conn:
        conn.execute("UPDATE sessions SET mode = 'turbo' WHERE id = ?", (sid,))
    kit = await open_kit(state, project)
    try:
        with pytest.raises(WorkflowError, match="unknown mode or state") as caught:
            await kit.workflow.get(sid)
        assert caught.value.why and caught.value.fix
    finally:
        await kit.close()
