"""The policy file's schema and loader (design: Security Policy Module, Rule Language).

A policy file is YAML (``safe_load`` semantics), validated with pydantic into typed
rules.  Unknown keys, wrong types, bad units and empty files of the wrong shape are
refused; every error names the file, the line and the field.  Nothing is guessed: a
policy that does not load blocks start-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fluffy.errors import ConfigError, FluffyError, PolicyError
from fluffy.kernel.audit.storage import StorageSettings
from fluffy.kernel.globs import check_globs
from fluffy.kernel.policy.argv import parse_pattern
from fluffy.kernel.policy.tdd_settings import (
    DEFAULT_EXEMPTIONS,
    Category,
    ExemptionRule,
    TddSettings,
    TechDebtSettings,
)
from fluffy.kernel.policy.tool_settings import MergeSettings, SchedulerSettings, ToolSettings
from fluffy.kernel.yamltext import YamlSyntax, load_yaml_node
from fluffy.units import parse_size

#: Largest policy file fluffy reads (a policy is a few KiB; this stops YAML bombs early).
MAX_POLICY_BYTES = 1024 * 1024
Action = Literal["allow", "deny", "require_review", "pass"]
SessionMode = Literal["strict", "explore", "debug"]


def _as_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


#: The fields a rule's ``match`` / ``except`` may test (AND across them, OR within one).
MATCH_FIELDS: Final = (
    "syscall",
    "path_glob",
    "caller_tag",
    "plugin",
    "state_machine_state",
    "session_mode",
    "command",
)


class Match(BaseModel):
    """Conditions: AND across fields, OR within a list."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    syscall: list[str] | None = None
    path_glob: list[str] | None = None
    caller_tag: list[str] | None = None
    plugin: list[str] | None = None
    state_machine_state: list[str] | None = None
    session_mode: list[SessionMode] | None = None
    #: Command patterns (``container.run``'s argv: :mod:`fluffy.kernel.policy.argv`).
    command: list[str] | None = None

    @field_validator(*MATCH_FIELDS, mode="before")
    @classmethod
    def _listify(cls, value: Any) -> Any:
        return _as_list(value)

    @field_validator("syscall")
    @classmethod
    def _syscalls(cls, value: list[str] | None) -> list[str] | None:
        for name in value or []:
            body = name[:-2] if name.endswith(".*") else name
            if not body or "*" in body or not body.strip() or body != body.strip():
                raise ValueError(
                    f"{name!r} is not a syscall name: use a name (fs.write) or a family "
                    "ending in .* (mcp.time.*)"
                )
        return value

    @field_validator("command")
    @classmethod
    def _commands(cls, value: list[str] | None) -> list[str] | None:
        for pattern in value or []:
            parse_pattern(pattern)  # its ValueError names the pattern and what is wrong
        return value

    @field_validator("path_glob")
    @classmethod
    def _globs(cls, value: list[str] | None) -> list[str] | None:
        for glob in value or []:
            if not glob.strip() or "\x00" in glob or glob.strip().startswith("#"):
                raise ValueError(f"{glob!r} is not a path glob")
        check_globs(value or ())  # said here, not by a kernel that cannot start
        return value


