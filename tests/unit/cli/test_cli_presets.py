"""`--provider ollama` / `lmstudio`: local OpenAI-compatible servers, and the allow-list hint."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from fluffy.cli.connect import message_options
from fluffy.cli.endpoint import allowlist_hint, endpoint
from fluffy.cli.task import task_parser
from fluffy.ipc.ai_types import Message, ProviderConfig, TextDelta
from fluffy.sandboxes.ai.openai import OpenAIAdapter
from fluffy.settings import load_settings
from tests.fakes import FakeOpenAIServer, Reply

pytestmark = pytest.mark.unit


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLUFFY_HOME", str(tmp_path / "home"))
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "FLUFFY_API_KEY", "FLUFFY_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    project = tmp_path / "project"
    project.mkdir()
    return project


def _policy(project: Path, *entries: str) -> None:
    (project / ".fluffy").mkdir(exist_ok=True)
    listed = "".join(f'\n  - "{e}"' for e in entries) or " []"
    (project / ".fluffy" / "policy.yaml").write_text(f"network_whitelist:{listed}\n")


@pytest.mark.parametrize(
    ("preset", "url"),
    [("ollama", "http://127.0.0.1:11434/v1"), ("lmstudio", "http://127.0.0.1:1234/v1")],
)
def test_a_preset_is_an_openai_compatible_server_on_loopback_without_a_key(
    home: Path, preset: str, url: str
) -> None:
    assert task_parser().parse_args(["--provider", preset]).provider == preset
    options = message_options(load_settings(home, {"provider": preset}), None)
    provider = options["provider"]
    assert provider["name"] == "openai" and provider["base_url"] == url
    assert provider["api_key"] == "" and provider["model"]


def test_base_url_moves_a_preset_and_the_request_reaches_the_server(home: Path) -> None:
    with FakeOpenAIServer([Reply("Hello from a local model.")]) as server:
        settings = load_settings(home, {"provider": "ollama", "base_url": server.base_url})
        options = message_options(settings, None)
        config = ProviderConfig(**options["provider"])
        with httpx.Client() as client:
            events = list(OpenAIAdapter(config, client).chat_stream([Message("user", "hi")], []))
    text = "".join(e.content for e in events if isinstance(e, TextDelta))
    assert text == "Hello from a local model."
    (request,) = server.requests
    assert request.path == "/v1/chat/completions"
    assert "authorization" not in request.headers  # no key needed, none sent
    assert request.body["model"] == settings.model


def test_an_unlisted_local_server_gets_a_hint_naming_the_entry(home: Path) -> None:
    _policy(home)
    options = message_options(load_settings(home, {"provider": "ollama"}), None)
    hint = allowlist_hint(home, options)
    assert hint is not None
    assert '`- "127.0.0.1:11434"` under network_whitelist' in hint and "fluffy stop" in hint
    _policy(home, "127.0.0.1:11434")
    assert allowlist_hint(home, options) is None


def test_the_public_endpoint_is_checked_too_and_scripted_never(home: Path) -> None:
    _policy(home)
    hint = allowlist_hint(home, {"provider": {"name": "anthropic", "base_url": ""}})
    assert hint is not None and '"api.anthropic.com:443"' in hint
    _policy(home, "api.anthropic.com")
    assert allowlist_hint(home, {"provider": {"name": "anthropic", "base_url": ""}}) is None
    assert allowlist_hint(home, {"provider": {"name": "scripted", "base_url": ""}}) is None


def test_localhost_is_pointed_to_the_loopback_address(home: Path) -> None:
    _policy(home, "localhost:11434")
    hint = allowlist_hint(
        home, {"provider": {"name": "openai", "base_url": "http://localhost:11434/v1"}}
    )
    assert hint is not None and "use 127.0.0.1:11434 in base_url" in hint


def test_endpoints() -> None:
    assert endpoint("http://127.0.0.1:1234/v1") == ("127.0.0.1", 1234)
    assert endpoint("https://api.openai.com/v1") == ("api.openai.com", 443)
    assert endpoint("http://[::1]:8080/v1") == ("::1", 8080)
    assert endpoint("") is None and endpoint("http://x:99999") is None
