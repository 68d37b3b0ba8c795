"""Scripts for the offline scripted provider: what a model would say and call, turn by turn.

Two shapes, both validated here (the sandbox gets plain data, it has no YAML):

``steps:`` one tool call per turn, with an optional ``expect`` the demo checks (the
state reached, or the error code the kernel must answer with) — the design's scenario
in examples/sessions/add-error-handling.yaml;

``turns:`` each turn says something and makes any number of calls (parallel calls of
one response); a turn with no calls ends the task.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fluffy.errors import ConfigError


class Expect(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    state: str | None = None
    error: str | None = None


class ScriptCall(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tool: str = Field(min_length=1, max_length=64)
    args: dict[str, Any] = Field(default_factory=dict)
    expect: Expect = Field(default_factory=Expect)


class ScriptTurn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    say: str = ""
    calls: list[ScriptCall] = Field(default_factory=list, max_length=32)


class ScriptStep(ScriptCall):
    say: str = ""


class SessionScript(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    task: str = Field(min_length=1)
    steps: list[ScriptStep] = Field(default_factory=list)
    turns: list[ScriptTurn] = Field(default_factory=list)
    done: str = "Done."

    @model_validator(mode="after")
    def _one_shape(self) -> SessionScript:
        if bool(self.steps) == bool(self.turns):
            raise ValueError("a script has either `steps:` or `turns:` (exactly one, not empty)")
        return self

    def as_turns(self) -> list[ScriptTurn]:
        if self.turns:
            return list(self.turns)
        return [
            ScriptTurn(say=s.say, calls=[ScriptCall(tool=s.tool, args=s.args, expect=s.expect)])
            for s in self.steps
        ]

    def provider_turns(self) -> list[dict[str, Any]]:
        """What the sandbox's scripted adapter replays (the final turn says ``done``)."""
        turns = [
            {"say": t.say, "calls": [{"tool": c.tool, "args": c.args} for c in t.calls]}
            for t in self.as_turns()
        ]
        return [*turns, {"say": self.done, "calls": []}]

    def expectations(self) -> list[Expect]:
        """Each call's expectation, in the order the calls are made."""
        return [c.expect for t in self.as_turns() for c in t.calls]


def parse_script(text: str, *, name: str = "the session script") -> SessionScript:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"{name} is not valid YAML",
            why=str(exc).splitlines()[0] if str(exc) else "a YAML syntax error",
            fix="Fix the YAML (see examples/sessions/ for the format).",
        ) from None
    try:
        return SessionScript.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(
            f"{name} is not a valid session script",
            why=problems,
            fix="A script has `task:` and either `steps:` (tool, args, say, expect) or "
            "`turns:` (say, calls: [{tool, args}]); see examples/sessions/.",
        ) from None


def load_script(path: Path) -> SessionScript:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot read the session script {path}",
            why=exc.strerror or str(exc),
            fix="Give the path of an existing script (see examples/sessions/).",
        ) from None
    return parse_script(text, name=str(path))


def load_turns(path: Path) -> list[dict[str, Any]]:
    """The scripted provider's turns from a YAML file (validated)."""
    return load_script(path).provider_turns()
