"""Wire an engine to a runtime and a container manager."""

from __future__ import annotations

from typing import Any

from fluffy.errors import ImageNotFound
from fluffy.kernel.containers.docker_runtime import DockerRuntime
from fluffy.kernel.containers.engine import Engine
from fluffy.kernel.containers.manager import ContainerManager
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


def template_images(engine: Engine) -> dict[str, str]:
    """Sandbox template -> current image ref; refuses images that are missing or stale."""
    from fluffy.images.builder import plan_images
    from fluffy.images.spec import spec_for_template
    from fluffy.kernel.containers.config import TEMPLATES

    plan = {status.name: status for status in plan_images(engine)}
    images: dict[str, str] = {}
    for template in TEMPLATES:
        status = plan[spec_for_template(template).name]
        if status.state != "current":
            raise ImageNotFound(
                f"image {status.ref} for the {template} sandbox is {status.state}",
                why="sandboxes run only from images built from this fluffy's sources",
            )
        images[template] = status.ref
    return images


def open_manager(engine: Engine, **kwargs: Any) -> ContainerManager:
    return ContainerManager(open_runtime(engine), template_images(engine), **kwargs)
