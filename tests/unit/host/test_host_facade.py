"""fluffy.host, the kernel's host-side façade: every listed name is the kernel's own
object, loaded on first use -- importing the façade imports none of the kernel (the
CLI's start-up stays light), and a name not listed is an AttributeError."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pytest

import fluffy.host

pytestmark = pytest.mark.unit

AREAS = [f"fluffy.host.{m.name}" for m in pkgutil.iter_modules(fluffy.host.__path__)]


def test_every_listed_name_is_the_kernel_s_object() -> None:
    assert len(AREAS) >= 5
    for area in AREAS:
        module = importlib.import_module(area)
        assert sorted(module.__all__) == sorted(module._FROM), area
        for name, source in module._FROM.items():
            assert getattr(module, name) is getattr(importlib.import_module(source), name)
        with pytest.raises(AttributeError, match="no attribute 'not_listed'"):
            module.not_listed  # noqa: B018


def test_importing_the_facade_imports_none_of_the_kernel() -> None:
    probe = (
        "import sys\n"
        + "".join(f"import {area}\n" for area in AREAS)
        + "print(sorted(m for m in sys.modules if m.startswith('fluffy.kernel')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]", done.stdout
