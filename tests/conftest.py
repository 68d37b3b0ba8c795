"""Shared fixtures.

Markers follow the folder: tests/unit -> ``unit`` (no engine), tests/integration ->
``integration`` (a real engine), tests/e2e -> ``e2e`` (the installed command and
scripts).  Without an engine, integration and e2e tests skip locally; with
``FLUFFY_MUST_WORK=1`` or ``CI=true`` they fail instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from fluffy.errors import FluffyError

ROOT = Path(__file__).resolve().parent.parent

# The kernel checks every syscall result it sends against its declared type (fluffy/ipc/
# results/); kernels the tests start as processes inherit it.  Set before any test module
# imports the syscall layer, which reads it once.
os.environ.setdefault("FLUFFY_CHECK_RESULTS", "1")

# Property tests check what holds, not how fast: a loaded CI machine (two cores running
# containers) must not fail an example for taking over hypothesis's 200 ms default.
# Speed is measured by the benchmarks.
settings.register_profile("fluffy", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("fluffy")


def must_work() -> bool:
    return os.environ.get("FLUFFY_MUST_WORK") == "1" or os.environ.get("CI") == "true"


#: the longest modules (a real project's whole suite, run several times), collected first:
#: scripts/test's two workers (pytest-xdist, one module at a time, in collection order)
#: then each start with one and finish near each other
LONGEST_FIRST = ("test_real_projects.py", "test_real_node_projects.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: Path(str(item.fspath)).name not in LONGEST_FIRST)  # stable
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT / "tests").parts
        if parts and parts[0] in ("unit", "integration", "e2e"):
            item.add_marker(getattr(pytest.mark, parts[0]))


def unavailable(reason: str) -> None:
    """Skip locally, fail where the engine must work (CI)."""
    if must_work():
        pytest.fail(f"{reason} (FLUFFY_MUST_WORK/CI: container tests may not skip)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def engine() -> Iterator[object]:
    from fluffy.kernel.containers.engine import connect

    try:
        connected = connect(timeout=30)
    except FluffyError as exc:
        unavailable(f"no container engine: {exc.what}")
        raise AssertionError("unreachable") from exc
    with connected:
        yield connected


@pytest.fixture(scope="session")
def images(engine: object) -> dict[str, str]:
    """name -> ref of every fluffy image, built if missing (a no-op when current)."""
    from fluffy.images.builder import build_images

    results = build_images(engine)  # type: ignore[arg-type]
    return {status.name: status.ref for status in results}


def run_in_image(engine: object, image: str, command: list[str]) -> tuple[int, str, str]:
    """Run ``command`` in ``image`` with the runtime's hardening and the standard profile."""
    import uuid

    from fluffy.kernel.containers.factory import open_runtime
    from fluffy.kernel.containers.runtime import LABEL_MANAGED, LABEL_PURPOSE, ContainerSpec
    from fluffy.seccomp.compile import oci_json

    runtime = open_runtime(engine)  # type: ignore[arg-type]
    spec = ContainerSpec(
        name=f"fluffy-test-{uuid.uuid4().hex[:12]}",
        image=image,
        command=command,
        labels={LABEL_MANAGED: "1", LABEL_PURPOSE: "test"},
        seccomp_json=oci_json("standard"),
    )
    container_id = runtime.create(spec)
    try:
        runtime.start(container_id)
        code = runtime.wait(container_id, 120)
        out, err = runtime.output(container_id)  # type: ignore[attr-defined]
    finally:
        runtime.remove(container_id)
    return code, out, err


def connect_engine(name: str) -> Any:
    """A connection to engine ``name`` (docker / podman), or unavailable() (skip, CI: fail)."""
    from fluffy.kernel.containers.engine import connect

    try:
        return connect({**os.environ, "FLUFFY_RUNTIME": name}, timeout=30)
    except FluffyError as exc:
        unavailable(f"{name} is not available: {exc.what} (scripts/setup --with-podman)")
        raise AssertionError("unreachable") from exc


@pytest.fixture(scope="session", params=["docker", "podman"])
def sandbox_manager(request: pytest.FixtureRequest) -> Iterator[object]:
    """A container manager on each engine, with that engine's images current."""
    from fluffy.images.builder import build_images
    from fluffy.images.templates import open_manager

    with connect_engine(request.param) as connected:
        build_images(connected)
        manager = open_manager(connected)
        try:
            yield manager
        finally:
            manager.close()


@pytest.fixture()
def fluffy_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "fluffy-home"
    monkeypatch.setenv("FLUFFY_HOME", str(home))
    return home


@pytest.fixture
def anyio_backend() -> str:
    """Async tests (``pytest.mark.anyio``, anyio's pytest plugin) run on asyncio, as the
    kernel does."""
    return "asyncio"
