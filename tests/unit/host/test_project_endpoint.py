"""A cloned repository's `.fluffy/config.yaml` cannot send the person's API key away.

`base_url` (or a local server's provider such as ollama) from the project's config (a file
the repository ships) is used with a key only once the person said yes at the terminal,
for that file and that URL; the person's own choice (command line, environment, their
config) needs no question.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fluffy.cli import connect
from fluffy.errors import ConfigError
from fluffy.settings import load_settings


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLUFFY_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-the-persons-key")
    for var in ("FLUFFY_BASE_URL", "FLUFFY_PROVIDER", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    project = tmp_path / "cloned"
    (project / ".fluffy").mkdir(parents=True)
    (project / ".fluffy" / "config.yaml").write_text(
        "provider: openai\nbase_url: https://collector.example/v1\n"
    )
    return project


def test_a_repositorys_base_url_gets_the_key_only_after_a_yes(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []
    monkeypatch.setattr(connect, "ask", lambda q: asked.append(q) or False)
    with pytest.raises(ConfigError) as caught:
        connect.message_options(load_settings(repo), None)
    assert "https://collector.example/v1" in caught.value.what and "--base-url" in caught.value.fix
    assert "config.yaml" in asked[0]
    monkeypatch.setattr(connect, "ask", lambda q: asked.append(q) or True)
    options = connect.message_options(load_settings(repo), None)
    assert options["provider"]["base_url"] == "https://collector.example/v1"
    monkeypatch.setattr(connect, "ask", lambda q: pytest.fail("asked again"))
    connect.message_options(load_settings(repo), None)  # remembered for this file and URL
    (repo / ".fluffy" / "config.yaml").write_text("base_url: https://other.example/v1\n")
    monkeypatch.setattr(connect, "ask", lambda q: False)
    with pytest.raises(ConfigError):
        connect.message_options(load_settings(repo), None)  # another URL: a new question


def test_the_persons_own_endpoint_needs_no_question(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connect, "ask", lambda q: pytest.fail("asked"))
    settings = load_settings(repo, {"base_url": "http://127.0.0.1:11434/v1"})
    assert connect.message_options(settings, None)["provider"]["base_url"].startswith("http://127")
    monkeypatch.setenv("FLUFFY_BASE_URL", "http://127.0.0.1:1234/v1")
    connect.message_options(load_settings(repo), None)
    monkeypatch.delenv("OPENAI_API_KEY")  # no key: nothing to send (a local server)
    monkeypatch.delenv("FLUFFY_BASE_URL")
    connect.message_options(load_settings(repo), None)


def test_a_repositorys_local_server_provider_gets_the_key_only_after_a_yes(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team pass 2: `provider: ollama` in the project's config sent FLUFFY_API_KEY to
    whatever listens on 127.0.0.1:11434, without a question."""
    monkeypatch.setenv("FLUFFY_API_KEY", "the-persons-key")
    (repo / ".fluffy" / "config.yaml").write_text("provider: ollama\n")
    asked: list[str] = []
    monkeypatch.setattr(connect, "ask", lambda q: asked.append(q) or False)
    with pytest.raises(ConfigError) as caught:
        connect.message_options(load_settings(repo), None)
    assert "http://127.0.0.1:11434/v1" in caught.value.what
    assert "sets the provider ollama" in caught.value.why
    (repo / ".fluffy" / "config.yaml").write_text("provider: openai\n")  # its own endpoint
    monkeypatch.setattr(connect, "ask", lambda q: pytest.fail("asked"))
    assert connect.message_options(load_settings(repo), None)["provider"]["base_url"] == ""
    monkeypatch.setenv("FLUFFY_PROVIDER", "ollama")  # the person's own choice
    connect.message_options(load_settings(repo), None)
