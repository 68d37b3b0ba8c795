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

    async def sandbox(call: Any, plan: Any) -> Any:
        return SimpleNamespace(result={"junit": "junit.xml"})

    async def release(outcome: Any) -> None:
        return None

    preparer = SimpleNamespace(
        project=tmp_path, state_dir=tmp_path / "state", prepare=prepare, environment=lambda: None
    )
    result = asyncio.run(
        base_run(
            _Call("c1", {}, SimpleNamespace(id="s1")),  # type: ignore[arg-type]
            preparer=preparer,  # type: ignore[arg-type]
            test_globs=["tests/**"],
            sandbox=sandbox,
            release=release,
            read=lambda outcome, name: JUNIT,
        )
    )
    assert asked == [{"coverage": True}]
    assert result.failing == {"tests/test_t.py::test_recursive"} and result.found == 1
