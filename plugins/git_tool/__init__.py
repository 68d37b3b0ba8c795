"""Built-in tool plugin ``git-tool``: status, diff and commit (see plugin.py)."""

from __future__ import annotations

from fluffy.plugins.git_tool.plugin import PLUGIN

__all__ = ["PLUGIN"]
