"""A project's suite runs in the test sandbox as on the person's machine (issue 33).

click's pager tests write small executables into pytest's ``tmp_path`` and run them,
and look for ``less``; both failed only in the sandbox (/tmp was noexec, no pager).  On
Docker and Podman, through the real kernel: such a suite is green, the project's
`.python-version` asking for another Python is named in the result, and everything
else stays shut (/output is not executable, the project is read-only)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import connect_engine
from tests.integration.tool_support import Kernel
from tests.project_support import GIT

SUITE = """\
import os, shutil, subprocess, errno


def test_an_executable_written_to_tmp_path_runs(tmp_path):
    tool = tmp_path / "LESS.EXE"
    tool.write_text("#!/bin/sh\\necho paged\\n")
    tool.chmod(0o755)
    assert subprocess.run([str(tool)], capture_output=True, text=True).stdout == "paged\\n"


def test_a_pager_and_a_terminal_type():
    assert shutil.which("less") and os.environ.get("TERM")


def test_the_rest_stays_shut():
    for path in ("/workspace/x", "/usr/x"):
        try:
            open(path, "w")
        except OSError as exc:
            assert exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM), exc
        else:
            raise AssertionError(path)
"""


@pytest.fixture(params=["docker", "podman"])
def runtime(request: pytest.FixtureRequest) -> str:
    from fluffy.images.builder import build_images

    with connect_engine(request.param) as connected:
        build_images(connected)
    return str(request.param)


def test_a_suite_that_runs_what_it_writes_is_green(tmp_path: Path, runtime: str) -> None:
    project = tmp_path / "repo"
    (project / "tests").mkdir(parents=True)
    (project / "tests" / "test_parity.py").write_text(SUITE)
    (project / ".python-version").write_text("3.12\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "initial"]):
        subprocess.run(["git", "-C", str(project), *args], check=True, capture_output=True,
                       env={**GIT, "PATH": "/usr/bin:/bin"})  # fmt: skip
    kernel = Kernel(tmp_path, project, runtime).start()
    try:
        with kernel.client() as client:
            sid = client.call("session.create")["session_id"]
            client.call("session.message", {"session_id": sid, "text": "look"})
            plan = {"session_id": sid, "tool": "plan.complete", "args": {"summary": "run"}}
            assert client.call("tool.call", plan)["ok"]
            answer = client.call("tool.call", {"session_id": sid, "tool": "test.run", "args": {}})
    finally:
        kernel.stop()
    assert answer["ok"], answer.get("error")
    out = answer["output"]
    assert out["counts"]["passed"] == 3 and out["counts"]["failed"] == 0, out["output_tail"]
    assert "asks for 3.12 (.python-version)" in out["interpreter"]
