"""What start-up loads: the kernel and the lifecycle commands leave the heavy SDKs for
their first use (issue 34), and each command builds only its own part of the parser.

Each check runs a fresh interpreter and reads ``sys.modules``: what is imported, not how
long it took (timings belong to ``python -m benchmarks.startup``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fluffy.cli.main import COMMANDS, PARTS, build_parser

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]


def _loaded(code: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> set[str]:
    """The modules loaded after running ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=cwd, env=env, capture_output=True, text=True,
        check=True,
    ).stdout  # fmt: skip
    return set(json.loads(out.splitlines()[-1]))


def test_the_kernel_starts_without_the_engine_and_mcp_sdks() -> None:
    loaded = _loaded("import fluffy.kernel.serve")
    for heavy in ("docker", "podman", "requests", "mcp", "jsonschema"):
        assert heavy not in loaded, f"importing the kernel loads {heavy}"


def test_the_engine_sdk_still_loads_for_an_engine_error() -> None:
    import requests.exceptions

    from fluffy.errors import EngineUnavailable
    from fluffy.kernel.containers.errors import engine_call

    with pytest.raises(EngineUnavailable), engine_call("reach the engine"):
        raise requests.exceptions.ConnectionError("refused")


@pytest.mark.parametrize("command", ["start", "stop", "status"])
def test_the_lifecycle_commands_do_not_load_the_settings_model(
    command: str, tmp_path: Path
) -> None:
    # no config file anywhere: the default theme, without reading the settings
    env = {**os.environ, "FLUFFY_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    env.pop("FLUFFY_THEME", None)
    code = f"from fluffy.cli.main import _theme, parse\nparse([{command!r}])\n_theme()"
    loaded = _loaded(code, tmp_path, env)
    assert "fluffy.settings" not in loaded and "fluffy.cli.task" not in loaded
    assert "pydantic" not in loaded
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "config.yaml").write_text("theme: plain\n")
    assert "fluffy.settings" in _loaded(code, tmp_path, env)  # a file sets it: it is read


def test_every_command_has_one_part_and_builds_alone() -> None:
    def names(parser: object) -> set[str]:
        import argparse

        assert isinstance(parser, argparse.ArgumentParser)
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return set(action.choices)

    assert names(build_parser()) == COMMANDS
    for part, _ in PARTS:
        for command in part:
            assert names(build_parser(only=command)) == set(part)
