"""The in-memory runtime meets the runtime conformance bar (tests/runtime_conformance.py).

The same tests run against Docker and Podman in
tests/integration/test_runtime_conformance.py; here the in-memory runtime plays each
script's documented outcome instead of running it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fluffy.kernel.containers.memory_runtime import Behaviour, FakeContainer, MemoryRuntime
from fluffy.kernel.containers.runtime import ContainerSpec, ExecResult
from tests.runtime_conformance import SCRIPTS, Harness, RuntimeConformance, harness_for

IMAGE = "fluffy/python-base:0123456789abcdef"


def _behave(spec: ContainerSpec) -> Behaviour:
    script = SCRIPTS[tuple(spec.command)]
    return Behaviour(script.exit_code, script.stdout, script.stderr, script.seconds)


def _execute(container: FakeContainer, command: list[str]) -> ExecResult:
    script = SCRIPTS[tuple(command)]
    return ExecResult(script.exit_code, script.stdout, script.stderr)


class TestMemoryRuntime(RuntimeConformance):
    @pytest.fixture()
    def harness(self, tmp_path: Path) -> Iterator[Harness]:
        runtime = MemoryRuntime(behave=_behave, execute=_execute)
        runtime.add_image(IMAGE)
        yield from harness_for(runtime, IMAGE, tmp_path)
