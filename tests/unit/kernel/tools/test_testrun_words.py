"""``test.run`` in a JavaScript project says what the project's runner did, in its name:
a runner that ended before any test ran is quoted in the verdict, never called pytest;
a test file mocha could not load (no report at all) is that file's failing run."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fluffy.errors import ToolInputInvalid
from fluffy.kernel.tools.testing.testprep import TestPlan
from fluffy.kernel.tools.testing.testrun import run_notes, run_tests
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

    def __init__(self, proves: Any = None) -> None:
        self.runs: list[TestRun] = []
        self.proves = proves

    async def get(self, session_id: str) -> Any:
        return SimpleNamespace(state="test_writing")

    async def record_test_run(self, session_id: str, run: TestRun, coverage: Any) -> None:
        self.runs.append(run)

    async def red_verdict(self, session_id: str, run: TestRun) -> tuple[bool, str]:
        base = TreeSnapshot({})
        return run.is_red(base, self.proves), run.red_reason(base, self.proves)


class _Flow:
    async def before_test_run(self, session_id: str) -> list[Any]:
        return []

    async def after_test_run(self, session_id: str, run: TestRun, *, whole: bool) -> Any:
        return [], None


def _run(
    tmp_path: Path,
    report: bytes | None,
    exit_code: int,
    *,
    output: str = CRASH,
    runner: str = "vitest",
    tests: dict[str, str] | None = None,
    proves: Any = None,
) -> tuple[dict[str, Any], Any]:
    if report is not None:
        (tmp_path / "junit.xml").write_bytes(report)
    trees = SimpleNamespace(tests=TreeSnapshot(tests or {}), sources=TreeSnapshot({}), hidden=())
    plan = TestPlan(trees, None, custom=True, dialect="javascript", runner=runner)  # type: ignore[arg-type]
    result = {"exit_code": exit_code, "junit": "junit.xml" if report else None,
              "output_tail": output}  # fmt: skip
    outcome = SimpleNamespace(result=result, call_dir=tmp_path)
    workflow = _Workflow(proves)

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


#: mocha 10 on Node 20, a test of a module not written yet (CommonJS, then ESM).
MOCHA_CJS = (
    "\n Exception during run: Error: Cannot find module '../lib/slug'\nRequire stack:\n"
    "- /workspace/test/slug.test.js\n"
    "    at Module._resolveFilename (node:internal/modules/cjs/loader:1207:15)\n"
    "    at Object.<anonymous> (/workspace/test/slug.test.js:2:21)\n"
)
MOCHA_ESM = (
    "\n Exception during run: Error [ERR_MODULE_NOT_FOUND]: Cannot find module "
    "'/workspace/lib/slug.mjs' imported from /workspace/test/slug.test.mjs\n"
    "    at finalizeResolution (node:internal/modules/esm/resolve:283:11) {\n"
    "  code: 'ERR_MODULE_NOT_FOUND',\n  url: 'file:///workspace/lib/slug.mjs'\n}\n"
)


class _Tree:
    def __init__(self, files: dict[str, bytes]) -> None:
        self.found = files

    def read(self, rel: str) -> bytes | None:
        return self.found.get(rel)

    def is_dir(self, rel: str) -> bool:
        return any(f.startswith(rel + "/") for f in self.found)

    def files(self, folder: str, suffixes: tuple[str, ...], limit: int) -> list[str]:
        return [f for f in self.found if f.endswith(suffixes)][:limit]


@pytest.mark.parametrize(("output", "test_file"), [(MOCHA_CJS, "test/slug.test.js"),
                                                    (MOCHA_ESM, "test/slug.test.mjs")])  # fmt: skip
def test_a_test_file_mocha_could_not_load_is_red_when_its_module_is_missing(
    tmp_path: Path, output: str, test_file: str
) -> None:
    from fluffy.kernel.workflow.jsmissing import JsMissingCode

    tree = _Tree({test_file: b"const { slugify } = require('../lib/slug')\n"})
    proves = JsMissingCode(tree, ["."]).proves
    answer, workflow = _run(tmp_path, None, 1, output=output, runner="mocha",
                            tests={test_file: "h1"}, proves=proves)  # fmt: skip
    (run,) = workflow.runs
    (case,) = run.cases
    assert (case.id, case.file, case.outcome) == (test_file, test_file, "error")
    assert answer["red"] is True, answer["red_reason"]
    assert "fail on missing code" in answer["red_reason"]


def test_a_load_failure_is_not_red_once_the_module_exists(tmp_path: Path) -> None:
    from fluffy.kernel.workflow.jsmissing import JsMissingCode

    tree = _Tree({"test/slug.test.js": b"x", "lib/slug.js": b"module.exports = {}\n"})
    answer, workflow = _run(tmp_path, None, 1, output=MOCHA_CJS, runner="mocha",
                            tests={"test/slug.test.js": "h1"},
                            proves=JsMissingCode(tree, ["."]).proves)  # fmt: skip
    assert answer["red"] is False
    (run,) = workflow.runs
    assert not run.is_green()  # the run still failed: a file that did not load


@pytest.mark.parametrize(
    "output",
    [
        CRASH,  # the importer is the runner's config, not a test file
        MOCHA_CJS.replace("/workspace/test/slug.test.js", "/tmp/elsewhere/slug.test.js"),
        MOCHA_CJS.replace("/workspace/test/slug.test.js", "/workspace/test/../lib/x.js"),
        "Error: Cannot find module '../lib/slug'\n",  # no importer named
    ],
)
def test_other_runs_without_a_report_stay_the_runner_s_error(tmp_path: Path, output: str) -> None:
    with pytest.raises(ToolInputInvalid) as refused:
        _run(tmp_path, None, 1, output=output, runner="mocha")
    assert refused.value.what == "test.run: mocha exited with 1 and wrote no report"


def test_a_run_names_the_persons_files_it_did_not_see_and_how_to_let_one_in(
    tmp_path: Path,
) -> None:
    hidden = (*(f"keys/k{n}.pem" for n in range(7)), ".env")
    trees = SimpleNamespace(tests=TreeSnapshot({}), sources=TreeSnapshot({}), hidden=hidden)
    plan = TestPlan(trees, None)  # type: ignore[arg-type]
    preparer = SimpleNamespace(project=tmp_path)
    notes = run_notes(plan, preparer, "", "test-runner")  # type: ignore[arg-type]
    assert "keys/k0.pem" in notes["secrets"] and "and 3 more" in notes["secrets"]
    assert "fluffy config tests secrets --allow PATH" in notes["secrets"]
    plan = TestPlan(SimpleNamespace(**{**vars(trees), "hidden": ()}), None)  # type: ignore[arg-type]
    assert "secrets" not in run_notes(plan, preparer, "", "test-runner")  # type: ignore[arg-type]
