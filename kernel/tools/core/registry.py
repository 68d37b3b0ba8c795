"""Which tools exist, what each one touches, and where it runs.

Three routes (design: AI Tools Module, Three-Layer Architecture):

- ``fast``: kernel-native, read-only (fs.read, fs.list, fs.exists, search.grep,
  search.glob) — no second IPC hop, no sandbox;
- ``plugin``: a tool plugin in an L2 sandbox of its template: a built-in (fs-tool,
  git-tool, test-tool, search-tool, container-tool; tagged ``core_plugin``) or an
  installed third-party plugin (tagged ``third_party``; :func:`third_party_specs`);
- ``kernel``: workflow tools the state machine answers itself (plan.complete,
  workflow.request_exemption, workflow.add_tests and workflow.request_mode, which only
  ask the user).

The plugin tools' descriptions and JSON schemas come from each plugin's
``manifest.yaml`` (one model for every plugin: :mod:`fluffy.kernel.plugins.manifest`);
the kernel adds what it must know itself and never takes from a plugin: the kind (read /
write / execute / commit), which paths a call reads and writes (for policy, availability
and the parallel planner), and the retry rule.  A third-party tool is ``read`` when its
manifest says ``read_only`` (its result is returned, nothing is staged) and ``execute``
otherwise (debug mode only, like ``container.run``); third-party tools never write the
project in v1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

from fluffy.errors import PluginManifestInvalid, PluginRejected, ToolInputInvalid, ToolNotFound
from fluffy.kernel.plugins.manifest import PluginManifest, load_manifest
from fluffy.kernel.plugins.registry import Reserved
from fluffy.kernel.tools.reading.fastpath import WORKFLOW_TOOLS

Route = Literal["fast", "plugin", "kernel", "mcp"]
#: ``external``: a tool of a registered MCP server (ADR-046): it runs in the server's
#: own sandbox, sees the project read-only and changes nothing of it.
Kind = Literal["read", "write", "execute", "commit", "workflow", "external"]

PLUGINS_DIR = Path(__file__).resolve().parents[3] / "plugins"
#: The whole project (a test run reads everything; a commit writes the repository).
EVERYTHING = ""


class ToolSpec(msgspec.Struct, frozen=True):
    name: str
    kind: Kind
    route: Route
    description: str = ""
    input_schema: Mapping[str, Any] = msgspec.field(default_factory=dict)
    #: Plugin serving it: (plugin name, python module, sandbox template).  A third-party
    #: plugin's module is ``file:<entry>`` (its code comes from the plugin store).
    plugin: str | None = None
    module: str | None = None
    template: str = "code-executor"
    #: Plugin tools with a kernel-native twin (search.*) may run in the kernel instead.
    fast_twin: bool = False
    #: The serving plugin's capability tags (design: Capability Tag), for policy.
    tags: frozenset[str] = frozenset({"core_plugin"})

    @property
    def third_party(self) -> bool:
        return "third_party" in self.tags

    @property
    def read_only(self) -> bool:
        return self.kind in ("read", "workflow")

    @property
    def retried(self) -> bool:
        """Reads are retried once after 100 ms; writes never (design: Retry Strategy)."""
        return self.kind == "read"

    def paths(self, args: Mapping[str, Any]) -> tuple[frozenset[str], frozenset[str]]:
        """(reads, writes): project paths the call touches ('' = everything)."""
        reads: set[str] = set()
        writes: set[str] = set()
        path = args.get("path")
        if self.kind == "write":
            if not isinstance(path, str):
                raise ToolInputInvalid(f"{self.name} needs a `path` (a string)")
            writes.add(path)
            reads.add(path)
        elif self.kind == "commit":
            writes.add(EVERYTHING)
            reads.add(EVERYTHING)
        elif self.kind == "execute":
            reads.add(EVERYTHING)
        elif self.kind == "read":
            reads.add(path if isinstance(path, str) and self.name.startswith("fs.") else EVERYTHING)
        return frozenset(reads), frozenset(writes)

    def public(self) -> dict[str, Any]:
        """What tool.list shows (and, in [8/9], what the provider's function calling gets)."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": dict(self.input_schema),
            "kind": self.kind,
            "route": self.route,
        }


#: (tool, kind) of each built-in plugin's tools; the manifest must declare exactly these.
BUILTIN_PLUGINS: dict[str, tuple[str, str, dict[str, Kind]]] = {
    "fs-tool": (
        "fs_tool",
        "code-executor",
        {"fs.write": "write", "fs.edit": "write", "fs.delete": "write"},
    ),
    "git-tool": (
        "git_tool",
        "code-executor",
        {"git.status": "read", "git.diff": "read", "git.commit": "commit"},
    ),
    "test-tool": ("test_tool", "code-executor", {"test.run": "execute"}),
    # debug mode only; each command reviewed unless a rule allows it (ADR-062)
    "container-tool": ("container_tool", "code-executor", {"container.run": "execute"}),
    "search-tool": (
        "search_tool",
        "code-executor",
        {"search.grep": "read", "search.glob": "read"},
    ),
}


