"""What a session merged and has not committed yet: the exact contents a commit takes.

The AI's commit holds HEAD's tree plus these paths, each with the content the merge
wrote (or removed), never whatever else is in the working tree: the person's untracked
files, their other uncommitted edits and their index stay theirs.  The record lives
in ``<state>/landed/<session>/``, which the git tool's sandbox sees read-only at
``/staged`` when it commits::

    tree/<path>      the merged content of each written path
    landed.json      {path: sha256 of that content, or null for a removal}

It is written *before* the merge touches the project (and trimmed to what the merge
really did afterwards), so a kernel killed mid-merge, which completes the merge at its
next start, still commits it.  A commit clears it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from fluffy.kernel.confined_files import read_existing, safe_relpath, write_atomic

MAX_LANDED_BYTES = 64 * 1024 * 1024


def safe_name(session_id: str) -> str:
    """A session id as one folder name (ids are hex; anything else is refused)."""
    if not session_id or not all(c.isalnum() or c in "-_" for c in session_id):
        raise ValueError(f"not a session id: {session_id!r}")
    return session_id


class Landed:
    """One session's merged, uncommitted paths (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.tree = root / "tree"
        self.index = root / "landed.json"

    def paths(self) -> dict[str, str | None]:
        """path -> sha256 of the content to commit (None: the path is removed)."""
        try:
            data = json.loads(self.index.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {str(k): (str(v) if isinstance(v, str) else None) for k, v in data.items()}

    def content(self, rel: str) -> bytes | None:
        return read_existing(self.tree, safe_relpath(rel), MAX_LANDED_BYTES)

    def add(self, contents: Mapping[str, bytes | None]) -> None:
        """Record ``contents`` (path -> merged bytes, None for a removal) on top."""
        self.tree.mkdir(parents=True, exist_ok=True)
        for folder in (self.root, self.tree):
            folder.chmod(0o755)  # the git tool's sandbox reads it as another uid
        listing = self.paths()
        for rel, data in contents.items():
            rel = safe_relpath(rel)
            if data is None:
                listing[rel] = None
                if (self.tree / rel).is_file():
                    (self.tree / rel).unlink()
                continue
            write_atomic(self.tree, rel, data, mode=0o644, dir_mode=0o755)
            listing[rel] = hashlib.sha256(data).hexdigest()
        self._save(listing)

    def keep_only(self, merged: Iterable[str], planned: Iterable[str]) -> None:
        """After a merge: drop the planned paths it did not write."""
        done = set(merged)
        listing = self.paths()
        for rel in set(planned) - done:
            listing.pop(rel, None)
            if (self.tree / rel).is_file():
                (self.tree / rel).unlink()
        self._save(listing)

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def _save(self, listing: Mapping[str, str | None]) -> None:
        tmp = self.index.with_suffix(".tmp")
        tmp.write_text(json.dumps(dict(sorted(listing.items())), indent=1))
        tmp.chmod(0o644)
        tmp.replace(self.index)
