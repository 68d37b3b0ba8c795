"""What the router tells the warm pool ahead of calls (ADR-038, ADR-065): the recipe a
tool's next sandbox will have, and the tools a batch asks for more than once."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fluffy.errors import FluffyError
from fluffy.kernel.tools.core.registry import Registry
from fluffy.kernel.tools.sandbox.plugins import PluginRunner
from fluffy.kernel.tools.sandbox.pool import Recipe


def plugin_recipe(
    runner: PluginRunner, registry: Registry, tool: str, project: Path, staged: Path,
    timeout_s: float,
) -> Recipe | None:  # fmt: skip
    """The recipe of ``tool``'s next sandbox (None: it runs in none)."""
    try:
        spec = registry.get(tool)
    except FluffyError:
        return None
    if spec.plugin is None or spec.module is None:
        return None
    return runner.recipe(
        plugin=spec.plugin, module=spec.module, template=spec.template, project=project,
        staged_dir=staged, timeout_s=timeout_s,
    )  # fmt: skip


def repeated_plugin_tools(registry: Registry, tools: Sequence[str]) -> dict[str, int]:
    """The plugin tools a batch asks for more than once, and how often (a fast-path
    read needs no sandbox)."""
    specs = registry.specs
    return {
        tool: tools.count(tool)
        for tool in set(tools)
        if tools.count(tool) > 1 and tool in specs and specs[tool].route == "plugin"
    }
