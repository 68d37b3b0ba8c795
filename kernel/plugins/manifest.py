"""The plugin manifest (design: Plugin Manifest): one pydantic model for every plugin.

Built-in plugins (``plugins/*/manifest.yaml``) and third-party ones are read by the same
model, so a rule holds for both.  The model is strict (no type coercion, unknown fields
refused) and checks what can be checked on the text alone:

- ``entry`` is a relative ``.py`` path inside the plugin folder: no ``..``, not absolute;
- ``sandbox_template`` is a template that hosts tool plugins;
- ``required_capabilities`` are syscall names the policy engine knows (:data:`CAPABILITIES`);
- every tool name is ``namespace.verb`` in the plugin's own namespace (``lint-tool`` ->
  ``lint.*``), and its ``input_schema`` is a well-formed schema of the SDK's subset.

Checks that need more than the text (the entry file exists, names are not taken, the
API version) belong to :mod:`fluffy.kernel.plugins.scan` and the registry.  Every
failure is one :class:`PluginManifestInvalid` naming each field and the reason.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fluffy.errors import ConfigError, PluginManifestInvalid, PluginManifestYaml
from fluffy.kernel.containers.config import TEMPLATES
from fluffy.kernel.policy.engine import READ_ONLY
from fluffy.kernel.yamltext import YamlSyntax, load_yaml
from fluffy.plugins.sdk.definition import PLUGIN_NAME, TOOL_NAME
from fluffy.plugins.sdk.schema import check_schema

#: Largest manifest read (a manifest is a few KiB; this stops YAML bombs early).
MAX_MANIFEST_BYTES: Final = 256 * 1024
#: The syscalls a plugin may declare it needs: what the policy rules speak of (the
#: engine's read-only syscalls, the built-in tools' writes, commands, git, containers).
CAPABILITIES: Final = frozenset(
    READ_ONLY
    | {
        "fs.write",
        "fs.edit",
        "fs.delete",
        "shell.run",
        "test.run",
        "git.status",
        "git.diff",
        "git.commit",
        "container.run",
    }
)
#: Templates a tool plugin may run in (the others host AI adapters and policy rules).
TOOL_TEMPLATES: Final = ("code-executor", "integration-test")
VERSION: Final = re.compile(r"\d{1,9}(\.\d{1,9}){0,2}([-+][0-9A-Za-z.-]{1,40})?")
TAG: Final = re.compile(r"[a-z][a-z0-9_]{0,39}")


def namespace_of(plugin: str) -> str:
    """The tool namespace a plugin owns: ``lint-tool`` -> ``lint``, ``my-vcs`` -> ``my_vcs``."""
    return plugin.removesuffix("-tool").replace("-", "_")


class ToolEntry(BaseModel):
    """One tool, as the SDK's ``ToolDefinition.to_dict()`` writes it."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, defer_build=True)

    name: str
    description: str = Field(min_length=1, max_length=4000)
    input_schema: dict[str, Any]
    output_mode: Literal["patch", "full"] = "patch"
    read_only: bool = False
    truncation: Literal["head", "tail", "middle"] = "tail"
    timeout_s: float = Field(60.0, gt=0, le=7200)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not TOOL_NAME.fullmatch(value) or len(value) > 128:
            raise ValueError(f"{value!r} is not a tool name of the form 'namespace.verb'")
        return value

    @field_validator("description")
    @classmethod
    def _description(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the description is blank")
        return value

    @field_validator("input_schema")
    @classmethod
    def _schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            check_schema(value)
        except ConfigError as exc:
            raise ValueError(exc.what) from None
        if value.get("type") != "object":
            raise ValueError("the input schema must be of type 'object' (the arguments)")
        return value

    def definition(self) -> dict[str, Any]:
        """The entry as plain data (equals the plugin's ``ToolDefinition.to_dict()``)."""
        return self.model_dump()


class PluginManifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, defer_build=True)

    name: str
    version: str
    description: str = Field(min_length=1, max_length=2000)
    author: str = Field(min_length=1, max_length=200)
    runtime: Literal["python"]
    entry: str
    sandbox_template: str
    required_capabilities: list[str] = Field(default_factory=list, max_length=32)
    tags: list[str] = Field(default_factory=list, max_length=16)
    tools: list[ToolEntry] = Field(min_length=1, max_length=64)
    min_api_version: int = Field(ge=0)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not PLUGIN_NAME.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a plugin name: lower-case letters, digits, '-' and '_', "
                "at most 64 characters, like 'lint-tool'"
            )
        return value

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        if not VERSION.fullmatch(value):
            raise ValueError(f"{value!r} is not a version like '1.0.0' (or '1.2.0-beta.1')")
        return value

    @field_validator("entry")
    @classmethod
    def _entry(cls, value: str) -> str:
        return check_entry(value)

    @field_validator("sandbox_template")
    @classmethod
    def _template(cls, value: str) -> str:
        if value not in TEMPLATES:
            raise ValueError(
                f"unknown sandbox template {value!r}; tool plugins run in "
                f"{' or '.join(TOOL_TEMPLATES)}"
            )
        if value not in TOOL_TEMPLATES:
            raise ValueError(
                f"the {value} template does not host tool plugins; use "
                f"{' or '.join(TOOL_TEMPLATES)}"
            )
        return value

    @field_validator("required_capabilities")
    @classmethod
    def _capabilities(cls, value: list[str]) -> list[str]:
        unknown = [c for c in value if c not in CAPABILITIES]
        if unknown:
            raise ValueError(
                f"unknown capabilit{'y' if len(unknown) == 1 else 'ies'} "
                f"{', '.join(repr(c) for c in unknown)}; known: {', '.join(sorted(CAPABILITIES))}"
            )
        if len(set(value)) != len(value):
            raise ValueError("a capability is listed twice")
        return value

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: list[str]) -> list[str]:
        bad = [t for t in value if not TAG.fullmatch(t)]
        if bad:
            raise ValueError(
                f"{', '.join(repr(t) for t in bad)}: a tag is a lower-case identifier like 'vcs'"
            )
        if len(set(value)) != len(value):
            raise ValueError("a tag is listed twice")
        return value

    @model_validator(mode="after")
    def _tools_in_namespace(self) -> PluginManifest:
        namespace = namespace_of(self.name)
        if namespace == "mcp":  # mcp.* names MCP servers' tools (ADR-046)
            raise ValueError(
                f"name: {self.name!r} would own the tool namespace 'mcp', which is kept for "
                "MCP servers' tools (mcp.SERVER.TOOL)"
            )
        seen: set[str] = set()
        for index, tool in enumerate(self.tools):
            if tool.name in seen:
                raise ValueError(f"tools.{index}.name: {tool.name!r} is declared twice")
            seen.add(tool.name)
            if tool.name.split(".", 1)[0] != namespace:
                raise ValueError(
                    f"tools.{index}.name: {tool.name!r} is not in the plugin's namespace: "
                    f"the tools of {self.name!r} are named '{namespace}.<verb>'"
                )
        return self

    @property
    def namespace(self) -> str:
        return namespace_of(self.name)

    @property
    def tool_names(self) -> list[str]:
        return [tool.name for tool in self.tools]

    def tool(self, name: str) -> ToolEntry | None:
        return next((tool for tool in self.tools if tool.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()


def check_entry(value: str) -> str:
    """``value`` as a normalised relative ``.py`` path, or ValueError saying why not."""
    if not value or "\x00" in value or "\\" in value:
        raise ValueError(f"{value!r} is not a file path (empty, NUL or backslash)")
    if value.startswith("/") or re.match(r"[A-Za-z]:", value):
        raise ValueError(f"{value!r} is absolute; give a path inside the plugin folder")
    if ".." in value.split("/"):
        raise ValueError(f"{value!r} contains '..'; the entry must stay inside the plugin folder")
    normal = posixpath.normpath(value)
    if normal in (".", "") or not normal.endswith(".py"):
        raise ValueError(f"{value!r} is not a Python file (.py) inside the plugin folder")
    return normal


# -- reading -------------------------------------------------------------------------
def _problem(error: Any) -> str:
    loc = ".".join(str(part) for part in error["loc"]) or "(manifest)"
    kind, message = error["type"], str(error["msg"])
    if kind == "extra_forbidden":
        message = "unknown field (not part of the manifest schema)"
    elif kind == "missing":
        message = "required field is missing"
    elif message.startswith("Value error, "):
        message = message.removeprefix("Value error, ")
        if loc == "(manifest)" and ": " in message and message.split(": ", 1)[0].count("."):
            loc, message = message.split(": ", 1)
    return f"{loc}: {message}"


def parse_manifest(data: Any, source: str = "manifest.yaml") -> PluginManifest:
    """Validate already-parsed manifest data; one error lists every problem."""
    if not isinstance(data, dict):
        raise PluginManifestYaml(
            f"{source}: a manifest is a YAML mapping of fields, not a {type(data).__name__}"
        )
    try:
        return PluginManifest.model_validate(data)
    except ValidationError as exc:
        problems = [_problem(error) for error in exc.errors()]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise PluginManifestInvalid(
            f"{source}: {problems[0]}{more}", why="\n".join(problems)
        ) from None


def _too_big(source: str) -> PluginManifestYaml:
    return PluginManifestYaml(
        f"{source}: the manifest is larger than {MAX_MANIFEST_BYTES // 1024} KiB",
        why="a manifest is a few KiB of fields; a file this big is a mistake or an attack",
        fix="Shorten the manifest.",
    )


def read_manifest_text(text: str, source: str = "manifest.yaml") -> PluginManifest:
    if len(text.encode("utf-8", "replace")) > MAX_MANIFEST_BYTES:
        raise _too_big(source)
    try:
        data = load_yaml(text, source, "manifests")
    except YamlSyntax as exc:
        raise PluginManifestYaml(str(exc)) from None
    return parse_manifest(data, source)


def load_manifest(path: Path) -> PluginManifest:
    """The manifest at ``path`` (``manifest.yaml`` of a plugin folder)."""
    try:
        if path.is_symlink() or not path.is_file():
            raise PluginManifestYaml(
                f"{path} is missing or not a regular file",
                why="every plugin folder has a manifest.yaml at its top",
                fix="Point at the plugin's folder (the one holding manifest.yaml).",
            )
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise _too_big(str(path))
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise PluginManifestYaml(f"{path} is not UTF-8 text") from None
    except OSError as exc:
        raise PluginManifestYaml(
            f"cannot read {path}: {exc.strerror or exc}", fix="Check the file's permissions."
        ) from None
    return read_manifest_text(text, str(path))
