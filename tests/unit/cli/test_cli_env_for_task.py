"""Before a task the CLI builds the project's environment; what stops it is said, except
an engine that does not answer (the kernel's start reports that)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from fluffy.cli import project as cli_project
from fluffy.errors import EngineTimeout, EngineUnavailable, ImageNotFound

pytestmark = pytest.mark.unit


class _Wanted:
    def wanted(self) -> bool:
        return True


def _run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, error: Exception) -> str:
    def fail(*_args: Any, **_kwargs: Any) -> None:
        raise error

    import fluffy.host.project as host_project

    monkeypatch.setattr(host_project, "needs_environment", lambda _p: _Wanted().wanted())
    monkeypatch.setattr(cli_project, "ensure_env", fail)
    console = Console(file=io.StringIO(), width=200)
    cli_project.env_for_task(tmp_path, console)
    out = console.file.getvalue()
    assert isinstance(out, str)
    return out


def test_a_stale_image_is_said_with_its_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    stale = ImageNotFound(
        "image fluffy/code-executor:0123 for the code-executor sandbox is stale",
        why="sandboxes run only from images built from this fluffy's sources",
        fix="Run `fluffy images build` to build fluffy's images locally.",
    )
    out = _run(monkeypatch, tmp_path, stale)
    assert "the test environment was not built: image fluffy/code-executor:0123" in out
    assert "Fix: Run `fluffy images build`" in out


@pytest.mark.parametrize("error", [EngineUnavailable("no engine"), EngineTimeout("slow")])
def test_an_engine_that_does_not_answer_is_left_to_the_kernels_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, error: Exception
) -> None:
    assert _run(monkeypatch, tmp_path, error) == ""
