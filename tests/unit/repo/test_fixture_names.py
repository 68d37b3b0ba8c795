"""No conftest fixture shadows one of the same name from a conftest above it.

A folder's conftest.py that defines a fixture under a name tests/conftest.py
already uses silently replaces it for every test in that folder: the tests
there then get a different object (once, a function where a dict was meant).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[2]


def _fixture_names(conftest: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(conftest.read_text()).body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for decorator in node.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            if isinstance(target, ast.Attribute) and target.attr == "fixture":
                names.add(node.name)
    return names


def test_the_top_conftest_defines_fixtures() -> None:
    assert {"engine", "images"} <= _fixture_names(TESTS / "conftest.py")


def test_no_folder_conftest_shadows_a_shared_fixture() -> None:
    shared = _fixture_names(TESTS / "conftest.py")
    clashes = {
        str(conftest.relative_to(TESTS)): sorted(_fixture_names(conftest) & shared)
        for conftest in sorted(TESTS.glob("*/conftest.py"))
    }
    assert {path: names for path, names in clashes.items() if names} == {}
