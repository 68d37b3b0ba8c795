"""Tool definitions and the plugin interface (design: Tool Plugin SDK).

A plugin module exposes ``PLUGIN``, an instance of a :class:`ToolPlugin` subclass::

    class EchoPlugin(ToolPlugin):
        name = "echo-tool"
        version = 1

        def tools(self) -> list[ToolDefinition]:
            return [ToolDefinition("echo.say", "Say it back", {"type": "object"})]

        def handlers(self) -> dict[str, Handler]:
            return {"echo.say": lambda ctx, args: {"said": args}}

A handler takes the :class:`~fluffy.plugins.sdk.context.ToolContext` and the validated
arguments and returns a JSON-able dict (or None for ``{}``).  :func:`check_plugin`
checks a plugin once, when the host loads it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from fluffy.errors import ConfigError
from fluffy.plugins.sdk.schema import check_schema, validate

if TYPE_CHECKING:
    from fluffy.plugins.sdk.context import ToolContext

OutputMode = Literal["patch", "full"]
Truncation = Literal["head", "tail", "middle"]
Handler = Callable[["ToolContext", dict[str, Any]], Mapping[str, Any] | None]

TOOL_NAME = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+")
PLUGIN_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
FIELDS = (
    "name",
    "description",
    "input_schema",
    "output_mode",
    "read_only",
    "truncation",
    "timeout_s",
)


def _bad(what: str, fix: str = "Correct the tool's definition in the plugin.") -> ConfigError:
    return ConfigError(what, why="a plugin's tool definitions are checked when it loads", fix=fix)


@dataclass(frozen=True)
class ToolDefinition:
    """One tool: its name (``ns.verb``), what it does, and how the kernel treats it."""

    name: str
    description: str
    input_schema: Mapping[str, Any] = field(repr=False)
    output_mode: OutputMode = "patch"
    read_only: bool = False
    truncation: Truncation = "tail"  # which end of a too-long result the kernel keeps
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not TOOL_NAME.fullmatch(self.name):
            raise _bad(f"tool name {self.name!r} is not of the form 'namespace.verb'")
        if not isinstance(self.description, str) or not self.description.strip():
            raise _bad(f"tool {self.name} has no description")
        if self.output_mode not in ("patch", "full"):
            raise _bad(f"tool {self.name}: output_mode must be 'patch' or 'full'")
        if self.truncation not in ("head", "tail", "middle"):
            raise _bad(f"tool {self.name}: truncation must be 'head', 'tail' or 'middle'")
        if not isinstance(self.read_only, bool):
            raise _bad(f"tool {self.name}: read_only must be true or false")
        timeout = self.timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise _bad(f"tool {self.name}: timeout_s must be a positive number of seconds")
        check_schema(self.input_schema)
        if self.input_schema.get("type") != "object":
            raise _bad(f"tool {self.name}: input_schema must be of type 'object'")

    def validate(self, args: Any) -> dict[str, Any]:
        """``args`` checked against the input schema, defaults filled in."""
        checked: dict[str, Any] = validate(self.input_schema, args)
        return checked

    def to_dict(self) -> dict[str, Any]:
        """The definition as plain data (the manifest's ``tools`` entries)."""
        data = {name: getattr(self, name) for name in FIELDS}
        data["input_schema"] = _plain(self.input_schema)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolDefinition:
        unknown = sorted(set(data) - set(FIELDS))
        if unknown:
            raise _bad(f"unknown tool definition field(s): {', '.join(unknown)}")
        missing = [name for name in ("name", "description", "input_schema") if name not in data]
        if missing:
            raise _bad(f"tool definition lacks {', '.join(missing)}")
        return cls(**data)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


class ToolPlugin:
    """Base class of a tool plugin; subclasses set ``name`` and ``version``."""

    name: str = ""
    version: int = 1

    def tools(self) -> list[ToolDefinition]:
        raise NotImplementedError

    def handlers(self) -> dict[str, Handler]:
        raise NotImplementedError

    def on_pause(self) -> None:
        """Called when the kernel is about to pause the sandbox (1 s to save state)."""

    def on_resume(self) -> None:
        """Called when the sandbox runs again after a pause."""


class BoundTool(NamedTuple):
    definition: ToolDefinition
    handler: Handler


def check_plugin(plugin: object) -> dict[str, BoundTool]:
    """The plugin's tools by name, each with its handler; ConfigError if inconsistent."""
    if not isinstance(plugin, ToolPlugin):
        raise _bad(
            f"PLUGIN is a {type(plugin).__name__}, not a ToolPlugin",
            fix="Set PLUGIN = YourPlugin() where YourPlugin subclasses ToolPlugin.",
        )
    if not isinstance(plugin.name, str) or not PLUGIN_NAME.fullmatch(plugin.name):
        raise _bad(f"plugin name {plugin.name!r} is not a lower-case name like 'git-tool'")
    version = plugin.version
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise _bad(f"plugin {plugin.name}: version must be a non-negative integer")
    definitions = plugin.tools()
    handlers = plugin.handlers()
    bound: dict[str, BoundTool] = {}
    for definition in definitions:
        if not isinstance(definition, ToolDefinition):
            raise _bad(f"plugin {plugin.name}: tools() returned a {type(definition).__name__}")
        if definition.name in bound:
            raise _bad(f"plugin {plugin.name} defines {definition.name} twice")
        handler = handlers.get(definition.name)
        if not callable(handler):
            raise _bad(f"plugin {plugin.name}: tool {definition.name} has no handler")
        bound[definition.name] = BoundTool(definition, handler)
    extra = sorted(set(handlers) - set(bound))
    if extra:
        raise _bad(f"plugin {plugin.name}: handlers for undefined tools: {', '.join(extra)}")
    if not bound:
        raise _bad(f"plugin {plugin.name} defines no tools")
    return bound
