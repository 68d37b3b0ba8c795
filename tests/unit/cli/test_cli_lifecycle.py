"""`fluffy start` (and a task) refuses a fluffy home too deep for the kernel's sockets
with what, why and fix, before any bootstrap runs (it would fail binding its gate)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from fluffy.bootstrap.supervisor import paths
from fluffy.cli.lifecycle import SOCKET_PATH_MAX, socket_path_problem

pytestmark = pytest.mark.unit


def _home(tmp_path: Path, size: int) -> Path:
    """A folder path of exactly ``size`` bytes under tmp_path."""
    pad = size - len(os.fsencode(tmp_path)) - 1
    assert pad > 0
    return tmp_path / ("h" * pad)


def test_the_deepest_home_the_error_allows_binds_and_one_byte_more_is_refused(
    tmp_path: Path,
) -> None:
    project = str(tmp_path / "project")
    error = socket_path_problem(paths(_home(tmp_path, 120), project))
    assert error is not None
    room = int(error.fix.split("at most ")[1].split(" bytes")[0])
    fits = paths(_home(tmp_path, room), project)
    assert socket_path_problem(fits) is None
    assert socket_path_problem(paths(_home(tmp_path, room + 1), project)) is not None
    gate = fits["gate"]  # the longest socket there binds for real
    gate.mkdir(parents=True)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(gate / "engine.sock"))
    assert len(os.fsencode(gate / "engine.sock")) == SOCKET_PATH_MAX


def test_the_refusal_names_the_socket_its_size_and_what_to_set(tmp_path: Path) -> None:
    home = _home(tmp_path, 90)
    error = socket_path_problem(paths(home, str(tmp_path / "project")))
    assert error is not None and error.code == "kernel.start_failed"
    assert "too deep" in error.what
    assert "engine.sock is " in error.why and f"at most {SOCKET_PATH_MAX}" in error.why
    assert str(home) in error.why and "FLUFFY_HOME" in error.fix
    assert socket_path_problem(paths(tmp_path / "h", str(tmp_path / "project"))) is None
