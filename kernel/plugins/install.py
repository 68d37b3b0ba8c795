"""``fluffy plugin install``'s steps, for the CLI (no kernel needed).

1. :func:`plan`: read the folder (files, manifest, entry, imports), check it can be
   registered (API version, names, tags) and pre-check its capabilities: a hostile or
   broken plugin is REJECTED here (reason and manifest path recorded), nothing copied;
2. the CLI shows the plan and asks the user (design: require_review);
3. :func:`install`: copy into the store (hashes recorded), read the *copy* again and
   register it; any failure removes the copy.

The install registry lives in the store (``registry.db``, rollback journal so the kernel
can read it from a read-only mount); the kernel activates what it lists at start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from fluffy.errors import PluginNotFound, PluginRejected
from fluffy.kernel.plugins.manifest import PluginManifest
from fluffy.kernel.plugins.registry import PluginInfo, PluginRegistry
from fluffy.kernel.plugins.scan import discover
from fluffy.kernel.plugins.store import PluginStore, inspect_tree


class InstallPlan(msgspec.Struct, frozen=True):
    """What the user is asked to approve."""

    source: Path
    manifest: PluginManifest
    files: int
    total_bytes: int
    warnings: list[str]

    def to_dict(self) -> dict[str, Any]:
        manifest = self.manifest
        return {
            "source": str(self.source),
            "name": manifest.name,
            "version": manifest.version,
            "description": manifest.description,
            "author": manifest.author,
            "sandbox_template": manifest.sandbox_template,
            "required_capabilities": list(manifest.required_capabilities),
            "tags": sorted({"third_party", *manifest.tags}),
            "tools": [
                {"name": t.name, "description": t.description, "read_only": t.read_only}
                for t in manifest.tools
            ],
            "min_api_version": manifest.min_api_version,
            "files": self.files,
            "total_bytes": self.total_bytes,
            "warnings": list(self.warnings),
        }


def read_home(store: PluginStore) -> dict[str, tuple[str, str | None]]:
    """name -> (state, reason) of the install registry, read-only (missing: no plugins)."""
    path = store.registry_file
    if not path.is_file():
        return {}
    uri = f"{path.resolve().as_uri()}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=5)) as db:
        rows = db.execute("SELECT name, state, reason FROM plugins").fetchall()
    return {str(name): (str(state), reason) for name, state, reason in rows}


async def plan(registry: PluginRegistry, source: Path) -> InstallPlan:
    """Everything checked before the user is asked; a refusal is recorded and raised."""
    source = source.expanduser().absolute()
    found = await asyncio.to_thread(discover, source)
    if found.manifest is None:
        await registry.register(found)  # records REJECTED with the reason
        assert found.error is not None
        raise found.error
    manifest = found.manifest
    problem = registry.refusal(manifest)
    if problem is not None:
        await registry.reject(found.manifest_path, manifest.name, problem)
        raise PluginRejected(
            f"{manifest.name} {manifest.version} cannot be installed: {problem}",
            why="the plugin's manifest or files do not meet fluffy's install rules",
        )
    files = await asyncio.to_thread(inspect_tree, source)
    warnings = registry.precheck(manifest) if registry.precheck is not None else []
    return InstallPlan(source, manifest, len(files), sum(f.size for f in files), warnings)


async def install(
    registry: PluginRegistry,
    store: PluginStore,
    approved: InstallPlan,
    files: Mapping[str, bytes] | None = None,
) -> PluginInfo:
    """Copy the approved plugin into the store and register the copy.

    ``files``: the exact bytes that were approved (a kernel's review); otherwise the
    plugin folder is read again.
    """
    manifest = approved.manifest
    if files is None:
        installed = await asyncio.to_thread(
            store.install, approved.source, manifest.name, manifest.version
        )
    else:
        installed = await asyncio.to_thread(
            store.install_files, files, manifest.name, manifest.version, str(approved.source)
        )
    try:
        found = await asyncio.to_thread(discover, installed.path)
        if found.manifest != manifest:
            raise PluginRejected(
                f"{manifest.name} changed while it was being installed",
                why="what is installed must be exactly what was shown for approval",
                fix="Install again once the plugin folder no longer changes.",
            )
        return registry.require_registered(await registry.register(found, folder=installed.path))
    except BaseException:
        await asyncio.to_thread(store.remove, manifest.name)
        raise


async def remove(registry: PluginRegistry, store: PluginStore, name: str) -> None:
    known = registry.get(name) is not None
    if known:
        await registry.unregister(name)
    if store.get(name) is not None:
        await asyncio.to_thread(store.remove, name)
    elif not known:
        raise PluginNotFound(
            f"no plugin named {name!r} is installed",
            why="neither the registry nor the plugin store has a plugin of that name",
        )
