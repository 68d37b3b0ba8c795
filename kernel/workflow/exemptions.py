"""Granting TDD exemptions (design: TDD Exemption Mechanism); the categories and the
tech-debt settings are in :mod:`fluffy.kernel.policy.tdd_settings`.

An exemption is asked for with ``workflow.request_exemption`` (never automatic), names a
category, the paths and a reason, and is granted only when *every* path matches the
category's globs from policy.yaml ``tdd_exemptions`` (.gitignore semantics).  A granted
exemption moves the session to ``exploring`` and does not spend tech-debt budget.
``type_refactor`` carries the condition ``type_only_change``: a Python file may change
only its annotations (checked on the AST by :func:`type_only_change`).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence

from fluffy.errors import ExemptionDenied
from fluffy.kernel.globs import Patterns
from fluffy.kernel.policy.tdd_settings import ExemptionRule


def check_exemption(
    rules: Mapping[str, ExemptionRule], category: str, paths: Sequence[str], reason: str
) -> ExemptionRule:
    """The category's rule when every path matches its globs; else ExemptionDenied."""
    rule = rules.get(category)
    if rule is None:
        raise ExemptionDenied(
            f"unknown exemption category {category!r}",
            why=f"policy.yaml configures: {', '.join(sorted(rules)) or 'none'}",
            fix="Ask for one of the configured categories.",
        )
    if not paths:
        raise ExemptionDenied("an exemption must name the paths it covers")
    if not reason.strip():
        raise ExemptionDenied("an exemption needs a reason", fix="Say why TDD does not apply.")
    for path in paths:
        parts = path.split("/")
        if not path or path.startswith("/") or "\\" in path or ".." in parts or "." in parts:
            raise ExemptionDenied(
                f"{path!r} is not a plain project-relative path",
                why="exemption paths are matched literally: no '..', '.', absolute or '\\'",
                fix="Name each file relative to the project root, e.g. docs/guide.md.",
            )
    spec = Patterns(rule.path_glob)
    outside = [path for path in paths if not spec.match(path)]
    if outside:
        raise ExemptionDenied(
            f"{category} does not cover {', '.join(outside[:5])}",
            why=f"{category} covers only {', '.join(rule.path_glob)}",
        )
    return rule


class _StripTypes(ast.NodeTransformer):
    """Remove everything that has no runtime effect in typed Python."""

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.returns = None
        self.generic_visit(node)
        return node

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        node.returns = None
        self.generic_visit(node)
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST | None:
        if node.value is None:
            return None  # a bare declaration
        return ast.Assign(targets=[node.target], value=node.value, lineno=node.lineno)

    def visit_If(self, node: ast.If) -> ast.AST | None:
        test = node.test
        name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
        if name == "TYPE_CHECKING" and not node.orelse:
            return None
        self.generic_visit(node)
        return node

    def visit_Expr(self, node: ast.Expr) -> ast.AST | None:
        return None if isinstance(node.value, ast.Constant) else node  # docstrings


def _annotations_run(tree: ast.Module) -> bool:
    """Without ``from __future__ import annotations`` a function's annotations execute."""
    return not any(
        isinstance(node, ast.ImportFrom)
        and node.module == "__future__"
        and any(alias.name == "annotations" for alias in node.names)
        for node in tree.body
    )


def _has_call(node: ast.AST | None) -> bool:
    return node is not None and any(isinstance(n, ast.Call) for n in ast.walk(node))


def _runtime_shape(source: str) -> str:
    tree = ast.parse(source)
    if _annotations_run(tree):
        for node in ast.walk(tree):
            annotated = [getattr(node, "annotation", None), getattr(node, "returns", None)]
            if any(_has_call(a) for a in annotated):
                raise ValueError("an annotation calls code at run time")
    tree = _StripTypes().visit(tree)
    return ast.dump(ast.fix_missing_locations(tree), annotate_fields=False)


def type_only_change(before: str, after: str) -> bool:
    """True when ``after`` differs from ``before`` only in annotations / typing-only code."""
    try:
        return _runtime_shape(before) == _runtime_shape(after)
    except (SyntaxError, ValueError, RecursionError):
        return False
