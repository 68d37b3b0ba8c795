"""A command whose reader goes away (`fluffy status --json | head`) ends quietly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("args", [["status", "--json"], ["doctor", "--json"]])
def test_a_closed_pipe_is_not_a_traceback(tmp_path: Path, args: list[str]) -> None:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte
    try:
        done = subprocess.run(
            [sys.executable, "-m", "fluffy", *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            env={**os.environ, "FLUFFY_HOME": str(tmp_path / "home")},
            timeout=60,
        )
    finally:
        os.close(write)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.returncode == 128 + signal.SIGPIPE, done.stderr
