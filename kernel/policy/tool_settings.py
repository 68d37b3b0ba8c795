"""policy.yaml's ``tools:``, ``merge:`` and ``scheduler:`` sections.

They are security settings (what the AI gets to see, what merges without a human, how
much runs at once), so they live in the policy file and change only through
``policy.update`` (design: Configuration Hierarchy).  The policy file's schema
(:mod:`fluffy.kernel.policy.model`) reads them and the tool router obeys them, so they
live in the policy package, below the tools that import the policy.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fluffy.kernel.globs import check_globs
from fluffy.units import parse_duration_ms, parse_size, valid_duration, valid_size

Strategy = Literal["head", "tail", "middle"]


class ToolSettings(BaseModel):
    """``tools:`` — output sanitisation and the kernel-native fast path."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_result_tokens: int = Field(default=4000, ge=100, le=200_000)
    #: Extra secret patterns (Python regular expressions), redacted like the built-ins.
    redact_patterns: list[str] = Field(default_factory=list)
    #: Truncation strategy per tool name or ``ns.*`` prefix (head / tail / middle).
    truncation: dict[str, Strategy] = Field(default_factory=dict)
    #: Read-only tools run in the kernel (design); false sends them to search-tool / fs-tool.
    fast_path: bool = True
    #: Largest file fs.read returns whole (larger: ask for a line range).
    read_max_size: str = "1MiB"
    #: Time limit for a plugin tool call (sandbox start excluded).
    call_timeout: str = "300s"

    @field_validator("redact_patterns")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        for pattern in value:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is not a regular expression: {exc}") from None
        return value

    _size = field_validator("read_max_size")(valid_size)
    _duration = field_validator("call_timeout")(valid_duration)

    @property
    def read_max_bytes(self) -> int:
        return parse_size(self.read_max_size)

    @property
    def call_timeout_s(self) -> float:
        return parse_duration_ms(self.call_timeout) / 1000


class MergeSettings(BaseModel):
    """``merge:`` — what auto-merges and what no tool may ever change."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    auto_merge_max_lines: int = Field(default=500, ge=0)
    #: Paths whose change always needs a human (gitignore globs), added to fluffy's own.
    sensitive_paths: list[str] | None = None
    #: Paths no tool output may change (added to .fluffy/** and .git/**).
    protected_paths: list[str] = Field(default_factory=list)
    #: Paths that merge without review besides the project's source and test folders
    #: (gitignore globs; ADR-054).  Everything else waits for a person, in every mode.
    auto_merge_paths: list[str] = Field(default_factory=list)

    @field_validator("auto_merge_paths", "sensitive_paths")
    @classmethod
    def _globs(cls, value: list[str] | None) -> list[str] | None:
        for glob in value or ():
            if not glob.strip() or "\0" in glob or "\n" in glob:
                raise ValueError(f"{glob!r} is not a path glob")
        check_globs(value or ())
        return value


class PoolSettings(BaseModel):
    """``scheduler.pool:`` — warm single-use sandboxes (kernel.tools.sandbox.pool, ADR-038)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    #: Idle sandboxes of all kinds together, at most (and within memory_budget).
    max_idle: int = Field(default=10, ge=0, le=32)
    #: What idle sandboxes may hold together (each counted at ~16 MiB).
    memory_budget: str = "160MiB"
    #: Sandboxes made at once in the background (each while its template has a slot).
    makers: int = Field(default=2, ge=1, le=8)
    #: A kind of sandbox not asked for this long is no longer kept warm.
    idle_after: str = "120s"
    #: Below this fraction of the machine's memory available, the pool empties.
    min_free_memory: float = Field(default=0.15, ge=0.0, le=0.9)

    _duration = field_validator("idle_after")(valid_duration)
    _size = field_validator("memory_budget")(valid_size)

    @property
    def memory_budget_mib(self) -> float:
        return parse_size(self.memory_budget) / 2**20

    @property
    def idle_after_s(self) -> float:
        return parse_duration_ms(self.idle_after) / 1000


#: The design's per-template limits; a template ``per_template`` leaves out keeps its own.
DESIGN_LIMITS = {"ai-provider": 2, "code-executor": 2, "policy-sandbox": 1}


class SchedulerSettings(BaseModel):
    """``scheduler:`` — the design's concurrency limits, and the warm pool."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    global_max: int = Field(default=4, ge=1, le=64)
    per_template: dict[str, int] = Field(default_factory=lambda: dict(DESIGN_LIMITS))
    age_threshold: str = "30s"
    pool: PoolSettings = Field(default_factory=PoolSettings)

    _duration = field_validator("age_threshold")(valid_duration)

    @property
    def limits(self) -> dict[str, int]:
        """Every template's limit: the design's, overridden by ``per_template``."""
        return {**DESIGN_LIMITS, **self.per_template}

    @model_validator(mode="after")
    def _room_for_tool_calls(self) -> SchedulerSettings:
        # a turn keeps its ai-provider slot while its tool calls run, and the policy
        # sandbox keeps its slot for good (ADR-043): with nothing left, calls would wait
        # for ever
        held = self.limits["ai-provider"] + self.limits["policy-sandbox"]
        if self.global_max <= held:
            raise ValueError(
                f"scheduler.global_max {self.global_max} leaves no slot for tool calls: "
                f"ai-provider ({self.limits['ai-provider']}) and policy-sandbox "
                f"({self.limits['policy-sandbox']}) slots can be held at once; "
                f"raise global_max to at least {held + 1} or lower those limits"
            )
        return self

    @property
    def age_threshold_s(self) -> float:
        return parse_duration_ms(self.age_threshold) / 1000
