"""The plugin registry and lifecycle (design: Plugin Registry, Lifecycle), in SQLite.

::

    DISCOVERED -> REGISTERED     manifest valid, API compatible, names free
    DISCOVERED -> REJECTED       anything else (reason and manifest path kept)
    REGISTERED -> LOADED -> ACTIVE -> UNLOADED (-> LOADED again)
    REGISTERED | LOADED | ACTIVE | UNLOADED -> DISABLED (user, policy, runtime error)
    DISABLED -> REGISTERED       enable again (it must load again)

DISCOVERED is what :func:`~.scan.scan` returns (nothing is stored for it).  Any other
move raises :class:`PluginStateError` naming the state and the moves it allows.  Loading
recomputes every file hash against the store's install record: a plugin whose files
changed is refused, DISABLED, and the refusal is audited.

Two registries use this class: the install registry of fluffy's home
(``$FLUFFY_HOME/plugins/registry.db``, written by ``fluffy plugin``) and the kernel's
own (the state database, ``db_path(state_dir)``), which the kernel fills at start-up
from the home one (:mod:`.activate`).  ``list``, ``get`` and ``by_tag`` answer from
memory (the design's synchronous calls); every change is written through.
"""

from __future__ import annotations

import builtins
import json
import sqlite3
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import aiosqlite
import msgspec
from msgspec.structs import replace

from fluffy.errors import (
    PluginError,
    PluginNotFound,
    PluginRejected,
    PluginStateError,
    PluginTampered,
)
from fluffy.kernel.audit.entry import Event, now_ms
from fluffy.kernel.audit.store import PRAGMAS
from fluffy.kernel.plugins.handshake import check_min_api_version
from fluffy.kernel.plugins.manifest import PluginManifest, parse_manifest
from fluffy.kernel.plugins.scan import Discovered, scan
from fluffy.kernel.plugins.store import PluginStore

if TYPE_CHECKING:  # the CLI uses the registry without the audit log's machinery
    from fluffy.kernel.audit.log import AuditLog

