"""The test tool plugin: ``test.run`` runs the project's tests on the view the AI sees.

The kernel mounts the session's view (the project plus its staged changes, kept in
step per session: :mod:`fluffy.kernel.tools.testing.testview`) read-only at ``/workspace`` and
runs the call in the project's test environment (its dependencies and the project
itself installed offline: :mod:`fluffy.images.environment`) when there is one.  Its
``settings`` say how (never the model's arguments):

* ``python``: the environment's interpreter (absent: the sandbox's own, with the
  project's ``import_roots`` on ``PYTHONPATH``);
* ``no_cov``: pytest-cov is installed (its ``--cov`` options would measure twice);
* ``command`` / ``env``: a project's own test command from ``.fluffy/config.yaml``
  (``{junit}``, ``{coverage}`` and ``{paths}`` are replaced), instead of pytest.

pytest runs under ``coverage run --branch --source=.`` with its JUnit XML, coverage data
and cache written outside the read-only project (the call's output folder and /tmp), so
the project's own pytest settings apply unchanged and no cache warning is raised.  The
result names the report files (the kernel re-reads them as evidence) and carries counts
and the end of the output for display.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from fluffy.errors import ToolTimeout
from fluffy.plugins.sdk import Handler, ToolContext, ToolDefinition, ToolPlugin, normalise_path
from fluffy.plugins.test_tool.canary import canary_token, write_plugin
from fluffy.plugins.test_tool.junit import EMPTY, junit_counts
from fluffy.safetext import strip_sequences

OUTPUT_TAIL = 4000
COVERAGE_TIMEOUT_S = 300
JUNIT, COVERAGE, DATA = "junit.xml", "coverage.json", ".coverage"
#: pytest's cache goes where the sandbox may write (the project is read-only).
CACHE_DIR = "/tmp/.fluffy-pytest-cache"  # noqa: S108 - the sandbox's private tmpfs

#: Per-file line counts in coverage.py's JSON shape (totals, files.*.summary) without
#: the line lists ``coverage json`` writes: the same analysis, a fraction of the output.
SUMMARY = """
import json, os, sys, coverage
root = os.getcwd() + os.sep
cov = coverage.Coverage(data_file=sys.argv[1])
cov.load()
files, covered, total = {}, 0, 0
for path in sorted(cov.get_data().measured_files()):
    try:
        _, statements, _, missing, _ = cov.analysis2(path)
    except Exception:
        continue  # a file that no longer parses (or vanished): not counted
    rel = path[len(root):] if path.startswith(root) else path
    n, hit = len(statements), len(statements) - len(missing)
    files[rel] = {"summary": {"covered_lines": hit, "num_statements": n}}
    covered, total = covered + hit, total + n
with open(sys.argv[2], "w") as out:
    json.dump({"totals": {"covered_lines": covered, "num_statements": total}, "files": files}, out)
