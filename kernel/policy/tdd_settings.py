"""policy.yaml's TDD settings: ``tdd_exemptions`` and ``tech_debt`` (design: TDD Exemption
Mechanism, tech-debt budget).

The settings only: what each exemption category covers and the coverage budget's
thresholds.  The workflow applies them (:mod:`fluffy.kernel.workflow.exemptions` grants
an exemption, :mod:`fluffy.kernel.workflow.coverage` judges the budget); the policy file's
schema (:mod:`fluffy.kernel.policy.model`) reads them.  They live here, below the
workflow, so that the policy never imports the workflow that consults it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fluffy.kernel.globs import check_globs


def check_thresholds(min_delta: float, warning: float, lockout: float) -> None:
    """ValueError unless lockout <= warning <= 0 and warning <= min_delta (all finite)."""
    if not (math.isfinite(warning) and math.isfinite(lockout) and lockout <= warning <= 0):
        raise ValueError(f"need lockout <= warning <= 0 points, got {lockout!r} and {warning!r}")
    if not (math.isfinite(min_delta) and warning <= min_delta):
        raise ValueError(
            f"need warning <= min_delta points (a finite number), got {warning!r} and {min_delta!r}"
        )


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
        check_globs(value)
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


class TddSettings(BaseModel):
    """``tdd:`` -- what counts as green for the merge."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: True: a test that fails on the base tree too (before the session's change) also
    #: blocks the merge; False (default): it is reported as pre-existing, not blocking.
    require_all_green: bool = False
