"""Kernel start-up: installed plugins become tools; tampered or disabled ones do not."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fluffy.errors import PluginRejected
from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.audit.query import Filters, entries
from fluffy.kernel.plugins.install import install, plan, read_home
from fluffy.kernel.plugins.store import PluginStore
from fluffy.kernel.plugins.tagging import TaggedPolicy
from fluffy.kernel.policy.audited import AuditedPolicy
from fluffy.kernel.policy.engine import Caller, PolicyEngine, Request
from fluffy.kernel.policy.model import parse_policy
from fluffy.kernel.tools.core.registry import Registry
from fluffy.kernel.tools.reading.fastpath import kernel_tools
from fluffy.kernel.tools.sandbox.plugin_activation import activate, open_home
from tests.unit.plugin_support import EXAMPLE, make_plugin, manifest, tool

pytestmark = pytest.mark.unit
POLICY = """
capabilities:
  - name: third-party-lint
    match: {syscall: [lint.check], caller_tag: [third_party]}
    action: allow
  - name: core-only
    match: {syscall: [lint.check], caller_tag: [core_plugin]}
    action: deny
"""


def engine() -> PolicyEngine:
    return PolicyEngine(parse_policy(POLICY))


async def install_all(store: PluginStore, folders: list[Path]) -> None:
    registry = await open_home(store, engine().evaluate)
    for folder in folders:
        await install(registry, store, await plan(registry, folder))
    await registry.disable("off-tool", "the user turned it off")
    await registry.close()


def test_enabled_intact_plugins_become_tools_and_the_rest_stay_out(tmp_path: Path) -> None:
    store = PluginStore(tmp_path / "home" / "plugins")
    off = make_plugin(tmp_path / "off", data=manifest("off-tool"))
    bad = make_plugin(tmp_path / "bad", data=manifest("bad-tool"))
    asyncio.run(install_all(store, [EXAMPLE, off, bad]))
    assert read_home(store) == {
        "lint-tool": ("REGISTERED", None),
        "off-tool": ("DISABLED", "the user turned it off"),
        "bad-tool": ("REGISTERED", None),
    }
    bad_copy = store.require("bad-tool").path
    (bad_copy / "plugin.py").write_text("PLUGIN = None  # replaced after install\n")
    state = tmp_path / "state"

    async def main() -> None:
        audit = await AuditLog.open(state)
        await audit.record(Event("kernel_start", input_summary="test"))
        tools = Registry.builtin(kernel_tools())
        activated = await activate(state, tools, engine().evaluate, audit, store)
        assert activated.registry is not None
        assert activated.names == {"lint-tool"}
        states = {i.name: (i.state, i.reason) for i in activated.registry.list()}
        assert states["lint-tool"] == ("ACTIVE", None)
        assert states["off-tool"] == ("DISABLED", "the user turned it off")
        assert states["bad-tool"][0] == "DISABLED"
        assert "changed: plugin.py" in (states["bad-tool"][1] or "")
        [spec] = activated.specs
        assert (spec.name, spec.kind, spec.route, spec.plugin) == (
            "lint.check",
            "read",
            "plugin",
            "lint-tool",
        )
        assert spec.module == "file:plugin.py" and spec.template == "code-executor"
        assert spec.third_party and "core_plugin" not in spec.tags
        code = activated.code["lint-tool"]
        assert code.entry == "plugin.py" and code.tools[0]["name"] == "lint.check"
        tools.add(activated.specs)
        assert tools.get("lint.check") is spec
        with pytest.raises(PluginRejected, match="are taken"):
            tools.add(activated.specs)
        # a second start rebuilds the kernel's registry from the install registry
        await activated.close()
        again = await activate(
            state, Registry.builtin(kernel_tools()), engine().evaluate, audit, store
        )
        assert again.names == {"lint-tool"}
        await again.close()
        await audit.close()

    asyncio.run(main())
    refusals = [
        e
        for e in entries(state, Filters(event_type="syscall"))
        if e["syscall_type"] == "plugin.load"
    ]
    assert [e["metadata"]["plugin"] for e in refusals] == ["bad-tool", "bad-tool"]
    assert all(e["policy_decision"] == "denied" for e in refusals)


def test_no_install_registry_means_no_plugins(tmp_path: Path) -> None:
    store = PluginStore(tmp_path / "empty")
    assert read_home(store) == {}

    async def main() -> None:
        activated = await activate(
            tmp_path / "state", Registry.builtin(kernel_tools()), engine().evaluate, None, store
        )
        assert activated.specs == [] and activated.names == set()
        await activated.close()

    asyncio.run(main())


def test_a_broken_install_registry_never_stops_the_kernel(tmp_path: Path) -> None:
    store = PluginStore(tmp_path / "home")
    store.root.mkdir()
    store.registry_file.write_bytes(b"this is not a database" * 100)

    async def main() -> None:
        activated = await activate(
            tmp_path / "state", Registry.builtin(kernel_tools()), engine().evaluate, None, store
        )
        assert activated.registry is None and activated.specs == []

    asyncio.run(main())


def test_third_party_calls_are_tagged_third_party_for_policy() -> None:
    front = AuditedPolicy(engine())
    tagged = TaggedPolicy(front, lambda: {"lint-tool"})
    as_router_builds_it = Caller("lint-tool", frozenset({"ai", "core_plugin"}))
    decision = tagged.evaluate(Request("lint.check", as_router_builds_it))
    assert decision.result == "allow" and decision.decided_by == "third-party-lint"
    assert front.evaluate(Request("lint.check", as_router_builds_it)).result == "deny"
    builtin = Caller("fs-tool", frozenset({"ai", "core_plugin"}))
    assert tagged.evaluate(Request("lint.check", builtin)).result == "deny"  # untouched
    replacement = PolicyEngine(parse_policy("capabilities: []"))
    tagged.swap(replacement)
    assert front.engine is replacement and tagged.engine is replacement
    assert tagged.evaluate(Request("lint.check", as_router_builds_it)).result == "deny"


def test_names_of_builtins_are_reserved_for_third_party_plugins(tmp_path: Path) -> None:
    store = PluginStore(tmp_path / "home")
    search = make_plugin(tmp_path / "s", data=manifest("search", tools=[tool("search.grep")]))

    async def main() -> None:
        registry = await open_home(store, engine().evaluate)
        with pytest.raises(PluginRejected, match="namespace 'search' belongs to the built-in"):
            await plan(registry, search)
        await registry.close()

    asyncio.run(main())
    assert store.names() == []


def test_a_copy_tampered_into_an_invalid_plugin_is_refused_and_audited(tmp_path: Path) -> None:
    store = PluginStore(tmp_path / "home")
    source = make_plugin(tmp_path / "src", data=manifest("evil-tool"))

    async def setup() -> None:
        registry = await open_home(store, engine().evaluate)
        await install(registry, store, await plan(registry, source))
        await registry.close()

    asyncio.run(setup())
    copy = store.require("evil-tool").path
    (copy / "plugin.py").write_text("from fluffy.kernel.audit import log\n")  # now invalid too
    state = tmp_path / "state"

    async def main() -> None:
        audit = await AuditLog.open(state)
        await audit.record(Event("kernel_start", input_summary="test"))
        activated = await activate(
            state, Registry.builtin(kernel_tools()), engine().evaluate, audit, store
        )
        assert activated.names == set() and activated.registry is not None
        [rejected] = activated.registry.list(rejected=True)
        assert rejected.reason == "files changed since install: changed: plugin.py"
        await activated.close()
        await audit.close()

    asyncio.run(main())
    [entry] = [
        e
        for e in entries(state, Filters(event_type="syscall"))
        if e["syscall_type"] == "plugin.load"
    ]
    assert entry["policy_decision"] == "denied" and entry["metadata"]["changed"] == "plugin.py"
