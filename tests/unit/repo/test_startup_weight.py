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


def _names(code: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> set[str]:
    """The names ``code`` prints last, as a JSON list, in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
        check=True,
    ).stdout  # fmt: skip
    return set(json.loads(out.splitlines()[-1]))


def _loaded(code: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> set[str]:
    """The modules loaded after running ``code``."""
    return _names(f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))", cwd, env)


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
    # nor the gate's HTTP server and parser: the CLI reads L1's status, never serves it
    assert "http.server" not in loaded and "http.client" not in loaded
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


#: The dataclasses the kernel's start still makes, each for what a Struct cannot do
#: (ADR-084): ``__post_init__`` that sets fields, field options (``init=False``,
#: ``compare=False``), a ``Generic`` base, a cached property.
START_DATACLASSES = {
    "fluffy.kernel.audit.query.Filters": "__post_init__",
    "fluffy.kernel.ai.context.TokenBudget": "__post_init__",
    "fluffy.kernel.containers.lifecycle.Sandbox": "__post_init__",
    "fluffy.kernel.ipc.syscalls.Syscall": "Generic base, cached properties",
    "fluffy.kernel.policy.tokens.CapabilityToken": "field options",
    "fluffy.kernel.project.layout.Layout": "field options",
    "fluffy.kernel.scheduler.scheduler.TaskRef": "Generic base, field options",
    "fluffy.kernel.scheduler.task.Limits": "__post_init__",
    "fluffy.kernel.scheduler.task.Task": "Generic base, __post_init__, field options",
    "fluffy.kernel.tools.reading.fastpath.FastPath": "__post_init__",
    "fluffy.kernel.workflow.coverage.CoverageReport": "__post_init__",
    "fluffy.kernel.workflow.evidence.TreeSnapshot": "__post_init__",
    "fluffy.plugins.sdk.definition.ToolDefinition": "__post_init__, field options",
}


def test_the_kernels_start_makes_records_as_structs() -> None:
    # a dataclass compiles its methods from source as its module loads (~0.5 ms each,
    # 122 of them were ~50 ms of every kernel start); a msgspec Struct is made in C
    probe = (
        "import dataclasses, inspect, json, sys\n"
        "import fluffy.kernel.serve\n"
        "print(json.dumps(sorted(f'{n}.{k}' for n, m in list(sys.modules.items())\n"
        "    if n.startswith('fluffy') and m is not None for k, v in vars(m).items()\n"
        "    if inspect.isclass(v) and v.__module__ == n and dataclasses.is_dataclass(v))))"
    )
    made = _names(probe)
    assert made - set(START_DATACLASSES) == set(), "make these msgspec Structs (ADR-084)"
    assert set(START_DATACLASSES) <= made, "a listed class is gone: take it off the list"
