"""A JavaScript project's commits: fluffy records no coverage of its tests, and says so
once, not as a warning on every commit; a Python project's notice is unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
from msgspec.structs import replace

from fluffy.errors import TransitionDenied
from unit.workflow_support import Kit, fake_run, make_project, open_kit

pytestmark = [pytest.mark.unit, pytest.mark.anyio]  # async tests run on asyncio


async def _commit(kit: Kit, project: Path) -> list[str]:
    """A strict change taken from validating to its commit with no coverage recorded;
    the budget's notices asked before its merge (what the person is shown as WARN)."""
    session = await kit.workflow.new_session()
    await kit.store.save(replace(session, state="validating"), "test_setup", "idle", {})
    green = fake_run(project, [("tests/test_calc.py::test_add", "passed", False)])
    await kit.workflow.record_test_run(session.id, green)  # no coverage report
    await kit.workflow.fire(session.id, "tests_passed")
    notices = await kit.workflow.check_budget(session.id)
    await kit.workflow.fire(session.id, "merge_approved", approved=True)
    await kit.workflow.fire(session.id, "commit_complete")
    return notices


async def test_a_javascript_project_is_told_once_that_no_coverage_is_recorded(
    tmp_path: Path,
) -> None:
    project = make_project(tmp_path / "p")
    kit = await open_kit(tmp_path / "s", project, language="javascript")
    try:
        (first,) = await _commit(kit, project)
        assert "fluffy records no coverage of a JavaScript project's tests" in first
        assert "said once" in first and "{coverage}" in first
        assert await _commit(kit, project) == []  # said once: no warning on every commit
        assert await _commit(kit, project) == []
    finally:
        await kit.close()


async def test_a_python_project_is_still_warned_on_each_commit_without_coverage(
    tmp_path: Path,
) -> None:
    project = make_project(tmp_path / "p")
    kit = await open_kit(tmp_path / "s", project)
    try:
        for _ in range(2):
            warned = await _commit(kit, project)
            assert warned == [
                "no coverage was recorded for this strict commit; the budget was not checked"
            ]
    finally:
        await kit.close()


async def test_an_automatic_javascript_explore_merge_still_waits_for_a_person(
    tmp_path: Path,
) -> None:
    """Not weakened: with no coverage, a non-strict change never merges on its own."""
    project = make_project(tmp_path / "p")
    kit = await open_kit(tmp_path / "s", project, language="javascript")
    try:
        session = await kit.workflow.new_session()
        placed = replace(session, state="validating", mode="explore")
        await kit.store.save(placed, "test_setup", "idle", {})
        green = fake_run(project, [("tests/test_calc.py::test_add", "passed", False)])
        await kit.workflow.record_test_run(session.id, green)
        with pytest.raises(TransitionDenied, match="no coverage was recorded"):
            await kit.workflow.check_budget(session.id, automatic=True)
    finally:
        await kit.close()
