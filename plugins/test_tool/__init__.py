"""Built-in tool plugin ``test-tool``: pytest with coverage on the view (see plugin.py)."""

from __future__ import annotations

from fluffy.plugins.test_tool.plugin import PLUGIN

__all__ = ["PLUGIN"]
