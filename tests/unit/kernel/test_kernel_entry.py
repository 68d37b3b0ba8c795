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


def test_the_kernel_loads_no_pydantic_plugin_an_installed_package_names(tmp_path: Path) -> None:
    """A package whose metadata names a pydantic plugin (entry point group `pydantic`)
    gets its code run by the first model of any process that imports it; the kernel
    turns plugins off before its imports.  The control: plain pydantic does load it."""
    site = tmp_path / "site"
    info = site / "marker_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: marker-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[pydantic]\nmarker = marker_plugin:plugin\n")
    marker = tmp_path / "loaded"
    (site / "marker_plugin.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('x')\n"
        "class Plugin:\n    def new_schema_validator(self, *_, **__):\n"
        "        return None, None, None\nplugin = Plugin()\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{site}"}
    env.pop("PYDANTIC_DISABLE_PLUGINS", None)
    model = "import pydantic\nclass M(pydantic.BaseModel):\n    x: int = 0\nM()"
    control = subprocess.run([sys.executable, "-c", model], env=env, capture_output=True,
                             text=True, timeout=60, cwd=ROOT)  # fmt: skip
    assert control.returncode == 0, control.stderr
    assert marker.exists(), "the control did not load the plugin: the test proves nothing"
    marker.unlink()
    done = subprocess.run(
        [sys.executable, "-m", "fluffy.kernel", "serve", "--socket", str(tmp_path / "k.sock"),
         "--state-dir", str(tmp_path / "state"), "--project", str(tmp_path / "gone")],
        env=env, capture_output=True, text=True, timeout=60, cwd=ROOT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr  # imported everything, then refused the project
    assert not marker.exists()
