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
    from fluffy.sandboxes.ai.anthropic import DEFAULT_BASE_URL as ANTHROPIC
    from fluffy.sandboxes.ai.openai import DEFAULT_BASE_URL as OPENAI

    return {"openai": OPENAI, "anthropic": ANTHROPIC}.get(name, "")


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
    from fluffy.kernel.net.allowlist import AllowList
    from fluffy.kernel.project.defaults import project_policy

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
