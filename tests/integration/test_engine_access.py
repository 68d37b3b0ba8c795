"""A user the engine's socket refuses is told that, and how to get an engine (the docker
group, or rootless Podman), not that no engine runs or that Docker must be installed.

Proven with the real sockets: the command runs as ``nobody`` (no supplementary group)
beside a running engine, and the socket refuses it with EACCES.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import unavailable

pytestmark = pytest.mark.integration
NOBODY = 65534


@pytest.fixture
def home() -> Iterator[Path]:
    """A folder nobody may use (pytest's own tmp_path is root's alone)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        unavailable("running a command as another user needs root and setpriv")
    folder = Path(tempfile.mkdtemp(prefix="fluffy-nobody-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _as_nobody(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"HOME": str(home), "FLUFFY_HOME": str(home / "fluffy"), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
         sys.executable, "-m", "fluffy", *args],
        capture_output=True, text=True, env=env, cwd=home, timeout=120,
    )  # fmt: skip


def test_a_user_outside_the_engine_s_group_is_told_how_to_get_in(
    engine: object, home: Path
) -> None:
    sockets = [s for s in ("/var/run/docker.sock", "/run/podman/podman.sock") if Path(s).exists()]
    assert sockets  # the engine fixture found one
    probe = _as_nobody(home, "doctor", "--json")
    assert "its socket is not open to you" in probe.stdout, probe.stdout + probe.stderr
    started = _as_nobody(home, "start", "--project", str(home))
    assert started.returncode == 3, started.stdout + started.stderr
    said = started.stderr
    assert "its socket is not open to you" in said and "(permission denied)" in said
    assert "user nobody" in said
    assert "usermod -aG docker" in said and "FLUFFY_RUNTIME=podman" in said
    assert "install docker.io" not in said and "is not running" not in said
