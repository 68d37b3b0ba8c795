"""The kernel's host-side façade: what the `fluffy` command and the web view use of the
kernel's code on the host (reading the audit log at rest, checking a policy file,
staging a plugin install, an MCP record, the engine...).  Everything else they ask the
running kernel over its socket (:mod:`fluffy.ipc`).

An import contract holds it: ``fluffy.cli`` and ``fluffy.ui`` never import
``fluffy.kernel`` directly, so what the host relies on is listed here, one module per
area, and the kernel's inside can change behind it.  Names are loaded on first use (the
CLI starts without importing the kernel); type checkers see the real definitions.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy(module: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that loads each listed name from its kernel module."""

    def get(name: str) -> Any:
        source = names.get(name)
        if source is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return getattr(importlib.import_module(source), name)

    return get
