"""fluffy's settings and where each comes from (design: Configuration Hierarchy).

Priority, high to low::

    1. command-line options         (--provider, --model, --mode ...)
    2. environment variables        FLUFFY_PROVIDER, FLUFFY_MODEL, FLUFFY_BASE_URL,
                                    FLUFFY_MODE, FLUFFY_RUNTIME, FLUFFY_THEME
    3. project config               <project>/.fluffy/config.yaml
    4. user config                  $FLUFFY_HOME/config.yaml (default ~/.fluffy/config.yaml)
    5. defaults                     (the model: per provider)

Every layer is validated on its own (unknown keys are refused), so an error names the
file or variable and the field.  :attr:`Settings.sources` says which layer each value
came from (``fluffy config show``).

**API keys are never configuration.**  :func:`api_key` reads ``OPENAI_API_KEY`` /
``ANTHROPIC_API_KEY`` (or ``FLUFFY_API_KEY``) from the environment only; a config file
that holds an ``api_key`` is refused with a fix, and nothing here writes one.

**Security settings are only requests.**  The hierarchy chooses non-security values
(provider, model, runtime, theme ...).  ``mode`` is merely the mode the CLI *asks* for:
it is applied through the kernel's ``session.set_mode``, i.e. the policy engine, which
may refuse it (debug mode needs approval) whatever layer it came from.  policy.yaml is
separate and changes only through ``policy.update``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StringConstraints,
    ValidationError,
)

from fluffy.errors import ConfigError
from fluffy.paths import project_config, user_config

Provider = Literal["scripted", "openai", "anthropic", "ollama", "lmstudio"]

DEFAULT_MODELS: Final[Mapping[str, str]] = {
    "scripted": "script",
    "openai": "gpt-4o-mini",
    "anthropic": "claude-sonnet-4-5",
    "ollama": "qwen2.5-coder:7b",
    "lmstudio": "qwen2.5-coder-7b-instruct",
}


@dataclass(frozen=True)
class Preset:
    """A local server that speaks the OpenAI API: where it listens by default."""

    base_url: str
    wire: Literal["openai"] = "openai"  # the API the kernel's adapter speaks to it


#: ``--provider ollama`` / ``lmstudio``: OpenAI-compatible servers on this machine, no key
#: needed (``FLUFFY_API_KEY`` is sent if set).  ``base_url`` overrides the address.
PRESETS: Final[Mapping[str, Preset]] = {
    "ollama": Preset("http://127.0.0.1:11434/v1"),
    "lmstudio": Preset("http://127.0.0.1:1234/v1"),
}
#: Environment variable -> setting.
ENV_VARS: Final[Mapping[str, str]] = {
    "FLUFFY_PROVIDER": "provider",
    "FLUFFY_MODEL": "model",
    "FLUFFY_BASE_URL": "base_url",
    "FLUFFY_MODE": "mode",
    "FLUFFY_RUNTIME": "container_runtime",
    "FLUFFY_THEME": "theme",
}
#: Where each provider's key comes from, in order (the environment only).
KEY_VARS: Final[Mapping[str, tuple[str, ...]]] = {
    "openai": ("OPENAI_API_KEY", "FLUFFY_API_KEY"),
    "anthropic": ("ANTHROPIC_API_KEY", "FLUFFY_API_KEY"),
    "scripted": (),
    "ollama": ("FLUFFY_API_KEY",),
    "lmstudio": ("FLUFFY_API_KEY",),
}
#: Smallest context window the context manager accepts (its fixed parts + 2,000 tokens).
MIN_CONTEXT_WINDOW: Final = 13_500
#: Ceilings of the retry settings (ADR-044): a turn never waits on a provider longer.
MAX_RETRIES: Final = 10
MAX_RETRY_WAIT_S: Final = 600.0


class Price(BaseModel):
    """A model's prices in US dollars per million tokens (the provider's price list).

    ``cached_input`` is the price of input read from the prompt cache (default: the
    ``input`` price, so a missing entry never under-states the cost).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0, le=10_000)
    output: float = Field(ge=0, le=10_000)
    cached_input: float | None = Field(default=None, ge=0, le=10_000)


#: What `fluffy config init` shows for ``prices`` (commented out, like every setting).
PRICES_EXAMPLE: Final[Mapping[str, Mapping[str, float]]] = {
    "gpt-4o-mini": {"input": 0.15, "output": 0.6, "cached_input": 0.075},
    "claude-sonnet-4-5": {"input": 3.0, "output": 15.0, "cached_input": 0.3},
}
ModelName = Annotated[str, StringConstraints(min_length=1, max_length=200)]


