"""The adapter for a provider config: the one place that knows every provider by name."""

from __future__ import annotations

import httpx

from fluffy.ipc.ai_types import AIProviderAdapter, ProviderConfig, ProviderError
from fluffy.sandboxes.ai.anthropic import AnthropicAdapter
from fluffy.sandboxes.ai.openai import OpenAIAdapter
from fluffy.sandboxes.ai.scripted import ScriptedAdapter

PROVIDERS = ("scripted", "openai", "anthropic")


def make_adapter(config: ProviderConfig, client: httpx.Client | None = None) -> AIProviderAdapter:
    """The adapter named by ``config.name``.

    ``client`` carries the network path (in the sandbox: the kernel's proxy tunnel); a
    network provider given none gets a plain client, which honours ``HTTPS_PROXY``.
    The scripted provider never touches the network.
    """
    if config.name == "scripted":
        return ScriptedAdapter(config)
    if config.name not in ("openai", "anthropic"):
        raise ProviderError(
            f"unknown AI provider {config.name!r}",
            why=f"the known providers are {', '.join(PROVIDERS)}",
            fix="Set the provider's name to one of them.",
        )
    if client is None:
        client = httpx.Client(timeout=config.timeout_s)
    if config.name == "openai":
        return OpenAIAdapter(config, client)
    return AnthropicAdapter(config, client)
