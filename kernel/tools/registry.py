"""Which tools exist, what each one touches, and where it runs.

Three routes (design: AI Tools Module, Three-Layer Architecture):

- ``fast``: kernel-native, read-only (fs.read, fs.list, fs.exists, search.grep,
  search.glob) — no second IPC hop, no sandbox;
- ``plugin``: a built-in tool plugin in an L2 sandbox of its template (fs-tool,
  git-tool, test-tool, search-tool);
- ``kernel``: workflow tools the state machine answers itself (plan.complete).

The plugin tools' descriptions and JSON schemas come from each plugin's
``manifest.yaml``; the kernel adds what it must know itself and never takes from a
plugin: the kind (read / write / execute / commit), which paths a call reads and writes
(for policy, availability and the parallel planner), and the retry rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from fluffy.errors import ToolInputInvalid, ToolNotFound

Route = Literal["fast", "plugin", "kernel"]
Kind = Literal["read", "write", "execute", "commit", "workflow"]

PLUGINS_DIR = Path(__file__).resolve().parents[2] / "plugins"
#: The whole project (a test run reads everything; a commit writes the repository).
EVERYTHING = ""


@dataclass(frozen=True)
class ToolSpec:
    name: str
    kind: Kind
    route: Route
    description: str = ""
    input_schema: Mapping[str, Any] = field(default_factory=dict)
    #: Built-in plugin serving it: (plugin name, python module, sandbox template).
    plugin: str | None = None
    module: str | None = None
    template: str = "code-executor"
    #: Plugin tools with a kernel-native twin (search.*) may run in the kernel instead.
    fast_twin: bool = False

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
    "search-tool": (
        "search_tool",
        "code-executor",
        {"search.grep": "read", "search.glob": "read"},
    ),
}


def _manifest_tools(package: str) -> dict[str, dict[str, Any]]:
    path = PLUGINS_DIR / package / "manifest.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return {}
    tools = data.get("tools") if isinstance(data, dict) else None
    found: dict[str, dict[str, Any]] = {}
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict) and isinstance(tool.get("name"), str):
            found[tool["name"]] = tool
    return found


class Registry:
    """Every tool the kernel can route, by name."""

    def __init__(self, specs: list[ToolSpec]) -> None:
        self.specs = {spec.name: spec for spec in specs}

    @classmethod
    def builtin(cls, fast: Mapping[str, tuple[str, Mapping[str, Any]]]) -> Registry:
        """Fast-path tools (name -> (description, schema)), kernel tools, built-in plugins."""
        specs: list[ToolSpec] = []
        for plugin, (package, template, tools) in BUILTIN_PLUGINS.items():
            declared = _manifest_tools(package)
            for name, kind in tools.items():
                raw = declared.get(name, {})
                specs.append(
                    ToolSpec(
                        name=name,
                        kind=kind,
                        route="plugin",
                        description=str(raw.get("description", "")),
                        input_schema=raw.get("input_schema") or {"type": "object"},
                        plugin=plugin,
                        module=f"fluffy.plugins.{package}",
                        template=template,
                        fast_twin=name in fast,
                    )
                )
        by_name = {spec.name: spec for spec in specs}
        for name, (description, schema) in fast.items():
            twin = by_name.get(name)
            fast_kind: Kind = "workflow" if name == "plan.complete" else "read"
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
