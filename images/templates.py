"""The image each sandbox template runs, and a container manager that runs them.

This lives with the images, not in ``kernel/containers``: the image builder uses the
container engine, so the engine's package must not ask the builder which image is
current (that was the ``images`` <-> ``containers`` package cycle).
"""

from __future__ import annotations

from typing import Any

from fluffy.errors import ImageNotFound
from fluffy.images.builder import plan_images
from fluffy.images.spec import spec_for_template
from fluffy.kernel.containers.config import TEMPLATES
from fluffy.kernel.containers.engine import Engine
from fluffy.kernel.containers.factory import open_runtime
from fluffy.kernel.containers.manager import ContainerManager


def template_images(engine: Engine) -> dict[str, str]:
    """Sandbox template -> current image ref; refuses images that are missing or stale."""
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
    """A container manager on ``engine`` whose templates run fluffy's current images."""
    return ContainerManager(open_runtime(engine), template_images(engine), **kwargs)
