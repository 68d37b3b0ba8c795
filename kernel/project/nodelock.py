"""A JavaScript project's lock file, found and read (:mod:`fluffy.kernel.project.npmlock`
for npm's and pnpm's, :mod:`fluffy.kernel.project.yarnlock` for yarn's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from fluffy.errors import EnvironmentFailed
from fluffy.kernel.project.files import read_json, read_text
from fluffy.kernel.project.nodelayout import node_parts
from fluffy.kernel.project.npmlock import MAX_LOCK_BYTES, NODE_LOCKS, NodeLock, read_npm, read_pnpm
from fluffy.kernel.project.yarnlock import read_yarn


def _lock_order(manifest: dict[str, Any]) -> list[str]:
    """The lock files to look for: the one of the manager ``packageManager`` names first."""
    declared = str(manifest.get("packageManager") or "").split("@", 1)[0]
    own = {"pnpm": ["pnpm-lock.yaml"], "yarn": ["yarn.lock"],
           "npm": ["npm-shrinkwrap.json", "package-lock.json"]}.get(declared, [])  # fmt: skip
    return list(dict.fromkeys([*own, *NODE_LOCKS]))


def _workspace_manifests(root: Path, manifest: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    notes: list[str] = []
    _, folders, _, _ = node_parts(root, manifest, notes)
    found = [(folder, read_json(root, f"{folder}/package.json", notes)) for folder in folders]
    return [(folder, data) for folder, data in found if isinstance(data, dict)]


def read_node_lock(root: Path, manifest: dict[str, Any], arch: str) -> NodeLock | None:
    """The project's lock file as :class:`NodeLock`; None when it has none.  A lock that
    cannot be read raises :class:`EnvironmentFailed` saying why and what to do."""
    for name in _lock_order(manifest):
        text = read_text(root, name, MAX_LOCK_BYTES)
        if text is None:
            if (root / name).is_symlink() or (root / name).exists():
                raise EnvironmentFailed(
                    f"{name} cannot be read",
                    why=f"it is a link, not a regular file, or larger than "
                    f"{MAX_LOCK_BYTES // 2**20} MiB",
                    fix=f"Make {name} a regular file of the project (regenerate it with its "
                    "package manager).",
                )
            continue
        try:
            if name.endswith(".json"):
                return read_npm(json.loads(text), name, arch)
            if name == "pnpm-lock.yaml":
                return read_pnpm(yaml.safe_load(text), name, arch)
            return read_yarn(text, name, manifest, _workspace_manifests(root, manifest))
        except (ValueError, yaml.YAMLError, RecursionError) as exc:
            raise EnvironmentFailed(
                f"{name} cannot be read",
                why=f"it is not valid {'JSON' if name.endswith('.json') else 'YAML'}: "
                f"{str(exc)[:300] or type(exc).__name__}",
                fix=f"Regenerate {name} with its package manager.",
            ) from None
    return None
