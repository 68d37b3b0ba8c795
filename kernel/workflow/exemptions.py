"""TDD exemptions (design: TDD Exemption Mechanism) and the tech-debt settings.

An exemption is asked for with ``workflow.request_exemption`` (never automatic), names a
category, the paths and a reason, and is granted only when *every* path matches the
category's globs from policy.yaml ``tdd_exemptions`` (.gitignore semantics).  A granted
exemption moves the session to ``exploring`` and does not spend tech-debt budget.
``type_refactor`` carries the condition ``type_only_change``: a Python file may change
only its annotations (checked on the AST by :func:`type_only_change`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from typing import Literal

from pathspec import GitIgnoreSpec
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fluffy.errors import ExemptionDenied
from fluffy.kernel.workflow.coverage import check_thresholds

Category = Literal["config_change", "type_refactor", "documentation", "asset_update"]
#: The design's ``tech_debt.coverage.baseline_file``.
BASELINE_FILE = ".fluffy/coverage-baseline.json"
#: What ``baseline_file`` may be: one level inside ``.fluffy/``, a ``.json`` name, so it
#: can never name a file the kernel owns there (policy.yaml, rules/*.py, databases).
_BASELINE_NAME = re.compile(r"\.fluffy/[A-Za-z0-9][A-Za-z0-9._-]{0,99}\.json", re.ASCII)
CATEGORIES: tuple[Category, ...] = (
    "config_change",
    "type_refactor",
    "documentation",
    "asset_update",
)


class ExemptionRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path_glob: list[str] = Field(min_length=1)
    condition: Literal["type_only_change"] | None = None

    @field_validator("path_glob")
    @classmethod
    def _globs(cls, value: list[str]) -> list[str]:
        for glob in value:
            if not glob.strip() or glob.startswith("!"):
                raise ValueError(f"{glob!r} is not a path glob (empty or a negation)")
        return value


#: The design's example configuration, used when policy.yaml has no tdd_exemptions.
DEFAULT_EXEMPTIONS: Mapping[str, ExemptionRule] = {
    "config_change": ExemptionRule(
        path_glob=[
            "*.json",
            "*.yaml",
            "*.yml",
            "*.toml",
            "*.env",
            "*.ini",
            "*.cfg",
            "Dockerfile",
            ".github/**",
        ]
    ),
    "type_refactor": ExemptionRule(
        path_glob=["*.pyi", "py.typed", "*.py"], condition="type_only_change"
    ),
    "documentation": ExemptionRule(
        path_glob=["*.md", "*.rst", "*.txt", "LICENSE", "CHANGELOG", "docs/**"]
    ),
    "asset_update": ExemptionRule(path_glob=["*.png", "*.svg", "*.css", "*.scss", "*.ico"]),
}


class TechDebtSettings(BaseModel):
    """policy.yaml ``tech_debt``: coverage-based budget (percentage points).

    ``min_delta`` 0: coverage must not decrease (a commit below it is not "ok", ADR-042).
    ``baseline_file``: where the kernel keeps the baseline, a ``.fluffy/<name>.json`` (a
    protected path: the tools the budget judges never write it; nothing else the kernel
    keeps there is a top-level ``.json``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_delta: float = 0
    warning_threshold: float = -2
    lockout_threshold: float = -5
    lockout_action: Literal["block_explore"] = "block_explore"
    recovery: Literal["strict_mode_with_coverage_gain"] = "strict_mode_with_coverage_gain"
    baseline_file: str = BASELINE_FILE

    @field_validator("lockout_threshold")
    @classmethod
    def _order(cls, value: float) -> float:
        if value > 0:
            raise ValueError("lockout_threshold is a drop: 0 or negative")
        return value

    @field_validator("baseline_file")
    @classmethod
    def _inside_fluffy(cls, value: str) -> str:
        if not _BASELINE_NAME.fullmatch(value):
            raise ValueError(
                f"baseline_file {value!r} must be a plain .fluffy/<name>.json: a JSON file "
                "directly inside .fluffy/ (a protected path the AI's tools cannot write), "
                "named with letters, digits, '.', '_' or '-', not one fluffy owns there "
                "(policy.yaml, config.yaml, rules/, the databases); e.g. "
                f"{BASELINE_FILE}"
            )
        return value

    @model_validator(mode="after")
    def _thresholds(self) -> TechDebtSettings:
        check_thresholds(self.min_delta, self.warning_threshold, self.lockout_threshold)
        return self


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
    spec = GitIgnoreSpec.from_lines(rule.path_glob)
    outside = [path for path in paths if not spec.match_file(path)]
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
