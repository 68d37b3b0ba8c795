"""Real projects archived in tests/fixtures/projects (ADR-063): unpack one, run its suite on
the host as its own developers would, find where a session's new code and test go.

Nothing here is per project beyond ``projects.json``: the host install is the pip
arguments recorded there, the session's places come from fluffy's own layout detection.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fluffy.kernel.project.layout import detect_layout
from tests.project_support import GIT

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "projects"


@dataclass(frozen=True)
class RealProject:
    name: str
    version: str
    archive: str
    licence: str
    licence_files: tuple[str, ...]
    shape: str
    host_install: tuple[str, ...]
    #: tests whose outcome differs, each ``{"tests", "host", "sandbox", "why"}``
    expected_differences: tuple[dict[str, Any], ...] = ()
    #: tests that fail only under coverage measurement, each ``{"tests", "why"}``
    coverage_differences: tuple[dict[str, Any], ...] = ()
    host_note: str = ""


def real_projects() -> list[RealProject]:
    """The projects of projects.json, in its order."""
    data = json.loads((FIXTURES / "projects.json").read_text())
    return [
        RealProject(
            name=p["name"],
            version=p["version"],
            archive=p["archive"],
            licence=p["licence"],
            licence_files=tuple(p["licence_files"]),
            shape=p["shape"],
            host_install=tuple(p["host_install"]),
            expected_differences=tuple(p.get("expected_differences") or ()),
            coverage_differences=tuple(p.get("coverage_differences") or ()),
            host_note=p.get("host_note", ""),
        )
        for p in data["projects"]
    ]


def unpack(project: RealProject, dest: Path, *, git: bool = True) -> Path:
    """The archive's tree at ``dest`` (world-readable: the sandbox user reads it; its
    executables kept executable), a git
    repository with one commit when ``git``."""
    with tarfile.open(FIXTURES / project.archive) as tar:
        tar.extractall(dest.parent / f".{dest.name}-unpack", filter="data")
    top = dest.parent / f".{dest.name}-unpack" / f"{project.name}-{project.version}"
    top.rename(dest)
    (dest.parent / f".{dest.name}-unpack").rmdir()
    for path in [dest, *dest.rglob("*")]:  # an executable stays one (a test may spawn it)
        path.chmod(0o755 if path.is_dir() or path.stat().st_mode & 0o100 else 0o644)
    if git:
        env = {**os.environ, **GIT}
        for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "import"]):
            subprocess.run(["git", "-C", str(dest), *args], check=True, env=env,
                           capture_output=True)  # fmt: skip
    return dest


@dataclass
class HostRun:
    passed: int
    failed: int  # failures and errors
    skipped: int
    seconds: float  # pytest's wall time alone (not the install)
    failing: list[str]  # test ids that failed or errored
    cases: dict[str, str]  # test id -> passed/failed/skipped
    install_s: float = 0.0


def junit_cases(path: Path) -> dict[str, str]:
    """test id (``file::name``, pytest's spelling) -> passed/failed/skipped."""
    out: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):  # our own run's report
        kinds = {child.tag for child in case}
        outcome = ("failed" if kinds & {"failure", "error"} else
                   "skipped" if "skipped" in kinds else "passed")  # fmt: skip
        file, classname = case.get("file") or "", case.get("classname") or ""
        module = file[:-3].replace("/", ".")
        inner = classname[len(module) + 1 :].replace(".", "::") if module else ""
        out["::".join(part for part in (file, inner, case.get("name") or "") if part)] = outcome
    return out


def host_run(project: RealProject, tree: Path, work: Path) -> HostRun:
    """A fresh venv in ``work``, the project's own set-up from PyPI, the whole suite."""
    venv = work / "venv"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "-U", "pip>=25.1"], check=True, capture_output=True, cwd=tree)  # --group
    done = subprocess.run([*pip, *project.host_install], capture_output=True, text=True, cwd=tree)
    assert done.returncode == 0, done.stdout + done.stderr
    install_s = time.perf_counter() - t0
    report = work / "host-junit.xml"
    t0 = time.perf_counter()
    subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-o", "junit_family=xunit1", f"--junitxml={report}"],
        cwd=tree, capture_output=True, text=True, timeout=1800,
        env={k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))},
    )  # fmt: skip
    seconds = time.perf_counter() - t0
    cases = junit_cases(report)
    failing = sorted(k for k, v in cases.items() if v == "failed")
    return HostRun(
        passed=sum(v == "passed" for v in cases.values()), failed=len(failing),
        skipped=sum(v == "skipped" for v in cases.values()), seconds=round(seconds, 2),
        failing=failing, cases=cases, install_s=round(install_s, 2),
    )  # fmt: skip


def expected_counts(project: RealProject, run: HostRun) -> dict[str, int]:
    """What ``test.run`` must count: the host's counts with the tests projects.json records
    as differing moved to their sandbox outcome (each checked to be as recorded on the
    host)."""
    counts = {"passed": run.passed, "failed": run.failed, "skipped": run.skipped}
    for difference in project.expected_differences:
        for test in difference["tests"]:
            assert run.cases.get(test) == difference["host"], (test, difference["why"])
            counts[difference["host"]] -= 1
            counts[difference["sandbox"]] += 1
    return counts


def preexisting_in_green(project: RealProject) -> set[str]:
    """The tests the run that decides a merge must name as failing before the change too:
    the ones recorded as failing in a sandbox, and the ones failing under coverage."""
    failing = {t for d in project.expected_differences if d["sandbox"] == "failed"
               for t in d["tests"]}  # fmt: skip
    return failing | {t for d in project.coverage_differences for t in d["tests"]}


CODE = "def fluffy_triple(x):\n    return 3 * x\n"


def session_places(tree: Path) -> dict[str, str]:
    """Where a model would put a new function and its test, from fluffy's layout
    detection alone: a module in the project's first package (or at its source root), a
    test file in its first test folder."""
    layout = detect_layout(tree)
    package = next((p for p in layout.packages if not p.endswith(".py")), None)
    if package is not None:
        root = next((r for r in layout.source_roots if package.startswith(f"{r}/")), ".")
        dotted = package[len(root) + 1 :] if root != "." else package
        module = f"{dotted.replace('/', '.')}.fluffy_extra"
        code = f"{package}/fluffy_extra.py"
    else:
        root = layout.source_roots[0] if layout.source_roots else "."
        module = "fluffy_extra"
        code = "fluffy_extra.py" if root == "." else f"{root}/fluffy_extra.py"
    tests = layout.test_roots[0] if layout.test_roots else "tests"
    return {"module": module, "code": code, "test": f"{tests}/test_fluffy_extra.py"}


def real_session_steps(places: dict[str, str]) -> list[dict[str, Any]]:
    """A model's natural TDD session: a test importing the code it is about to write (a
    natural red), the code, the whole suite green (merges), the commit."""
    test = (f"from {places['module']} import fluffy_triple\n\n\n"
            "def test_fluffy_triple():\n    assert fluffy_triple(3) == 9\n")  # fmt: skip
    return [
        {"tool": "plan.complete", "args": {"summary": "fluffy_triple, test first"}},
        {"tool": "fs.write", "args": {"path": places["test"], "content": test}},
        {
            "tool": "test.run",
            "args": {"paths": [places["test"]]},
            "expect": {"state": "code_writing"},
        },
        {"tool": "fs.write", "args": {"path": places["code"], "content": CODE}},
        {"tool": "test.run", "args": {}, "expect": {"state": "committing"}},
        {
            "tool": "git.commit",
            "args": {"message": "Add fluffy_triple"},
            "expect": {"state": "idle"},
        },
    ]