class Constraints(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    require_sandbox: str | None = None
    require_capability_token: bool = False
    max_file_size: str | None = None

    @field_validator("max_file_size")
    @classmethod
    def _size(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_size(value)
            except ConfigError as exc:  # pydantic reports ValueErrors with the field's place
                raise ValueError(f"{exc.what}: {exc.why}") from None
        return value

    @property
    def max_file_bytes(self) -> int | None:
        return parse_size(self.max_file_size) if self.max_file_size is not None else None


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(min_length=1, max_length=200)
    match: Match
    action: Action
    reason: str | None = None
    except_: list[Match] = Field(default_factory=list, alias="except")
    constraints: Constraints | None = None


class SessionSettings(BaseModel):
    """The AI session loop (policy.yaml ``session:``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Refused tool calls (policy denials, tools unavailable in the state) after which the
    #: session is quarantined to read-only tools until the user lifts it.
    quarantine_after: int = Field(default=5, ge=1, le=1000)
    #: Model responses one task may take at most.
    max_rounds: int = Field(default=50, ge=1, le=1000)


class PolicyFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    capabilities: list[Rule] = Field(default_factory=list)
    tdd_exemptions: dict[Category, ExemptionRule] | None = None
    tech_debt: TechDebtSettings = Field(default_factory=TechDebtSettings)
    tdd: TddSettings = Field(default_factory=TddSettings)
    audit: StorageSettings = Field(default_factory=StorageSettings)
    tools: ToolSettings = Field(default_factory=ToolSettings)
    merge: MergeSettings = Field(default_factory=MergeSettings)
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    #: Hosts the ai-provider sandbox may reach through the kernel's CONNECT proxy:
    #: ``host`` (port 443), ``host:port``, ``*.example.com``, ``127.0.0.1:11434``.
    network_whitelist: list[str] = Field(default_factory=list, max_length=256)
    session: SessionSettings = Field(default_factory=SessionSettings)

    @field_validator("network_whitelist")
    @classmethod
    def _hosts(cls, entries: list[str]) -> list[str]:
        from fluffy.kernel.net.allowlist import AllowList

        try:
            AllowList.from_entries(entries)
        except FluffyError as exc:
            raise ValueError(f"{exc.what} ({exc.why})" if exc.why else exc.what) from None
        return entries

    @property
    def exemptions(self) -> Mapping[str, ExemptionRule]:
        """The configured exemption categories (the design's defaults when absent)."""
        if self.tdd_exemptions is None:
            return DEFAULT_EXEMPTIONS
        return {str(key): rule for key, rule in self.tdd_exemptions.items()}

    @field_validator("capabilities")
    @classmethod
    def _unique(cls, rules: list[Rule]) -> list[Rule]:
        seen: set[str] = set()
        for rule in rules:
            if rule.name in seen:
                raise ValueError(f"two rules are named {rule.name!r}; names must be unique")
            seen.add(rule.name)
        return rules


def _line_of(node: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """The 1-based line of the YAML node at pydantic's error location."""
    line = node.start_mark.line + 1 if node is not None else None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            found = None
            for k, v in node.value:
                if k.value == key or (key == "except_" and k.value == "except"):
                    found = v
                    line = k.start_mark.line + 1
                    break
            node = found
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int):
            node = node.value[key] if key < len(node.value) else None
            line = node.start_mark.line + 1 if node is not None else line
        else:
            break
    return line


def _too_big(source: str) -> PolicyError:
    return PolicyError(
        f"{source}: the policy file is larger than {MAX_POLICY_BYTES // 1024} KiB",
        why="a policy is a list of rules, a few KiB; a file this big is a mistake or an attack",
        fix="Shorten the file.",
    )


def parse_policy(text: str, source: str = "<policy>") -> PolicyFile:
    """Parse and validate policy text; :class:`PolicyError` names file, line and field."""
    if len(text.encode("utf-8", "replace")) > MAX_POLICY_BYTES:
        raise _too_big(source)
    try:
        data, node = load_yaml_node(text, source, "policy files")
    except YamlSyntax as exc:
        raise PolicyError(
            str(exc),
            fix="Fix the YAML syntax at that line (anchors and aliases are not allowed).",
            why="the file is not valid YAML, or uses anchors, which fluffy refuses",
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyError(
            f"{source}:1: the policy must be a mapping with a `capabilities` list, "
            f"not a {type(data).__name__}",
            fix="Start the file with `capabilities:` and list the rules under it.",
            why="policy.yaml is a mapping whose capabilities key lists the rules",
        )
    try:
        return PolicyFile.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = tuple(error["loc"])
            line = _line_of(node, loc)
            field = ".".join(str(part) for part in loc).replace("except_", "except") or "(top)"
            problems.append(f"{source}:{line}: {field}: {error['msg']}")
        raise PolicyError(
            problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
            why="\n".join(problems),
            fix="Correct the named field; docs/SECURITY.md lists the policy schema.",
        ) from None


def load_policy(path: Path) -> PolicyFile:
    try:
        size = path.stat().st_size
        if size > MAX_POLICY_BYTES:
            raise _too_big(str(path))
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PolicyError(
            f"policy file {path} does not exist",
            fix="Create it, or point to an existing policy.",
            why="the policy is read from that path",
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(
            f"cannot read policy file {path}: {exc}",
            fix="Check the file's permissions and encoding (UTF-8).",
            why="the file exists but could not be read as UTF-8 text",
        ) from None
    return parse_policy(text, str(path))