"""

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


def _test_arg(path: str) -> str:
    rel = normalise_path(path)
    return "./" + rel if rel.startswith("-") else rel  # never read as a pytest option


def _strings(value: object) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def run_environment(ctx: ToolContext) -> tuple[str, dict[str, str]]:
    """The interpreter and the variables the tests run with."""
    python = ctx.settings.get("python")
    env = {"HOME": "/tmp", "TMPDIR": "/tmp"}  # noqa: S108 - the sandbox's tmpfs
    # what a developer's terminal has, which suites read (click's pager tests, colours)
    env.update(TERM="xterm-256color", LANG="C.UTF-8", PAGER="less")
    if isinstance(python, str) and python:
        bin_dir = str(Path(python).parent)
        env["PATH"] = f"{bin_dir}:{ctx.env.get('PATH', '/usr/bin:/bin')}"
        env["VIRTUAL_ENV"] = str(Path(bin_dir).parent)
        return python, env
    roots = [str(ctx.workspace / r) if r not in ("", ".") else str(ctx.workspace)
             for r in _strings(ctx.settings.get("import_roots"))]  # fmt: skip
    if roots:
        env["PYTHONPATH"] = ":".join(roots)
    return sys.executable or "python3", env


def _pytest(ctx: ToolContext, args: dict[str, Any], python: str, canary: str | None) -> list[str]:
    call = ctx.call_dir
    command = [python]
    if ctx.settings.get("coverage", True):
        command += ["-m", "coverage", "run", f"--data-file={call / DATA}", "--branch"]
        command += ["--source=."]
    command += ["-m", "pytest", "-q", "-o", f"cache_dir={CACHE_DIR}"]
    command += ["-o", "junit_family=xunit1", f"--junitxml={call / JUNIT}"]
    if ctx.settings.get("no_cov"):
        command.append("--no-cov")
    if canary is not None:  # after the project's addopts: a failing canary never stops it
        command += ["-p", canary, "--maxfail=0"]
    command += [_test_arg(path) for path in args.get("paths", [])]
    if "keyword" in args:
        command.append(f"-k{args['keyword']}")
    return command


def _custom(ctx: ToolContext, args: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """The project's own test command, its placeholders filled in."""
    call = ctx.call_dir
    paths = [_test_arg(path) for path in args.get("paths", [])]
    values = {"junit": str(call / JUNIT), "coverage": str(call / "coverage.out")}
    command: list[str] = []
    for part in _strings(ctx.settings.get("command")):
        if part == "{paths}":
            command += paths
            paths = []
        else:
            command.append(part.format_map(values))
    command += paths
    raw_env = ctx.settings.get("env")
    extra = {
        str(k): str(v).format_map(values) for k, v in (raw_env or {}).items()
    } if isinstance(raw_env, dict) else {}  # fmt: skip
    return command, extra


def _canary(folder: Path, token: str | None, env: dict[str, str]) -> str | None:
    """Write the run's canary plugin into ``folder`` and put it on the tests' path;
    return its module name (None: no canary)."""
    if token is None:
        return None
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")]))
    return write_plugin(folder, token)


def run_tests(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    call = ctx.call_dir
    for name in (JUNIT, COVERAGE, DATA):
        (call / name).unlink(missing_ok=True)
    python, env = run_environment(ctx)
    custom = bool(ctx.settings.get("command"))
    if custom:
        command, extra = _custom(ctx, args)
        env.update(extra)
    else:
        env.update(_custom(ctx, args)[1])  # the project's variables (`tests: env:`)
    token = None if custom else canary_token(ctx.settings)
    with tempfile.TemporaryDirectory(prefix="fluffy-canary-") as folder:
        if not custom:
            command = _pytest(ctx, args, python, _canary(Path(folder), token, env))
        tests = ctx.run(command, cwd=ctx.workspace, timeout_s=args["timeout_s"], env=env)
    # terminal colour and cursor codes (runners colour their output when CI is set), each
    # sequence whole: dropped from what the model and the person read; and the canary's
    # lines (pytest -v names each test as it starts)
    output = strip_sequences(tests.stdout + (("\n" + tests.stderr) if tests.stderr else ""))
    if token is not None:
        output = "\n".join(line for line in output.split("\n") if token not in line)
    if tests.timed_out:
        raise ToolTimeout(
            f"the tests did not finish within {args['timeout_s']} s; output ends: {output[-500:]}",
            fix="Run fewer tests (paths, keyword) or give a larger timeout_s.",
        )
    junit = call / JUNIT
    counts = junit_counts(junit.read_bytes(), token) if junit.is_file() else dict(EMPTY)
    coverage: str | None = None
    if not custom and tests.exit_code in (0, 1) and (call / DATA).is_file():
        # the kernel uses a green run's coverage only (the tech-debt budget and baseline),
        # and a run with failures that were there before the change is green (ADR-061)
        ctx.run([python, "-c", SUMMARY, str(call / DATA), str(call / COVERAGE)],
                cwd=ctx.workspace, timeout_s=COVERAGE_TIMEOUT_S, env=env)  # fmt: skip
        if (call / COVERAGE).is_file():
            coverage = COVERAGE
    elif custom and (call / "coverage.out").is_file():
        coverage = "coverage.out"
    # a run without a report (a custom command's too) is the kernel's to judge: a test
    # file mocha could not load is that file's failure, anything else the runner's error
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
