"""The kernel's own handlers of built-in tools name real built-in tools (a renamed tool
must not fall through to a bare plugin call without its kernel part)."""

from __future__ import annotations

import pytest

from fluffy.kernel.tools.core.registry import BUILTIN_PLUGINS
from fluffy.kernel.tools.routing.availability import WORKFLOW_STATES
from fluffy.kernel.tools.routing.handlers import HANDLERS

pytestmark = pytest.mark.unit


def test_every_handler_is_a_built_in_tool_and_every_workflow_tool_has_one() -> None:
    plugin_tools = {name for _m, _t, tools in BUILTIN_PLUGINS.values() for name in tools}
    assert set(HANDLERS) <= plugin_tools | set(WORKFLOW_STATES)
    assert set(WORKFLOW_STATES) <= set(HANDLERS)  # no plugin would answer them
    for wrapped in ("test.run", "container.run", "git.commit"):
        assert wrapped in HANDLERS