def builtin_manifest(plugin: str) -> PluginManifest:
    """A built-in plugin's manifest; it must declare exactly the tools listed above."""
    package, _, tools = BUILTIN_PLUGINS[plugin]
    path = PLUGINS_DIR / package / "manifest.yaml"
    manifest = load_manifest(path)
    if manifest.name != plugin or sorted(manifest.tool_names) != sorted(tools):
        raise PluginManifestInvalid(
            f"{path}: declares {manifest.name} with tools {', '.join(manifest.tool_names)}; "
            f"the kernel expects {plugin} with {', '.join(tools)}",
            fix="Keep the built-in manifest and BUILTIN_PLUGINS in step.",
        )
    return manifest


def third_party_specs(manifest: PluginManifest, tags: frozenset[str]) -> list[ToolSpec]:
    """The tools of an installed, active third-party plugin."""
    return [
        ToolSpec(
            name=tool.name,
            kind="read" if tool.read_only else "execute",
            route="plugin",
            description=tool.description,
            input_schema=tool.input_schema,
            plugin=manifest.name,
            module=f"file:{manifest.entry}",
            template=manifest.sandbox_template,
            tags=frozenset({"third_party", *tags} - {"core_plugin", "trusted_write"}),
        )
        for tool in manifest.tools
    ]


class Registry:
    """Every tool the kernel can route, by name."""

    def __init__(self, specs: list[ToolSpec]) -> None:
        self.specs = {spec.name: spec for spec in specs}

    @classmethod
    def builtin(cls, fast: Mapping[str, tuple[str, Mapping[str, Any]]]) -> Registry:
        """Fast-path tools (name -> (description, schema)), kernel tools, built-in plugins."""
        specs: list[ToolSpec] = []
        for plugin, (package, template, tools) in BUILTIN_PLUGINS.items():
            manifest = builtin_manifest(plugin)
            for name, kind in tools.items():
                declared = manifest.tool(name)
                assert declared is not None  # builtin_manifest checked the names
                specs.append(
                    ToolSpec(
                        name=name,
                        kind=kind,
                        route="plugin",
                        description=declared.description,
                        input_schema=declared.input_schema,
                        plugin=plugin,
                        module=f"fluffy.plugins.{package}",
                        template=template,
                        fast_twin=name in fast,
                    )
                )
        by_name = {spec.name: spec for spec in specs}
        for name, (description, schema) in fast.items():
            twin = by_name.get(name)
            fast_kind: Kind = "workflow" if name in WORKFLOW_TOOLS else "read"
            route: Route = "kernel" if fast_kind == "workflow" else "fast"
            by_name[name] = ToolSpec(
                name=name,
                kind=fast_kind,
                route=route,
                description=description,
                input_schema=schema,
                plugin=twin.plugin if twin else None,
                module=twin.module if twin else None,
                template=twin.template if twin else "code-executor",
            )
        return cls(list(by_name.values()))

    def add(self, specs: list[ToolSpec]) -> None:
        """Add tools (an installed plugin's); a name already taken is refused."""
        taken = sorted(spec.name for spec in specs if spec.name in self.specs)
        if taken:
            raise PluginRejected(
                f"tool name(s) {', '.join(taken)} are taken",
                why="every tool name belongs to one plugin",
                fix="Remove the plugin that repeats them.",
            )
        for spec in specs:
            self.specs[spec.name] = spec

    def replace(self, prefix: str, specs: list[ToolSpec]) -> None:
        """Swap the MCP tools whose names start with ``prefix`` for ``specs`` (reload)."""
        for name in [n for n, s in self.specs.items() if n.startswith(prefix) and s.route == "mcp"]:
            del self.specs[name]
        self.add([spec for spec in specs if spec.name.startswith(prefix) and spec.route == "mcp"])

    def plugins(self) -> set[str]:
        return {spec.plugin for spec in self.specs.values() if spec.plugin is not None}

    def get(self, name: str) -> ToolSpec:
        try:
            return self.specs[name]
        except KeyError:
            raise ToolNotFound(
                f"there is no tool named {name!r}",
                fix="Use one of: " + ", ".join(sorted(self.specs)) + ".",
            ) from None

    def names(self, keep: Callable[[ToolSpec], bool] = lambda _: True) -> list[str]:
        return sorted(name for name, spec in self.specs.items() if keep(spec))


def reserved_by(tools: Registry) -> Reserved:
    """What ``tools`` owns, so no third-party plugin may take it: plugin and tool names."""
    return Reserved(plugins=set(tools.plugins()), tools=set(tools.specs))
