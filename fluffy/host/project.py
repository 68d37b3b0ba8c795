"""A project: its layout, its default policy, its environment's requirements."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fluffy.host import lazy

if TYPE_CHECKING:
    from fluffy.kernel.project.defaults import (
        project_policy,
        render_policy,
    )
    from fluffy.kernel.project.deps import collect_requirements
    from fluffy.kernel.project.envstate import EnvRecord, choose, needs_environment
    from fluffy.kernel.project.layout import detect_layout
    from fluffy.kernel.project.testcmd import (
        TestCommand,
        approve,
        approved,
        command_example,
        load_test_command,
    )
    from fluffy.kernel.project.testsecrets import allowed_secrets, kept_out, set_allowed

_FROM = {
    "TestCommand": "fluffy.kernel.project.testcmd",
    "approve": "fluffy.kernel.project.testcmd",
    "approved": "fluffy.kernel.project.testcmd",
    "load_test_command": "fluffy.kernel.project.testcmd",
    "command_example": "fluffy.kernel.project.testcmd",
    "allowed_secrets": "fluffy.kernel.project.testsecrets",
    "kept_out": "fluffy.kernel.project.testsecrets",
    "set_allowed": "fluffy.kernel.project.testsecrets",
    "choose": "fluffy.kernel.project.envstate",
    "collect_requirements": "fluffy.kernel.project.deps",
    "detect_layout": "fluffy.kernel.project.layout",
    "EnvRecord": "fluffy.kernel.project.envstate",
    "needs_environment": "fluffy.kernel.project.envstate",
    "project_policy": "fluffy.kernel.project.defaults",
    "render_policy": "fluffy.kernel.project.defaults",
}
__all__ = [
    "EnvRecord",
    "TestCommand",
    "allowed_secrets",
    "approve",
    "approved",
    "choose",
    "collect_requirements",
    "command_example",
    "detect_layout",
    "kept_out",
    "load_test_command",
    "needs_environment",
    "project_policy",
    "render_policy",
    "set_allowed",
]
__getattr__ = lazy(__name__, _FROM)
