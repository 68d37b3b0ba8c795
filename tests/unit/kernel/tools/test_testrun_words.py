"""``test.run`` in a JavaScript project says what the project's runner did, in its name:
a runner that ended before any test ran is quoted in the verdict, never called pytest."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fluffy.errors import ToolInputInvalid
from fluffy.kernel.tools.testing.testprep import TestPlan
from fluffy.kernel.tools.testing.testrun import run_tests
from fluffy.kernel.workflow.evidence import TestRun, TreeSnapshot

pytestmark = pytest.mark.unit

#: vitest's report when its config failed to load: no test at all.
EMPTY = b'<?xml version="1.0" encoding="UTF-8" ?>\n<testsuites name="vitest tests" tests="0">\n'
EMPTY += b"</testsuites>\n"
CRASH = (
    "\n RUN  v3.2.4 /workspace\n\n"
    "failed to load config from /workspace/vitest.config.ts\n\n"
    "Error: Cannot find module 'vite-tsconfig-paths'\n"
    "Require stack:\n- /workspace/vitest.config.ts\n"
)


@dataclass
class _Call:
    args: dict[str, Any] = field(default_factory=dict)
    session: Any = field(default_factory=lambda: SimpleNamespace(id="s1"))
    spec: Any = field(default_factory=lambda: SimpleNamespace(template="test-runner"))


class _Workflow:
    test_globs = ("test/**",)

    def __init__(self) -> None:
        self.runs: list[TestRun] = []

    async def get(self, session_id: str) -> Any:
        return SimpleNamespace(state="test_writing")

    async def record_test_run(self, session_id: str, run: TestRun, coverage: Any) -> None:
        self.runs.append(run)

    async def red_verdict(self, session_id: str, run: TestRun) -> tuple[bool, str]:
        return run.is_red(TreeSnapshot({})), run.red_reason(TreeSnapshot({}))


class _Flow:
    async def before_test_run(self, session_id: str) -> list[Any]:
        return []

    async def after_test_run(self, session_id: str, run: TestRun, *, whole: bool) -> Any:
        return [], None


def _run(tmp_path: Path, report: bytes | None, exit_code: int) -> tuple[dict[str, Any], Any]:
    if report is not None:
        (tmp_path / "junit.xml").write_bytes(report)
    trees = SimpleNamespace(tests=TreeSnapshot({}), sources=TreeSnapshot({}))
    plan = TestPlan(trees, None, custom=True, dialect="javascript", runner="vitest")  # type: ignore[arg-type]
    result = {"exit_code": exit_code, "junit": "junit.xml" if report else None,
              "output_tail": CRASH}  # fmt: skip
    outcome = SimpleNamespace(result=result, call_dir=tmp_path)
    workflow = _Workflow()

    async def sandbox(call: Any, plan: Any) -> Any:
        return outcome

    async def release(outcome: Any) -> None:
        return None

    answer = asyncio.run(
        run_tests(
            _Call(),  # type: ignore[arg-type]
            preparer=SimpleNamespace(prepare=lambda *a, **k: plan, project=tmp_path),  # type: ignore[arg-type]
            flow=_Flow(),  # type: ignore[arg-type]
            workflow=workflow,  # type: ignore[arg-type]
            workspaces=SimpleNamespace(get=lambda sid: SimpleNamespace(overlay=dict, tree=None)),  # type: ignore[arg-type]
            sandbox=sandbox,
            release=release,
            expect=lambda session, tool: None,
        )
    )
    return answer, workflow


def test_a_runner_that_ran_no_test_is_named_and_its_output_quoted(tmp_path: Path) -> None:
    answer, workflow = _run(tmp_path, EMPTY, 1)
    assert answer["red"] is False
    reason = answer["red_reason"]
    assert reason.startswith("not red: vitest ran no tests (exit code 1); its output ends: ")
    assert "Error: Cannot find module 'vite-tsconfig-paths'" in reason
    assert "pytest" not in reason
    (run,) = workflow.runs  # recorded with it: the guard's refusal says the same
    assert run.runner == "vitest" and "vite-tsconfig-paths" in run.output


def test_a_runner_that_wrote_no_report_is_named(tmp_path: Path) -> None:
    with pytest.raises(ToolInputInvalid) as refused:
        _run(tmp_path, None, 1)
    assert refused.value.what == "test.run: vitest exited with 1 and wrote no report"
    assert "vite-tsconfig-paths" in (refused.value.why or "")
    assert "collection" not in (refused.value.fix or "")  # pytest's word
