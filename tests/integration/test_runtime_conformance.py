"""Docker and Podman meet the runtime conformance bar (tests/runtime_conformance.py).

Containers are made from the base image (debian:bookworm-slim or FLUFFY_BASE_IMAGE),
the smallest image every engine here has, with fluffy's hardening and seccomp profile.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fluffy.errors import FluffyError
from fluffy.images.base import base_image_ref
from fluffy.kernel.containers.factory import open_runtime
from fluffy.kernel.containers.runtime import ContainerRuntime
from tests.conftest import connect_engine, unavailable
from tests.runtime_conformance import Harness, RuntimeConformance, harness_for


@pytest.fixture(scope="module", params=["docker", "podman"])
def runtime_under_test(request: pytest.FixtureRequest) -> Iterator[ContainerRuntime]:
    """One runtime per engine for the whole module (connecting costs more than a test)."""
    with connect_engine(request.param) as engine:
        runtime = open_runtime(engine)
        try:
            runtime.image_id(base_image_ref())
        except FluffyError as exc:
            unavailable(f"{engine.name} lacks the base image {base_image_ref()}: {exc}")
        yield runtime
        close = getattr(runtime, "close", None)
        if close is not None:
            close()


class TestEngineRuntime(RuntimeConformance):
    @pytest.fixture()
    def harness(self, runtime_under_test: ContainerRuntime, tmp_path: Path) -> Iterator[Harness]:
        yield from harness_for(runtime_under_test, base_image_ref(), tmp_path)
