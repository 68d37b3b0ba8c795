"""fluffy's Python tool-plugin SDK (design: Tool Plugin SDK).

A plugin is a module exposing ``PLUGIN``, a :class:`ToolPlugin` whose ``tools()`` are
:class:`ToolDefinition` s and whose ``handlers()`` map each tool name to a function of a
:class:`ToolContext` and the validated arguments.  The in-sandbox host
(``python3 -m fluffy.sandboxes.plugin_host <module>``) runs the kernel's jobs with it.

Modules: ``definition`` (tools, plugins), ``schema`` (input validation), ``context`` (the
handler's world), ``view`` (workspace + staged changes), ``paths`` (AI-given paths),
``diff`` (patch output), ``run`` (commands, environment), ``execute`` (one job).  They
import the standard library, msgspec, ``fluffy.ipc`` and ``fluffy.errors`` only: L2
images do not carry the kernel.
"""

from __future__ import annotations

from fluffy.plugins.sdk.context import SESSION_MODES, ToolContext
from fluffy.plugins.sdk.definition import (
    BoundTool,
    Handler,
    ToolDefinition,
    ToolPlugin,
    check_plugin,
)
from fluffy.plugins.sdk.diff import unified_diff
from fluffy.plugins.sdk.execute import Roots, execute_job
from fluffy.plugins.sdk.paths import link_stays_inside, normalise_path
from fluffy.plugins.sdk.run import ENV_ALLOW, RunResult, scrub_environment, scrubbed
from fluffy.plugins.sdk.schema import check_schema, validate
from fluffy.plugins.sdk.view import Entry, ProjectView

__all__ = [
    "ENV_ALLOW",
    "SESSION_MODES",
    "BoundTool",
    "Entry",
    "Handler",
    "ProjectView",
    "Roots",
    "RunResult",
    "ToolContext",
    "ToolDefinition",
    "ToolPlugin",
    "check_plugin",
    "check_schema",
    "execute_job",
    "link_stays_inside",
    "normalise_path",
    "scrub_environment",
    "scrubbed",
    "unified_diff",
    "validate",
]
