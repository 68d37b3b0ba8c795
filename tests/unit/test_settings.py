"""The configuration hierarchy: CLI > env > project > user > defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from fluffy.errors import ConfigError
from fluffy.kernel.ai.context import TokenBudget
from fluffy.paths import project_config, user_config
from fluffy.settings import (
    MIN_CONTEXT_WINDOW,
    Settings,
    api_key,
    api_key_source,
    load_settings,
)

pytestmark = pytest.mark.unit


@pytest.fixture()
def project(tmp_path: Path, fluffy_home: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    return root


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_defaults_with_no_files_and_no_environment(project: Path) -> None:
    settings = load_settings(project, {}, env={})
    assert (settings.provider, settings.model, settings.mode) == ("scripted", "script", "strict")
    assert settings.container_runtime == "auto" and settings.context_window == 128_000
    assert settings.sources["provider"] == "default"
    assert settings.sources["model"] == "default for scripted"


@pytest.mark.parametrize(
    ("provider", "model"),
    [("openai", "gpt-4o-mini"), ("anthropic", "claude-sonnet-4-5"), ("scripted", "script")],
)
def test_each_provider_has_a_default_model(project: Path, provider: str, model: str) -> None:
    settings = load_settings(project, {"provider": provider}, env={})
    assert settings.model == model and settings.sources["provider"] == "command line"


def test_each_layer_overrides_the_ones_below(project: Path) -> None:
    write(user_config(), "provider: openai\nmodel: from-user\ntheme: dark\nmode: explore\n")
    write(project_config(project), "model: from-project\nmax_rounds: 7\n")
    env = {"FLUFFY_MODEL": "from-env", "FLUFFY_RUNTIME": "podman"}
    cli = {"model": "from-cli", "mode": None}  # None: the option was not given

    settings = load_settings(project, cli, env=env)
    assert settings.model == "from-cli" and settings.sources["model"] == "command line"
    assert load_settings(project, {}, env=env).model == "from-env"
    assert load_settings(project, {}, env={}).model == "from-project"
    (project / ".fluffy" / "config.yaml").unlink()
    assert load_settings(project, {}, env={}).model == "from-user"

    assert settings.theme == "dark" and settings.sources["theme"] == str(user_config())
    assert settings.mode == "explore"
    assert settings.container_runtime == "podman"
    assert settings.sources["container_runtime"] == "env FLUFFY_RUNTIME"
    assert settings.max_rounds == 7
    assert settings.sources["max_rounds"] == str(project_config(project))


def test_env_over_project_over_user_for_the_mode(project: Path) -> None:
    write(user_config(), "mode: debug\n")
    write(project_config(project), "mode: explore\n")
    assert load_settings(project, {}, env={}).mode == "explore"
    assert load_settings(project, {}, env={"FLUFFY_MODE": "strict"}).mode == "strict"
    assert load_settings(project, {"mode": "debug"}, env={"FLUFFY_MODE": "strict"}).mode == "debug"


def test_errors_name_the_file_and_the_field(project: Path) -> None:
    path = write(project_config(project), "provider: openai\nmode: yolo\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(project, {}, env={})
    assert str(path) in caught.value.what and "mode" in caught.value.what
    assert "strict" in caught.value.why

    write(project_config(project), "colour: red\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(project, {}, env={})
    assert "colour" in caught.value.what and "unknown setting" in caught.value.why

    write(project_config(project), "context_window: 1000\n")
    with pytest.raises(ConfigError, match="context_window"):
        load_settings(project, {}, env={})


def test_errors_name_the_environment_variable_and_never_echo_values(project: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(project, {}, env={"FLUFFY_BASE_URL": "ftp://hidden-host.example"})
    text = f"{caught.value.what} {caught.value.why} {caught.value.fix}"
    assert "FLUFFY_BASE_URL" in text and "base_url" in text
    assert "hidden-host" not in text


def test_invalid_yaml_and_non_mappings_are_refused_with_the_file(project: Path) -> None:
    path = write(user_config(), "provider: [openai\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(project, {}, env={})
    assert str(path) in caught.value.what and "line" in caught.value.what
    write(user_config(), "- provider\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_settings(project, {}, env={})
    write(user_config(), "")  # an empty file is no settings, not an error
    assert load_settings(project, {}, env={}).provider == "scripted"


@pytest.mark.parametrize(
    "text",
    ["api_key: sk-secret-value\n", "openai_api_key: sk-secret-value\n", "openai:\n  api_key: x\n"],
)
def test_an_api_key_in_a_config_file_is_refused_with_the_env_var(project: Path, text: str) -> None:
    path = write(project_config(project), text)
    with pytest.raises(ConfigError) as caught:
        load_settings(project, {}, env={"OPENAI_API_KEY": "sk-env"})
    error = caught.value
    assert str(path) in error.what and "api_key" in error.what
    assert "OPENAI_API_KEY" in error.fix and "sk-secret-value" not in f"{error.what}{error.why}"


def test_api_keys_come_from_the_environment_only(project: Path) -> None:
    openai = load_settings(project, {"provider": "openai"}, env={})
    assert api_key(openai, {}) is None
    assert api_key(openai, {"OPENAI_API_KEY": " sk-1 ", "FLUFFY_API_KEY": "sk-2"}) == "sk-1"
    assert api_key(openai, {"FLUFFY_API_KEY": "sk-2", "ANTHROPIC_API_KEY": "a"}) == "sk-2"
    assert api_key_source(openai, {"FLUFFY_API_KEY": "sk-2"}) == "FLUFFY_API_KEY"
    anthropic = load_settings(project, {"provider": "anthropic"}, env={})
    assert api_key(anthropic, {"OPENAI_API_KEY": "sk-1", "ANTHROPIC_API_KEY": "a"}) == "a"
    scripted = load_settings(project, {}, env={})
    assert api_key(scripted, {"OPENAI_API_KEY": "sk-1", "FLUFFY_API_KEY": "x"}) is None


def test_the_api_key_method_reads_the_process_environment(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "from-env")
    settings = load_settings(project, {"provider": "anthropic"}, env={})
    assert settings.api_key() == "from-env"


def test_api_keys_are_not_settings_anywhere(project: Path) -> None:
    with pytest.raises(ValidationError):
        Settings.model_validate({"api_key": "sk-x"})
    with pytest.raises(ConfigError, match="command-line"):
        load_settings(project, {"api_key": "sk-x"}, env={})
    assert "api_key" not in Settings().model_dump()


def test_minimum_context_window_matches_the_token_budget() -> None:
    assert TokenBudget(total=200_000).minimum_total() == MIN_CONTEXT_WINDOW
