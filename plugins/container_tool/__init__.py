"""Built-in tool plugin ``container-tool``: one command in a sandbox (see plugin.py)."""

from __future__ import annotations

from fluffy.plugins.container_tool.plugin import PLUGIN

__all__ = ["PLUGIN"]
