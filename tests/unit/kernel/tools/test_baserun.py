"""The base tree's run measures coverage as the run that decides a merge does.

structlog's tests/test_tracebacks.py::test_recursive passes without coverage and fails
under ``coverage run --source=.`` (the recursion limit is then hit inside the tracer:
"... while calling a Python object").  The deciding run measures coverage; a base run
without it saw the test pass, so the failure counted as the change's and blocked every
session on structlog (tests/integration/test_real_projects.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec

from fluffy.kernel.project.testsecrets import SecretFiles, set_allowed
from fluffy.kernel.tools.testing.baserun import base_run

JUNIT = (b'<testsuite><testcase classname="tests.test_t" name="test_recursive" file="tests/'
         b'test_t.py"><failure message="x"/></testcase></testsuite>')  # fmt: skip


class _Call(msgspec.Struct):  # a RoutedCall's fields the base run reads
    call_id: str
    args: dict[str, Any]
    session: Any


def test_the_base_run_measures_coverage_like_the_deciding_run(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_t.py").write_text("def test_recursive():\n    pass\n")
    asked: list[dict[str, Any]] = []

    def prepare(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs)
        return SimpleNamespace(custom=False, dialect="pytest", canary=None)

    result = asyncio.run(_base(tmp_path, prepare))
    assert asked == [{"coverage": True}]
    assert result.failing == {"tests/test_t.py::test_recursive"} and result.found == 1


async def _base(project: Path, prepare: Any) -> Any:
    async def sandbox(call: Any, plan: Any) -> Any:
        return SimpleNamespace(result={"junit": "junit.xml"})

    async def release(outcome: Any) -> None:
        return None

    state = project.parent / "state"  # outside the project, as the kernel's is
    preparer = SimpleNamespace(
        project=project, state_dir=state, prepare=prepare, environment=lambda: None,
        views=SimpleNamespace(hidden=SecretFiles(project, state).hidden),
    )  # fmt: skip
    return await base_run(
        _Call("c1", {}, SimpleNamespace(id="s1")),  # type: ignore[arg-type]
        preparer=preparer,  # type: ignore[arg-type]
        test_globs=["tests/**"],
        sandbox=sandbox,
        release=release,
        read=lambda outcome, name: JUNIT,
    )


def test_a_base_run_is_measured_again_once_the_person_lets_tests_see_a_file(
    tmp_path: Path,
) -> None:
    """Its outcome is cached by the tree, and by what the run could not see."""
    project = tmp_path / "p"
    (project / "tests").mkdir(parents=True)
    (project / "tests" / "test_t.py").write_text("def test_recursive():\n    pass\n")
    (project / ".env").write_text("TOKEN=x\n")  # no repository: the person's
    runs: list[object] = []

    def prepare(*args: Any, **kwargs: Any) -> Any:
        runs.append(args)
        return SimpleNamespace(custom=False, dialect="pytest", canary=None)

    asyncio.run(_base(project, prepare))
    asyncio.run(_base(project, prepare))
    assert len(runs) == 1  # the second: from the cache
    set_allowed(tmp_path / "state", [".env"])
    asyncio.run(_base(project, prepare))
    assert len(runs) == 2
