"""Before a task: would the kernel's proxy let the model's requests through?

The ai-provider sandbox reaches its provider only through the kernel's CONNECT proxy,
which dials only what policy.yaml ``network_whitelist`` admits (and, in L1, through the
engine gate, which takes its copy of the list when the kernel starts).  A local server
(``--provider ollama``, ``lmstudio``, or any ``base_url``) is rarely listed, and the
refusal would only show after the turn started; so the CLI looks first and says what to
add.  Only a hint: the kernel's proxy decides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fluffy.errors import FluffyError

DEFAULT_PORTS = {"http": 80, "https": 443}


def public_url(name: str) -> str:
    """The provider's own endpoint, used when no base_url is set ("" for scripted)."""
    from fluffy.sandboxes.ai import endpoints  # not the adapters: they need httpx

    return {"openai": endpoints.OPENAI, "anthropic": endpoints.ANTHROPIC}.get(name, "")


def endpoint(base_url: str) -> tuple[str, int] | None:
    """(host, port) of ``base_url`` (None: none given, or not a URL)."""
    try:
        parts = urlsplit(base_url)
        port = parts.port or DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return None
    if not parts.hostname or port is None:
        return None
    return parts.hostname, port


def _entry(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def allowlist_hint(project: Path, options: dict[str, Any]) -> str | None:
    """What to add to policy.yaml when the provider's ``base_url`` is not admitted."""
    from fluffy.host.policy import AllowList
    from fluffy.host.project import project_policy

    provider = options.get("provider") or {}
    base_url = str(provider.get("base_url") or public_url(str(provider.get("name"))))
    found = endpoint(base_url)
    if found is None:
        return None  # the scripted provider: no network
    host, port = found
    if host == "localhost":  # a name for loopback: the proxy admits only the literal address
        return (
            f"localhost:{port} (the provider's base URL) is a name for a loopback address, "
            "which the kernel's proxy reaches only through an IP entry of policy.yaml "
            f'network_whitelist. Fix: use 127.0.0.1:{port} in base_url and add `- "127.0.0.1:'
            f'{port}"` under network_whitelist in .fluffy/policy.yaml, then restart the '
            "kernel (`fluffy stop`)."
        )
    try:
        entries = project_policy(project)[0].network_whitelist
        if AllowList.from_entries(entries).allows(host, port) is not None:
            return None
    except FluffyError:
        return None  # a policy that does not load: the kernel says why when it starts
    entry = _entry(host, port)
    return (
        f"{entry} (the provider's base URL) is not in policy.yaml network_whitelist, so "
        "the kernel's proxy will refuse the model's requests. "
        f'Fix: add `- "{entry}"` under network_whitelist in .fluffy/policy.yaml '
        "(`fluffy config policy edit`), then restart the kernel (`fluffy stop`; the next "
        "fluffy asks you to approve the new entry)."
    )


# -- a repository's settings never send the person's key elsewhere on their own ---------
TRUST_FILE = "trusted-endpoints.json"


def _chosen_by_project(settings: Any, key: str) -> str | None:
    """The project config file that chose setting ``key`` (None: the person chose it, on
    the command line, in the environment or in their own config, or nobody did)."""
    from fluffy.paths import user_config

    source = str(settings.sources.get(key, ""))
    if not getattr(settings, key, None) or not source.endswith("config.yaml"):
        return None
    return None if Path(source) == user_config() else source


def _project_source(settings: Any, url: str) -> tuple[str, str] | None:
    """(the project config file, what it chose) when it decides where the key goes: a
    ``base_url``, or a provider whose endpoint is not a provider's own public one (a
    local server such as ollama's: whatever listens on that port gets the key)."""
    if settings.base_url:  # whoever set it chose the endpoint
        source = _chosen_by_project(settings, "base_url")
        return None if source is None else (source, "base_url")
    source = _chosen_by_project(settings, "provider")
    public = {public_url("openai"), public_url("anthropic")}
    if source is not None and url not in public:
        return source, f"the provider {settings.provider}"
    return None


def guard_project_endpoint(settings: Any, key: str, confirm: Any, url: str = "") -> None:
    """A cloned repository's ``.fluffy/config.yaml`` may name a ``base_url`` (or a local
    server's provider); the person's API key goes to ``url`` (the endpoint that follows,
    default: the base_url) only once they said yes for that file and that URL (remembered
    in ``$FLUFFY_HOME/trusted-endpoints.json``).  ``confirm(question)``: the terminal's
    answer (None or no terminal: no)."""
    import json

    from fluffy.errors import ConfigError
    from fluffy.paths import fluffy_home

    url = url or str(settings.base_url or "") or public_url(str(settings.provider))
    chosen = _project_source(settings, url)
    if not key or chosen is None:
        return
    source, what = chosen
    path = fluffy_home() / TRUST_FILE
    try:
        trusted = json.loads(path.read_text())
        trusted = trusted if isinstance(trusted, dict) else {}
    except (OSError, ValueError):
        trusted = {}
    if url in (trusted.get(source) or []):
        return
    question = f"This project's settings ({source}) send your API key to {url}. Allow it?"
    if confirm is not None and confirm(question):
        trusted.setdefault(source, []).append(url)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(trusted, indent=1))
        tmp.chmod(0o600)
        tmp.replace(path)
        return
    raise ConfigError(
        f"the project's settings would send your API key to {url}",
        why=f"{source} sets {what}; a repository you cloned can ship that file, so fluffy "
        "sends a key there only once you have said yes at the terminal",
        fix="Run fluffy in a terminal and answer y, or name the endpoint yourself: "
        "--base-url URL, FLUFFY_BASE_URL, or `fluffy config set base_url URL` (your config).",
    )
