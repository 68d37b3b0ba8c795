"""``SandboxConfig`` and the design's sandbox templates.

A config is validated with pydantic; limits use the design's units ("512MiB", "300s").
What is *not* here on purpose: no-new-privileges, read-only root, the user, capabilities
and the engine socket — those are constants (:mod:`hardening`), not options.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fluffy.errors import ConfigError
from fluffy.units import parse_duration_ms, parse_size, valid_duration, valid_size

#: Smallest memory limit Docker accepts; 0 would mean "unlimited", so it is refused too.
MIN_MEMORY = 6 * 1024 * 1024

SeccompProfile = Literal["strict", "standard", "standard-net"]
Template = Literal[
    "ai-provider", "code-executor", "policy-sandbox", "integration-test", "mcp-server"
]


class SandboxConfig(BaseModel):
    """One sandbox's settings (design: Sandbox Configuration)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    template: Template
    plugin_name: str = "fluffy"
    network_mode: Literal["none", "restricted"] = "none"
    allowed_hosts: tuple[str, ...] = ()
    memory_limit: str = "512MiB"
    cpu_limit: float = Field(1.0, gt=0, le=64)
    max_pids: int = Field(100, ge=1, le=4096)
    max_duration: str = "300s"
    seccomp_profile: SeccompProfile = "standard"
    project_dir: Path | None = None
    workdir: str = "/workspace"
    environment: dict[str, str] = Field(default_factory=dict)
    #: Folder holding this sandbox's own kernel socket, mounted read-only at /run/fluffy.
    kernel_socket_dir: Path | None = None
    #: The session's staged changes (layout of kernel.merge.staging), read-only at /staged.
    staged_dir: Path | None = None
    #: A fluffy image to use instead of the template's (a project's test environment,
    #: built FROM the template's image); None: the template's own.
    image: str | None = Field(default=None, pattern=r"^fluffy/[a-z0-9-]+:[0-9a-f]{12,64}$")

    @field_validator("memory_limit")
    @classmethod
    def _size(cls, value: str) -> str:
        if parse_size(valid_size(value)) < MIN_MEMORY:
            raise ValueError(
                f"memory_limit {value!r} is below 6MiB; the engines read 0 as 'no limit' "
                "and refuse less than 6 MiB"
            )
        return value

    _duration = field_validator("max_duration")(valid_duration)

    @property
    def memory_bytes(self) -> int:
        return parse_size(self.memory_limit)

    @property
    def max_duration_ms(self) -> int:
        return parse_duration_ms(self.max_duration)

    @property
    def nano_cpus(self) -> int:
        return int(self.cpu_limit * 1_000_000_000)


#: The design's templates.  Every sandbox's container has no network (``--network
#: none``); "restricted" means the kernel also puts a socket of its CONNECT proxy
#: (:mod:`fluffy.kernel.net.proxy`) in the sandbox's folder, narrowed to the policy's
#: network_whitelist, and that socket is its only way out.
TEMPLATES: dict[str, SandboxConfig] = {
    "ai-provider": SandboxConfig(
        template="ai-provider",
        network_mode="restricted",
        memory_limit="256MiB",
        cpu_limit=0.5,
        max_pids=10,
        max_duration="120s",
        seccomp_profile="strict",
    ),
    "code-executor": SandboxConfig(
        template="code-executor",
        network_mode="none",
        memory_limit="1GiB",
        cpu_limit=1.0,
        max_pids=100,
        max_duration="300s",
        seccomp_profile="standard",
    ),
    "policy-sandbox": SandboxConfig(
        template="policy-sandbox",
        network_mode="none",
        memory_limit="128MiB",
        cpu_limit=0.25,
        max_pids=5,
        max_duration="100ms",
        seccomp_profile="strict",
    ),
    "integration-test": SandboxConfig(
        template="integration-test",
        network_mode="restricted",
        memory_limit="1GiB",
        cpu_limit=1.0,
        max_pids=100,
        max_duration="300s",
        seccomp_profile="standard-net",
    ),
    # an MCP server (ADR-046): long-lived, its image its own (built FROM code-executor
    # with the server's packages), the project read-only, no network
    "mcp-server": SandboxConfig(
        template="mcp-server",
        network_mode="none",
        memory_limit="512MiB",
        cpu_limit=1.0,
        max_pids=64,
        max_duration="24h",
        seccomp_profile="standard",
    ),
}

#: The image (by its fluffy name) each template runs; images/spec.py builds these images
#: and the kernel finds them by :data:`LABEL_IMAGE`.
TEMPLATE_IMAGES: dict[str, str] = {
    "ai-provider": "ai-provider",
    "code-executor": "code-executor",
    "policy-sandbox": "policy-sandbox",
    "integration-test": "code-executor",
    "mcp-server": "code-executor",  # an MCP server's own image is built FROM it
}
#: The label naming a fluffy image (every image images/ builds carries it).
LABEL_IMAGE = "org.fluffy.image"
#: The label holding an image's content hash: fluffy's images are tagged with exactly it.
LABEL_HASH = "org.fluffy.content-hash"


def template_config(name: str, **overrides: object) -> SandboxConfig:
    """The template's config with ``overrides`` applied (and validated again)."""
    try:
        base = TEMPLATES[name]
    except KeyError:
        raise ConfigError(
            f"unknown sandbox template {name!r}",
            fix="Use one of: " + ", ".join(TEMPLATES),
            why="a sandbox is made from one of fluffy's templates",
        ) from None
    try:
        return SandboxConfig.model_validate({**base.model_dump(), **overrides})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(
            f"invalid settings for the {name} sandbox: {problems}",
            fix="Use the design's units (e.g. 512MiB, 30s) and the documented limits.",
            why="a sandbox's settings are checked against the design's limits before it is made",
        ) from None
