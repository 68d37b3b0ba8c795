"""Wire an engine to a runtime.

Which image a template runs, and a manager built on both, are
:mod:`fluffy.images.templates`' (the image builder uses this package, not the reverse).
"""

from __future__ import annotations

from fluffy.kernel.containers.docker_runtime import DockerRuntime
from fluffy.kernel.containers.engine import Engine
from fluffy.kernel.containers.runtime import ContainerRuntime


def open_runtime(engine: Engine, *, compat: bool = False) -> ContainerRuntime:
    """Docker through its SDK; Podman through its own API (podman SDK), or, ``compat``,
    through its Docker-compatible API (in L1: the engine gate serves only that one)."""
    if compat:
        runtime = DockerRuntime(engine.client, engine.info.url)
        runtime.reports_oom = engine.name != "podman"
        return runtime
    if engine.name == "podman":
        from fluffy.kernel.containers.podman_runtime import PodmanRuntime

        return PodmanRuntime(engine.info.url)
    return DockerRuntime(engine.client, engine.info.url)
