"""The ``fluffy`` command's end: what it loaded is frozen out of the interpreter's last
garbage collections (they walked it all, ~70 ms after `fluffy start`), and nothing it
wrote is lost by that."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PROBE = """
import gc, json, sys
from fluffy.cli.main import command
sys.argv = ["fluffy", *sys.argv[1:]]
code = command()
print(json.dumps({"code": code, "frozen": gc.get_freeze_count()}), file=sys.stderr)
"""


def test_the_console_script_is_the_command() -> None:
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "fluffy"]
    assert script.value == "fluffy.cli.main:command"


def test_a_command_ends_frozen_with_its_output_whole(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "stop", "--json", "--project", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "FLUFFY_HOME": str(tmp_path / "home")},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"ok": True, "stopped": False}
    end = json.loads(done.stderr.strip().splitlines()[-1])
    assert end["code"] == 0
    assert end["frozen"] > 10_000  # the modules the command loaded, and their objects
