"""The container engine: reach it, check access, run a sandbox from the host."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fluffy.host import lazy

if TYPE_CHECKING:
    from fluffy.kernel.containers.config import (
        TEMPLATES,
        template_config,
    )
    from fluffy.kernel.containers.engine import (
        Engine,
        connect,
        engine_access_problem,
    )
    from fluffy.kernel.containers.factory import open_runtime
    from fluffy.kernel.containers.lifecycle import FailureReason
    from fluffy.kernel.containers.manager import ContainerManager, RunOutcome
    from fluffy.kernel.containers.runtime import sandbox_identity

_FROM = {
    "RunOutcome": "fluffy.kernel.containers.manager",
    "connect": "fluffy.kernel.containers.engine",
    "ContainerManager": "fluffy.kernel.containers.manager",
    "Engine": "fluffy.kernel.containers.engine",
    "engine_access_problem": "fluffy.kernel.containers.engine",
    "FailureReason": "fluffy.kernel.containers.lifecycle",
    "open_runtime": "fluffy.kernel.containers.factory",
    "sandbox_identity": "fluffy.kernel.containers.runtime",
    "template_config": "fluffy.kernel.containers.config",
    "TEMPLATES": "fluffy.kernel.containers.config",
}
__all__ = [
    "TEMPLATES",
    "ContainerManager",
    "Engine",
    "FailureReason",
    "RunOutcome",
    "connect",
    "engine_access_problem",
    "open_runtime",
    "sandbox_identity",
    "template_config",
]
__getattr__ = lazy(__name__, _FROM)