State = Literal["DISCOVERED", "REGISTERED", "REJECTED", "LOADED", "ACTIVE", "UNLOADED", "DISABLED"]
THIRD_PARTY: Final = "third_party"
#: Tags the kernel gives, never a manifest: a plugin claiming one would raise its own trust.
RESERVED_TAGS: Final = frozenset({"core_plugin", "trusted_write"})
#: action -> (states it starts from, state it leads to); None: the row goes.
MOVES: Final[Mapping[str, tuple[frozenset[str], str | None]]] = {
    "load": (frozenset({"REGISTERED", "UNLOADED"}), "LOADED"),
    "enable": (frozenset({"LOADED", "DISABLED"}), "ACTIVE"),  # DISABLED -> REGISTERED
    "unload": (frozenset({"LOADED", "ACTIVE"}), "UNLOADED"),
    "disable": (frozenset({"REGISTERED", "LOADED", "ACTIVE", "UNLOADED"}), "DISABLED"),
    "unregister": (frozenset({"REGISTERED", "UNLOADED", "DISABLED"}), None),
}
SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS plugins (
    name TEXT PRIMARY KEY, version TEXT NOT NULL, state TEXT NOT NULL, reason TEXT,
    manifest_path TEXT NOT NULL, manifest TEXT NOT NULL, tags TEXT NOT NULL,
    warnings TEXT NOT NULL, folder TEXT NOT NULL, updated_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS plugin_rejections (
    manifest_path TEXT PRIMARY KEY, name TEXT NOT NULL, reason TEXT NOT NULL,
    rejected_at INTEGER NOT NULL
);
"""


class PluginInfo(msgspec.Struct, frozen=True):
    """One plugin as the registry knows it (the design's PluginInfo)."""

    name: str
    state: str
    manifest_path: str
    version: str = ""
    reason: str | None = None
    manifest: PluginManifest | None = None
    tags: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    folder: str = ""
    updated_at: int = 0

    @property
    def tools(self) -> list[str]:
        return self.manifest.tool_names if self.manifest is not None else []

    def to_dict(self) -> dict[str, Any]:
        manifest = self.manifest
        return {
            "name": self.name,
            "version": self.version,
            "state": self.state,
            "reason": self.reason,
            "manifest_path": self.manifest_path,
            "folder": self.folder,
            "tags": list(self.tags),
            "warnings": list(self.warnings),
            "tools": self.tools,
            "required_capabilities": list(manifest.required_capabilities) if manifest else [],
            "description": manifest.description if manifest else "",
            "author": manifest.author if manifest else "",
            "sandbox_template": manifest.sandbox_template if manifest else "",
            "min_api_version": manifest.min_api_version if manifest else None,
            "updated_at": self.updated_at,
        }


class Reserved(msgspec.Struct):
    """Names third-party plugins may not take: the built-ins' plugins, tools, namespaces."""

    plugins: set[str] = msgspec.field(default_factory=set)
    tools: set[str] = msgspec.field(default_factory=set)

    @property
    def namespaces(self) -> set[str]:
        return {tool.split(".", 1)[0] for tool in self.tools}


def _row_info(row: sqlite3.Row | tuple[Any, ...]) -> PluginInfo:
    name, version, state, reason, manifest_path, manifest, tags, warnings, folder, at = row
    return PluginInfo(
        name=str(name),
        version=str(version),
        state=str(state),
        reason=reason,
        manifest_path=str(manifest_path),
        manifest=parse_manifest(json.loads(manifest), str(manifest_path)),
        tags=tuple(json.loads(tags)),
        warnings=tuple(json.loads(warnings)),
        folder=str(folder),
        updated_at=int(at),
    )


class PluginRegistry:
    """Register, load, enable, disable and list plugins; every change persisted."""

    def __init__(
        self,
        db: aiosqlite.Connection,
        *,
        store: PluginStore | None = None,
        reserved: Reserved | None = None,
        precheck: Callable[[PluginManifest], list[str]] | None = None,
        audit: AuditLog | None = None,
    ) -> None:
        self.db = db
        self.store = store
        self.reserved = reserved or Reserved()
        self.precheck = precheck
        self.audit = audit
        self._plugins: dict[str, PluginInfo] = {}
        self._rejected: dict[str, PluginInfo] = {}

    @classmethod
    async def open(
        cls, db_file: Path, *, rollback_journal: bool = False, **options: Any
    ) -> PluginRegistry:
        """The registry in ``db_file`` (created if missing).

        ``rollback_journal``: no WAL, so that the file can be read from a read-only mount
        (the home registry, read by the kernel in L1).
        """
        # the home store is readable by the kernel's user (plugin code is not secret)
        db_file.parent.mkdir(parents=True, exist_ok=True, mode=0o755 if rollback_journal else 0o700)
        db = await aiosqlite.connect(db_file)
        try:
            for pragma in PRAGMAS:
                if rollback_journal and "journal_mode" in pragma:
                    pragma = "PRAGMA journal_mode=DELETE"
                await db.execute(pragma)
            await db.executescript(SCHEMA)
            await db.commit()
            if rollback_journal:  # the kernel may run as another user (a root host)
                db_file.chmod(0o644)
            registry = cls(db, **options)
            await registry._reload()
        except BaseException:
            await db.close()
            raise
        return registry

    async def close(self) -> None:
        await self.db.close()

    async def _reload(self) -> None:
        rows = await self.db.execute_fetchall(
            "SELECT name, version, state, reason, manifest_path, manifest, tags, warnings, "
            "folder, updated_at FROM plugins"
        )
        self._plugins = {info.name: info for info in map(_row_info, rows)}
        rejected = await self.db.execute_fetchall(
            "SELECT manifest_path, name, reason, rejected_at FROM plugin_rejections"
        )
        self._rejected = {
            str(path): PluginInfo(
                str(name), "REJECTED", str(path), reason=str(reason), updated_at=int(at)
            )
            for path, name, reason, at in rejected
        }

    # -- reading (the design's synchronous calls) ---------------------------------------
    def get(self, name: str) -> PluginInfo | None:
        return self._plugins.get(name)

    def require(self, name: str) -> PluginInfo:
        info = self._plugins.get(name)
        if info is None:
            raise PluginNotFound(
                f"no plugin named {name!r} is registered",
                why="the registry has no entry with that name",
            )
        return info

    def list(
        self, *, state: str | None = None, tag: str | None = None, rejected: bool = False
    ) -> builtins.list[PluginInfo]:
        """Registered plugins (by name); ``rejected``: the rejections only."""
        pool = self._rejected.values() if rejected else self._plugins.values()
        found = [
            info
            for info in pool
            if (state is None or info.state == state) and (tag is None or tag in info.tags)
        ]
        return sorted(found, key=lambda info: (info.name, info.manifest_path))

    def by_tag(self, tag: str) -> builtins.list[PluginInfo]:
        return self.list(tag=tag)

    # -- discovering and registering ----------------------------------------------------
    async def scan(self, directory: Path) -> builtins.list[Discovered]:
        import asyncio

        return await asyncio.to_thread(scan, directory)

    def refusal(self, manifest: PluginManifest) -> str | None:
        """Why ``manifest`` cannot be registered now (None: it can)."""
        name = manifest.name
        try:
            check_min_api_version(name, manifest.min_api_version)
        except PluginError as exc:
            return f"{exc.what} ({exc.why})"
        claimed = sorted(RESERVED_TAGS.intersection(manifest.tags))
        if claimed:
            return f"tag {', '.join(claimed)} is given by the kernel, not claimed by a manifest"
        if name in self.reserved.plugins:
            return f"the name {name!r} belongs to a built-in plugin"
        existing = self._plugins.get(name)
        if existing is not None:
            return f"a plugin named {name!r} is already registered (version {existing.version})"
        if manifest.namespace in self.reserved.namespaces:
            return f"the tool namespace {manifest.namespace!r} belongs to the built-in tools"
        taken = {tool: info.name for info in self._plugins.values() for tool in info.tools}
        for tool in manifest.tool_names:
            if tool in self.reserved.tools:
                return f"tool {tool} is a built-in tool"
            if tool in taken:
                return f"tool {tool} is already provided by plugin {taken[tool]}"
        return None

    async def reject(self, manifest_path: Path | str, name: str, reason: str) -> PluginInfo:
        at = now_ms()
        await self.db.execute(
            "INSERT OR REPLACE INTO plugin_rejections VALUES (?, ?, ?, ?)",
            (str(manifest_path), name, reason, at),
        )
        await self.db.commit()
        info = PluginInfo(name, "REJECTED", str(manifest_path), reason=reason, updated_at=at)
        self._rejected[str(manifest_path)] = info
        return info

    async def register(self, found: Discovered, *, folder: Path | None = None) -> PluginInfo:
        """DISCOVERED -> REGISTERED, or REJECTED with the reason (returned, not raised)."""
        manifest = found.manifest
        if manifest is None:
            error = found.error
            reason = error.what if error is not None else "no manifest"
            if error is not None and error.why and error.why not in reason:
                reason = f"{reason} ({error.why})" if "\n" not in error.why else error.why
            return await self.reject(found.manifest_path, found.name, reason)
        problem = self.refusal(manifest)
        if problem is not None:
            return await self.reject(found.manifest_path, manifest.name, problem)
        warnings = self.precheck(manifest) if self.precheck is not None else []
        info = PluginInfo(
            name=manifest.name,
            state="REGISTERED",
            manifest_path=str(found.manifest_path),
            version=manifest.version,
            manifest=manifest,
            tags=tuple(sorted({THIRD_PARTY, *manifest.tags})),
            warnings=tuple(warnings),
            folder=str(folder or found.folder),
            updated_at=now_ms(),
        )
        await self.db.execute(
            "INSERT INTO plugins VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                info.name,
                info.version,
                info.state,
                None,
                info.manifest_path,
                json.dumps(manifest.to_dict(), sort_keys=True),
                json.dumps(list(info.tags)),
                json.dumps(list(info.warnings)),
                info.folder,
                info.updated_at,
            ),
        )
        await self.db.execute(
            "DELETE FROM plugin_rejections WHERE manifest_path = ?", (info.manifest_path,)
        )
        await self.db.commit()
        self._plugins[info.name] = info
        self._rejected.pop(info.manifest_path, None)
        return info

    def require_registered(self, info: PluginInfo) -> PluginInfo:
        """``info`` if registered; its rejection as :class:`PluginRejected` otherwise."""
        if info.state == "REJECTED":
            raise PluginRejected(
                f"plugin {info.name} was rejected: {info.reason}",
                why=f"registration checks {info.manifest_path}",
            )
        return info

    # -- moving -------------------------------------------------------------------------
    def _check_move(self, name: str, action: str) -> PluginInfo:
        info = self.require(name)
        starts, _ = MOVES[action]
        if info.state not in starts:
            allowed = sorted(a for a, (s, _) in MOVES.items() if info.state in s)
            raise PluginStateError(
                f"cannot {action} plugin {name}: it is {info.state}",
                fix=f"From {info.state} a plugin can: {', '.join(allowed) or 'nothing'}."
                + (" Unload it first." if action == "unregister" else ""),
            )
        return info

    async def _set(self, info: PluginInfo, state: str, reason: str | None) -> PluginInfo:
        moved = replace(info, state=state, reason=reason, updated_at=now_ms())
        await self.db.execute(
            "UPDATE plugins SET state = ?, reason = ?, updated_at = ? WHERE name = ?",
            (state, reason, moved.updated_at, info.name),
        )
        await self.db.commit()
        self._plugins[info.name] = moved
        return moved

    async def unregister(self, name: str) -> None:
        self._check_move(name, "unregister")
        await self.db.execute("DELETE FROM plugins WHERE name = ?", (name,))
        await self.db.commit()
        self._plugins.pop(name, None)

    async def load(self, name: str) -> PluginInfo:
        """REGISTERED | UNLOADED -> LOADED once its files match the install record."""
        info = self._check_move(name, "load")
        if self.store is not None:
            try:
                report = self.store.verify(name)
                problem = None if report.ok else f"files changed since install: {report.describe()}"
                details = report.to_dict()
            except PluginError as exc:
                problem, details = exc.what, {}
            if problem is not None:
                await self._set(info, "DISABLED", problem)
                await self.audit_refusal(info.name, info.version, info.folder, problem, details)
                raise PluginTampered(f"plugin {name} refused to load: {problem}")
        return await self._set(info, "LOADED", None)

    async def enable(self, name: str) -> PluginInfo:
        """LOADED -> ACTIVE; DISABLED -> REGISTERED (it loads again before it is used)."""
        info = self._check_move(name, "enable")
        return await self._set(info, "ACTIVE" if info.state == "LOADED" else "REGISTERED", None)

    async def unload(self, name: str) -> PluginInfo:
        return await self._set(self._check_move(name, "unload"), "UNLOADED", None)

    async def disable(self, name: str, reason: str) -> PluginInfo:
        if not reason.strip():
            raise PluginStateError(f"disabling {name} needs a reason", fix="Say why.")
        return await self._set(self._check_move(name, "disable"), "DISABLED", reason)

    async def settle(self) -> builtins.list[str]:
        """Start-up: LOADED / ACTIVE rows of an earlier kernel become UNLOADED."""
        moved = [i.name for i in self._plugins.values() if i.state in ("LOADED", "ACTIVE")]
        for name in moved:
            await self._set(self._plugins[name], "UNLOADED", "the previous kernel stopped")
        return moved

    async def audit_refusal(
        self, name: str, version: str, folder: str, problem: str, details: dict[str, Any]
    ) -> None:
        """Record (durably) that a plugin was refused to load, and why."""
        if self.audit is None:
            return
        metadata = {"plugin": name, "version": version, "folder": folder}
        for key in ("changed", "missing", "added"):
            if details.get(key):
                metadata[key] = ",".join(details[key])[:1000]
        await self.audit.record(
            Event(
                "syscall",
                caller="kernel",
                syscall_type="plugin.load",
                policy_decision="denied",
                policy_rule_name="kernel.plugin_integrity",
                deny_reason=problem[:500],
                input_summary=f"load plugin {name} {version}",
                metadata=metadata,
            )
        )
        await self.audit.flush()
