"""Built-in tool plugin ``search-tool``: grep and glob over the view (see plugin.py)."""

from __future__ import annotations

from fluffy.plugins.search_tool.plugin import PLUGIN

__all__ = ["PLUGIN"]