class _Fields(BaseModel):
    """Every setting optional: one layer (a file, the environment, the command line)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: Provider | None = None
    model: str | None = Field(default=None, min_length=1)
    base_url: str | None = Field(default=None, pattern=r"^(https?://\S+)?$")
    mode: Literal["strict", "explore", "debug"] | None = None
    container_runtime: Literal["auto", "docker", "podman"] | None = None
    theme: Literal["auto", "dark", "light", "plain"] | None = None
    context_window: int | None = Field(default=None, ge=MIN_CONTEXT_WINDOW, le=10_000_000)
    max_rounds: int | None = Field(default=None, ge=1, le=1000)
    max_retries: int | None = Field(default=None, ge=0, le=MAX_RETRIES)
    retry_max_wait_s: float | None = Field(default=None, ge=0, le=MAX_RETRY_WAIT_S)
    prices: dict[ModelName, Price] | None = None
    commit_trailer: str | None = Field(default=None, max_length=500)
    branch: bool | None = None


FIELDS: Final = tuple(_Fields.model_fields)
#: What `fluffy config init` explains for each setting.
HELP: Final[Mapping[str, str]] = {
    "provider": "AI provider: scripted (offline, no key) | openai | anthropic | ollama | "
    "lmstudio (local OpenAI-compatible servers, no key)",
    "model": "model name (default per provider: gpt-4o-mini, claude-sonnet-4-5, script)",
    "base_url": "provider endpoint, e.g. a local OpenAI-compatible server (default: public)",
    "mode": "session mode to ask for: strict | explore | debug (the policy decides)",
    "container_runtime": "container engine: auto | docker | podman",
    "theme": "terminal colours: auto | dark | light | plain",
    "context_window": "the model's context window in tokens",
    "max_rounds": "most model rounds (request + tool calls) in one task",
    "max_retries": "retries of a model request that was rate limited or failed (0-10)",
    "retry_max_wait_s": "the most seconds a request's retries may wait in all",
    "prices": "per model, US dollars per million tokens (input, output, cached_input): "
    "/usage and `fluffy session list` show the cost",
    "commit_trailer": "the last line of the AI's commit messages ({model} is the model's "
    'name; "" for none)',
    "branch": "run each task on a branch of its own in a copy of the repository (true), "
    "merged with `fluffy session merge ID`",
}


class Settings(BaseModel):
    """The effective settings (see the module docstring for the hierarchy)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: Provider = "scripted"
    model: str = ""  # "" until loaded: the provider's default
    base_url: str = ""
    mode: Literal["strict", "explore", "debug"] = "strict"
    container_runtime: Literal["auto", "docker", "podman"] = "auto"
    theme: Literal["auto", "dark", "light", "plain"] = "auto"
    context_window: int = Field(default=128_000, ge=MIN_CONTEXT_WINDOW)
    max_rounds: int = Field(default=50, ge=1, le=1000)
    max_retries: int = Field(default=4, ge=0, le=MAX_RETRIES)
    retry_max_wait_s: float = Field(default=60.0, ge=0, le=MAX_RETRY_WAIT_S)
    prices: dict[ModelName, Price] = Field(default_factory=dict)
    commit_trailer: str = Field(default="Assisted-by: fluffy ({model})", max_length=500)
    branch: bool = False

    _sources: dict[str, str] = PrivateAttr(default_factory=dict)

    @property
    def sources(self) -> dict[str, str]:
        """Setting -> where its value came from ("default", a file, a variable, "command line")."""
        return {name: self._sources.get(name, "default") for name in FIELDS}

    def api_key(self) -> str | None:
        return api_key(self)


def _is_key_name(key: object) -> bool:
    text = str(key).lower().replace("-", "_")
    return text in ("api_key", "apikey") or text.endswith(("_api_key", "_apikey"))


def _find_key(value: Any, where: str = "") -> str | None:
    """The dotted name of an API-key-like entry anywhere in ``value`` (None: none)."""
    if isinstance(value, dict):
        for key, item in value.items():
            name = f"{where}.{key}" if where else str(key)
            if _is_key_name(key):
                return name
            found = _find_key(item, name)
            if found:
                return found
    return None


def refuse_api_key(field: str, where: str) -> ConfigError:
    return ConfigError(
        f"{where}: {field} is not allowed in a config file",
        why="API keys are read from the environment only; fluffy never stores them on disk",
        fix=(
            f"Remove {field} from {where} and set OPENAI_API_KEY or ANTHROPIC_API_KEY (or "
            "FLUFFY_API_KEY) in the environment instead."
        ),
    )


