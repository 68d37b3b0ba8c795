"""The plugin manifest model: one for built-ins and third-party; errors name field and reason."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import yaml

from fluffy.errors import PluginManifestInvalid, PluginManifestYaml
from fluffy.kernel.plugins.manifest import (
    CAPABILITIES,
    MAX_MANIFEST_BYTES,
    load_manifest,
    namespace_of,
    parse_manifest,
    read_manifest_text,
)
from fluffy.kernel.plugins.scan import read_plugin
from fluffy.kernel.tools.core.registry import BUILTIN_PLUGINS, builtin_manifest
from tests.unit.plugin_support import EXAMPLE, ROOT, make_plugin, manifest, tool

pytestmark = pytest.mark.unit


def invalid(data: dict[str, Any]) -> PluginManifestInvalid:
    with pytest.raises(PluginManifestInvalid) as caught:
        parse_manifest(data, "m.yaml")
    assert caught.value.code == "plugin.manifest_invalid"
    return caught.value


def test_builtin_manifests_load_with_the_same_model() -> None:
    for plugin, (package, _, tools) in BUILTIN_PLUGINS.items():
        loaded = builtin_manifest(plugin)
        assert loaded.name == plugin and sorted(loaded.tool_names) == sorted(tools)
        assert "core_plugin" in loaded.tags and loaded.runtime == "python"
        same = load_manifest(ROOT / "plugins" / package / "manifest.yaml")
        assert same == loaded


def test_the_example_plugin_matches_its_manifest() -> None:
    loaded = read_plugin(EXAMPLE)
    assert (loaded.name, loaded.namespace, loaded.tool_names) == (
        "lint-tool",
        "lint",
        ["lint.check"],
    )
    spec = importlib.util.spec_from_file_location("lint_example", EXAMPLE / loaded.entry)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert [t.to_dict() for t in module.PLUGIN.tools()] == [t.definition() for t in loaded.tools]


def test_namespaces() -> None:
    assert namespace_of("lint-tool") == "lint"
    assert namespace_of("my-vcs") == "my_vcs"
    assert namespace_of("fs-tool") == "fs"


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        ({"entry": "../outside.py"}, "entry", "contains '..'"),
        ({"entry": "sub/../../x.py"}, "entry", "contains '..'"),
        ({"entry": "/etc/passwd.py"}, "entry", "is absolute"),
        ({"entry": "C:/x.py"}, "entry", "is absolute"),
        ({"entry": "plugin.sh"}, "entry", "not a Python file"),
        ({"sandbox_template": "super-privileged"}, "sandbox_template", "unknown sandbox template"),
        ({"sandbox_template": "policy-sandbox"}, "sandbox_template", "does not host tool"),
        (
            {"required_capabilities": ["fs.read", "root.shell"]},
            "required_capabilities",
            "root.shell",
        ),
        ({"required_capabilities": ["fs.read", "fs.read"]}, "required_capabilities", "twice"),
        ({"runtime": "deno"}, "runtime", "'python'"),
        ({"name": "Bad Name"}, "name", "not a plugin name"),
        ({"version": "one"}, "version", "not a version"),
        ({"tags": ["Not A Tag"]}, "tags", "lower-case identifier"),
        ({"min_api_version": "1"}, "min_api_version", "valid integer"),
        ({"min_api_version": -1}, "min_api_version", "greater than or equal to 0"),
        ({"tools": []}, "tools", "at least 1"),
        ({"tools": [tool("other.echo")]}, "tools.0.name", "not in the plugin's namespace"),
        ({"tools": [tool("demo.echo"), tool("demo.echo")]}, "tools.1.name", "declared twice"),
        ({"tools": [tool("echo")]}, "tools.0.name", "namespace.verb"),
        ({"unexpected": 1}, "unexpected", "unknown field"),
    ],
)
def test_each_bad_field_is_named_with_its_reason(
    change: dict[str, Any], field: str, reason: str
) -> None:
    error = invalid(manifest(**change))
    assert error.what.startswith(f"m.yaml: {field}:"), error.what
    assert reason in error.what, error.what
    assert error.fix


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ({"type": "string"}, "must be of type 'object'"),
        ({"type": "object", "patternProperties": {}}, "unsupported keyword"),
        ({"type": "object", "required": ["x"]}, "undeclared properties"),
        ({"type": "thing"}, "is not one of"),
    ],
)
def test_tool_schemas_are_validated_as_schemas(schema: dict[str, Any], reason: str) -> None:
    bad = tool("demo.echo")
    bad["input_schema"] = schema
    error = invalid(manifest(tools=[bad]))
    assert error.what.startswith("m.yaml: tools.0.input_schema:") and reason in error.what


def test_missing_fields_and_every_problem_are_listed() -> None:
    data = manifest()
    del data["author"]
    data["entry"] = "../x.py"
    error = invalid(data)
    assert "(and 1 more)" in error.what
    assert "author: required field is missing" in error.why
    assert "entry: '../x.py' contains '..'" in error.why


def test_invalid_yaml_is_its_own_error_with_the_line() -> None:
    with pytest.raises(PluginManifestYaml) as caught:
        read_manifest_text("name: demo-tool\ntools: [unclosed\n", "m.yaml")
    assert caught.value.code == "plugin.manifest_yaml"
    assert caught.value.what.startswith("m.yaml:3: not valid YAML")


def test_yaml_aliases_tags_and_non_mappings_are_refused() -> None:
    with pytest.raises(PluginManifestYaml, match="aliases are not allowed"):
        read_manifest_text("a: &x [1]\nb: *x\n")
    with pytest.raises(PluginManifestYaml, match="not valid YAML"):
        read_manifest_text("name: !!python/object:os.system x\n")
    with pytest.raises(PluginManifestYaml, match="not a list"):
        read_manifest_text("- 1\n- 2\n")
    with pytest.raises(PluginManifestYaml, match="larger than"):
        read_manifest_text("x" * (MAX_MANIFEST_BYTES + 1))


def test_load_manifest_reads_files(tmp_path: Path) -> None:
    folder = make_plugin(tmp_path / "p")
    assert load_manifest(folder / "manifest.yaml").name == "demo-tool"
    with pytest.raises(PluginManifestYaml, match="missing or not a regular file"):
        load_manifest(tmp_path / "nothing.yaml")
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe")
    with pytest.raises(PluginManifestYaml, match="not UTF-8"):
        load_manifest(tmp_path / "bin.yaml")


def test_capabilities_are_the_policy_engines_syscalls() -> None:
    from fluffy.kernel.policy.engine import READ_ONLY

    assert READ_ONLY <= CAPABILITIES
    assert {"fs.write", "shell.run", "git.commit"} <= CAPABILITIES


def test_the_manifest_round_trips_through_yaml() -> None:
    loaded = parse_manifest(manifest())
    again = read_manifest_text(yaml.safe_dump(loaded.to_dict()))
    assert again == loaded and again.tool("demo.echo") is not None


@pytest.mark.parametrize(
    ("source", "module"),
    [
        ("import fluffy.kernel.audit.log\n", "fluffy.kernel.audit.log"),
        ("from fluffy import kernel\n", "fluffy.kernel"),
        ("from fluffy.cli import main\n", "fluffy.cli"),
        (
            "import importlib\nimportlib.import_module('fluffy.kernel.tools')\n",
            "fluffy.kernel.tools",
        ),
        ("__import__('fluffy.bootstrap')\n", "fluffy.bootstrap"),
    ],
)
def test_plugins_may_not_import_fluffys_internals(tmp_path: Path, source: str, module: str) -> None:
    folder = make_plugin(tmp_path / "p")
    (folder / "helper.py").write_text(source)
    with pytest.raises(PluginManifestInvalid) as caught:
        read_plugin(folder)
    assert f"imports {module}, which is fluffy's internals" in caught.value.what
    assert caught.value.what.startswith("helper.py:")


def test_the_sdk_and_errors_are_what_plugins_may_import(tmp_path: Path) -> None:
    folder = make_plugin(tmp_path / "p")
    (folder / "helper.py").write_text(
        "import fluffy\nfrom fluffy.errors import ToolFailed\n"
        "from fluffy.plugins.sdk import ToolContext\nimport json, os\n"
    )
    assert read_plugin(folder).name == "demo-tool"
    (folder / "broken.py").write_text("def (:\n")
    with pytest.raises(PluginManifestInvalid, match=r"broken\.py:1: not valid Python"):
        read_plugin(folder)
