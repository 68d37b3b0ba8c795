"""Built-in tool plugin ``fs-tool``: file writes as staged changes (see plugin.py)."""

from __future__ import annotations

from fluffy.plugins.fs_tool.plugin import PLUGIN

__all__ = ["PLUGIN"]
