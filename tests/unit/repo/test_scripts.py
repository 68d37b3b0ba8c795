"""The scripts CI and users run: exit codes and wiring."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _pytest_strict(folder: Path) -> subprocess.CompletedProcess[str]:
    script = str(ROOT / "scripts" / "pytest-strict")
    return subprocess.run(
        [sys.executable, script, "-q", "-p", "no:cacheprovider", str(folder)],
        capture_output=True,
        text=True,
        cwd=folder,
    )


def test_pytest_strict_turns_no_tests_into_a_failure(tmp_path: Path) -> None:
    (tmp_path / "test_nothing.py").write_text("def helper():\n    pass\n")
    proc = _pytest_strict(tmp_path)
    assert proc.returncode == 1
    assert "collected no tests" in proc.stderr


def test_pytest_strict_passes_real_failures_through(tmp_path: Path) -> None:
    (tmp_path / "test_fail.py").write_text("def test_x():\n    assert False\n")
    proc = _pytest_strict(tmp_path)
    assert proc.returncode == 1 and "1 failed" in proc.stdout


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./scripts/test" in readme and "./scripts/test" in ci
    assert "./scripts/run" in readme


def test_the_test_script_sets_up_first_and_runs_every_marker() -> None:
    script = (ROOT / "scripts" / "test").read_text()
    assert script.index("scripts/setup") < script.index("pytest-strict")
    assert '"unit or integration or e2e"' in script
    assert "FLUFFY_MUST_WORK=1" in script


def test_scripts_are_valid_bash() -> None:
    for name in ("setup", "check", "test", "run"):
        subprocess.run(["bash", "-n", str(ROOT / "scripts" / name)], check=True)
    subprocess.run(["bash", "-n", str(ROOT / ".ci" / "run")], check=True)
