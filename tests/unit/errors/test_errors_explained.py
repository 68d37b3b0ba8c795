"""Every error fluffy raises says why it happened and how to fix it.

The rule, read on the source of everything shipped (not tests, benchmarks or scripts):
a ``raise X(...)`` of a class of the error tree passes ``why=`` and ``fix=``, unless X
(or a class above it) has a ``default_why`` / ``default_fix`` of its own that covers
every raise of it.  A call that passes ``**kwargs`` is taken as supplying both (the
dict is built beside it); re-raising an existing exception (``raise exc``) is not a
new error.  A class whose generic default would hide a missing explanation must not
get one just to pass this test: write the site's own why and fix.
"""

from __future__ import annotations

import ast

import pytest

from fluffy.errors import FluffyError, all_error_classes
from tests.repo_files import ROOT, tracked

pytestmark = pytest.mark.unit

CLASSES = {cls.__name__: cls for cls in all_error_classes()}


def _missing(call: ast.Call, cls: type[FluffyError]) -> list[str]:
    given = {k.arg for k in call.keywords}
    if None in given:  # **kwargs
        return []
    if "reason" in given:  # ToolUnavailable: the reason is the why
        given.add("why")
    return [
        part
        for part, default in (("why", cls.default_why), ("fix", cls.default_fix))
        if part not in given and not default
    ]


def _unexplained() -> list[str]:
    found = []
    for path in tracked("*.py", skip=("tests/", "benchmarks/", "scripts/")):
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=rel)):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
                continue
            func = node.exc.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            cls = CLASSES.get(name or "")
            if cls is not None and (missing := _missing(node.exc, cls)):
                found.append(f"{rel}:{node.lineno}: {name} without {' and '.join(missing)}")
    return found


def test_every_raise_says_why_and_how_to_fix_it() -> None:
    unexplained = _unexplained()
    assert unexplained == [], "\n".join(unexplained)


def test_the_rule_sees_a_raise_without_a_why() -> None:
    call = ast.parse('ConfigError("x", fix="y")', mode="eval").body
    assert isinstance(call, ast.Call)
    assert _missing(call, CLASSES["ConfigError"]) == ["why"]
    spread = ast.parse("ConfigError('x', **more)", mode="eval").body
    assert isinstance(spread, ast.Call) and _missing(spread, CLASSES["ConfigError"]) == []
