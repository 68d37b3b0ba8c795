"""Kernel start-up: the user's installed, enabled plugins become tools.

``fluffy plugin install`` writes the plugin store and its install registry in fluffy's
home (``$FLUFFY_HOME/plugins``: ``<name>/<version>/``, ``<name>/install.json``,
``registry.db``); the kernel only *reads* them (in L1 the folder is mounted read-only,
``FLUFFY_PLUGIN_STORE``), at start.  It trusts nothing there but the user's choice of
plugins: each enabled plugin is registered again in the kernel's own registry (the state
database), so its installed manifest is validated again, its names checked against the
built-ins, its capabilities pre-checked against *this* project's policy; then it is
loaded (every file hash recomputed: a changed plugin is DISABLED and the refusal
audited) and enabled.  ACTIVE plugins' tools join the tool registry, tagged
``third_party``.  Nothing here stops the kernel: a plugin that fails stays out.

It lives with the tools because it turns plugins into tools: the tools import the plugin
machinery (:mod:`fluffy.kernel.plugins`), which never imports the tools back.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import msgspec

from fluffy.errors import FluffyError
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.audit.store import db_path
from fluffy.kernel.plugins.install import read_home
from fluffy.kernel.plugins.precheck import Evaluate, precheck
from fluffy.kernel.plugins.registry import PluginInfo, PluginRegistry
from fluffy.kernel.plugins.scan import discover
from fluffy.kernel.plugins.store import PluginStore
from fluffy.kernel.tools.core.registry import Registry, ToolSpec, reserved_by, third_party_specs
from fluffy.kernel.tools.reading.fastpath import kernel_tools
from fluffy.kernel.tools.sandbox.pluginjob import ThirdPartyCode

log = logging.getLogger("fluffy.kernel.plugins")


class Activated(msgspec.Struct):
    """What start-up made of the installed plugins."""

    registry: PluginRegistry | None = None
    specs: list[ToolSpec] = msgspec.field(default_factory=list)
    code: dict[str, ThirdPartyCode] = msgspec.field(default_factory=dict)

    @property
    def names(self) -> set[str]:
        return set(self.code)

    async def close(self) -> None:
        if self.registry is not None:
            await self.registry.close()


async def _bring_up(registry: PluginRegistry, store: PluginStore, name: str) -> PluginInfo | None:
    installed = store.get(name)
    if installed is None:
        log.warning("plugin %s is registered but not in the store %s; skipped", name, store.root)
        return None
    found = discover(installed.path)
    if found.manifest is None:  # a copy that no longer reads: tampered, or broken?
        report = store.verify(name)
        if not report.ok:
            problem = f"files changed since install: {report.describe()}"
            await registry.reject(found.manifest_path, name, problem)
            folder = str(installed.path)
            await registry.audit_refusal(name, installed.version, folder, problem, report.to_dict())
            log.error("plugin %s refused: %s", name, problem)
            return None
    info = await registry.register(found, folder=installed.path)
    if info.state == "REJECTED":
        log.warning("plugin %s was rejected: %s", name, info.reason)
        return None
    await registry.load(name)  # PluginTampered: DISABLED and audited
    return await registry.enable(name)


async def open_home(store: PluginStore, evaluate: Evaluate) -> PluginRegistry:
    """The install registry of ``store``, pre-checking against ``evaluate``'s policy."""
    return await PluginRegistry.open(
        store.registry_file,
        rollback_journal=True,
        store=store,
        reserved=reserved_by(Registry.builtin(kernel_tools())),
        precheck=lambda manifest: precheck(evaluate, manifest),
    )


async def activate(
    state_dir: Path,
    tools: Registry,
    evaluate: Evaluate,
    audit: AuditLog | None,
    store: PluginStore | None = None,
) -> Activated:
    """Register, load and enable every enabled installed plugin; never raises."""
    store = store or PluginStore.default()
    activated = Activated()
    try:
        home = read_home(store)
        registry = await PluginRegistry.open(
            db_path(state_dir),
            store=store,
            reserved=reserved_by(tools),
            precheck=lambda manifest: precheck(evaluate, manifest),
            audit=audit,
        )
    except (sqlite3.Error, OSError, FluffyError) as exc:
        log.error("installed plugins not loaded: %s", exc)
        return activated
    activated.registry = registry
    try:
        await registry.settle()
        for stale in registry.list():  # rebuilt from the install registry at every start
            await registry.unregister(stale.name)
    except (sqlite3.Error, FluffyError) as exc:
        log.error("installed plugins not loaded: %s", exc)
        return activated
    for name, (state, reason) in sorted(home.items()):
        try:
            if state == "DISABLED":
                installed = store.get(name)
                if installed is not None:
                    found = discover(installed.path)
                    if (await registry.register(found, folder=installed.path)).state != "REJECTED":
                        await registry.disable(name, reason or "disabled by the user")
                continue
            info = await _bring_up(registry, store, name)
        except (FluffyError, OSError, sqlite3.Error) as exc:
            log.error("plugin %s not activated: %s", name, exc)
            continue
        if info is None or info.manifest is None:
            continue
        manifest = info.manifest
        activated.specs.extend(third_party_specs(manifest, frozenset(info.tags)))
        activated.code[name] = ThirdPartyCode(
            store=store,
            name=name,
            entry=manifest.entry,
            min_api_version=manifest.min_api_version,
            tools=[tool.definition() for tool in manifest.tools],
            capabilities=tuple(manifest.required_capabilities),
        )
        for warning in info.warnings:
            log.warning("plugin %s: %s", name, warning)
    return activated
