"""The plugin registry: lifecycle, persistence, rejections, tamper caught at load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fluffy.errors import PluginNotFound, PluginStateError, PluginTampered
from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.audit.query import Filters, entries
from fluffy.kernel.audit.store import db_path
from fluffy.kernel.plugins.precheck import precheck
from fluffy.kernel.plugins.registry import PluginRegistry, Reserved
from fluffy.kernel.plugins.scan import discover, scan
from fluffy.kernel.plugins.store import PluginStore
from fluffy.kernel.policy.engine import PolicyEngine
from fluffy.kernel.policy.model import parse_policy
from tests.unit.plugin_support import make_plugin, manifest, tool

pytestmark = [pytest.mark.unit, pytest.mark.anyio]
BUILTINS = Reserved(plugins={"fs-tool", "git-tool"}, tools={"fs.write", "git.diff"})
ALLOWING = """
capabilities:
  - name: third-party-reads
    match: {syscall: [fs.read], caller_tag: [third_party]}
    action: allow
  - name: demo-tools
    match: {syscall: [demo.echo], caller_tag: [third_party]}
    action: allow
"""


async def opened(tmp_path: Path, **options: Any) -> PluginRegistry:
    options.setdefault("reserved", BUILTINS)
    options.setdefault("store", PluginStore(tmp_path / "store"))
    return await PluginRegistry.open(db_path(tmp_path / "state"), **options)


async def test_the_whole_lifecycle_is_persisted(tmp_path: Path) -> None:
    folder = make_plugin(tmp_path / "src")

    registry = await opened(tmp_path, store=None)
    info = await registry.register(discover(folder))
    assert (info.state, info.version, info.tools) == ("REGISTERED", "1.0.0", ["demo.echo"])
    assert info.tags == ("demo", "third_party") and info.manifest_path.endswith("manifest.yaml")
    steps = [
        (registry.load("demo-tool"), "LOADED"),
        (registry.enable("demo-tool"), "ACTIVE"),
        (registry.unload("demo-tool"), "UNLOADED"),
        (registry.load("demo-tool"), "LOADED"),
        (registry.disable("demo-tool", "policy changed"), "DISABLED"),
        (registry.enable("demo-tool"), "REGISTERED"),
    ]
    for step, state in steps:
        assert (await step).state == state
    await registry.disable("demo-tool", "the user said so")
    await registry.close()
    again = await opened(tmp_path, store=None)  # a new process sees the same
    kept = again.get("demo-tool")
    assert kept is not None and (kept.state, kept.reason) == ("DISABLED", "the user said so")
    assert kept.manifest is not None and kept.manifest.tool_names == ["demo.echo"]
    assert [i.name for i in again.list(state="DISABLED")] == ["demo-tool"]
    assert [i.name for i in again.by_tag("third_party")] == ["demo-tool"]
    assert again.by_tag("core_plugin") == []
    await again.unregister("demo-tool")
    assert again.get("demo-tool") is None and again.list() == []
    await again.close()


@pytest.mark.parametrize(
    ("state_moves", "action", "message"),
    [
        ([], "enable", "cannot enable plugin demo-tool: it is REGISTERED"),
        ([], "unload", "cannot unload plugin demo-tool: it is REGISTERED"),
        (["load", "enable"], "unregister", "cannot unregister plugin demo-tool: it is ACTIVE"),
        (["load", "enable"], "load", "cannot load plugin demo-tool: it is ACTIVE"),
        (["load"], "load", "cannot load plugin demo-tool: it is LOADED"),
    ],
)
async def test_illegal_moves_name_the_state_and_what_is_allowed(
    tmp_path: Path, state_moves: list[str], action: str, message: str
) -> None:
    registry = await opened(tmp_path, store=None)
    await registry.register(discover(make_plugin(tmp_path / "src")))
    for move in state_moves:
        await getattr(registry, move)("demo-tool")
    before = registry.require("demo-tool").state
    with pytest.raises(PluginStateError) as caught:
        await getattr(registry, action)("demo-tool")
    assert caught.value.what == message and "From " in caught.value.fix
    assert registry.require("demo-tool").state == before
    with pytest.raises(PluginStateError, match="needs a reason"):
        await registry.disable("demo-tool", " ")
    with pytest.raises(PluginNotFound):
        await registry.load("nobody")
    await registry.close()


def hostile(tmp_path: Path) -> dict[str, Path]:
    """Plugin folders that must all be REJECTED (their reasons are checked below)."""
    found = {
        "taken-name": make_plugin(tmp_path / "a-dup", data=manifest("demo-tool")),
        "builtin-name": make_plugin(
            tmp_path / "b-fs", data=manifest("fs-tool", tools=[tool("fs.extra")])
        ),
        "builtin-tool": make_plugin(
            tmp_path / "c-git", data=manifest("git", tools=[tool("git.diff")])
        ),
        "api-too-new": make_plugin(
            tmp_path / "d-api", data=manifest("api-tool", min_api_version=2)
        ),
        "core-tag": make_plugin(
            tmp_path / "e-tag", data=manifest("tag-tool", tags=["core_plugin"])
        ),
        "bad-yaml": make_plugin(tmp_path / "f-yaml", text="name: [oops\n"),
        "entry-escape": make_plugin(
            tmp_path / "g-entry", data=manifest("esc-tool", entry="../x.py")
        ),
        "kernel-import": make_plugin(
            tmp_path / "h-imp",
            data=manifest("imp-tool"),
            code="from fluffy.kernel.policy import engine\nPLUGIN = None\n",
        ),
        "missing-entry": make_plugin(
            tmp_path / "i-entry", data=manifest("ent-tool", entry="no.py")
        ),
    }
    (tmp_path / "j-link").mkdir()
    make_plugin(tmp_path / "j-link", data=manifest("link-tool"))
    (tmp_path / "j-link" / "escape").symlink_to("/etc")
    found["symlink"] = tmp_path / "j-link"
    return found


REASONS = {
    "taken-name": "a plugin named 'demo-tool' is already registered (version 1.0.0)",
    "builtin-name": "the name 'fs-tool' belongs to a built-in plugin",
    "builtin-tool": "the tool namespace 'git' belongs to the built-in tools",
    "api-too-new": "needs syscall API version 2 or later; this kernel speaks versions 0 to 1",
    "core-tag": "tag core_plugin is given by the kernel",
    "bad-yaml": "not valid YAML",
    "entry-escape": "entry: '../x.py' contains '..'",
    "kernel-import": "plugin.py:1 imports fluffy.kernel.policy, which is fluffy's internals",
    "missing-entry": "entry: 'no.py' is not a file of the plugin folder",
    "symlink": "escape is a symbolic link to '/etc', which leaves the plugin folder",
}


async def test_hostile_plugins_are_rejected_with_their_reasons_and_kept_listed(
    tmp_path: Path,
) -> None:
    source = make_plugin(tmp_path / "good" / "demo")
    folders = hostile(tmp_path / "bad")

    registry = await opened(tmp_path)
    assert (await registry.register(discover(source))).state == "REGISTERED"
    for label, folder in folders.items():
        info = await registry.register(discover(folder))
        assert info.state == "REJECTED", label
        assert REASONS[label] in (info.reason or ""), (label, info.reason)
        assert info.manifest_path == str(folder / "manifest.yaml")
    await registry.close()
    again = await opened(tmp_path)
    rejected = again.list(rejected=True)
    assert {i.manifest_path for i in rejected} == {
        str(f / "manifest.yaml") for f in folders.values()
    }
    assert all(i.state == "REJECTED" and i.reason for i in rejected)
    assert [i.name for i in again.list()] == ["demo-tool"]  # nothing else registered
    await again.close()


async def test_scan_finds_plugin_folders_valid_or_not(tmp_path: Path) -> None:
    make_plugin(tmp_path / "plugins" / "one", data=manifest("one-tool"))
    make_plugin(tmp_path / "plugins" / "two", text="- not a mapping\n")
    (tmp_path / "plugins" / "not-a-plugin").mkdir()

    registry = await opened(tmp_path)
    found = await registry.scan(tmp_path / "plugins")
    assert [(d.name, d.manifest is not None) for d in found] == [
        ("one-tool", True),
        ("two", False),
    ]
    assert found[1].error is not None and "mapping" in found[1].error.what
    assert scan(tmp_path / "plugins" / "one")[0].name == "one-tool"
    assert scan(tmp_path / "nowhere") == []
    await registry.close()


async def test_a_tampered_plugin_refuses_to_load_is_disabled_and_audited(tmp_path: Path) -> None:
    store = PluginStore(tmp_path / "store")
    installed = store.install(make_plugin(tmp_path / "src"), "demo-tool", "1.0.0")
    state = tmp_path / "state"

    audit = await AuditLog.open(state)
    await audit.record(Event("kernel_start", input_summary="test"))
    registry = await opened(tmp_path, store=store, audit=audit)
    await registry.register(discover(installed.path), folder=installed.path)
    assert (await registry.load("demo-tool")).state == "LOADED"  # intact: loads
    await registry.unload("demo-tool")
    (installed.path / "plugin.py").write_text("import socket  # something else\n")
    (installed.path / "dropped.py").write_text("")
    with pytest.raises(PluginTampered) as caught:
        await registry.load("demo-tool")
    assert "changed: plugin.py" in caught.value.what and "added: dropped.py" in caught.value.what
    info = registry.require("demo-tool")
    assert info.state == "DISABLED" and "files changed since install" in (info.reason or "")
    await registry.close()
    await audit.close()
    found = [
        e
        for e in entries(state, Filters(event_type="syscall"))
        if e["syscall_type"] == "plugin.load"
    ]
    assert len(found) == 1
    entry = found[0]
    assert entry["policy_decision"] == "denied" and entry["caller"] == "kernel"
    assert entry["policy_rule_name"] == "kernel.plugin_integrity"
    assert "plugin.py" in entry["deny_reason"]
    assert (
        entry["metadata"]["changed"] == "plugin.py" and entry["metadata"]["added"] == "dropped.py"
    )


async def test_a_plugin_gone_from_the_store_is_refused_too(tmp_path: Path) -> None:
    store = PluginStore(tmp_path / "store")
    installed = store.install(make_plugin(tmp_path / "src"), "demo-tool", "1.0.0")

    registry = await opened(tmp_path, store=store)
    await registry.register(discover(installed.path), folder=installed.path)
    store.remove("demo-tool")
    with pytest.raises(PluginTampered, match="is installed"):
        await registry.load("demo-tool")
    assert registry.require("demo-tool").state == "DISABLED"
    await registry.close()


async def test_the_capability_precheck_warns_but_never_blocks(tmp_path: Path) -> None:
    deny_all = PolicyEngine(parse_policy("capabilities: []")).evaluate
    allowing = PolicyEngine(parse_policy(ALLOWING)).evaluate
    needy = manifest(required_capabilities=["fs.read", "shell.run"])

    strict = await opened(tmp_path / "a", precheck=lambda m: precheck(deny_all, m))
    info = await strict.register(discover(make_plugin(tmp_path / "p1", data=needy)))
    assert info.state == "REGISTERED"
    assert [w.split(":")[0] for w in info.warnings] == [
        "capability fs.read",
        "capability shell.run",
        "tool demo.echo",
    ]
    await strict.close()
    kind = await opened(tmp_path / "b", precheck=lambda m: precheck(allowing, m))
    info = await kind.register(discover(make_plugin(tmp_path / "p2", data=needy)))
    assert info.warnings == (
        "capability shell.run: the current policy denies it to a third_party plugin in "
        "every workflow state",
    )
    await kind.close()


async def test_the_install_flow_installs_nothing_for_a_hostile_plugin(tmp_path: Path) -> None:
    from fluffy.errors import PluginError
    from fluffy.kernel.plugins.install import install, plan, remove

    store = PluginStore(tmp_path / "store")
    good = make_plugin(tmp_path / "good")
    bad = make_plugin(tmp_path / "bad", data=manifest("bad-tool", min_api_version=9))

    registry = await opened(tmp_path, store=store)
    with pytest.raises(PluginError, match="needs syscall API version 9"):
        await plan(registry, bad)
    assert store.names() == [] and registry.list() == []
    assert [i.name for i in registry.list(rejected=True)] == ["bad-tool"]
    approved = await plan(registry, good)
    assert approved.to_dict()["tools"][0]["name"] == "demo.echo"
    info = await install(registry, store, approved)
    assert info.state == "REGISTERED" and info.folder == str(store.root / "demo-tool" / "1.0.0")
    assert store.verify("demo-tool").ok
    with pytest.raises(PluginError, match="already registered"):
        await plan(registry, good)
    await remove(registry, store, "demo-tool")
    assert store.names() == [] and registry.list() == []
    await registry.close()
    assert yaml.safe_load((bad / "manifest.yaml").read_text())["min_api_version"] == 9
