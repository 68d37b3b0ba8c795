"""Plugin folders for the plugin tests: a valid small plugin, and ways to break it."""

from __future__ import annotations

import copy
import textwrap
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "plugins" / "lint-tool"

SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string", "maxLength": 100}},
    "additionalProperties": False,
}


def tool(name: str = "demo.echo") -> dict[str, Any]:
    """A tool entry exactly as ``ToolDefinition.to_dict()`` writes it."""
    return {
        "name": name,
        "description": "Say the text back",
        "input_schema": copy.deepcopy(SCHEMA),
        "output_mode": "full",
        "read_only": True,
        "truncation": "tail",
        "timeout_s": 30.0,
    }


def manifest(name: str = "demo-tool", **changes: Any) -> dict[str, Any]:
    namespace = name.removesuffix("-tool").replace("-", "_")
    data: dict[str, Any] = {
        "name": name,
        "version": "1.0.0",
        "description": "A plugin for tests",
        "author": "tests",
        "runtime": "python",
        "entry": "plugin.py",
        "sandbox_template": "code-executor",
        "required_capabilities": ["fs.read"],
        "tags": ["demo"],
        "tools": [tool(f"{namespace}.echo")],
        "min_api_version": 1,
    }
    data.update(changes)
    return data


def plugin_code(tools: list[dict[str, Any]], name: str = "demo-tool") -> str:
    """A plugin module defining ``tools`` (each handler echoes its arguments)."""
    return textwrap.dedent(
        f"""
        from fluffy.plugins.sdk import ToolDefinition, ToolPlugin

        TOOLS = [ToolDefinition.from_dict(t) for t in {tools!r}]

        def handle(ctx, args):
            return {{"said": args.get("text"), "tool": ctx.tool_name}}


        class Demo(ToolPlugin):
            name = {name!r}
            version = 1

            def tools(self):
                return TOOLS

            def handlers(self):
                return {{t.name: handle for t in TOOLS}}


        PLUGIN = Demo()
        """
    )


def make_plugin(
    folder: Path,
    name: str = "demo-tool",
    *,
    data: dict[str, Any] | None = None,
    code: str | None = None,
    text: str | None = None,
) -> Path:
    """A plugin folder: ``manifest.yaml`` (``data``, or raw ``text``) and ``plugin.py``."""
    folder.mkdir(parents=True, exist_ok=True)
    data = manifest(name) if data is None else data
    (folder / "manifest.yaml").write_text(text if text is not None else yaml.safe_dump(data))
    tools = data.get("tools") if isinstance(data.get("tools"), list) else []
    (folder / "plugin.py").write_text(code if code is not None else plugin_code(tools, name))
    return folder
