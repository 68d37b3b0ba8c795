"""`python3 -m fluffy.kernel`, the L1 image's entry point, run as the bootstrap runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _kernel(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fluffy.kernel", *args],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def test_serve_refuses_a_missing_project_with_what_why_fix_and_code(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    done = _kernel("serve", "--socket", str(tmp_path / "k.sock"),
                   "--state-dir", str(tmp_path / "state"), "--project", str(gone))  # fmt: skip
    assert done.returncode == 3, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == f"ERROR: project directory {gone} does not exist"
    assert "Fix: Pass an existing directory with --project." in lines
    assert lines[-1].startswith("(config.") and "Traceback" not in done.stderr
    assert not (tmp_path / "k.sock").exists()


def test_serve_says_which_options_it_needs() -> None:
    done = _kernel("serve", "--socket", "/tmp/x.sock")
    assert done.returncode == 2
    assert "--state-dir" in done.stderr and "Traceback" not in done.stderr


def test_an_unknown_command_prints_the_usage() -> None:
    done = _kernel("start")
    assert done.returncode == 2
    assert done.stderr.startswith("usage: python3 -m fluffy.kernel self-check | serve")
