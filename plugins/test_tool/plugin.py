"""The test tool plugin: ``test.run`` runs the project's pytest suite under coverage.

The view (project + staged changes) is copied to ``/output/<call>/view`` and the tests
run there: ``coverage run --branch --source=. -m pytest`` writing ``junit.xml`` and
``.coverage`` into the call's output, then ``coverage json`` writing ``coverage.json``.
The result names those files (the kernel re-reads them as evidence for the TDD
workflow) and carries counts and the end of pytest's output for display.
"""

from __future__ import annotations

import sys
from typing import Any

from fluffy.errors import ToolTimeout
from fluffy.plugins.sdk import Handler, ToolContext, ToolDefinition, ToolPlugin, normalise_path
from fluffy.plugins.test_tool.junit import EMPTY, junit_counts
from fluffy.plugins.test_tool.viewcopy import copy_view

OUTPUT_TAIL = 4000
COVERAGE_TIMEOUT_S = 300
JUNIT, COVERAGE, DATA, VIEW = "junit.xml", "coverage.json", ".coverage", "view"

RUN = ToolDefinition(
    name="test.run",
    description="Run the project's tests (pytest, with branch coverage) on the project as "
    "this session sees it. Optionally only some paths or tests matching a -k keyword. "
    "Returns pass/fail counts and the end of pytest's output.",
    input_schema={
        "type": "object",
        "properties": {
            "paths": {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "maxLength": 4096},
                "maxItems": 1000,
                "description": "Test files, folders or node ids (tests/test_x.py::test_y).",
            },
            "keyword": {"type": "string", "minLength": 1, "maxLength": 1000},
            "timeout_s": {"type": "integer", "minimum": 1, "maximum": 3600, "default": 300},
        },
        "additionalProperties": False,
    },
    output_mode="full",
    read_only=True,
    truncation="tail",
    timeout_s=3600 + COVERAGE_TIMEOUT_S + 300,
)


def _python() -> str:
    return sys.executable or "python3"


def _test_arg(path: str) -> str:
    rel = normalise_path(path, what="paths[]")
    return "./" + rel if rel.startswith("-") else rel  # never read as a pytest option


def run_tests(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    targets = [_test_arg(path) for path in args.get("paths", [])]
    call = ctx.call_dir
    view = call / VIEW
    copy_view(ctx, view)
    for name in (JUNIT, COVERAGE, DATA):
        (call / name).unlink(missing_ok=True)
    command = [_python(), "-m", "coverage", "run", f"--data-file={call / DATA}", "--branch"]
    command += ["--source=.", "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    command += ["-o", "junit_family=xunit1", f"--junitxml={call / JUNIT}", *targets]
    if "keyword" in args:
        command.append(f"-k{args['keyword']}")
    tests = ctx.run(command, cwd=view, timeout_s=args["timeout_s"])
    output = tests.stdout + (("\n" + tests.stderr) if tests.stderr else "")
    if tests.timed_out:
        raise ToolTimeout(
            f"the tests did not finish within {args['timeout_s']} s; output ends: {output[-500:]}",
            fix="Run fewer tests (paths, keyword) or give a larger timeout_s.",
        )
    junit = call / JUNIT
    counts = junit_counts(junit.read_bytes()) if junit.is_file() else dict(EMPTY)
    coverage: str | None = None
    if (call / DATA).is_file():
        report = [_python(), "-m", "coverage", "json", "-q", f"--data-file={call / DATA}"]
        ctx.run(
            [*report, "-o", str(call / COVERAGE)],
            cwd=view,
            timeout_s=COVERAGE_TIMEOUT_S,
        )
        if (call / COVERAGE).is_file():  # written even when a fail_under is not met
            coverage = COVERAGE
    return {
        "exit_code": tests.exit_code,
        "junit": JUNIT if junit.is_file() else None,
        "coverage": coverage,
        "counts": counts,
        "output_tail": output[-OUTPUT_TAIL:],
    }


class TestTool(ToolPlugin):
    __test__ = False  # not a pytest test class
    name = "test-tool"
    version = 1

    def tools(self) -> list[ToolDefinition]:
        return [RUN]

    def handlers(self) -> dict[str, Handler]:
        return {"test.run": run_tests}


PLUGIN = TestTool()