def _invalid(where: str, error: ValidationError, fix: str | None) -> ConfigError:
    """One ConfigError naming the layer and each bad field (never echoing the values)."""
    problems = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = "unknown setting" if item["type"] == "extra_forbidden" else item["msg"]
        problems.append(f"{field}: {message}")
    return ConfigError(
        f"{where}: invalid setting {problems[0].split(':')[0]}",
        why="; ".join(problems),
        fix=fix or f"Correct it in {where}; the settings are: {', '.join(FIELDS)}.",
    )


def validate_layer(
    data: Mapping[str, Any], where: str, *, fix: str | None = None
) -> dict[str, Any]:
    """One layer's settings, validated (only the keys it sets)."""
    try:
        layer = _Fields.model_validate(dict(data))
    except ValidationError as error:
        raise _invalid(where, error, fix) from None
    return layer.model_dump(exclude_none=True)


def read_file(path: Path) -> dict[str, Any]:
    """A config file's raw mapping ({} when missing); API keys refused."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"cannot read {path}", why=exc.strerror or str(exc)) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(
            f"{path}{line} is not valid YAML",
            why=str(getattr(exc, "problem", None) or exc),
            fix=f"Correct {path}, or recreate it with `fluffy config init --force`.",
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path} must be a mapping of settings, not {type(data).__name__}",
            fix="Write one `setting: value` per line (see `fluffy config init`).",
            why="a settings file is YAML whose top level maps setting names to values",
        )
    key = _find_key(data)
    if key is not None:
        raise refuse_api_key(key, str(path))
    return data


#: Settings of the project's config file that the kernel reads (not the CLI's hierarchy).
PROJECT_ONLY: Final = ("tests",)


def _project_only(data: dict[str, Any], path: Path, is_project: bool) -> None:
    """Take the kernel's project settings out of ``data`` (checked; user files refuse)."""
    for key in PROJECT_ONLY:
        if key not in data:
            continue
        if not is_project:
            raise ConfigError(
                f"{path}: `{key}` is a project setting",
                fix=f"Move `{key}:` to the project's .fluffy/config.yaml.",
                why="the project's own settings belong to the project, not to a user's settings "
                "file",
            )
        from fluffy.host.project import TestCommand

        try:
            TestCommand.model_validate(data.pop(key))
        except ValidationError as error:
            raise _invalid(f"{path} (tests)", error, "See `fluffy init` for the form.") from None


def _env_layer(env: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for var, field in ENV_VARS.items():
        raw = env.get(var, "").strip()
        if raw:
            values[field] = validate_layer({field: raw}, f"environment variable {var}")[field]
            sources[field] = f"env {var}"
    return values, sources


def load_settings(
    project: Path,
    cli: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """The effective settings for ``project`` (CLI > env > project > user > defaults)."""
    env = os.environ if env is None else env
    layers: list[tuple[dict[str, Any], dict[str, str]]] = []
    for path in (user_config(), project_config(project)):
        data = read_file(path)
        _project_only(data, path, path == project_config(project))
        values = validate_layer(data, str(path))
        if layers and layers[0][0].get("branch") is True and values.get("branch") is False:
            # the person's own "keep the AI off my checkout": a cloned repository's
            # settings may turn it on, never off (only the person's env or option can)
            del values["branch"]
        layers.append((values, dict.fromkeys(values, str(path))))
    layers.append(_env_layer(env))
    given = {k: v for k, v in (cli or {}).items() if v is not None}
    if any(_is_key_name(k) for k in given):
        raise ConfigError(
            "API keys are not command-line options",
            fix="Set OPENAI_API_KEY or ANTHROPIC_API_KEY (or FLUFFY_API_KEY) in the environment.",
            why="a key on the command line would be visible to every local user in the process "
            "list",
        )
    values = validate_layer(given, "command line")
    layers.append((values, dict.fromkeys(values, "command line")))
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for values, where in layers:
        merged.update(values)
        sources.update(where)
    if "model" not in merged:
        merged["model"] = DEFAULT_MODELS[merged.get("provider", "scripted")]
        sources["model"] = f"default for {merged.get('provider', 'scripted')}"
    settings = Settings.model_validate(merged)
    settings._sources.update(sources)
    return settings


def api_key(settings: Settings, env: Mapping[str, str] | None = None) -> str | None:
    """The provider's API key, from the environment only (None: not set or not needed)."""
    env = os.environ if env is None else env
    for var in KEY_VARS[settings.provider]:
        value = env.get(var, "").strip()
        if value:
            return value
    return None


def api_key_source(settings: Settings, env: Mapping[str, str] | None = None) -> str | None:
    """The name of the variable :func:`api_key` takes the key from (never the key)."""
    env = os.environ if env is None else env
    return next((v for v in KEY_VARS[settings.provider] if env.get(v, "").strip()), None)
